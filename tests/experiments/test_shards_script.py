"""scripts/run_study_shards.sh with a stand-in `python` on PATH that records
each call and exits as told: how the script reports its shards' outcomes
and what it passes to the collecting call."""

import os
import pathlib
import stat
import subprocess

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / 'scripts/run_study_shards.sh'

# Exits with $STATUS_<i> for --shard=i/n (0 when unset), $COLLECT_STATUS
# (0 when unset) for the collect call; every call's arguments are appended
# to $CALLS, one line each.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$CALLS"
for arg in "$@"; do
  case "$arg" in --shard=*) i=${arg#--shard=}; i=${i%/*}; var="STATUS_$i"; exit "${!var:-0}" ;; esac
done
exit "${COLLECT_STATUS:-0}"
"""


def _run(tmp_path, statuses, *flags, collect_status=0):
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir(exist_ok=True)
  fake = bin_dir / 'python'
  fake.write_text(FAKE_PYTHON)
  fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
  calls = tmp_path / 'calls.txt'
  env = {**os.environ, 'PATH': f'{bin_dir}{os.pathsep}{os.environ["PATH"]}',
         'CALLS': str(calls), 'COLLECT_STATUS': str(collect_status),
         **{f'STATUS_{i}': str(s) for i, s in enumerate(statuses)}}
  proc = subprocess.run(['bash', str(SCRIPT), str(len(statuses)),
                         str(tmp_path / 'study'), *flags],
                        env=env, capture_output=True, text=True, timeout=60)
  return proc, calls.read_text().splitlines()


def test_every_shard_trains_and_the_collect_call_drops_the_time_limit(tmp_path):
  proc, calls = _run(tmp_path, [0, 0], '--seeds=2',
                     '--stop_between_runs_after=2h')
  assert proc.returncode == 0, proc.stderr
  shards = sorted(c for c in calls if '--shard=' in c)
  assert [c.split('--shard=')[1].split()[0] for c in shards] == ['0/2', '1/2']
  assert all('--stop_between_runs_after=2h' in c for c in shards)
  # The driver refuses --collect_only with a time limit: it must not get one.
  collect = [c for c in calls if '--collect_only' in c]
  assert len(collect) == 1 and '--seeds=2' in collect[0]
  assert 'stop_between_runs_after' not in collect[0]


@pytest.mark.parametrize('flags', [['--stop_between_runs_after', '90m'],
                                   ['--stop_between_runs_after=90m']])
def test_a_shard_stopped_between_runs_makes_the_script_exit_75(tmp_path,
                                                               flags):
  proc, calls = _run(tmp_path, [0, 75, 0], *flags)
  assert proc.returncode == 75
  assert 'rerun the same command to continue' in proc.stderr
  collect = [c for c in calls if '--collect_only' in c]
  assert collect and '90m' not in collect[0]     # the value went with its flag


def test_a_failed_shard_is_named_and_the_script_fails_after_collecting(
    tmp_path):
  proc, calls = _run(tmp_path, [2, 75])
  assert proc.returncode == 1
  assert 'shard 0/2 exited with status 2; see ' in proc.stderr
  assert 'shard_0.log' in proc.stderr and 'shard 1/2' not in proc.stderr
  assert any('--collect_only' in c for c in calls)


def test_the_shards_outcome_outranks_a_failed_collection(tmp_path):
  """The collector fails (status 2) where no run has finished yet: with a
  failed shard the script said 2, not its documented 1; alone, its status
  is the script's."""
  proc, _ = _run(tmp_path, [75, 1], collect_status=2)
  assert proc.returncode == 1 and 'shard 1/2 exited with status 1' in proc.stderr
  proc, _ = _run(tmp_path, [75, 0], collect_status=2)
  assert proc.returncode == 75
  proc, _ = _run(tmp_path, [0, 0], collect_status=2)
  assert proc.returncode == 2

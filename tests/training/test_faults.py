"""Faults, simulated for real: signals, damaged checkpoints, a busy workdir,
diverging runs, and the log filter under a checkout named `selfattn`."""

import json
import logging as std_logging
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from selfattn import errors
from selfattn.training import log_setup
from selfattn.training import train
from selfattn.training import workdir as workdir_lib
from selfattn.errors import ConfigError
from runs import ROOT, cli, saved_params, subprocess_env, thirty_steps_config
from tiers import EXTENDED


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_flushes_events_and_resumes(tmp_path):
  """Preemption: SIGTERM mid-run stops after the current step with a
  checkpoint, events on disk and a one-line message; the same command then
  finishes the run."""
  from tensorboard.backend.event_processing import event_accumulator
  workdir = tmp_path / 'run'
  # 800 steps: the stop lands soon after the 20th, and the resume trains
  # the rest (with 3000 the test took 18 s, with 800 14 s).
  overrides = ['--config.train.num_steps=800', '--config.train.log_every=10',
               '--config.train.checkpoint_every=800', '--config.eval.every=800']
  log = tmp_path / 'stderr.txt'
  with open(log, 'w') as stderr:
    proc = subprocess.Popen(
        [sys.executable, '-m', 'selfattn.main', '--config=configs/tiny.py',
         f'--workdir={workdir}', *overrides], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=stderr, env=subprocess_env())
    deadline = time.time() + 300
    while time.time() < deadline and 'step     20/' not in log.read_text():
      time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
  text = log.read_text()
  lines = text.strip().splitlines()
  assert lines[-1].startswith('stopped: SIGTERM received: stopped after step')
  assert 'Traceback' not in text
  step = int(lines[-1].split('after step ')[1].split()[0])
  assert 20 <= step < 800
  assert sorted(int(d) for d in os.listdir(workdir / 'checkpoints')
                if d.isdigit()) == [step]
  events = event_accumulator.EventAccumulator(str(workdir))
  events.Reload()
  # The stop logs the progress line of its own step (not only every 10th).
  assert events.Scalars('train/loss')[-1].step == step
  assert any(f'step {step:6d}/800' in line for line in lines[:-1])
  again = cli(workdir, *overrides[:1], *overrides[1:])
  assert again.returncode == 0, again.stderr[-2000:]
  assert f'Resumed from checkpoint at step {step}' in again.stderr
  # One HParams session for the run: the resume keeps the first one (a
  # second copy per resume was written before).
  from tensorboard.backend.event_processing import event_file_loader
  sessions = [value.tag for name in os.listdir(workdir)
              if name.startswith('events.out.tfevents')
              for event in event_file_loader.EventFileLoader(
                  str(workdir / name)).Load()
              for value in event.summary.value
              if value.tag == '_hparams_/session_start_info']
  assert len(sessions) == 1
  assert len([n for n in os.listdir(workdir)
              if n.startswith('events.out.tfevents')]) == 2


def test_a_stop_between_a_checkpoint_and_its_evaluation_loses_nothing(
    tiny_config, tmp_path):
  """A stop request (or a kill) at an evaluation step came after that
  step's checkpoint and before its evaluation, and the resumed run never
  made it: its eval scalars and images were missing for good. The resume
  now makes it first, unless the record says it was made; and TensorBoard
  hides what the stopped process wrote after its checkpoint (purge_step),
  so each step's train/loss appears once."""
  from tensorboard.backend.event_processing import event_accumulator
  from runs import crashed_copy
  tiny_config.train.checkpoint_every = tiny_config.eval.every = 10
  tiny_config.train.log_every = 1
  straight = tmp_path / 'straight'
  train.train_and_evaluate(tiny_config, str(straight))
  assert workdir_lib.last_evaluated(str(straight)) == 20

  tag = 'eval/token_accuracy/len_0008'

  def steps(workdir, tag):
    events = event_accumulator.EventAccumulator(str(workdir),
                                                purge_orphaned_data=True)
    events.Reload()
    return [e.step for e in events.Scalars(tag)]

  missed = crashed_copy(straight, tmp_path / 'missed', 10)
  again = train.train_and_evaluate(tiny_config, str(missed))
  assert [h['step'] for h in again['history']] == [10, 20]
  assert steps(missed, tag) == [10, 20]

  # Killed after the evaluation at 10 and later steps: the stopped
  # process's events (its steps past the checkpoint included) are kept up
  # to the checkpoint and replaced after it.
  made = crashed_copy(straight, tmp_path / 'made', 10)
  history = json.loads((straight / 'summary.json').read_text())['history']
  record = {'step': 10, 'history': history[:1],
            'settings': workdir_lib.evaluation_settings(tiny_config)}
  assert json.loads((straight / workdir_lib.EVALUATED_FILE).read_text()) == {
      **record, 'step': 20, 'history': history}
  workdir_lib.write_json(str(made / workdir_lib.EVALUATED_FILE), record)
  for name in os.listdir(straight):
    if name.startswith('events.'):
      shutil.copy(straight / name, made / name)
  again = train.train_and_evaluate(tiny_config, str(made))
  # summary.json's history holds the evaluations before the resume too
  # (it held only the resumed invocation's: [20]).
  assert [h['step'] for h in history] == [10, 20]
  assert again['history'] == history
  # A resume that measures otherwise (other lengths: allowed without early
  # stopping) starts the history afresh rather than join two kinds of
  # measurement in one curve.
  other = crashed_copy(straight, tmp_path / 'other', 10)
  workdir_lib.write_json(str(other / workdir_lib.EVALUATED_FILE), record)
  tiny_config.eval.lengths = [4, 8]
  again = train.train_and_evaluate(tiny_config, str(other))
  assert [(h['step'], sorted(h['eval'])) for h in again['history']] == [
      (20, ['4', '8'])]
  assert steps(made, tag) == [10, 20]
  assert steps(made, 'train/loss') == list(range(1, 21))


def test_a_kill_before_the_first_checkpoint_leaves_each_step_once(
    tiny_config, tmp_path):
  """A process killed before its first checkpoint left its events; the
  rerun starts from step 0 and used to write every step again beside them
  (no purge from step 0): train/loss twice per step in TensorBoard."""
  from tensorboard.backend.event_processing import event_accumulator
  tiny_config.train.log_every = 1
  straight = tmp_path / 'straight'
  train.train_and_evaluate(tiny_config, str(straight))
  killed = tmp_path / 'killed'            # its events, no checkpoint yet
  killed.mkdir()
  for name in os.listdir(straight):
    if name.startswith('events.'):
      shutil.copy(straight / name, killed / name)
  train.train_and_evaluate(tiny_config, str(killed))
  events = event_accumulator.EventAccumulator(str(killed),
                                              purge_orphaned_data=True)
  events.Reload()
  assert [e.step for e in events.Scalars('train/loss')] == list(range(1, 21))
  assert [e.step for e in events.Scalars('eval/token_accuracy/len_0008')
          ] == [20]


def test_a_second_live_run_on_a_workdir_is_refused(tiny_config, tmp_path):
  with workdir_lib.workdir_lock(str(tmp_path)):
    with pytest.raises(ConfigError, match=f'in use by another live run '
                       rf'\(pid {os.getpid()}'):
      train.train_and_evaluate(tiny_config, str(tmp_path))
  # Released with its holder: the run now goes ahead.
  assert train.train_and_evaluate(tiny_config, str(tmp_path))['step'] == 20


def _damage(step_dir, how):
  default = step_dir / 'default'
  if how == 'truncated':
    data = [os.path.join(d, f) for d, _, files in os.walk(default)
            for f in files if '/d/' in os.path.join(d, f)]
    for path in data:
      with open(path, 'r+b') as f:
        f.truncate(3)
  elif how == 'no_metadata':
    os.remove(default / '_METADATA')
  else:
    for entry in os.listdir(step_dir):
      path = step_dir / entry
      shutil.rmtree(path) if path.is_dir() else os.remove(path)




@pytest.fixture(scope='module')
def thirty_step_run(tmp_path_factory):
  """One finished 30-step run with checkpoints 10, 20, 30 (shared)."""
  workdir = tmp_path_factory.mktemp('reference')
  train.train_and_evaluate(thirty_steps_config(), str(workdir))
  return workdir


# Reading the truncated array fails inside tensorstore, whose late callback
# then finds orbax's event loop closed: the RuntimeError that the command line
# drops (log_setup, tested below) surfaces here through pytest's own
# unraisable hook. Only that exact error is ignored.
@pytest.mark.filterwarnings(
    r'ignore:(?s)Exception ignored in.*Event loop is closed'
    r':pytest.PytestUnraisableExceptionWarning')
# 'truncated' in the commit tier. Extended: 'no_metadata' fails inside orbax's
# restore as 'truncated' does (the same catch-all in _newest_that_restores);
# 'emptied' is rejected by the step-metadata check, as
# test_init_from_never_modifies_the_source_workdir's emptied step 30 is, and
# test_checkpoint_integrity.py::test_a_flipped_byte_falls_back_to_the_previous_checkpoint
# moves a damaged step aside through the same _Damaged branch (tests/README.md).
@pytest.mark.parametrize('how', [
    'truncated', pytest.param('no_metadata', marks=EXTENDED),
    pytest.param('emptied', marks=EXTENDED)])
def test_damaged_latest_checkpoint_falls_back_to_the_previous(thirty_step_run,
                                                               tmp_path, how):
  """The newest checkpoint that restores is used, with a warning; the run
  then redoes the lost steps and ends with the same parameters."""
  tiny_config = thirty_steps_config()
  reference = thirty_step_run
  # As if killed at step 25: checkpoints 10 and 20, no summary; then damage 20.
  damaged = tmp_path / 'damaged'
  shutil.copytree(reference, damaged)
  os.remove(damaged / workdir_lib.SUMMARY_FILE)
  shutil.rmtree(damaged / 'checkpoints' / '30')
  _damage(damaged / 'checkpoints' / '20', how)
  summary = train.train_and_evaluate(tiny_config, str(damaged))
  assert summary['step'] == 30
  for a, b in zip(saved_params(reference), saved_params(damaged), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert os.path.isdir(damaged / 'checkpoints' / '20.damaged')


# Extended: (1e30, 0, 1) diverges in its first step with a checkpoint at
# every step, as (3.4e38, 0, 1) does, through the same checks before a save;
# the two cases that used to checkpoint bad parameters stay in the commit
# tier (tests/README.md).
@pytest.mark.parametrize('lr,warmup,every', [
    pytest.param(1e30, 0, 1, marks=EXTENDED), (3.4e38, 0, 1), (1e9, 30, 2)])
def test_diverged_parameters_are_never_checkpointed(tiny_config, tmp_path, lr,
                                                    warmup, every):
  """Divergence stops the run in one message naming the checkpoint to go back
  to (never 'step None'); the last two cases used to checkpoint inf or huge
  parameters after a finite loss."""
  c = tiny_config
  c.train.learning_rate, c.train.warmup_steps = lr, warmup
  c.train.log_every = c.train.checkpoint_every = every
  with pytest.raises(errors.NonFiniteError) as err:
    train.train_and_evaluate(c, str(tmp_path))
  message = str(err.value)
  assert 'step None' not in message
  assert ('no checkpoint was saved' in message
          or 'last good checkpoint is step' in message)
  if (tmp_path / 'checkpoints').exists() and any(
      d.isdigit() for d in os.listdir(tmp_path / 'checkpoints')):
    params = saved_params(tmp_path)
    assert all(np.all(np.isfinite(p)) for p in params)
    assert max(np.abs(p).max() for p in params) < 1e6


def test_log_filter_reads_the_emitting_module_not_a_path_substring():
  """A virtualenv inside a checkout named `selfattn` must not let every
  library's INFO lines through."""
  keep = log_setup._OwnInfoOnly()

  def record(path, level=std_logging.INFO):
    return std_logging.LogRecord('absl', level, path, 1, 'x', None, None)

  venv_lib = os.path.join(ROOT, '.venv', 'lib', 'python3.11', 'site-packages',
                          'orbax', 'checkpoint', 'x.py')
  assert not keep.filter(record(venv_lib))
  assert not keep.filter(record('/elsewhere/selfattn/experiments/lib.py'))
  assert keep.filter(record(os.path.join(ROOT, 'selfattn', 'training',
                                         'train.py')))
  assert keep.filter(record(venv_lib, std_logging.WARNING))


def test_unraisable_hook_drops_only_closed_loop_callbacks(monkeypatch):
  """tensorstore's late callbacks into a closed loop are dropped; any other
  unraisable error still reaches the default report."""
  reported = []
  monkeypatch.setattr(sys, '__unraisablehook__', reported.append)

  def unraisable(error):
    return type('Unraisable', (), {'exc_value': error, 'object': None})()

  log_setup._drop_closed_loop_callbacks(
      unraisable(RuntimeError('Event loop is closed')))
  assert reported == []
  other = unraisable(RuntimeError('something else'))
  log_setup._drop_closed_loop_callbacks(other)
  assert reported == [other]


def test_config_stored_before_a_field_existed_still_resumes(tiny_config,
                                                             tmp_path):
  """A run stored by an older selfattn (no model.attention_impl, remat,
  scan_layers or gpu_kernel) resumes when the new fields hold the old behaviour, and is
  refused when they do not."""
  workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=True)
  path = tmp_path / workdir_lib.CONFIG_FILE
  stored = json.loads(path.read_text())
  for field in ('attention_impl', 'remat', 'scan_layers', 'gpu_kernel'):
    del stored['model'][field]
  path.write_text(json.dumps(stored))
  workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=False)
  path.write_text(json.dumps(stored))
  tiny_config.model.scan_layers = True
  with pytest.raises(ConfigError,
                     match='config.model.scan_layers: stored False, now True'):
    workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=False)


@pytest.mark.parametrize('field, value', [('label_smoothing', 0.1),
                                          ('batch_tokens', 4096)])
def test_a_resume_refuses_another_loss_or_batching(tiny_config, tmp_path,
                                                   field, value):
  """label_smoothing (every step's loss) and batch_tokens (translation's
  batches) were missing from the fields a resume must match: a rerun with
  another value resumed and rewrote config.json as if steps 1..N had
  trained with it."""
  workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=True)
  tiny_config.train[field] = value
  with pytest.raises(ConfigError, match=f'config.train.{field}: stored'):
    workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=False)


def test_stating_the_default_vocab_size_continues_the_same_run(tiny_config,
                                                               tmp_path):
  """task.vocab_size unset and set to the size the task takes then (8 for
  reverse) are the same run: a resume stating it was refused as 'stored
  None, now 8'. Another size is refused, named by the size it had."""
  assert tiny_config.task.vocab_size is None
  workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=True)
  tiny_config.task.vocab_size = 8
  assert workdir_lib.check_or_store_config(str(tmp_path), tiny_config,
                                           write=False) == []
  tiny_config.task.vocab_size = 10
  with pytest.raises(ConfigError,
                     match='config.task.vocab_size: stored 8, now 10'):
    workdir_lib.check_or_store_config(str(tmp_path), tiny_config, write=False)


def _make_unwritable(path) -> bool:
  """Read-only for this process: chmod for a normal user, the immutable
  attribute for root (which chmod does not stop). False if neither works."""
  if os.geteuid() != 0:
    os.chmod(path, 0o555)
  elif shutil.which('chattr') is None or subprocess.run(
      ['chattr', '+i', str(path)], capture_output=True).returncode:
    return False
  try:
    (path / 'probe').mkdir()
  except OSError:
    return True
  (path / 'probe').rmdir()
  return False


def _make_writable(path) -> None:
  if os.geteuid() == 0:
    subprocess.run(['chattr', '-i', str(path)], capture_output=True)
  os.chmod(path, 0o755)


def test_a_checkpoint_that_cannot_be_written_fails_fast_in_one_line(tmp_path):
  """A read-only checkpoints/ used to keep the process waiting ~5 minutes on
  orbax's barrier; now the first save stops the run at once (exit 1) with
  one line naming the directory. The bound below catches that hang."""
  checkpoints_dir = tmp_path / 'checkpoints'
  checkpoints_dir.mkdir()
  if not _make_unwritable(checkpoints_dir):
    pytest.skip('cannot make a directory read-only here')
  try:
    start = time.time()
    result = cli(tmp_path, '--config.train.num_steps=10')
    took = time.time() - start
  finally:
    _make_writable(checkpoints_dir)
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith('error: cannot write checkpoint step ')
  assert str(checkpoints_dir) in last and 'Traceback' not in result.stderr
  assert took < 120, took


def test_a_full_disk_stops_training_with_one_line(tmp_path):
  """A checkpoint write that runs out of space (a 300 KiB tmpfs, too small
  for the second checkpoint) fails in orbax's background threads; the run
  stops with exit 1 and a last line naming the directory and the cause.
  Orbax's thread tracebacks (840 lines before) are dropped by the log
  filter, and tensorstore's late 'Event loop is closed' callbacks (10-35
  unraisable tracebacks, some printed after the error line) by the
  unraisable hook."""
  disk = tmp_path / 'disk'
  disk.mkdir()
  if subprocess.run(['mount', '-t', 'tmpfs', '-o', 'size=300k', 'tmpfs',
                     str(disk)], capture_output=True).returncode:
    pytest.skip('cannot mount a small tmpfs here (needs root)')
  try:
    result = cli(disk / 'run', '--config.model.num_hiddens=64',
                 '--config.model.ffn_num_hiddens=256')
  finally:
    subprocess.run(['umount', str(disk)], capture_output=True)
  assert result.returncode == 1, result.stderr[-2000:]
  last = result.stderr.strip().splitlines()[-1]
  assert last.startswith(f'error: saving checkpoints to {disk}/run/checkpoints')
  assert 'No space left on device' in last
  assert 'Traceback' not in result.stderr, result.stderr[-3000:]
  # Progress lines, orbax's one-line errors and ours: about 10.
  assert len(result.stderr.splitlines()) < 30, result.stderr[-3000:]

"""scripts/bench_gpu.py's recovery from a lost device: a run whose device
is lost after a row fails exits with LOST_DEVICE, and --resume continues
its NAME.json in a fresh process without running its rows again (what
scripts/gpu_session.sh's bench step does). The rows themselves run on a
GPU; here the smoke shapes on the CPU."""

import json
import os
import subprocess
import sys

from scripts import measure

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _bench(out, *args):
  subprocess.run(
      [sys.executable, 'scripts/bench_gpu.py', '--smoke', '--lengths=32',
       '--check=false', '--encodings=none', '--peers=flax', f'--out={out}',
       *args],
      cwd=ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, check=True,
      capture_output=True)
  with open(os.path.join(out, 'bench_gpu.json')) as f:
    return json.load(f)['rows']


def test_resume_keeps_the_rows_that_ran_and_runs_only_the_rest(tmp_path):
  first = _bench(tmp_path, '--impls=plain')
  assert [r['label'] for r in first] == ['L=32 bidir peer/flax',
                                         'L=32 bidir none/plain']
  # Marked, to tell a kept row from one run again.
  path = tmp_path / 'bench_gpu.json'
  result = json.loads(path.read_text())
  result['rows'][1]['ms'] = 12345.0
  path.write_text(json.dumps(result))
  rows = _bench(tmp_path, '--impls=plain,chunked', '--resume')
  assert [(r['label'], r.get('ms') == 12345.0) for r in rows] == [
      ('L=32 bidir peer/flax', False), ('L=32 bidir none/plain', True),
      ('L=32 bidir none/chunked', False)]
  assert rows[2]['status'] == 'ok' and rows[0]['ms'] == first[0]['ms']


def test_only_a_failed_run_asks_whether_the_device_is_lost(monkeypatch):
  asked = []

  def alive():
    asked.append(True)
    return False

  monkeypatch.setattr(measure, 'device_alive', alive)
  assert not measure.lost_device({'status': 'ok'})
  assert not measure.lost_device({'status': 'unsupported: no kernel'})
  assert not asked                      # a compile failure loses nothing
  assert measure.lost_device({'status': 'error at run: CUDA_ERROR_ILLEGAL'})
  assert measure.lost_device({'status': 'ok', 'rel_err_error': 'INTERNAL'})
  monkeypatch.setattr(measure, 'device_alive', lambda: True)
  assert not measure.lost_device({'status': 'OOM at run: out of memory'})


def test_device_alive_runs_a_computation(monkeypatch):
  assert measure.device_alive()

  def lost(*args, **kwargs):
    raise RuntimeError('CUDA_ERROR_ILLEGAL_ADDRESS')

  monkeypatch.setattr(measure.jnp, "arange", lost)
  assert not measure.device_alive()


def test_fallbacks_to_the_plain_path_are_timed_once_per_encoding(tmp_path):
  # xl is in no kernel: its pallas and pallas_hopper rows both run the plain
  # path, and the second repeats the first's numbers instead of a re-run.
  rows = _bench(tmp_path, '--encodings=xl', '--impls=pallas,pallas_hopper',
                '--peers=')
  first, second = rows
  assert first['path'].startswith('plain (fallback')
  assert second['path'].startswith('plain (fallback')
  assert first['status'] == second['status'] == 'ok'
  assert second['ms'] == first['ms'] and second['compile_s'] == first[
      'compile_s']


def test_the_context_peers_run_after_the_targets_rows():
  # A time budget stops new rows: the peers that are not a ratio's
  # denominator (tokamax's rows compile for up to half a minute) come
  # after the encodings' rows of their length and mask, so an early end
  # cuts them, not a target's row.
  script = (
      'import sys; sys.argv = ["bench_gpu"]\n'
      'from absl import flags\n'
      'from scripts import bench_gpu\n'
      'flags.FLAGS(sys.argv)\n'
      'plan = bench_gpu.row_plan([8192, 2048], [False], ["tokamax", "cudnn",'
      ' "cudnn+bias", "flax"], ["none", "t5"], ["pallas"])\n'
      'print(*(f"{l}:{e}:{i}" for l, c, e, i in plan))\n')
  out = subprocess.run([sys.executable, '-c', script], cwd=ROOT, check=True,
                       env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
                       capture_output=True, text=True).stdout.split()
  per_length = ['peer:cudnn', 'peer:flax', 'none:pallas', 't5:pallas',
                'peer:tokamax', 'peer:cudnn+bias']
  assert out == [f'{n}:{row}' for n in (8192, 2048) for row in per_length]

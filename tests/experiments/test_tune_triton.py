"""scripts/tune_triton.py's sweep: each kernel's launch is chosen with the
earlier kernels at their best, a failed launch is a row and never chosen,
and the summary names the fastest configuration in the form
pallas_attention takes. (Its --smoke run lowers each row for 'cuda' and
checks the launches reach the kernels; the lowering itself is
tests/nn/test_lowering.py's.)"""

import types

from scripts import tune_triton

# Made-up costs with a different best launch per kernel.
COST = {'forward': {(8, 3): 1.0}, 'dq': {(4, 1): 2.0, (8, 1): 2.5},
        'dkdv': {(8, 1): 3.0}}
WORSE = 5.0
N = len(tune_triton.LAUNCHES)


def _cost(pass_name, launch):
  return COST[pass_name].get(tuple(launch), WORSE)


class FakeTimer:
  q = types.SimpleNamespace(shape=(2, 16, 8192, 64))

  def __init__(self, fails=()):
    self.asked, self.fails = [], fails

  def ms(self, pass_name, blocks, launch):
    self.asked.append((pass_name, launch))
    if pass_name != 'forward' and tuple(launch.dq) in self.fails:
      raise RuntimeError('Triton: out of resources |\nshared memory')
    forward = _cost('forward', launch.forward)
    if pass_name == 'forward':
      return forward
    return forward + _cost('dq', launch.dq) + _cost('dkdv', launch.dkdv)


def _sweep(timer, base=None, out_of_time=lambda: False):
  rows = []

  def record(row):
    rows.append({'causal': False, 'pass': row.pop('pass_name'), **row})

  tune_triton.sweep(timer, (128, 64), tune_triton.LAUNCHES, flops=1e12,
                    base=base or {}, record=record, out_of_time=out_of_time)
  return rows


def test_the_sweep_chooses_each_kernel_with_the_earlier_ones_at_their_best():
  timer = FakeTimer()
  rows = _sweep(timer, base={'forward': 2.0, 'forward+backward': 4.0})
  # dK/dV's trial at its default launch is dQ's best row: reused, not rerun.
  assert len(rows) == len(timer.asked) == 3 * N - 1
  assert all(launch.forward == (8, 3) for _, launch in timer.asked[N:])
  assert all(launch.dq == (4, 1) for _, launch in timer.asked[2 * N:])
  best = min((r for r in rows if r['pass'] != 'forward'),
             key=lambda r: r['ms'])
  assert best['ms'] == 1.0 + 2.0 + 3.0
  assert best['x_cudnn'] == 1.5 and best['tflops'] == 3.5e12 / 6.0 / 1e9
  assert tune_triton.best_rows(rows) == [
      'causal=False: block_q=128, block_k=64, triton=TritonTuning('
      'forward=TritonLaunch(8, 3), dq=TritonLaunch(4, 1), '
      'dkdv=TritonLaunch(8, 1))  # 6.000 ms forward + backward']


def test_a_failed_launch_is_a_row_and_never_chosen():
  rows = _sweep(FakeTimer(fails={(4, 1)}))
  failed = [r for r in rows if r['status'] != 'ok']
  assert [r['dq'] for r in failed] == [(4, 1)]
  assert failed[0]['status'] == ('RuntimeError: Triton: out of resources '
                                 '\\| shared memory')
  assert 'dq=TritonLaunch(8, 1)' in tune_triton.best_rows(rows)[0]
  # The cuDNN rows and the failed one, one table line each.
  table = tune_triton.markdown({
      'kind': 'none', 'device': 'H200', 'jax': '0.11.2', 'batch': 2,
      'heads': 16, 'length': 8192, 'head_dim': 64,
      'rows': [{'causal': False, 'pass': 'forward', 'kernel': 'cudnn',
                'ms': 2.0}] + rows,
      'best': tune_triton.best_rows(rows)})
  lines = table.splitlines()
  assert '| False | cudnn | forward |  |' in lines[4]
  assert sum('out of resources' in line for line in lines) == 1
  assert len(lines) == 4 + 1 + len(rows) + 3 + 1


def test_a_time_limit_stops_the_sweep_between_rows():
  calls = iter(range(100))
  rows = _sweep(FakeTimer(), out_of_time=lambda: next(calls) >= 4)
  assert [(r['pass'], r['forward']) for r in rows] == [
      ('forward', launch) for launch in tune_triton.LAUNCHES[:4]]


def test_resume_reuses_the_earlier_rows_and_skips_the_failed_ones():
  """--resume (after a fault lost the device): the earlier rows' times are
  reused (the sweep makes the same choices without running them) and
  their failed configurations are not run again; a failure asks whether
  the device is lost (on_failure)."""
  import json
  first = _sweep(FakeTimer(fails={(4, 1)}))
  # As read back from the JSON: launches as lists.
  earlier = json.loads(json.dumps(first[:N + 3]))
  # The call's cuDNN rows come before them in result['rows'].
  earlier.insert(0, {'causal': False, 'pass': 'forward', 'kernel': 'cudnn',
                     'ms': 1.0})
  timer, rows, failures = FakeTimer(), [], []

  def record(row):
    rows.append({'causal': False, 'pass': row.pop('pass_name'), **row})

  tune_triton.sweep(timer, (128, 64), tune_triton.LAUNCHES, flops=1e12,
                    base={}, record=record, out_of_time=lambda: False,
                    earlier=earlier, on_failure=lambda: failures.append(1))
  # Only the rows after the earlier ones run, and not dq = (4, 1), which
  # failed before (this timer would not fail it).
  assert len(timer.asked) == len(first) - (N + 3)
  assert all(tuple(launch.dq) != (4, 1) for _, launch in timer.asked)
  assert [r['ms'] for r in rows] == [r['ms'] for r in first[N + 3:]]
  assert failures == []
  tune_triton.sweep(FakeTimer(fails={(4, 1)}), (128, 64),
                    tune_triton.LAUNCHES, flops=1e12, base={},
                    record=lambda row: None, out_of_time=lambda: False,
                    on_failure=lambda: failures.append(1))
  assert failures == [1]

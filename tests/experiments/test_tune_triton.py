"""scripts/tune_triton.py's sweep: each kernel's launch is chosen with the
earlier kernels at their best, and the summary names the fastest
configuration in the form pallas_attention takes. (Its --smoke run lowers
each row for 'cuda' and checks the launches reach the kernels; the lowering
itself is tests/nn/test_lowering.py's.)"""

import types

from scripts import tune_triton

# Made-up costs with a different best launch per kernel.
COST = {'forward': {(8, 3): 1.0}, 'dq': {(4, 1): 2.0}, 'dkdv': {(8, 1): 3.0}}
WORSE = 5.0


def _cost(pass_name, launch):
  return COST[pass_name].get(tuple(launch), WORSE)


class FakeTimer:
  q = types.SimpleNamespace(shape=(2, 16, 8192, 64))

  def __init__(self):
    self.asked = []

  def ms(self, pass_name, blocks, launch):
    self.asked.append((pass_name, launch))
    forward = _cost('forward', launch.forward)
    if pass_name == 'forward':
      return forward
    return forward + _cost('dq', launch.dq) + _cost('dkdv', launch.dkdv)


def test_the_sweep_chooses_each_kernel_with_the_earlier_ones_at_their_best():
  rows, timer = [], FakeTimer()

  def record(row):
    rows.append({'causal': False, 'pass': row.pop('pass_name'), **row})

  tune_triton.sweep(timer, (128, 64), tune_triton.LAUNCHES, flops=1e12,
                    base={'forward': 2.0, 'forward+backward': 4.0},
                    record=record, out_of_time=lambda: False)
  n = len(tune_triton.LAUNCHES)
  assert len(rows) == 3 * n
  # Every dQ trial runs the forward's best; every dK/dV trial both bests.
  assert all(launch.forward == (8, 3) for name, launch in timer.asked[n:])
  assert all(launch.dq == (4, 1) for name, launch in timer.asked[2 * n:])
  best = min(rows, key=lambda r: r['ms'] if r['pass'] != 'forward' else 99)
  assert best['ms'] == 1.0 + 2.0 + 3.0
  assert best['x_cudnn'] == 1.5 and best['tflops'] == 3.5e12 / 6.0 / 1e9
  assert tune_triton.best_rows(rows) == [
      'causal=False: block_q=128, block_k=64, triton=TritonTuning('
      'forward=TritonLaunch(8, 3), dq=TritonLaunch(4, 1), '
      'dkdv=TritonLaunch(8, 1))  # 6.000 ms forward + backward']


def test_a_time_limit_stops_the_sweep_between_rows():
  rows, calls = [], iter(range(100))
  tune_triton.sweep(FakeTimer(), (64, 64), tune_triton.LAUNCHES, 1e12, {},
                    lambda row: rows.append(row),
                    out_of_time=lambda: next(calls) >= 4)
  assert len(rows) == 4 and all(r['x_cudnn'] is None for r in rows)

"""scripts/tune_hopper.py's summary: the fastest row per (pass, causal) in
the form of hopper_attention.TUNED's rows (the backward's with the form
that won, fused_dq), failed rows never chosen, and the fused rows'
distance from the two kernels' gradients. (Its --smoke run interprets the
kernels: BENCHMARKS.md; the kernels' own checks are
tests/nn/test_hopper_attention.py's.)"""

import jax.numpy as jnp
import numpy as np

from scripts import tune_hopper


def _row(causal, pass_name, ms=None, **cells):
  row = {'causal': causal, 'kernel': 'hopper', 'block_k': 128, 'stages': 2,
         'ping_pong': True if pass_name == 'forward' else None,
         'pass': pass_name, **cells}
  if ms is not None:
    row['ms'] = ms
  return row


ROWS = [
    _row(False, 'forward', 2.0),
    _row(False, 'forward', 1.5, block_k=64, ping_pong=False),
    _row(False, 'backward', 5.0, fused_dq=False),
    _row(False, 'backward', 4.0, fused_dq=True, vs_two_kernels=3e-3),
    _row(False, 'backward', fused_dq=True, block_k=64,
         status='ValueError: no fit'),                    # never chosen
    _row(True, 'backward', 3.0, fused_dq=False),
    _row(True, 'backward', 3.5, fused_dq=True),
    {'causal': False, 'pass': 'forward', 'kernel': 'cudnn', 'ms': 0.5},
]


def test_best_rows_name_the_winning_shape_and_backward_form():
  assert tune_hopper.best_rows(ROWS) == [
      "('forward', False): dict(block_k=64, stages=2, ping_pong=False),"
      "  # 1.500 ms",
      "('backward', False): dict(block_k=128, stages=2, fused_dq=True),"
      "  # 4.000 ms",
      "('backward', True): dict(block_k=128, stages=2, fused_dq=False),"
      "  # 3.000 ms"]


def test_the_table_shows_the_form_and_its_distance_from_two_kernels():
  table = tune_hopper.markdown({
      'kind': 'none', 'device': 'H200', 'jax': '0.11.2', 'batch': 2,
      'heads': 16, 'length': 8192, 'head_dim': 64, 'rows': ROWS,
      'best': tune_hopper.best_rows(ROWS)})
  lines = table.splitlines()
  assert ('| False | backward | hopper | 128 | 2 |  | True | 4.000 |  |  '
          '| 3.0e-03 | ok |') in lines
  assert ('| False | backward | hopper | 64 | 2 |  | True |  |  |  |  '
          '| ValueError: no fit |') in lines


def test_largest_difference_is_relative_to_each_gradients_largest_entry():
  reference = (jnp.array([[1.0, -4.0]]), jnp.array([0.5, 0.25]), None)
  grads = (jnp.array([[1.0, -3.0]]), jnp.array([0.5, 0.5]), None)
  # dq: 1 / 4; dk: 0.25 / 0.5; the worst is dk's.
  np.testing.assert_allclose(
      tune_hopper.largest_difference(grads, reference), 0.5)
  assert tune_hopper.largest_difference(reference, reference) == 0.0


def test_resume_runs_only_the_grid_points_without_a_forward_row(tmp_path):
  """--resume (what gpu_session.sh runs after a fault lost the device)
  keeps the earlier rows and runs the rest of the grid: here the smoke
  grid's second point alone, interpreted."""
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(
      os.path.abspath(__file__))))
  earlier = [_row(False, 'forward', 123.0, block_k=64),
             _row(False, 'backward', 456.0, block_k=64, fused_dq=False),
             {'causal': False, 'pass': 'forward', 'kernel': 'cudnn',
              'ms': 0.5}]
  (tmp_path / 'tune_hopper.json').write_text(json.dumps({'rows': earlier}))
  subprocess.run([sys.executable, 'scripts/tune_hopper.py', '--smoke',
                  '--causal=false', '--resume', f'--out={tmp_path}'],
                 cwd=root, check=True, capture_output=True)
  rows = json.loads((tmp_path / 'tune_hopper.json').read_text())['rows']
  kept = [(r['pass'], r['ms']) for r in rows[:2]]
  assert kept == [('forward', 123.0), ('backward', 456.0)]
  # cuDNN's earlier row is dropped (measured again, none in smoke mode);
  # the new point is the smoke grid's other one, its forward alone (no
  # ping-pong: the backward was timed with the first).
  assert [(r['pass'], r['ping_pong'], r.get('status', 'ok'))
          for r in rows[2:]] == [('forward', False, 'ok')]

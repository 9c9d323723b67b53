"""Issue 47's targets in scripts/bench_gpu.py's summary: a ratio over cuDNN
from the same call, met or not, 'not measured' (never 'met') where the
call had no GPU, and 'unchecked' (never 'met') where the row's kernel was
not checked against the plain path in that call."""

import pytest

from scripts import gpu_targets

MINE = gpu_targets.KERNEL_ROW


def _row(impl, encoding, ms, mib, causal=False, length=8192, rel_err=2e-3):
  return {'impl': impl, 'encoding': encoding, 'length': length,
          'causal': causal, 'status': 'ok', 'ms': ms, 'compiled_mib': mib,
          'rel_err': rel_err}


def test_each_target_is_met_missed_or_not_measured():
  rows = [_row('cudnn', 'none', 4.0, 100.0),
          _row(MINE, 'none', 4.4, 120.0),          # 1.10x, 1.20x: met
          _row(MINE, 'shaw', 10.0, 200.0),         # 2.50x, 2.00x: missed
          _row(MINE, 'alibi', 4.0, 100.0, length=4096)]   # another L
  by = {e['encoding']: e for e in gpu_targets.targets(rows, 8192)}
  assert set(by) == set(gpu_targets.TIME_TARGETS)
  assert by['none']['measured'] == 1.1 and by['none']['met'] is True
  assert by['none']['memory'] == 1.2 and by['none']['memory_met'] is True
  assert by['shaw']['met'] is False and by['shaw']['memory_met'] is False
  assert by['alibi']['measured'] is None and by['alibi']['met'] is None
  table = gpu_targets.targets_table(list(by.values()))
  assert '| none | bidir | 8192 | 1.20 | 1.10 | yes | 1.50 | 1.20 | yes |' in table
  assert '| alibi | bidir | 8192 | 1.25 |  | not measured |' in table


def test_targets_read_the_rows_bench_gpu_writes():
  """bench_gpu.py names selfattn's rows 'selfattn:IMPL' (row_impl): a row
  named by the bare impl, as the first version of targets() expected, is
  not the kernel's row (that version matched no real row)."""
  assert gpu_targets.KERNEL_ROWS == ('selfattn:pallas_hopper',
                                     'selfattn:pallas_hopper_fused',
                                     'selfattn:pallas')
  rows = [_row('cudnn', 'none', 4.0, 100.0), _row('pallas', 'none', 4.4, 1.0)]
  by = {e['encoding']: e for e in gpu_targets.targets(rows, 8192)}
  assert by['none']['measured'] is None


def test_the_faster_of_selfattns_kernel_rows_counts():
  """'pallas' (Triton until the Hopper kernels are the default),
  'pallas_hopper' and 'pallas_hopper_fused' (its one-kernel backward): the
  target is selfattn's best kernel in that call."""
  rows = [_row('cudnn', 'alibi', 4.0, 100.0),
          _row('selfattn:pallas', 'alibi', 12.0, 100.0),
          _row('selfattn:pallas_hopper', 'alibi', 5.2, 100.0),
          _row('selfattn:pallas_hopper_fused', 'alibi', 4.8, 100.0)]
  rows[0]['encoding'] = 'none'
  by = {e['encoding']: e for e in gpu_targets.targets(rows, 8192)}
  assert by['alibi']['measured'] == pytest.approx(1.2) and by['alibi']['met']


def test_a_run_without_cudnn_meets_nothing():
  """A CPU run measures selfattn's kernel but has no cuDNN row."""
  rows = [_row(MINE, name, 1.0, 1.0) for name in gpu_targets.TIME_TARGETS]
  entries = gpu_targets.targets(rows, 8192)
  assert all(e['met'] is None and e['memory_met'] is None for e in entries)
  assert 'yes' not in gpu_targets.targets_table(entries)


def test_a_row_whose_check_failed_never_counts_and_an_unchecked_one_meets_nothing():
  """The fastest row counts only if its kernel computes attention: a fast
  row whose output check failed (at any length of that impl, encoding and
  mask, or kernel_probe's 'wrong') is left out; a row never checked is
  reported but 'unchecked', not met."""
  hopper, triton = 'selfattn:pallas_hopper', 'selfattn:pallas'
  rows = [_row('cudnn', 'none', 4.0, 100.0),
          _row(hopper, 'alibi', 4.4, 100.0, rel_err=None),   # fast, but ...
          _row(hopper, 'alibi', 1.0, 1.0, length=2048, rel_err=0.7),  # wrong
          _row(triton, 'alibi', 6.0, 100.0),                 # 1.5x: missed
          _row(hopper, 't5', 4.0, 100.0, rel_err=None),
          _row(triton, 't5', 5.0, 100.0, rel_err=None),
          _row(hopper, 'shaw', 4.0, 100.0, rel_err=None),
          _row(triton, 'shaw', 9.0, 100.0)]
  rows[-2]['probe'] = 'wrong (out 0.9)'
  by = {e['encoding']: e for e in gpu_targets.targets(rows, 8192)}
  assert by['alibi']['row'] == triton and by['alibi']['met'] is False
  assert by['alibi']['measured'] == 1.5 and by['alibi']['checked'] is True
  # Measured, but no check ran for either t5 row: reported, not met.
  assert by['t5']['measured'] == 1.0 and by['t5']['checked'] is None
  assert by['t5']['met'] is None and by['t5']['memory_met'] is None
  assert by['shaw']['row'] == triton and by['shaw']['met'] is False
  table = gpu_targets.targets_table(list(by.values()))
  assert '| t5 | bidir | 8192 | 1.50 | 1.00 | unchecked | 1.50 | 1.00 | unchecked |' in table
  rows[4]['probe'] = 'ok (out 3e-03)'
  by = {e['encoding']: e for e in gpu_targets.targets(rows, 8192)}
  assert by['t5']['met'] is True and by['t5']['checked'] is True

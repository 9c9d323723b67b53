"""scripts/triton_offline_facts.py: the Triton IR it hands the `triton`
package is the Pallas kernels' own (captured while lowering for 'cuda' on
this host), and its launches are checked. The compile itself needs the
triton package, which is not a dependency (BENCHMARKS.md shows a run)."""

import pytest
from absl import app

from scripts import triton_offline_facts as tof


def test_the_training_steps_three_kernels_are_captured():
  kernels = tof.capture_ttir('alibi', causal=False, shape=(1, 2, 256, 64),
                             block_k=64)
  assert [name for name, _ in kernels] == [
      'selfattn_flash_forward', 'selfattn_flash_dq', 'selfattn_flash_dkdv']
  for name, ir in kernels:
    assert f'tt.func public @{name}' in ir or f'tt.func @{name}' in ir
    assert 'tt.dot' in ir
  # The capture is undone: a second lowering captures afresh.
  again = tof.capture_ttir('none', causal=True, shape=(1, 1, 128, 64),
                           block_k=64)
  assert len(again) == 3


@pytest.mark.parametrize('values, launches', [
    (['4:2', '8:3'], [(4, 2), (8, 3)]), (['16:1'], [(16, 1)])])
def test_launches_are_read(values, launches):
  assert tof.parse_launches(values) == launches


@pytest.mark.parametrize('value', ['4', '3:2', '8:0', 'eight:2'])
def test_bad_launches_are_refused_by_flag(value):
  with pytest.raises(app.UsageError, match='--launches'):
    tof.parse_launches([value])

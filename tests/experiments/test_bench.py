"""The benchmark at its smoke level (--quick's sections at their smallest):
every key present, positive and finite. The extended tier (tiers.py): 80 s
of compiling, for a script whose numbers are measurements, not checks."""

import json
import math
import subprocess
import sys

import pytest

from runs import ROOT
from runs import smoke_env
from tiers import EXTENDED

KEYS = ['matmul_gflops', 'mha_speedup_vs_flax', 'mha_fraction_of_roofline',
        'shaw_time_ratio', 'shaw_memory_ratio', 'huang_memory_ratio',
        'train_steps_per_sec', 'train_tokens_per_sec', 'train_overhead_fraction',
        'compiled_steps_per_sec', 'bfloat16_speedup', 'peak_rss_mb',
        'chunked_memory_ratio', 'chunked_time_ratio', 'max_train_length',
        'scan_compile_ratio']


@EXTENDED
@pytest.mark.slow
def test_smoke_benchmark_writes_every_key(tmp_path):
  out = tmp_path / 'bench.json'
  result = subprocess.run(
      [sys.executable, 'scripts/bench.py', '--smoke', f'--json={out}'],
      cwd=ROOT, capture_output=True, text=True, timeout=600,
      env=smoke_env())
  assert result.returncode == 0, result.stderr[-3000:]
  assert '| length | batch | selfattn ms | flax ms |' in result.stdout
  data = json.loads(out.read_text())
  for key in KEYS:
    value = data[key]
    assert isinstance(value, float) and math.isfinite(value), (key, value)
    assert value > 0 or key == 'train_overhead_fraction', (key, value)
  assert 0 <= data['train_overhead_fraction'] < 1
  for name in ('shaw', 'huang', 'rope', 'alibi', 't5'):
    assert data['encoding_time_ratio'][name] > 0
  # At 1024 keys the (L, L) weights already dominate plain attention's
  # temporaries; the chunked path keeps one block of them.
  assert data['chunked_memory_ratio'] < 0.75
  assert set(data['compile_seconds']) == {'loop_1', 'scan_1'}
  assert all(s > 0 for s in data['compile_seconds'].values())
  # PoPE's q.k^T is over 2d features: more temporary memory than RoPE's,
  # and the extra forward FLOPs are 2 B H L^2 d (d = 32, L = 128, B = 8).
  pope = data['pope_over_rope']['128']
  assert pope['pope_memory_ratio'] > 1 and pope['pope_time_ratio'] > 0
  assert pope['extra_qk_gflop'] == pytest.approx(2 * 8 * 8 * 128 ** 2 * 32 / 1e9)


@pytest.mark.slow
def test_the_benchmark_imports_and_names_its_levels():
  """The commit tier's check of the script the smoke run above (extended
  tier) runs: it imports with the library as it is, and its help names the
  levels the docs quote."""
  result = subprocess.run(
      [sys.executable, 'scripts/bench.py', '--helpshort'], cwd=ROOT,
      capture_output=True, text=True, timeout=120, env=smoke_env())
  # absl's help exits with status 1 after printing; an import error is a
  # traceback.
  assert 'Traceback' not in result.stderr, result.stderr[-2000:]
  for flag in ('--[no]quick', '--[no]smoke', '--json'):
    assert flag in result.stdout, flag

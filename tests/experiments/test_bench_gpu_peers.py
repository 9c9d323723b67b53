"""scripts/bench_gpu.py's peers that need care to run at all.

JAX's Mosaic GPU attention (pallas_mgpu) refuses bfloat16 and does not
scale the logits: a bfloat16 run gives it float16 inputs, q scaled.
tokamax (scripts/tokamax_peer.py) is not a requirement: where it is
installed (the GPU call carries it) the smoke row runs its 'xla'
implementation and must match the float32 plain path, bias included; where
it is not, the row says so instead of stopping the run."""

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def _runs(code: str) -> bool:
  return subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                        capture_output=True).returncode == 0


TOKAMAX_LOADS = 'from scripts import tokamax_peer; tokamax_peer.load()'


def test_the_tokamax_rows_match_the_plain_path_or_say_it_is_missing(
    tmp_path):
  subprocess.run(
      [sys.executable, 'scripts/bench_gpu.py', '--smoke', '--lengths=32',
       '--encodings=none', '--impls=plain', '--peers=tokamax,tokamax+bias',
       f'--out={tmp_path}'],
      cwd=ROOT, env={**os.environ, 'JAX_PLATFORMS': 'cpu'}, check=True,
      capture_output=True)
  rows = json.loads((tmp_path / 'bench_gpu.json').read_text())['rows']
  peers = {r['impl']: r for r in rows if r['label'].startswith(
      'L=32 bidir peer/')}
  assert set(peers) == {'tokamax', 'tokamax+bias'}
  if _runs(TOKAMAX_LOADS):
    for r in peers.values():
      assert r['status'] == 'ok' and r['rel_err'] < 1e-5, r
    assert peers['tokamax+bias']['encoding'] == 'bias (1,H,L,L)'
  else:
    for r in peers.values():
      assert r['status'].startswith('unsupported: tokamax does not import'), r


def test_tokamax_s_xprof_import_is_met_by_a_stub_where_xprof_is_missing():
  script = ('from scripts import tokamax_peer\n'
            'tokamax_peer._stub_xprof()\n'
            'from xprof.cli.tools import get_kernel_stats_tool\n'
            'print(get_kernel_stats_tool is None)\n')
  out = subprocess.run([sys.executable, '-c', script], cwd=ROOT, check=True,
                       capture_output=True, text=True).stdout.strip()
  assert out == ('False' if _runs('import xprof.cli.tools') else 'True')


def test_jax_mosaic_gpu_attention_gets_float16_in_a_bfloat16_run():
  # peer_case only builds the row here (on a GPU it is then compiled): its
  # inputs must be float16, since attention_mgpu's buffers are, and q
  # scaled, since it applies no 1/sqrt(D).
  script = (
      'import sys; sys.argv = ["bench_gpu"]\n'
      'from absl import flags\n'
      'from scripts import bench_gpu\n'
      'flags.FLAGS(sys.argv)\n'
      'import jax.numpy as jnp\n'
      'x = bench_gpu.inputs(1, 2, 128, 64, jnp.bfloat16)\n'
      'case = bench_gpu.peer_case("pallas_mgpu", x, False, gpu=True)\n'
      'if isinstance(case, str): print(case); raise SystemExit\n'
      'print(case.path, *sorted({a.dtype.name for a in case.args}))\n'
      '# It does not scale the logits: q must come scaled by 1/sqrt(64).\n'
      'print(bool((case.args[0] == x["q_t"].astype(jnp.float16) / 8).all()),'
      ' bool((case.args[1] == x["k_t"].astype(jnp.float16)).all()))\n')
  out = subprocess.run([sys.executable, '-c', script], cwd=ROOT, check=True,
                       env={**os.environ, 'JAX_PLATFORMS': 'cpu'},
                       capture_output=True, text=True).stdout.strip()
  if out.startswith('unsupported'):   # a JAX without attention_mgpu
    pytest.skip(out)
  assert out.splitlines() == ['pallas mosaic-gpu (float16) float16',
                              'True True']


def test_tokamax_tuned_takes_the_nearest_matching_entry_of_its_h100_data():
  # tokamax_tuned runs the configs tokamax's H100 data chose at the shape
  # nearest bench_gpu's (2 x 8192 x 16 x 64): the same dtype, L, D, mask
  # and scale without bias, then batch x heads nearest in ratio, then the
  # forward called for a gradient (with residuals).
  from scripts.tokamax_peer import Entry, nearest
  scale = 1 / 8

  def entry(shape, config, dtype='bfloat16', same_kv=True, causal=False,
            other_mask=False, has_bias=False, s=scale, residuals=True):
    return Entry(shape, dtype, same_kv, causal, other_mask, has_bias, s,
                 residuals, config)

  length = 8192
  near = (2, length, 32, 64)
  entries = [
      entry((2, length, 16, 64), 'float16', dtype='float16'),
      entry((2, length, 16, 64), 'grouped kv', same_kv=False),
      entry((2, length, 16, 64), 'causal', causal=True),
      entry((2, length, 16, 64), 'window', other_mask=True),
      entry((2, length, 16, 64), 'bias', has_bias=True),
      entry((2, length, 16, 64), 'other scale', s=0.1),
      entry((2, 4096, 16, 64), 'other length'),
      entry((2, length, 16, 128), 'other width', s=128 ** -0.5),
      entry(near, 'near, no residuals', residuals=False),
      entry(near, 'near'),
      entry((16, length, 32, 64), 'far'),
  ]
  at = lambda shape, causal=False: getattr(
      nearest(entries, shape, 'bfloat16', causal), 'config', None)
  assert at((2, length, 16, 64)) == 'near'
  assert at((2, length, 16, 64), causal=True) == 'causal'
  assert at((32, length, 16, 64)) == 'far'   # 512 heads x batch: 1x, not 8x
  assert at((2, length, 16, 128)) == 'other width'
  assert at((2, 1024, 16, 64)) is None
  assert nearest(entries[-3:-2], (2, length, 16, 64), 'bfloat16',
                 False).config == 'near, no residuals'

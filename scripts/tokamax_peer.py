"""tokamax (Google's JAX kernel library) as a peer of scripts/bench_gpu.py:
its flash attention, forward and backward, which on a Hopper GPU runs its
Mosaic GPU sm90 kernels (tokamax/_src/ops/attention/
pallas_mosaic_gpu_kernel_sm90.py and the _vjp_ one).

tokamax is not in requirements.txt: it is a peer to measure against, not a
dependency, and it pulls in a profiler (xprof, a 22 MB wheel) that the
device call's 64 MiB cannot carry beside the repository. tokamax imports one
name of xprof at import time (benchmarking.py: `get_kernel_stats_tool`, for
its own xprof timing mode, which the peer never uses), so `load` stands a
stub in for that name where xprof is missing. scripts/gpu_session.sh's
`prepare` fetches tokamax and what it needs beyond the GPU image's packages
(TOKAMAX_WHEELS) into .whl/kernel, which the `kernel` step installs.

  python scripts/tokamax_peer.py [--shape=B,L,H,D]   # where tokamax is installed

prints what tokamax's own H100 data measured near a shape (h100_report).

Configs: tokamax looks its kernels' block shapes up in tuning data it ships
per card (data/autotuning/<device kind>/), and where it has none for the
card or the shape it takes a heuristic config and never autotunes unless
asked. 0.0.17 ships one Hopper card's, the H100 SXM's: on the lent H200,
and at bench_gpu's shape (H = 16, where its data has H = 32) on an H100
too, the plain `tokamax` row runs the heuristic config (forward block_q 64,
block_kv 128, 2 stages). `tuned_op` builds the op with the configs its H100
data chose at the nearest shape (the same dtype, L, D, mask, scale and no
bias; batch x heads nearest), for bench_gpu's `tokamax_tuned` row: the
peer as its authors measured it fastest, on the same architecture.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import types
from typing import Any, Callable, Iterable, NamedTuple

# The one sm90 card whose tuning data tokamax 0.0.17 ships.
H100_KIND = 'NVIDIA H100 80GB HBM3'


def _stub_xprof() -> None:
  """Make `from xprof.cli.tools import get_kernel_stats_tool` succeed with
  None where xprof is not installed."""
  try:
    import xprof.cli.tools  # noqa: F401
    return
  except ImportError:
    pass
  for name in ('xprof', 'xprof.cli'):
    sys.modules.setdefault(name, types.ModuleType(name))
  tools = types.ModuleType('xprof.cli.tools')
  tools.get_kernel_stats_tool = None  # type: ignore[attr-defined]
  sys.modules['xprof.cli.tools'] = tools


def load() -> Any:
  """The tokamax module; ImportError (naming what is missing) where it is
  not installed."""
  _stub_xprof()
  import tokamax
  return tokamax


def attention(tokamax: Any, implementation: Any,
              causal: bool) -> Callable[..., Any]:
  """forward(q, k, v[, bias]) -> (B, L, H, D): tokamax.dot_product_attention
  on (B, L, H, D) inputs, scale 1/sqrt(D), with an optional bias
  broadcastable to (B, H, L, L). implementation: a name ('mosaic', 'xla')
  or a configured op (tuned_op)."""
  if not isinstance(implementation, str):
    implementation = (implementation,)   # tokamax takes ops in a sequence

  def forward(q, k, v, bias=None):
    return tokamax.dot_product_attention(q, k, v, bias=bias, is_causal=causal,
                                         implementation=implementation)
  return forward


class Entry(NamedTuple):
  """One cached call of tokamax's tuning data: its q shape (B, L, H, D),
  what else decides whether it is our call, and its fastest config."""
  shape: tuple[int, ...]
  dtype: str
  same_kv: bool        # k and v shaped as q (no grouped heads)
  causal: bool         # a plain causal mask (offset 0, no window)
  other_mask: bool     # lengths, a boolean mask or a window
  has_bias: bool
  scale: float
  residuals: bool      # the forward as called under a gradient
  config: Any
  ms: float | None = None   # the config's median time as tokamax measured it


def nearest(entries: Iterable[Entry], shape: tuple[int, ...], dtype: str,
            causal: bool) -> Entry | None:
  """The entry for a call at `shape` (B, L, H, D) without bias, scale
  1/sqrt(D): the same dtype, L, D and mask, batch x heads nearest in ratio
  (the grid's size, not a block's work), one that returned residuals (as
  under a gradient) first; None where no entry matches."""
  b, length, h, d = shape
  scale = 1 / math.sqrt(d)
  fits = [e for e in entries
          if len(e.shape) == 4 and e.shape[1] == length and e.shape[3] == d
          and e.dtype == dtype and e.same_kv and e.causal == causal
          and not e.other_mask and not e.has_bias
          and math.isclose(e.scale, scale, rel_tol=1e-6)]
  if not fits:
    return None
  return min(fits, key=lambda e: (
      abs(math.log(e.shape[0] * e.shape[2] / (b * h))), not e.residuals))


def _entries(cache: dict) -> list[Entry]:
  """tokamax's parsed tuning data (op.get_autotuning_cache) as Entries."""
  out = []
  for key, data in cache.items():
    q, k, v, mask = key['q'], key['k'], key['v'], key['mask']
    window = mask.causal_mask is not None and (
        mask.causal_mask.offset != 0 or mask.causal_mask.window_size is not None)
    other = window or any(getattr(mask, n) is not None for n in (
        'bool_mask', 'q_start', 'q_end', 'k_start', 'k_end'))
    try:
      config = data.fastest_config
    except Exception:  # noqa: BLE001  (no valid benchmark in the entry)
      continue
    out.append(Entry(
        tuple(q.shape), str(q.dtype), k.shape == q.shape == v.shape,
        mask.causal_mask is not None, other, key['bias'] is not None,
        float(key['logits_scale']), bool(key.get('return_residuals')),
        config, statistics.median(data[config].evaluation_times_ms)))
  return out


def _h100_ops_and_entries() -> tuple[Any, list[list[Entry]]]:
  """tokamax's Mosaic GPU attention op (its backward op is .vjp) and the
  entries of its H100 tuning data, forward's then backward's."""
  _stub_xprof()
  from tokamax._src.ops.attention import pallas_mosaic_gpu
  base = pallas_mosaic_gpu.PallasMosaicGpuFlashAttention()
  return base, [_entries(op.get_autotuning_cache(H100_KIND))
                for op in (base, base.vjp)]


def tuned_op(shape: tuple[int, ...], dtype: str,
             causal: bool) -> tuple[Any, str] | str:
  """(op, what it runs) for tokamax's Mosaic GPU attention configured, forward
  and backward, as its H100 tuning data chose at the nearest shape
  (`nearest`); a string saying why not where the data has no such entry."""
  base, caches = _h100_ops_and_entries()
  found = []
  for op, entries in zip((base, base.vjp), caches):
    entry = nearest(entries, shape, dtype, causal)
    if entry is None:
      b, length, h, d = shape
      return (f'unsupported: tokamax\'s H100 tuning data has no '
              f'{type(op).__name__} entry at {dtype} L={length} D={d} '
              f'{"causal" if causal else "bidirectional"} without bias')
    found.append(entry)
  (fwd, bwd) = found
  op = base.replace(config=fwd.config,
                    vjp=base.vjp.replace(config=bwd.config))
  shapes = 'x'.join(map(str, fwd.shape))
  if bwd.shape != fwd.shape:
    shapes += ' / backward ' + 'x'.join(map(str, bwd.shape))
  return op, f'tokamax mosaic, H100-tuned at {shapes}'


def h100_report(shape: tuple[int, ...], dtype: str) -> list[str]:
  """What tokamax's H100 data measured at the entries nearest `shape`
  (B, L, H, D), as markdown: per mask, the forward's and the backward's
  config, median ms and TFLOP/s (forward 4BHL^2D, backward 2.5x that,
  halved causal), and their sum."""
  _, caches = _h100_ops_and_entries()
  lines = [f'tokamax {sys.modules["tokamax"].__version__}: its packaged '
           f'tuning data for {H100_KIND}, the entries nearest '
           f'{"x".join(map(str, shape))} {dtype}', '',
           '| mask | pass | measured at | config | ms | TFLOP/s |',
           '|---|---|---|---|---:|---:|']
  for causal in (False, True):
    mask = 'causal' if causal else 'bidir'
    total_ms = total_flop = 0.0
    for name, entries, work in (('forward', caches[0], 1.0),
                                ('backward', caches[1], 2.5)):
      e = nearest(entries, shape, dtype, causal)
      if e is None or e.ms is None:
        lines.append(f'| {mask} | {name} | no entry | | | |')
        total_ms = math.nan
        continue
      b, length, h, d = e.shape
      flop = work * 4 * b * h * length * length * d * (0.5 if causal else 1)
      total_ms += e.ms
      total_flop += flop
      lines.append(f'| {mask} | {name} | {"x".join(map(str, e.shape))} | '
                   f'{e.config} | {e.ms:.3f} | {flop / e.ms / 1e9:.0f} |')
    if total_ms == total_ms:   # not NaN
      lines.append(f'| {mask} | both | | | {total_ms:.3f} | '
                   f'{total_flop / total_ms / 1e9:.0f} |')
  return lines


def main() -> None:
  parser = argparse.ArgumentParser(description=h100_report.__doc__)
  parser.add_argument('--shape', default='2,8192,16,64',
                      help='B,L,H,D (default: bench_gpu.py\'s)')
  parser.add_argument('--dtype', default='bfloat16')
  args = parser.parse_args()
  load()
  shape = tuple(int(n) for n in args.shape.split(','))
  print('\n'.join(h100_report(shape, args.dtype)))


if __name__ == '__main__':
  main()


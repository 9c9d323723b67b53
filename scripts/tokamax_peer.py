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
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable


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


def attention(tokamax: Any, implementation: str,
              causal: bool) -> Callable[..., Any]:
  """forward(q, k, v[, bias]) -> (B, L, H, D): tokamax.dot_product_attention
  on (B, L, H, D) inputs, scale 1/sqrt(D), with an optional bias
  broadcastable to (B, H, L, L)."""
  def forward(q, k, v, bias=None):
    return tokamax.dot_product_attention(q, k, v, bias=bias, is_causal=causal,
                                         implementation=implementation)
  return forward

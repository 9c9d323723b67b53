"""XLA:CPU thread pools large enough for JAX's Mosaic GPU interpreter.

The interpreter runs each warpgroup of a kernel as a thread whose host
callbacks block at the kernel's barriers, and XLA:CPU runs some of those
callbacks on its own pools, one thread per core. When every pool thread
waits at a barrier that only a computation queued behind them can pass,
the kernel never finishes: `scripts/tune_hopper.py --smoke` hung that way
on one core (2 s of CPU in 4 minutes, 2026-11-29). XLA sizes the pools by
the CPU client's device count where that is larger, so a process that
interprets the Hopper kernels starts JAX with POOL_FLAG
(tests/support/interpreter.py does the same for the tests). Only the CPU
client gets the extra devices: a GPU's are untouched.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

POOL_THREADS = 8
POOL_FLAG = f'--xla_force_host_platform_device_count={POOL_THREADS}'


def with_pools(xla_flags: str | None) -> str:
  """`xla_flags` (XLA_FLAGS's value) with POOL_FLAG added after it (the
  last setting wins), unless it already asks for POOL_THREADS host
  devices or more."""
  flags = xla_flags or ''
  counts = re.findall(r'--xla_force_host_platform_device_count=(\d+)', flags)
  if counts and int(counts[-1]) >= POOL_THREADS:
    return flags
  return ' '.join(filter(None, [flags, POOL_FLAG]))


def smoke_requested(argv: Sequence[str]) -> bool:
  """Whether absl would read --smoke in `argv` as true (--smoke,
  --smoke=true/1; --nosmoke and --smoke=false are not)."""
  value = None
  for arg in argv[1:]:
    if arg in ('--smoke', '-smoke'):
      value = True
    elif arg in ('--nosmoke', '-nosmoke'):
      value = False
    elif arg.startswith(('--smoke=', '-smoke=')):
      value = arg.split('=', 1)[1].lower() in ('true', 't', '1')
  return bool(value)


def for_smoke_run(argv: Sequence[str]) -> None:
  """Before JAX is imported: the pools, if this run's --smoke interprets
  the kernels."""
  if smoke_requested(argv):
    os.environ['XLA_FLAGS'] = with_pools(os.environ.get('XLA_FLAGS'))

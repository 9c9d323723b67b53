"""Tests that run JAX's Mosaic GPU interpreter do so in a child process
whose XLA thread pools can hold every simulated warpgroup.

The interpreter runs each warpgroup of a kernel as a thread whose host
callbacks block at the kernel's barriers. XLA:CPU runs some of those
callbacks on its own thread pools, which have one thread per core (two on
CI). When every pool thread waits at a barrier that only a computation
queued behind them can pass, the kernel never finishes: the Hopper tests
hung a CI run that way, rarely on two cores and every time under
`taskset -c 0`. XLA sizes the pools by the CPU client's device count when
that is larger, so the child is started with
scripts/interpreter_pools.py's POOL_FLAG; the tests' own
process keeps its one device. With the pools that size the same tests pass
under `taskset -c 0`.

On a Hopper GPU the kernels are compiled, not interpreted, and
`in_interpreter_process` runs the test where it is.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import multiprocessing
import os
from concurrent import futures
from typing import Callable

from scripts import interpreter_pools

# One interpreted test takes 5-15 s on two cores; far past that is a hang.
TIMEOUT_SECONDS = 300
_executor: list[futures.ProcessPoolExecutor] = []


def _start() -> futures.ProcessPoolExecutor:
  if _executor:
    return _executor[0]
  before = os.environ.get('XLA_FLAGS')
  # The child copies this process's environment when it starts (the first
  # submit), before it imports JAX.
  os.environ['XLA_FLAGS'] = interpreter_pools.with_pools(before)
  try:
    executor = futures.ProcessPoolExecutor(
        max_workers=1, mp_context=multiprocessing.get_context('spawn'))
    executor.submit(os.getpid).result()
  finally:
    if before is None:
      del os.environ['XLA_FLAGS']
    else:
      os.environ['XLA_FLAGS'] = before
  _executor.append(executor)
  atexit.register(executor.shutdown, cancel_futures=True)
  return executor


def _stop() -> None:
  """Kill a child that stopped answering, so the next test gets a new one."""
  executor = _executor.pop()
  for process in list(getattr(executor, '_processes', {}).values()):
    process.kill()
  executor.shutdown(wait=False, cancel_futures=True)


def _run_in_child(path: str, name: str, kwargs: dict) -> None:
  """Import the test module from its file and run the undecorated test."""
  spec = importlib.util.spec_from_file_location(f'_child_{name}', path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  getattr(module, name).__wrapped__(**kwargs)


def in_interpreter_process(test: Callable) -> Callable:
  """Run `test` (its assertions too) in the child process when the kernels
  are interpreted; in this process on a Hopper host. Its arguments must be
  picklable (pytest parameters, not fixtures)."""
  import inspect
  path = inspect.getfile(test)

  @functools.wraps(test)
  def wrapper(**kwargs):
    from selfattn.nn import hopper_attention
    if hopper_attention.lowering_for_hopper():
      return test(**kwargs)
    future = _start().submit(_run_in_child, path, test.__name__, kwargs)
    try:
      return future.result(timeout=TIMEOUT_SECONDS)
    except futures.TimeoutError:
      _stop()
      raise AssertionError(
          f'{test.__name__} did not finish in {TIMEOUT_SECONDS} s in the '
          f'interpreter process (a deadlocked kernel?)') from None
    except futures.process.BrokenProcessPool:
      _stop()
      raise
  return wrapper

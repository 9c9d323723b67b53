"""Timing and memory helpers shared by the benchmark scripts."""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from flax import nnx


# The exit status of a timing script whose device was lost after a row
# failed: scripts/gpu_session.sh resumes it in a fresh process.
LOST_DEVICE = 75


def device_alive() -> bool:
  """Whether the device still runs a trivial computation: after a kernel
  faults (an illegal address, say) the process's CUDA context is lost and
  every later call of the process fails with it."""
  try:
    return float(jax.block_until_ready(jnp.arange(4.0).sum())) == 6.0
  except Exception:  # noqa: BLE001
    return False


def earlier_rows(path: str) -> list[dict]:
  """The rows of an earlier run's JSON (a timing script's output with
  `rows`), none if it is absent: what --resume continues."""
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return json.load(f)['rows']


def lost_device(row: dict) -> bool:
  """Whether a bench_gpu.py row (its status: 'ok', 'unsupported: ...',
  'error at run: ...', ...) failed at run time and the device is gone
  with it (device_alive checked only then: a failed compile loses
  nothing)."""
  failed = (row.get('status', '').startswith(('error', 'OOM at run'))
            or 'rel_err_error' in row)
  return failed and not device_alive()


def timed(fn, *args) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn(*args))
  return time.perf_counter() - start


def time_calls(fn, args, repeats: int, warmup: int = 1) -> list[float]:
  """Seconds of each of `repeats` calls fn(*args), each waited for, after
  `warmup` untimed ones (the first call may compile or autotune)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  return [timed(fn, *args) for _ in range(repeats)]


def compare_times(fns: dict, args: dict, repeats: int, warmup: int = 2) -> dict:
  """Median seconds per call of each function, measured in alternation."""
  for name, fn in fns.items():
    for _ in range(warmup):
      timed(fn, *args[name])
  samples = {name: [] for name in fns}
  for _ in range(repeats):
    for name, fn in fns.items():
      samples[name].append(timed(fn, *args[name]))
  return {name: statistics.median(s) for name, s in samples.items()}


def temp_bytes(jitted, *args) -> int:
  """XLA's temporary buffer size for the compiled function."""
  return jitted.lower(*args).compile().memory_analysis().temp_size_in_bytes


def grad_fn(module, call):
  """jit(grad) of mean(y^2) w.r.t. the module's parameters and the input."""
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)

  @jax.jit
  def step(params, x):
    def loss(params, x):
      y = call(nnx.merge(graphdef, params, rest, copy=True), x)
      return jnp.mean(jnp.square(y.astype(jnp.float32)))
    return jax.grad(loss, argnums=(0, 1))(params, x)

  return step, params


def matmul_gflops(n: int, repeats: int) -> float:
  """The machine's float32 rate for an (n, n) @ (n, n) matmul through JAX,
  GFLOP/s: the roofline the benchmarks divide by."""
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32)
  f = jax.jit(jnp.matmul)
  t = compare_times({'mm': f}, {'mm': (a, b)}, repeats)['mm']
  return 2 * n ** 3 / t / 1e9


def step_rates(train_step, state, batches, rounds: int) -> list[float]:
  """Steps per second of `train_step(state, batch) -> (state, metrics)`
  called back to back over pre-generated `batches`, one rate per round,
  after three warm-up steps (compilation)."""
  for b in batches[:3]:
    state, _ = train_step(state, b)
  rates = []
  for _ in range(rounds):
    start = time.perf_counter()
    for b in batches:
      state, metrics = train_step(state, b)
    jax.block_until_ready((state, metrics))
    rates.append(len(batches) / (time.perf_counter() - start))
  return rates

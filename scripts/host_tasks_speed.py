"""Batch generation of the host-sampled suite tasks: one callback per batch
against one per example, in the same run.

  python scripts/host_tasks_speed.py [--batch_size=128] [--max_len=40]

Prints milliseconds per training batch for each way and their ratio, and
checks that both give the same batch.
"""

from __future__ import annotations

import random
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app
from absl import flags

from measure import compare_times
from selfattn.tasks.synthetic import chomsky as chomsky_tasks
from selfattn import tasks

_BATCH = flags.DEFINE_integer('batch_size', 128, 'Examples per batch.')
_MAX_LEN = flags.DEFINE_integer('max_len', 40, 'Task lengths 1..max_len.')
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed batches per way.')
HOST_TASKS = ('binary_addition', 'binary_multiplication', 'compute_sqrt',
              'modular_arithmetic_brackets', 'solve_equation',
              'stack_manipulation')


def generator(task, method: str):
  """A jitted step -> batch whose host callbacks use `method` (it is read
  while tracing, so trace now)."""
  chomsky_tasks.HOST_VMAP_METHOD = method
  # make_batch is a jit of its own: without this, the second method would
  # reuse the trace made under the first (the method is not one of its
  # arguments).
  jax.clear_caches()
  fn = jax.jit(lambda step: tasks.make_batch(
      task, 0, step, jnp.arange(_BATCH.value), 1, _MAX_LEN.value))
  fn.lower(jnp.int32(0)).compile()
  jax.block_until_ready(fn(jnp.int32(0)))
  chomsky_tasks.HOST_VMAP_METHOD = 'expand_dims'
  return fn


def sampling_alone_ms(name: str) -> float:
  """The Python sampler by itself, one batch of examples (median of 5)."""
  fn = getattr(chomsky_tasks, '_' + name)
  rng = random.Random(0)
  times = []
  for _ in range(5):
    start = time.perf_counter()
    for _ in range(_BATCH.value):
      fn(rng, rng.randint(1, _MAX_LEN.value))
    times.append(time.perf_counter() - start)
  return 1e3 * statistics.median(times)


def main(argv):
  del argv
  print('| task | per example ms | per batch ms | speedup | sampling alone ms |\n'
        '|---|---:|---:|---:|---:|')
  for name in HOST_TASKS:
    task = tasks.get_task(name, layout='placeholders')
    fns = {m: generator(task, m) for m in ('sequential', 'expand_dims')}
    same = [np.array_equal(a, b) for a, b in zip(
        fns['sequential'](jnp.int32(1)), fns['expand_dims'](jnp.int32(1)))]
    assert all(same), f'{name}: the two ways gave different batches'
    args = {m: (jnp.int32(1),) for m in fns}
    t = compare_times(fns, args, _REPEATS.value, warmup=1)
    print(f'| {name} | {1e3 * t["sequential"]:.1f} | '
          f'{1e3 * t["expand_dims"]:.1f} | '
          f'{t["sequential"] / t["expand_dims"]:.1f} | '
          f'{sampling_alone_ms(name):.1f} |', flush=True)


if __name__ == '__main__':
  app.run(main)

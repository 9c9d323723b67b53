"""selfattn's own order-sensitive tasks (not from the reference suite).

`reverse` and `sort` compute what the suite's `reverse_string` and
`bucket_sort` compute, over a configurable alphabet (task.vocab_size, default
8) instead of the suite's fixed one; `shift`, `window_sum` and `precedes` have
no counterpart in the suite. All are aligned token tasks except `precedes`, a
classification.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec


def _aligned(fn):
  """A token task with output i computed from the whole input by fn(x, length,
  V, options) -> (outputs, output_mask)."""
  def make_sampler(V, options):
    def sample(key, length, max_length):
      x = jax.random.randint(key, (max_length,), 0, V, dtype=jnp.int32)
      outputs, mask = fn(x, length, V, options)
      return Example(x, length, outputs, length, mask)
    return sample
  return make_sampler


def _all(x):
  return jnp.ones(x.shape, bool)


@_aligned
def _reverse(x, length, V, options):
  i = jnp.arange(x.shape[0])
  return x[jnp.clip(length - 1 - i, 0, x.shape[0] - 1)], _all(x)


@_aligned
def _sort(x, length, V, options):
  valid = jnp.arange(x.shape[0]) < length
  return jnp.sort(jnp.where(valid, x, V)), _all(x)   # padding sorts last


@_aligned
def _shift(x, length, V, options):
  k = options['shift']
  i = jnp.arange(x.shape[0])
  return x[jnp.clip(i - k, 0, None)], i >= k


@_aligned
def _window_sum(x, length, V, options):
  w = options['window']
  valid = jnp.arange(x.shape[0]) < length
  padded = jnp.pad(jnp.where(valid, x, 0), (w, w))
  total = sum(padded[w + d: w + d + x.shape[0]] for d in range(-w, w + 1))
  return total % V, _all(x)


def _precedes(V, options):
  # Markers A = V and B = V + 1 at two distinct positions; label: A before B.
  def sample(key, length, max_length):
    key_x, key_extra = jax.random.split(key)
    x = jax.random.randint(key_x, (max_length,), 0, V, dtype=jnp.int32)
    key_a, key_b = jax.random.split(key_extra)
    pos_a = jax.random.randint(key_a, (), 0, length)
    pos_b = jax.random.randint(key_b, (), 0, length - 1)
    pos_b = pos_b + (pos_b >= pos_a)
    x = x.at[pos_a].set(V).at[pos_b].set(V + 1)
    label = (pos_a < pos_b).astype(jnp.int32)
    return Example(x, length, label[None], jnp.int32(1), jnp.ones((1,), bool))
  return sample


def _shift_problem(options: dict, max_len: int) -> str | None:
  shift = options['shift']
  if not 1 <= shift < max_len:
    return (f'config.task.shift={shift} must be between 1 and '
            f'config.task.max_len - 1 = {max_len - 1} (positions before the '
            f'shift count for nothing)')
  return None


def _window_problem(options: dict, max_len: int) -> str | None:
  del max_len
  if options['window'] < 0:
    return f'config.task.window must be >= 0; got {options["window"]}'
  return None


ORDER_TASKS: dict[str, TaskSpec] = {
    'reverse': TaskSpec(
        description='output i = input L-1-i', make_sampler=_reverse,
        level='selfattn', aligned=True),
    'sort': TaskSpec(
        description='the input sorted', make_sampler=_sort, level='selfattn',
        aligned=True),
    'shift': TaskSpec(
        description='output i = input i-k (task.shift = k)',
        make_sampler=_shift, level='selfattn', aligned=True,
        options_problem=_shift_problem, options=('shift',)),
    'window_sum': TaskSpec(
        description='output i = sum of inputs i-w..i+w mod V (task.window = w)',
        make_sampler=_window_sum, level='selfattn', aligned=True,
        options_problem=_window_problem, options=('window',)),
    'precedes': TaskSpec(
        description='whether marker A occurs before marker B',
        make_sampler=_precedes, level='selfattn', classification=True,
        input_symbols=lambda V: V + 2, num_classes=lambda V: 2,
        chance=lambda V: 0.5, min_length=2),
}

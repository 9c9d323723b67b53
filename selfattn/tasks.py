"""Synthetic order-sensitive tasks, generated deterministically on the fly.

Every example is a pure function of (seed, step, example index, length): batch
generation is a jitted JAX function, so a resumed run sees exactly the batches
it would have seen, and a batch is the same whether one device or many, one
process or many, generate it (each device computes only its own examples).

An example holds `inputs` (T,) int32, `targets` (T,) int32 and `weights` (T,)
float32, the positions that count. Token tasks predict at every counted
position; sequence-classification tasks put a CLS token at position 0 and
predict there only. "Length" is the number of input symbols; the sequence
length T is `task.seq_len(length)` (length + 1 with a CLS token, 2*length + 1
for missing_duplicate_string).

`chance` is the accuracy of always guessing the most likely class (1/V for
uniform symbols, 0.5 for balanced binary labels), as in the Chomsky-hierarchy
benchmark. A model without positions can beat it on token tasks whose target
is one of the inputs (reverse, sort, odds_first, shift): it can guess the
commonest symbol of the bag of inputs (about 0.35 on reverse with V=8, L=8).
`precedes` leaves it exactly at chance.

Token ids: data symbols 0..V-1, then PAD = V, then task specials (CLS, MASK,
markers) from V + 1.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp

_TRAIN_STREAM, _EVAL_STREAM = 0, 1   # training and evaluation never share a key


class Batch(NamedTuple):
  """A padded batch: inputs, targets (B, T) int32; weights (B, T) float32;
  valid_lens (B,) int32 (positions >= valid_len are padding)."""
  inputs: jax.Array
  targets: jax.Array
  weights: jax.Array
  valid_lens: jax.Array


@dataclasses.dataclass(frozen=True)
class Task:
  """One synthetic task.

  sample(key, length, T) -> (inputs, targets, weights) for one example with
  `length` symbols (a traced int) padded to static length T.
  """
  name: str
  description: str
  vocab_size: int               # V data symbols
  num_classes: int
  classification: bool          # one label per sequence, read at the CLS token
  order_sensitive: bool         # unsolvable without position information
  chance: float                 # accuracy of guessing the most likely class
  sample: Callable
  num_specials: int = 1         # PAD (+ task specials)
  min_length: int = 1
  length_factor: int = 1        # sequence length = factor * length (+1 for CLS)

  @property
  def pad(self) -> int:
    return self.vocab_size

  @property
  def input_vocab_size(self) -> int:
    return self.vocab_size + self.num_specials

  def seq_len(self, length: int) -> int:
    return self.length_factor * length + int(self.classification)


# --------------------------------------------------------------------------
# Task definitions. Each gets V and task options, returns a sampler.
# --------------------------------------------------------------------------

def _symbols(key, V, T, length):
  x = jax.random.randint(key, (T,), 0, V, dtype=jnp.int32)
  valid = jnp.arange(T) < length
  return jnp.where(valid, x, V), valid


def _aligned(fn):
  """A token task whose target i depends on x; weights = valid positions."""
  def sample(V, opts):
    def one(key, length, T):
      x, valid = _symbols(key, V, T, length)
      targets, weights = fn(x, valid, length, V, opts)
      return x, jnp.where(weights, targets, 0), weights.astype(jnp.float32)
    return one
  return sample


@_aligned
def _reverse(x, valid, length, V, opts):
  i = jnp.arange(x.shape[0])
  return x[jnp.clip(length - 1 - i, 0, x.shape[0] - 1)], valid


@_aligned
def _sort(x, valid, length, V, opts):
  return jnp.sort(x), valid        # PAD = V sorts after every symbol


@_aligned
def _shift(x, valid, length, V, opts):
  k = opts['shift']
  i = jnp.arange(x.shape[0])
  return x[jnp.clip(i - k, 0, None)], valid & (i >= k)


@_aligned
def _window_sum(x, valid, length, V, opts):
  w = opts['window']
  padded = jnp.pad(jnp.where(valid, x, 0), (w, w))
  total = sum(padded[w + d: w + d + x.shape[0]] for d in range(-w, w + 1))
  return total % V, valid


@_aligned
def _odds_first(x, valid, length, V, opts):
  i = jnp.arange(x.shape[0])
  half = (length + 1) // 2      # symbols at 1-based odd positions come first
  source = jnp.where(i < half, 2 * i, 2 * (i - half) + 1)
  return x[jnp.clip(source, 0, x.shape[0] - 1)], valid


def _classify(fn, specials=0):
  """A sequence task: CLS at position 0, label fn(...) read there."""
  def sample(V, opts):
    cls = V + 1

    def one(key, length, T):
      key_x, key_extra = jax.random.split(key)
      x, valid = _symbols(key_x, V, T - 1, length)
      x, label = fn(x, valid, length, V, key_extra)
      inputs = jnp.concatenate([jnp.array([cls], jnp.int32), x])
      targets = jnp.zeros((T,), jnp.int32).at[0].set(label)
      weights = jnp.zeros((T,), jnp.float32).at[0].set(1.0)
      return inputs, targets, weights
    return one
  return sample


def _parity(x, valid, length, V, key):
  return x, jnp.sum(valid & (x == 1)) % 2


def _even_pairs(x, valid, length, V, key):
  # #(01) + #(10) is even exactly when the first symbol equals the last.
  return x, (x[0] == x[jnp.maximum(length - 1, 0)]).astype(jnp.int32)


def _precedes(x, valid, length, V, key):
  # Markers A = V+2, B = V+3 at two distinct valid positions; label: A before B.
  key_a, key_b = jax.random.split(key)
  pos_a = jax.random.randint(key_a, (), 0, length)
  pos_b = jax.random.randint(key_b, (), 0, length - 1)
  pos_b = pos_b + (pos_b >= pos_a)
  x = x.at[pos_a].set(V + 2).at[pos_b].set(V + 3)
  return x, (pos_a < pos_b).astype(jnp.int32)


def _missing_duplicate(V, opts):
  cls, mask = V + 1, V + 2

  def one(key, length, T):
    key_x, key_m = jax.random.split(key)
    n_max = (T - 1) // 2
    s, _ = _symbols(key_x, V, n_max, length)
    i = jnp.arange(T - 1)
    # ss: position i < 2*length holds s[i mod length].
    doubled = jnp.where(i < 2 * length, s[jnp.where(i < length, i, i - length)
                                          .clip(0, n_max - 1)], V)
    hidden = jax.random.randint(key_m, (), 0, 2 * length)
    label = doubled[hidden]
    x = doubled.at[hidden].set(mask)
    inputs = jnp.concatenate([jnp.array([cls], jnp.int32), x])
    targets = jnp.zeros((T,), jnp.int32).at[0].set(label)
    weights = jnp.zeros((T,), jnp.float32).at[0].set(1.0)
    return inputs, targets, weights
  return one


@dataclasses.dataclass(frozen=True)
class _Spec:
  description: str
  sampler: Callable
  classification: bool
  order_sensitive: bool
  num_specials: int = 1
  num_classes: Callable[[int], int] = lambda V: V
  binary: bool = False
  min_length: int = 1
  length_factor: int = 1


TASKS: dict[str, _Spec] = {
    'reverse': _Spec('output i = input L-1-i', _reverse, False, True),
    'sort': _Spec('the input sorted (bucket sort)', _sort, False, True),
    'shift': _Spec('output i = input i-k (task.shift = k)', _shift, False, True),
    'window_sum': _Spec('output i = sum of inputs i-w..i+w mod V '
                        '(task.window = w)', _window_sum, False, True),
    'odds_first': _Spec('symbols at odd positions, then at even positions '
                        '(1-based)', _odds_first, False, True),
    'parity_check': _Spec('parity of the number of 1s', _classify(_parity),
                          True, False, num_specials=2,
                          num_classes=lambda V: 2, binary=True),
    'even_pairs': _Spec('whether #01 + #10 is even (first symbol == last)',
                        _classify(_even_pairs), True, True, num_specials=2,
                        num_classes=lambda V: 2, binary=True),
    'precedes': _Spec('whether marker A occurs before marker B',
                      _classify(_precedes), True, True, num_specials=4,
                      num_classes=lambda V: 2, min_length=2),
    'missing_duplicate_string': _Spec(
        'input ss with one symbol masked; output the masked symbol',
        # Not order-sensitive: the masked symbol is the one whose count is odd.
        _missing_duplicate, True, False, num_specials=3, length_factor=2),
}
ALIASES = {'reverse_string': 'reverse', 'bucket_sort': 'sort'}
TASK_NAMES: tuple[str, ...] = tuple(TASKS) + tuple(ALIASES)
DEFAULT_OPTIONS = {'shift': 1, 'window': 1}


def get_task(name: str, vocab_size: int, **options) -> Task:
  """Builds a task by name. Raises ValueError naming the valid tasks."""
  if name not in TASK_NAMES:
    raise ValueError(f'unknown task {name!r}; valid: {", ".join(TASK_NAMES)}')
  spec = TASKS[ALIASES.get(name, name)]
  if spec.binary and vocab_size != 2:
    raise ValueError(f'task {name!r} is over binary strings: task.vocab_size '
                     f'must be 2, got {vocab_size}')
  if vocab_size < 2:
    raise ValueError(f'task.vocab_size must be >= 2, got {vocab_size}')
  opts = {**DEFAULT_OPTIONS, **options}
  num_classes = spec.num_classes(vocab_size)
  if name == 'window_sum':
    chance = 1.0 / vocab_size
  elif spec.classification and num_classes == 2:
    chance = 0.5
  else:
    chance = 1.0 / num_classes
  return Task(name=name, description=spec.description, vocab_size=vocab_size,
              num_classes=num_classes, classification=spec.classification,
              order_sensitive=spec.order_sensitive, chance=chance,
              sample=spec.sampler(vocab_size, opts),
              num_specials=spec.num_specials, min_length=spec.min_length,
              length_factor=spec.length_factor)


# --------------------------------------------------------------------------
# Batches.
# --------------------------------------------------------------------------

def example_keys(seed: int, stream: int, position: jax.Array,
                 indices: jax.Array) -> jax.Array:
  """One key per example: key(seed) folded with stream, step (or eval length)
  and the global example index."""
  base = jax.random.fold_in(jax.random.key(seed), stream)
  base = jax.random.fold_in(base, position)
  return jax.vmap(lambda i: jax.random.fold_in(base, i))(indices)


def make_batch(task: Task, seed: int, step: jax.Array, indices: jax.Array,
               min_len: int, max_len: int) -> Batch:
  """Training batch for `step`: example lengths uniform in [min_len, max_len],
  padded to task.seq_len(max_len). `indices` (B,) are global example indices."""
  T = task.seq_len(max_len)
  keys = example_keys(seed, _TRAIN_STREAM, step, indices)

  def one(key):
    key_len, key_ex = jax.random.split(key)
    length = jax.random.randint(key_len, (), min_len, max_len + 1)
    inputs, targets, weights = task.sample(key_ex, length, T)
    return inputs, targets, weights, task.seq_len(length)

  return Batch(*jax.vmap(one)(keys))


def make_eval_batch(task: Task, seed: int, length: int,
                    indices: jax.Array) -> Batch:
  """Evaluation batch: every example has exactly `length` symbols, no padding.
  The same examples at every evaluation of a run."""
  T = task.seq_len(length)
  keys = example_keys(seed, _EVAL_STREAM, length, indices)
  inputs, targets, weights = jax.vmap(
      lambda k: task.sample(k, length, T))(keys)
  return Batch(inputs, targets, weights,
               jnp.full(indices.shape, T, jnp.int32))

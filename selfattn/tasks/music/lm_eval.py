"""Scoring a causal language model on whole sequences, and sampling from it.

Sequences are 1-D int arrays `seq` = [START] + tokens; target j is seq[j+1],
predicted from seq[:j+1]. Every function here takes `model(tokens (B, T)) ->
logits (B, T, C)` (models.LanguageModel, or any causal model) and scores or
draws the C classes.

Scoring sequences longer than the trained window (`score`): the strided
sliding window of jsb.window_plan, every target scored exactly once with at
least window - stride + 1 tokens of context; with a window at least as long
as a sequence it is one full pass (tested equal). `nll_by_position` scores
each sequence in one pass of up to `max_length` tokens, however long the
model was trained on, so NLL can be read per position beyond the window.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from selfattn.nn import decoding
from selfattn.tasks.music import jsb


def _nll_fn(model: nnx.Module) -> Callable:
  """A jitted (tokens (B, T), targets (B, T)) -> -log p(target) (B, T)."""
  graphdef, state = nnx.split(model)
  return lambda tokens, targets: np.asarray(
      _nll(graphdef, state, tokens, targets))


# Module-level, the model's structure static: the valid and test splits
# (same window and batch) and every model of one structure share one
# compiled program.
@functools.partial(jax.jit, static_argnums=0)
def _nll(graphdef: nnx.GraphDef, state: nnx.State, tokens: jax.Array,
         targets: jax.Array) -> jax.Array:
  logits = nnx.merge(graphdef, state)(tokens, deterministic=True)
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def _batched(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
             width: int, batch_size: int, nll: Callable):
  """(inputs, targets, weights) rows, each padded to `width` -> summed NLL
  and count over the weighted targets, and the per-row NLL arrays."""
  total, count, per_row = 0.0, 0.0, []
  for i in range(0, len(rows), batch_size):
    chunk = rows[i:i + batch_size]
    n = len(chunk)
    inputs = np.full((batch_size, width), jsb.PAD, np.int32)
    targets = np.zeros((batch_size, width), np.int32)
    weights = np.zeros((batch_size, width), np.float64)
    for b, (x, y, w) in enumerate(chunk):
      inputs[b, :len(x)], targets[b, :len(y)], weights[b, :len(w)] = x, y, w
    values = nll(jnp.asarray(inputs), jnp.asarray(targets)).astype(np.float64)
    total += float(np.sum(values * weights))
    count += float(np.sum(weights))
    per_row += [values[b] * weights[b] for b in range(n)]
  return total, count, per_row


def score(model: nnx.Module, sequences: Sequence[np.ndarray], window: int,
          stride: int | None = None, batch_size: int = 16
          ) -> tuple[float, int]:
  """(summed NLL in nats, number of targets) over every target of every
  sequence, scored with strided windows of at most `window` input tokens
  (stride: default window // 2, rounded down to a multiple of 4)."""
  stride = stride or max(4, window // 2 // 4 * 4)
  rows = []
  for seq in sequences:
    seq = np.asarray(seq, np.int32)
    for start, end, first in jsb.window_plan(len(seq) - 1, window, stride):
      w = np.zeros(end - start)
      w[first - start:] = 1.0
      rows.append((seq[start:end], seq[start + 1:end + 1], w))
  total, count, _ = _batched(rows, window, batch_size, _nll_fn(model))
  return total, int(count)


def nll_by_position(model: nnx.Module, sequences: Sequence[np.ndarray],
                    max_length: int, batch_size: int = 8
                    ) -> tuple[np.ndarray, np.ndarray]:
  """(summed NLL (max_length,), count (max_length,)): target j of every
  sequence scored in one pass over its first max_length input tokens."""
  rows = []
  for seq in sequences:
    seq = np.asarray(seq, np.int32)[:max_length + 1]
    rows.append((seq[:-1], seq[1:], np.ones(len(seq) - 1)))
  _, _, per_row = _batched(rows, max_length, batch_size, _nll_fn(model))
  totals, counts = np.zeros(max_length), np.zeros(max_length)
  for (x, _, _), values in zip(rows, per_row):
    totals[:len(x)] += values[:len(x)]
    counts[:len(x)] += 1
  return totals, counts


def sample(model: nnx.Module, prompt: jax.Array, num_steps: int,
           key: jax.Array, *, temperature: float = 1.0,
           top_k: int | None = None, use_cache: bool = True) -> jax.Array:
  """Continues prompt (B, P) by num_steps tokens: (B, P + num_steps).

  Step i draws with jax.random.fold_in(key, i) (decoding.draw: softmax of
  logits / temperature among the top_k; temperature 0 is argmax), so the
  cached path (decoding.generate: the prompt fills the key/value caches,
  then one token per step) and the uncached one (per step, a full pass over
  the sequence padded to its final length, read at the last token so far)
  draw the same tokens from the same logits. `model` is causal (a
  LanguageModel): the uncached path relies on it.
  """
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1; got {num_steps}')
  prompt = jnp.asarray(prompt, jnp.int32)
  if not use_cache:
    # One length for every step: the sequence is padded to its final length
    # and step i reads the logits at its last real position (a causal pass,
    # so the padding after it changes nothing there). One compiled program,
    # where a pass over each length would compile one per step.
    p = prompt.shape[1]
    seq = jnp.pad(prompt, ((0, 0), (0, num_steps)))
    for i in range(num_steps):
      logits = _logits_at(model, seq, jnp.int32(p + i - 1))
      token = decoding.draw(logits, jax.random.fold_in(key, i), temperature,
                            top_k)
      seq = seq.at[:, p + i].set(token)
    return seq
  method = 'greedy' if temperature == 0 else 'sample'
  return _generate(model, prompt, key, num_steps=num_steps, method=method,
                   temperature=temperature, top_k=top_k)


# Module-level, so a second call with the same model structure, shapes and
# settings reuses the compiled program.
@nnx.jit
def _logits_at(model: nnx.Module, seq: jax.Array, position: jax.Array
               ) -> jax.Array:
  """(B, V) logits at `position` of a causal full pass over seq (B, T)."""
  logits = model(seq, deterministic=True)
  return jax.lax.dynamic_index_in_dim(logits, position, axis=1,
                                      keepdims=False)


@functools.partial(nnx.jit, static_argnames=('num_steps', 'method',
                                             'temperature', 'top_k'))
def _generate(model: nnx.Module, prompt: jax.Array, key: jax.Array, *,
              num_steps: int, method: str, temperature: float,
              top_k: int | None) -> jax.Array:
  return decoding.generate(model, prompt, num_steps, method=method, key=key,
                           temperature=temperature, top_k=top_k).tokens

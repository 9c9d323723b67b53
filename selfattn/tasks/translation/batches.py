"""Translation's training batches: a pure function of (seed, step), drawn
in JAX like every other task's.

The step's bucket is drawn first, with probability proportional to its
pairs over its batch size (so every pair is about equally likely to be seen
per step), then each example draws one pair of that bucket uniformly. The
bucket sets the batch's static shape; the training step runs one compiled
program that switches between the buckets (`lax.switch`,
translation_steps.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.tasks import registry as tasks
from selfattn.tasks.translation import data as translation_data

_BUCKET_STREAM = 3       # beside registry.py's train/eval/positions streams


def token_budget(batch_tokens: int, batch_size: int, longest: int) -> int:
  """Padded tokens a training batch holds: batch_tokens, or (0) batch_size
  sentences of the longest bucket (`longest` tokens)."""
  return batch_tokens or batch_size * longest


def batch_sizes(bounds: tuple[int, ...], budget: int, devices: int
                ) -> tuple[int, ...]:
  """Each bucket's batch size: about `budget` tokens at its padded length
  (bounds[b]), a multiple of `devices`, at least one sentence on each."""
  return tuple(max(devices, budget // bound // devices * devices)
               for bound in bounds)


class TrainingBatches:
  """The training pairs as device arrays, and the batches of each bucket.

  sizes[b] is bucket b's batch size: about `token_budget` tokens at its
  padded length, a multiple of `devices`.
  """

  def __init__(self, corpus, token_budget: int, devices: int = 1):
    self.bounds = tuple(b.bound for b in corpus.buckets)
    self.sizes = batch_sizes(self.bounds, token_budget, devices)
    self._tables = [
        (jnp.asarray(b.sources), jnp.asarray(b.source_lens),
         jnp.asarray(translation_data.decoder_inputs(b.targets)),
         jnp.asarray(b.targets), jnp.asarray(b.target_lens))
        for b in corpus.buckets]
    counts = np.array([len(b) for b in corpus.buckets], np.float64)
    self.probabilities = counts / np.array(self.sizes) / np.sum(
        counts / np.array(self.sizes))
    self._log_p = jnp.asarray(np.log(self.probabilities), jnp.float32)

  def bucket(self, seed: jax.Array, step: jax.Array) -> jax.Array:
    """() int32: the bucket of `step` (the same on every device)."""
    key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed),
                                                _BUCKET_STREAM), step)
    return jax.random.categorical(key, self._log_p).astype(jnp.int32)

  def batch(self, b: int, seed: jax.Array, step: jax.Array,
            indices: jax.Array):
    """Bucket b's batch of `step` for global example `indices` (B_b,)."""
    sources, source_lens, dec_in, targets, target_lens = self._tables[b]
    keys = tasks.example_keys(seed, tasks.TRAIN_STREAM, step, indices)
    pair = jax.vmap(lambda k: jax.random.randint(k, (), 0, len(source_lens)))(
        keys)
    bound = self.bounds[b]
    weights = (jnp.arange(bound)[None] < target_lens[pair][:, None])
    return tasks.Batch(inputs=sources[pair], targets=targets[pair],
                       weights=weights.astype(jnp.float32),
                       valid_lens=source_lens[pair],
                       decoder_inputs=dec_in[pair])

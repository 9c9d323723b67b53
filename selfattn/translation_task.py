"""Translation as a task of the training system: Multi30k German-English.

The task `multi30k` (layout encoder_decoder) trains an encoder-decoder on
the training pairs, as translation_data.py tokenizes and buckets them. Its
`task.vocab_size` is the SentencePiece vocabulary (joint, unigram, trained on
the training split only), its `task.max_len` the longest source (in tokens)
a training pair may have: pairs with longer sources are left out (the
length-generalization protocol sets it low; 64 keeps all of them, the
longest is 55).

A training batch is a pure function of (seed, step), drawn in JAX like every
other task's: the step's bucket is drawn first, with probability
proportional to its pairs over its batch size (so every pair is about
equally likely to be seen per step), then each example draws one pair of
that bucket uniformly. The bucket sets the batch's static shape; the
training step runs one compiled program that switches between the buckets
(`lax.switch`, translation_steps.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.task_spec import TaskSpec

_BUCKET_STREAM = 3       # beside tasks.py's train/eval/positions streams


def _make_sampler(V: int, options: dict):
  del options
  # Trains (or reads from its cache) the tokenizer now, so missing data or
  # an impossible vocabulary is reported by config validation.
  from selfattn import translation_data
  translation_data.tokenizer_for(V)

  def sample(key, length, max_length):
    raise NotImplementedError(
        'translation batches come from selfattn.translation_task.'
        'TrainingBatches (pairs of two sequences), not from per-example '
        'samples')
  return sample


TRANSLATION_TASKS: dict[str, TaskSpec] = {
    'multi30k': TaskSpec(
        description='German to English image descriptions (Multi30k task 1), '
                    'SentencePiece tokens',
        make_sampler=_make_sampler, level='translation', seq2seq=True,
        default_vocab=8000, min_length=1),
}


class TrainingBatches:
  """The training pairs as device arrays, and the batches of each bucket.

  sizes[b] is bucket b's batch size: about `token_budget` tokens at its
  padded length, a multiple of `devices`.
  """

  def __init__(self, corpus, token_budget: int, devices: int = 1):
    from selfattn import translation_data
    self.bounds = tuple(b.bound for b in corpus.buckets)
    self.sizes = tuple(max(devices, token_budget // b.bound // devices * devices)
                       for b in corpus.buckets)
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
    from selfattn import tasks
    sources, source_lens, dec_in, targets, target_lens = self._tables[b]
    keys = tasks.example_keys(seed, tasks._TRAIN_STREAM, step, indices)
    pair = jax.vmap(lambda k: jax.random.randint(k, (), 0, len(source_lens)))(
        keys)
    bound = self.bounds[b]
    weights = (jnp.arange(bound)[None] < target_lens[pair][:, None])
    return tasks.Batch(inputs=sources[pair], targets=targets[pair],
                       weights=weights.astype(jnp.float32),
                       valid_lens=source_lens[pair],
                       decoder_inputs=dec_in[pair])

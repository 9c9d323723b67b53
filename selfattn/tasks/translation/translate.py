"""Translating with a trained Seq2SeqModel: greedy or beam search through
the decoder's key/value caches (decoding.generate), batched and jittable,
and the host loop that turns a list of sources into target ids
(TranslationTrainer.translate_texts detokenizes them)."""

from __future__ import annotations

from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.nn import decoding
from selfattn.tasks.translation import data as translation_data
from selfattn.tasks.translation.data import BOS, EOS, PAD


def max_steps(source_width: int, limit: int) -> int:
  """Target tokens allowed for sources padded to `source_width`: twice the
  width plus 10, at most `limit` (the decoder's positions). With the joint
  8000 vocabulary this admits every Multi30k reference, in either
  direction, even with its source padded alone, but one: test_2017_mscoco's
  line 7, whose English reference is in capitals (46 tokens for 12
  German ones; limit 42). A decoder that loops stops here."""
  return max(1, min(2 * source_width + 10, limit))


def translate(model, sources: jax.Array, source_lens: jax.Array,
              num_steps: int, *, method: str = 'greedy', beam_size: int = 4,
              alpha: float = 0.6) -> jax.Array:
  """sources (B, S) int, source_lens (B,) -> (B, num_steps) target ids
  (EOS, then PAD, once a sentence ends). `model` is a Seq2SeqModel; its
  decoder's caches are replaced. Beam search uses GNMT's length penalty
  with exponent `alpha`."""
  enc = model.encode(sources, source_lens, deterministic=True)
  prompt = jnp.full((sources.shape[0], 1), BOS, jnp.int32)
  out = decoding.generate(model.decoder, prompt, num_steps, method=method,
                          beam_size=beam_size, alpha=alpha, eos=EOS, pad=PAD,
                          call_args=(enc, source_lens))
  return out.tokens[:, 1:]


def translate_all(run_chunk: Callable[[np.ndarray, np.ndarray, int], np.ndarray],
                  source_ids: Sequence[Sequence[int]], *, token_budget: int,
                  limit: int, multiple: int = 1) -> list[list[int]]:
  """Target ids (without EOS) for every source, in the input's order.

  run_chunk(sources (n, S), source_lens (n,), num_steps) -> (n, num_steps)
  ids: a jitted `translate` for one chunk. Sources are chunked by length
  (translation_data.eval_chunks), so a chunk is padded to about its own
  longest sentence."""
  out: list[list[int] | None] = [None] * len(source_ids)
  for indices, sources, lens, _ in translation_data.eval_chunks(
      list(source_ids), None, token_budget, multiple):
    ids = np.asarray(run_chunk(sources, lens,
                               max_steps(sources.shape[1], limit)))
    for row, i in zip(ids, indices):
      if i >= 0:
        row = row.tolist()
        out[i] = row[:row.index(EOS)] if EOS in row else row
  return out

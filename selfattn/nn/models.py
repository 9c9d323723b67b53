"""The trained models: TransformerEncoder plus a linear head over classes,
(language-model tasks) a causal TransformerDecoder, or (translation) an
encoder-decoder. Built from a config by selfattn.training.build."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.encoder import TransformerEncoder
from selfattn.nn.masks import check_flag
from selfattn.nn.masks import check_size


class SequenceModel(nnx.Module):
  """tokens (B, T) int32, valid_lens (B,) -> logits (B, T, num_classes) float32.

  Logits at every position; the task's weights say which ones count (every
  input position of an in-place token task, the CLS token of an in-place
  classification, the placeholders of the placeholders layout, the separator
  and outputs of the autoregressive layout, where attention is causal). `positions`
  (B, T): randomized positions, or None. A causal model also runs one step
  at a time: `model.stack.init_cache(B, T)`, then calls with decode=True
  (no valid_lens) on the next tokens (free_running.py uses it).
  """

  def __init__(self, encoder: TransformerEncoder, num_classes: int, *,
               causal: bool = False, rngs: nnx.Rngs):
    self.encoder = encoder
    self.causal = check_flag(causal, 'causal')
    num_classes = check_size(num_classes, 'num_classes')
    self.head = nnx.Linear(encoder.num_hiddens, num_classes,
                           dtype=encoder.dtype, rngs=rngs)

  @property
  def stack(self) -> TransformerEncoder:
    return self.encoder

  def __call__(self, tokens: jax.Array, valid_lens: jax.Array | None = None, *,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False) -> jax.Array:
    hidden = self.encoder(tokens, valid_lens, causal=self.causal,
                          positions=positions, deterministic=deterministic,
                          decode=decode)
    return self.head(hidden).astype(jnp.float32)


class LanguageModel(nnx.Module):
  """A causal TransformerDecoder over the task's input tokens, read out over
  its classes: tokens (B, T) -> logits (B, T, num_classes) float32, the
  prediction of the next token at every position.

  Right padding needs no mask: under causal attention a padded key comes
  after every valid query. `decode=True` runs one step against the key/value
  caches (`decoder.init_cache`), for sampling (lm_eval.sample).
  """

  def __init__(self, decoder: TransformerDecoder, num_classes: int):
    self.decoder = decoder
    self.num_classes = check_size(num_classes, 'num_classes')

  causal = True

  @property
  def stack(self) -> TransformerDecoder:
    return self.decoder

  def __call__(self, tokens: jax.Array, valid_lens: jax.Array | None = None, *,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False) -> jax.Array:
    del valid_lens
    logits = self.decoder(tokens, positions=positions,
                          deterministic=deterministic, decode=decode)
    return logits[..., :self.num_classes]


class Seq2SeqModel(nnx.Module):
  """An encoder and a decoder with cross-attention (translation).

  Call: (sources (B, S) int, source_lens (B,), *, decoder_inputs (B, T)
  int) -> logits (B, T, vocab) float32, the next target token at every
  decoder position. Both stacks carry the configured encoding in their
  self-attention; cross-attention carries none (Shaw et al. 2018).
  `encode` and the decoder alone serve decoding (translate.py):
  decoder(tokens, enc_outputs, source_lens, decode=True) after
  decoder.init_cache.

  tie_embeddings: one token table for the encoder's input, the decoder's
  input and the decoder's output (a joint vocabulary makes this possible).
  """

  def __init__(self, encoder: TransformerEncoder, decoder: TransformerDecoder,
               *, tie_embeddings: bool = False):
    self.encoder = encoder
    self.decoder = decoder
    self.tie_embeddings = tie_embeddings
    if tie_embeddings:
      decoder.embedding = encoder.embedding       # one shared nnx.Embed

  causal = False

  @property
  def stack(self) -> TransformerEncoder:
    """The encoder: what the attention probe and position table read."""
    return self.encoder

  def encode(self, sources: jax.Array, source_lens: jax.Array, *,
             deterministic: bool | None = None) -> jax.Array:
    """(B, S) -> (B, S, num_hiddens)."""
    return self.encoder(sources, source_lens, deterministic=deterministic)

  def __call__(self, tokens: jax.Array, valid_lens: jax.Array | None = None, *,
               decoder_inputs: jax.Array,
               positions: jax.Array | None = None,
               deterministic: bool | None = None) -> jax.Array:
    if positions is not None:
      raise ValueError('randomized positions are not supported for '
                       'translation')
    enc = self.encode(tokens, valid_lens, deterministic=deterministic)
    return self.decoder(decoder_inputs, enc, valid_lens,
                        deterministic=deterministic)

"""Transformer encoder: the chapter's blocks, with layer-norm placement and
skip connections as switches (exercise 1 studies what they do)."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.attention import MultiHeadAttention
from selfattn.attention import combine_masks
from selfattn.positions import NoEncoding, get_position

NORMS = ('post', 'pre', 'none')


class PositionWiseFFN(nnx.Module):
  """d2l's position-wise FFN: dense2(relu(dense1(X))). (B, L, F) -> (B, L, out)."""

  def __init__(self, num_inputs: int, ffn_num_hiddens: int, ffn_num_outputs: int,
               *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.dense1 = nnx.Linear(num_inputs, ffn_num_hiddens, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)
    self.dense2 = nnx.Linear(ffn_num_hiddens, ffn_num_outputs, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)

  def __call__(self, X: jax.Array) -> jax.Array:
    return self.dense2(jax.nn.relu(self.dense1(X)))


class AddNorm(nnx.Module):
  """d2l's AddNorm, generalised: wraps a sublayer f with skip and LayerNorm.

    norm='post' (the chapter): LayerNorm(X + Dropout(f(X)))
    norm='pre':                X + Dropout(f(LayerNorm(X)))
    norm='none':               X + Dropout(f(X))
  residual=False drops the `X +`. Call as `addnorm(X, f, deterministic=...)`.
  """

  def __init__(self, num_hiddens: int, dropout: float, *, norm: str = 'post',
               residual: bool = True, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if norm not in NORMS:
      raise ValueError(f'norm={norm!r}; valid: {", ".join(NORMS)}')
    self.norm = norm
    self.residual = residual
    self.ln = (nnx.LayerNorm(num_hiddens, dtype=dtype, param_dtype=param_dtype,
                             rngs=rngs) if norm != 'none' else None)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, X: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
               *, deterministic: bool = True) -> jax.Array:
    Y = sublayer(self.ln(X) if self.norm == 'pre' else X)
    Y = self.dropout(Y, deterministic=deterministic)
    if self.residual:
      Y = X + Y
    return self.ln(Y) if self.norm == 'post' else Y


class TransformerEncoderBlock(nnx.Module):
  """Self-attention then position-wise FFN, each wrapped in AddNorm.

  X: (B, L, num_hiddens) -> (B, L, num_hiddens). `relative` is this layer's own
  relative-position module (or None).
  """

  def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
               dropout: float, *, norm: str = 'post', residual: bool = True,
               relative=None, use_bias: bool = False, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.attention = MultiHeadAttention(
        num_hiddens, num_heads, dropout, use_bias=use_bias, relative=relative,
        dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, num_hiddens,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    addnorm = dict(norm=norm, residual=residual, dtype=dtype,
                   param_dtype=param_dtype, rngs=rngs)
    self.addnorm1 = AddNorm(num_hiddens, dropout, **addnorm)
    self.addnorm2 = AddNorm(num_hiddens, dropout, **addnorm)

  def __call__(self, X: jax.Array, mask: jax.Array | None = None, *,
               positions: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    X = self.addnorm1(
        X, lambda Z: self.attention(Z, Z, Z, mask=mask, positions=positions,
                                    deterministic=deterministic),
        deterministic=deterministic)
    return self.addnorm2(X, self.ffn, deterministic=deterministic)


class TransformerEncoder(nnx.Module):
  """The chapter's encoder with any positional encoding.

  Call as `enc(tokens, valid_lens=None, *, mask=None, deterministic=True)`:
  tokens (B, L) int, valid_lens (B,), or mask (B, L) bool (True = real token;
  use it for left padding), positions (B, L) int: the positions every encoding
  sees (randomized positional encodings; None: 0..L-1). Returns
  (B, L, num_hiddens).

  Embedding * sqrt(num_hiddens), then the absolute encoding (with dropout),
  then `num_layers` blocks. Relative encodings get one module per layer. With
  norm='pre' a final LayerNorm closes the stack. Per-layer attention weights
  (B, H, L, L) are in `enc.blks[i].attention.attention_weights[...]` after a
  call (or `nnx.pop(enc, nnx.Intermediate)`; see `attention_weights`).
  `position_options` go to the encoding (e.g. clip_distance=8 for shaw).
  """

  def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int,
               num_heads: int, num_layers: int, dropout: float = 0.0, *,
               position: str = 'sinusoidal', max_len: int = 1024,
               norm: str = 'post', residual: bool = True,
               use_bias: bool = False, dtype=None, param_dtype=jnp.float32,
               rngs: nnx.Rngs, **position_options):
    if norm not in NORMS:
      raise ValueError(f'norm={norm!r}; valid: {", ".join(NORMS)}')
    if num_hiddens % num_heads:
      raise ValueError(f'num_hiddens={num_hiddens} is not divisible by '
                       f'num_heads={num_heads}')
    kind, options = get_position(position, position_options)
    self.num_hiddens = num_hiddens
    self.position = position
    self.dtype = dtype
    self.embedding = nnx.Embed(vocab_size, num_hiddens, dtype=dtype,
                               param_dtype=param_dtype, rngs=rngs)
    if kind.relative:
      # Relative encodings add nothing to the embeddings: dropout only.
      self.pos_encoding = NoEncoding(num_hiddens, dropout, rngs=rngs)
    else:
      self.pos_encoding = kind.build(num_hiddens=num_hiddens, dropout=dropout,
                                     max_len=max_len, param_dtype=param_dtype,
                                     rngs=rngs, **options)

    def relative():
      if not kind.relative:
        return None
      return kind.build(num_heads=num_heads, head_dim=num_hiddens // num_heads,
                        max_len=max_len, param_dtype=param_dtype, rngs=rngs,
                        **options)

    self.blks = nnx.List([
        TransformerEncoderBlock(
            num_hiddens, ffn_num_hiddens, num_heads, dropout, norm=norm,
            residual=residual, relative=relative(), use_bias=use_bias,
            dtype=dtype, param_dtype=param_dtype, rngs=rngs)
        for _ in range(num_layers)
    ])
    self.final_ln = (nnx.LayerNorm(num_hiddens, dtype=dtype,
                                   param_dtype=param_dtype, rngs=rngs)
                     if norm == 'pre' else None)

  def __call__(self, tokens: jax.Array, valid_lens: jax.Array | None = None, *,
               mask: jax.Array | None = None,
               positions: jax.Array | None = None, deterministic: bool = True,
               return_hidden: bool = False):
    length = tokens.shape[1]
    key_mask = combine_masks(valid_lens, mask, length, length)
    if key_mask is not None:
      key_mask = key_mask[:, 0]       # (B, L): one key mask for every query
    X = self.embedding(tokens) * math.sqrt(self.num_hiddens)
    if positions is None:
      X = self.pos_encoding(X, deterministic=deterministic)
    else:
      X = self.pos_encoding(X, positions=positions, deterministic=deterministic)
    hidden = [X]
    for blk in self.blks:
      X = blk(X, key_mask, positions=positions, deterministic=deterministic)
      hidden.append(X)
    if self.final_ln is not None:
      X = self.final_ln(X)
    return (X, hidden) if return_hidden else X

  def attention_weights(self) -> list[jax.Array]:
    """Per-layer (B, H, L, L) attention weights of the latest call."""
    return [blk.attention.attention_weights[...] for blk in self.blks]


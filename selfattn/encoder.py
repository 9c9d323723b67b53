"""Transformer encoder: the chapter's blocks, with layer-norm placement and
skip connections as switches (exercise 1 studies what they do)."""

from __future__ import annotations

import math
from typing import Callable, Literal, overload

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn import masks
from selfattn.attention import MultiHeadAttention
from selfattn.attention import capturing
from selfattn.layers import dropout_layer
from selfattn.positions import HuangRelative, NoEncoding, POSITIONS, get_position

NORMS = ('post', 'pre', 'none')


class PositionWiseFFN(nnx.Module):
  """d2l's position-wise FFN: dense2(relu(dense1(X))). (B, L, F) -> (B, L, out).

  Args: num_inputs F, ffn_num_hiddens (the inner width), ffn_num_outputs,
  dtype / param_dtype, rngs (a 'params' stream).
  """

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

  Args: num_hiddens (the LayerNorm width), dropout rate, norm, residual,
  dtype / param_dtype, rngs ('params', and 'dropout' when dropout > 0).
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
    self.dropout = dropout_layer(dropout, rngs)

  def __call__(self, X: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
               *, deterministic: bool | None = None) -> jax.Array:
    Y = sublayer(self.ln(X) if self.norm == 'pre' else X)
    Y = self.dropout(Y, deterministic=deterministic)
    if self.residual:
      Y = X + Y
    return self.ln(Y) if self.norm == 'post' else Y


class TransformerEncoderBlock(nnx.Module):
  """Self-attention then position-wise FFN, each wrapped in AddNorm.

  X: (B, L, num_hiddens) -> (B, L, num_hiddens). Call as `blk(X, mask=None, *,
  bias=None, causal=False, positions=None, deterministic=None, decode=False)`
  with mask / bias / causal as in masks.py.

  Args: num_hiddens, ffn_num_hiddens, num_heads, dropout; norm ('post', 'pre',
  'none'), residual; relative: this layer's own relative-position module (or
  None); use_bias in the attention projections; attention_impl ('plain',
  'fused', 'chunked' or 'auto', see MultiHeadAttention); dtype / param_dtype; rngs.
  """

  def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
               dropout: float, *, norm: str = 'post', residual: bool = True,
               relative=None, use_bias: bool = False,
               attention_impl: str = 'plain', dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.attention = MultiHeadAttention(
        num_hiddens, num_heads, dropout, use_bias=use_bias, relative=relative,
        attention_impl=attention_impl, dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, num_hiddens,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    addnorm = dict(norm=norm, residual=residual, dtype=dtype,
                   param_dtype=param_dtype, rngs=rngs)
    self.addnorm1 = AddNorm(num_hiddens, dropout, **addnorm)
    self.addnorm2 = AddNorm(num_hiddens, dropout, **addnorm)

  def __call__(self, X: jax.Array, mask: jax.Array | None = None, *,
               bias: jax.Array | None = None, causal: bool = False,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False) -> jax.Array:
    X = self.addnorm1(
        X, lambda Z: self.attention(Z, mask=mask, bias=bias, causal=causal,
                                    positions=positions,
                                    deterministic=deterministic,
                                    decode=decode),
        deterministic=deterministic)
    return self.addnorm2(X, self.ffn, deterministic=deterministic)


def check_position_options(owner: str, position: str,
                           options: dict) -> None:
  """A keyword that is no encoding's option is a typo: TypeError naming it, as
  Python does. (An option of another encoding is get_position's ValueError.)"""
  known = {name for kind in POSITIONS.values() for name in kind.options}
  unknown = sorted(set(options) - known)
  if unknown:
    raise TypeError(f'{owner}() got an unexpected keyword argument '
                    f'{unknown[0]!r} (position={position!r}; encoding options '
                    f'are passed as keywords: {", ".join(sorted(known))})')


def check_stack(owner: str, position: str, position_options: dict, *,
                norm: str, num_hiddens: int, num_heads: int, num_layers: int):
  """The checks every stack's constructor makes; returns (kind, options)."""
  check_position_options(owner, position, position_options)
  if norm not in NORMS:
    raise ValueError(f'norm={norm!r}; valid: {", ".join(NORMS)}')
  if num_heads < 1 or num_hiddens < 1 or num_layers < 0:
    raise ValueError(f'num_hiddens={num_hiddens}, num_heads={num_heads} '
                     f'must be positive, num_layers={num_layers} >= 0')
  if num_hiddens % num_heads:
    raise ValueError(f'num_hiddens={num_hiddens} is not divisible by '
                     f'num_heads={num_heads}')
  return get_position(position, position_options)


def check_tokens(tokens: jax.Array, name: str = 'tokens') -> None:
  """ValueError naming `name` unless tokens are (B, L) int ids or (B, L, F)
  float features (a rank-1 array would fail later with an IndexError)."""
  shape = jnp.shape(tokens)
  integer = jnp.issubdtype(jnp.result_type(tokens), jnp.integer)
  if len(shape) != (2 if integer else 3):
    want = '(B, L) int token ids' if integer else '(B, L, num_hiddens) features'
    raise ValueError(f'{name} must be {want}; got shape {tuple(shape)} (a '
                     f'single sequence needs a batch axis: {name}[None])')


class EmbeddingMixin:
  """Tokens or features to the first layer's input, with the absolute
  encoding; shared by TransformerEncoder and TransformerDecoder (the modules
  keep `embedding` and `pos_encoding` as their own attributes, so parameter
  paths, and checkpoints, stay those of the chapter's encoder).

  tokens (B, L) int -> Embed * sqrt(num_hiddens); features (B, L, num_hiddens)
  float pass as they are (the caller embedded them). Then the absolute
  encoding at `positions` (None: 0..L-1) and dropout; relative encodings add
  nothing here (dropout only). vocab_size=None: features only.
  """

  def _init_embedding(self, vocab_size: int | None, num_hiddens: int,
                      dropout: float, *, kind, options: dict, max_len: int,
                      dtype, param_dtype, rngs: nnx.Rngs) -> None:
    self.num_hiddens = num_hiddens
    self.embedding = (None if vocab_size is None else
                      nnx.Embed(vocab_size, num_hiddens, dtype=dtype,
                                param_dtype=param_dtype, rngs=rngs))
    if kind.relative:
      self.pos_encoding = NoEncoding(num_hiddens, dropout, rngs=rngs)
    else:
      self.pos_encoding = kind.build(num_hiddens=num_hiddens, dropout=dropout,
                                     max_len=max_len, param_dtype=param_dtype,
                                     rngs=rngs, **options)

  def embed(self, inputs: jax.Array, *, positions: jax.Array | None = None,
            deterministic: bool | None = None) -> jax.Array:
    """(B, L) tokens or (B, L, num_hiddens) features -> (B, L, num_hiddens)."""
    if jnp.issubdtype(inputs.dtype, jnp.integer):
      if self.embedding is None:
        raise ValueError('this module was built with vocab_size=None: pass '
                         '(B, L, num_hiddens) float features, not token ids')
      X = self.embedding(inputs) * math.sqrt(self.num_hiddens)
    else:
      if inputs.ndim != 3 or inputs.shape[-1] != self.num_hiddens:
        raise ValueError(f'features must be (B, L, num_hiddens='
                         f'{self.num_hiddens}); got shape {inputs.shape}')
      X = inputs
    if positions is None:
      return self.pos_encoding(X, deterministic=deterministic)
    return self.pos_encoding(X, positions=positions,
                             deterministic=deterministic)


def relative_layers(kind, options: dict, num_layers: int, *, num_heads: int,
                    head_dim: int, max_len: int, causal: bool, param_dtype,
                    rngs: nnx.Rngs) -> list:
  """One relative-position module per layer (None for absolute encodings)."""
  if not kind.relative:
    return [None] * num_layers
  layers = [kind.build(num_heads=num_heads, head_dim=head_dim, max_len=max_len,
                       param_dtype=param_dtype, rngs=rngs, **options)
            for _ in range(num_layers)]
  for layer in layers:
    if isinstance(layer, HuangRelative):
      layer.causal = causal       # the Music Transformer's causal skew
  return layers


def build_blocks(make_block: Callable[[object, nnx.Rngs], nnx.Module],
                 num_layers: int, *, scan_layers: bool, kind, options: dict,
                 num_heads: int, head_dim: int, max_len: int, causal: bool,
                 param_dtype, rngs: nnx.Rngs) -> nnx.Module:
  """num_layers blocks, each make_block(relative, rngs) with its own relative
  module (None for absolute encodings).

  Without scan_layers: an nnx.List, every relative module drawn before the
  blocks (the order, hence the initial values, of every earlier run). With
  it: one block whose variables carry a leading layer axis, for nnx.scan (one
  compiled block instead of num_layers); each layer still has its own values
  of everything.
  """
  def relatives(count, rngs):
    return relative_layers(kind, options, count, num_heads=num_heads,
                           head_dim=head_dim, max_len=max_len, causal=causal,
                           param_dtype=param_dtype, rngs=rngs)

  if scan_layers:
    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
      return make_block(relatives(1, rngs)[0], rngs)
    return stacked(rngs)
  return nnx.List([make_block(relative, rngs)
                   for relative in relatives(num_layers, rngs)])


class TransformerEncoder(EmbeddingMixin, nnx.Module):
  """The chapter's encoder with any positional encoding.

  Calls: see `__call__`.

  Embedding * sqrt(num_hiddens), then the absolute encoding (with dropout),
  then `num_layers` blocks. Relative encodings get one module per layer. With
  norm='pre' a final LayerNorm closes the stack. Attention weights on request:
  `attention_weights(enc, inputs, ...)`, or nnx.capture(enc, nnx.Intermediate).

  Args:
    vocab_size: token vocabulary, or None for a features-only encoder.
    num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout: as in d2l.
    position: one of positions.POSITION_NAMES.
    max_len: table size of the learned / relative tables.
    norm: 'post' (the chapter), 'pre' or 'none'; residual: skip connections.
    causal: a causal encoder: calls are causal by default (key j attends to
      query i iff j <= i), and Huang's relative modules use the causal skew.
      A call's `causal=True` makes any encoder's call causal; `causal=False`
      on an encoder built causal raises ValueError (its Huang skew is wrong
      above the diagonal).
    use_bias: biases in the attention projections.
    attention_impl: 'plain', 'fused' (jax.nn.dot_product_attention; cuDNN's
      kernel on a GPU where attention.fused_implementation allows),
      'chunked' (memory O(L), every encoding) or 'auto' (chunked for long
      sequences); see MultiHeadAttention.
    remat: rematerialise each block in the backward pass (nnx.remat): less
      activation memory, one more forward per block. Off while capturing
      attention weights.
    scan_layers: stack the blocks' parameters on a leading layer axis and run
      them with nnx.scan (compile time independent of depth). `blks` is then
      one stacked block, not a list: per-layer attention weights are not
      captured.
    dtype, param_dtype: computation and parameter dtypes.
    rngs: a 'params' stream, and 'dropout' when dropout > 0.
    **position_options: the encoding's options (e.g. clip_distance=8 for
      shaw); a keyword that is no encoding's option raises TypeError.
  """

  def __init__(self, vocab_size: int | None, num_hiddens: int,
               ffn_num_hiddens: int, num_heads: int, num_layers: int,
               dropout: float = 0.0, *, position: str = 'sinusoidal',
               max_len: int = 1024, norm: str = 'post', residual: bool = True,
               causal: bool = False, use_bias: bool = False,
               attention_impl: str = 'plain', remat: bool = False,
               scan_layers: bool = False, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs, **position_options):
    kind, options = check_stack(
        type(self).__name__, position, position_options, norm=norm,
        num_hiddens=num_hiddens, num_heads=num_heads, num_layers=num_layers)
    self.num_heads = num_heads
    self.position = position
    self.causal = causal
    self.dtype = dtype
    self.remat = remat
    self.scan_layers = scan_layers
    self._init_embedding(vocab_size, num_hiddens, dropout, kind=kind,
                         options=options, max_len=max_len, dtype=dtype,
                         param_dtype=param_dtype, rngs=rngs)

    def block(relative, rngs):
      return TransformerEncoderBlock(
          num_hiddens, ffn_num_hiddens, num_heads, dropout, norm=norm,
          residual=residual, relative=relative, use_bias=use_bias,
          attention_impl=attention_impl, dtype=dtype, param_dtype=param_dtype,
          rngs=rngs)

    self.blks = build_blocks(
        block, num_layers, scan_layers=scan_layers, kind=kind,
        options=options, num_heads=num_heads,
        head_dim=num_hiddens // num_heads, max_len=max_len, causal=causal,
        param_dtype=param_dtype, rngs=rngs)
    self.final_ln = (nnx.LayerNorm(num_hiddens, dtype=dtype,
                                   param_dtype=param_dtype, rngs=rngs)
                     if norm == 'pre' else None)

  @overload
  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = ...,
               *, mask: jax.Array | None = ..., bias: jax.Array | None = ...,
               causal: bool | None = ..., positions: jax.Array | None = ...,
               deterministic: bool | None = ...,
               return_hidden: Literal[False] = ...) -> jax.Array:
    ...

  @overload
  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = ...,
               *, mask: jax.Array | None = ..., bias: jax.Array | None = ...,
               causal: bool | None = ..., positions: jax.Array | None = ...,
               deterministic: bool | None = ...,
               return_hidden: Literal[True]
               ) -> tuple[jax.Array, list[jax.Array]]:
    ...

  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = None,
               *, mask: jax.Array | None = None,
               bias: jax.Array | None = None, causal: bool | None = None,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               return_hidden: bool = False
               ) -> jax.Array | tuple[jax.Array, list[jax.Array]]:
    """Encodes a batch.

    Args:
      inputs: tokens (B, L) int in [0, vocab_size), or features (B, L,
        num_hiddens) float (already embedded: they skip the embedding, not
        the absolute encoding). Token ids are not range-checked (a
        data-dependent check cannot run under jit): as with nnx.Embed, an id
        outside the range gives NaN or another row. selfattn's own batches
        are in range (tests/test_tasks.py); check yours upstream.
      valid_lens: (B,) or (B, L) (one length per query), or None.
      mask: boolean, four axes broadcastable to (B, H, L, L)
        (`masks.make_padding_mask(valid)` for left padding); see masks.py.
      bias: float, broadcastable like mask, added to the logits.
      causal: None (the default) takes the constructor's `causal`. Causality
        reaches the attention as a flag, so the chunked path never builds an
        (L, L) mask.
      positions: (B, L) int, the positions every encoding sees (randomized
        positional encodings; None: 0..L-1).
      deterministic: None follows model.train() / model.eval() (modules
        start in eval mode).
      return_hidden: also return the list of per-layer inputs.

    Returns:
      (B, L, num_hiddens); with return_hidden=True the pair (that, the list
      of per-layer inputs).
    """
    check_tokens(inputs, 'inputs')
    if causal is None:
      causal = self.causal
    elif self.causal and not causal:
      raise ValueError('causal=False on an encoder built with causal=True: '
                       'build it with causal=False for bidirectional calls')
    causal = bool(causal)
    length = inputs.shape[1]
    target = (inputs.shape[0], self.num_heads, length, length)
    # causal stays a flag (not an (L, L) mask) down to the attention, so the
    # chunked path builds it per block.
    attn_mask = masks.attention_mask(target, valid_lens=valid_lens, mask=mask)
    X = self.embed(inputs, positions=positions, deterministic=deterministic)
    hidden = [X]

    def run(blk, X, attn_mask, bias, positions):
      return blk(X, attn_mask, bias=bias, causal=causal, positions=positions,
                 deterministic=deterministic)

    if self.remat and not capturing(self):
      # Recompute each block's activations in the backward pass instead of
      # storing them (memory for compute); outputs and gradients are equal.
      run = nnx.remat(run)
    if self.scan_layers:
      def step(blk, X, attn_mask, bias, positions):
        X = run(blk, X, attn_mask, bias, positions)
        return X, X
      scanned = nnx.scan(step, in_axes=(0, nnx.Carry, None, None, None),
                         out_axes=(nnx.Carry, 0))
      X, per_layer = scanned(self.blks, X, attn_mask, bias, positions)
      hidden += list(per_layer)
    else:
      for blk in self.blks:
        X = run(blk, X, attn_mask, bias, positions)
        hidden.append(X)
    if self.final_ln is not None:
      X = self.final_ln(X)
    return (X, hidden) if return_hidden else X


def attention_weights(model: nnx.Module, *args, **kwargs
                      ) -> tuple[object, list[jax.Array]]:
  """Calls model(*args, **kwargs) and returns (its output, every attention
  layer's (B, H, Lq, Lk) weights in module order), via nnx.capture: nothing is
  left on the model."""
  out, inter = nnx.capture(model, nnx.Intermediate)(*args, **kwargs)
  found = [(path, value) for path, value in nnx.to_flat_state(inter)
           if path[-1] == 'attention_weights']
  return out, [value[...] if hasattr(value, 'get_value') else value
               for _, value in found]

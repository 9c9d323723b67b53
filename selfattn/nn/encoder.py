"""Transformer encoder: the chapter's blocks, with layer-norm placement and
skip connections as switches (exercise 1 studies what they do)."""

from __future__ import annotations

from typing import Literal, overload

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn import masks
from selfattn.nn.attention import MultiHeadAttention
from selfattn.nn.attention import poison
# Re-exported: their home is layers.py, shared with the decoder.
from selfattn.nn.layers import AddNorm  # noqa: F401
from selfattn.nn.layers import PositionWiseFFN
from selfattn.nn.stack import CacheMixin
from selfattn.nn.stack import EmbeddingMixin
from selfattn.nn.stack import check_stack
from selfattn.nn.stack import check_tokens
from selfattn.nn.stack import run_blocks


class TransformerEncoderBlock(nnx.Module):
  """Self-attention then position-wise FFN, each wrapped in AddNorm.

  X: (B, L, num_hiddens) -> (B, L, num_hiddens). Call as `blk(X, mask=None, *,
  valid_lens=None, bias=None, causal=False, positions=None,
  deterministic=None, decode=False)` with mask / valid_lens / bias / causal
  as in masks.py.

  Args: num_hiddens, ffn_num_hiddens, num_heads, dropout; norm ('post', 'pre',
  'none'), residual, norm_type ('layernorm', 'rmsnorm'); relative: this
  layer's own relative-position module (or None); use_bias in the attention
  projections; attention_impl ('plain', 'fused', 'chunked', 'auto' or
  'pallas', see MultiHeadAttention); dtype / param_dtype; rngs.
  """

  def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
               dropout: float = 0.0, *, norm: str = 'post',
               residual: bool = True, norm_type: str = 'layernorm',
               relative=None,
               use_bias: bool = False,
               attention_impl: str = 'plain', dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.attention = MultiHeadAttention(
        num_hiddens, num_heads, dropout, use_bias=use_bias, relative=relative,
        attention_impl=attention_impl, dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, num_hiddens,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    addnorm = dict(norm=norm, residual=residual, norm_type=norm_type,
                   dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.addnorm1 = AddNorm(num_hiddens, dropout, **addnorm)
    self.addnorm2 = AddNorm(num_hiddens, dropout, **addnorm)

  def __call__(self, X: jax.Array, mask: jax.Array | None = None, *,
               valid_lens: jax.Array | None = None,
               bias: jax.Array | None = None, causal: bool = False,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False,
               cache_start: jax.Array | None = None) -> jax.Array:
    """X (B, L, num_hiddens) -> (B, L, num_hiddens). mask (boolean, four
    axes broadcastable to (B, H, L, L)) is the second positional argument;
    lengths go in valid_lens= ((B,) or (B, L)), as the encoder's
    `enc(tokens, valid_lens)` takes them second."""
    X = self.addnorm1(
        X, lambda Z: self.attention(Z, valid_lens=valid_lens, mask=mask,
                                    bias=bias, causal=causal,
                                    positions=positions,
                                    deterministic=deterministic,
                                    decode=decode, cache_start=cache_start),
        deterministic=deterministic)
    # A function, not the module: nnx.tabulate cannot describe a module
    # given as an argument.
    return self.addnorm2(X, lambda Z: self.ffn(Z),
                         deterministic=deterministic)


class TransformerEncoder(EmbeddingMixin, CacheMixin, nnx.Module):
  """The chapter's encoder with any positional encoding.

  Calls: see `__call__`.

  Embedding * sqrt(num_hiddens), then the absolute encoding (with dropout),
  then `num_layers` blocks. Relative encodings get one module per layer. With
  norm='pre' a final norm closes the stack. Attention weights on request:
  `attention_weights(enc, inputs, ...)`, or nnx.capture(enc, nnx.Intermediate).

  Args:
    vocab_size: token vocabulary, or None for a features-only encoder.
    num_hiddens, ffn_num_hiddens, num_heads, num_layers, dropout: as in d2l.
    position: one of positions.POSITION_NAMES.
    max_len: table size of the learned / relative tables.
    norm: 'post' (the chapter), 'pre' or 'none'; residual: skip connections.
    norm_type: 'layernorm' (the chapter) or 'rmsnorm', for every norm.
    causal: a causal encoder: calls are causal by default (key j attends to
      query i iff j <= i), and Huang's relative modules use the causal skew.
      A call's `causal=True` makes any encoder's call causal; `causal=False`
      on an encoder built causal raises ValueError (its Huang skew is wrong
      above the diagonal). A causal encoder also decodes through key/value
      caches (`init_cache`, then calls with decode=True), as
      TransformerDecoder does.
    use_bias: biases in the attention projections.
    attention_impl: 'plain', 'fused' (jax.nn.dot_product_attention; cuDNN's
      kernel on a GPU where attention.cudnn_takes allows),
      'chunked' (memory O(L), every encoding), 'auto' (chunked for long
      sequences) or 'pallas' (the flash-attention kernels); see
      MultiHeadAttention.
    remat: rematerialise each block in the backward pass (nnx.remat): less
      activation memory, one more forward per block. Off while capturing
      attention weights.
    scan_layers: stack the blocks' parameters on a leading layer axis and run
      them with nnx.scan (compile time independent of depth). `blks` is then
      one stacked block, not a list (attention_weights still returns the
      weights per layer).
    meter_period, meter_step_tokens: a learned embedding of the step phase
      (position // meter_step_tokens) % meter_period added to the inputs
      (0: none; see stack.EmbeddingMixin).
    dtype, param_dtype: computation and parameter dtypes.
    rngs: a 'params' stream, and 'dropout' when dropout > 0.
    **position_options: the encoding's options (e.g. clip_distance=8 for
      shaw); a keyword that is no encoding's option raises TypeError.
  """

  def __init__(self, vocab_size: int | None, num_hiddens: int,
               ffn_num_hiddens: int, num_heads: int, num_layers: int,
               dropout: float = 0.0, *, position: str = 'sinusoidal',
               max_len: int = 1024, norm: str = 'post', residual: bool = True,
               norm_type: str = 'layernorm', causal: bool = False,
               use_bias: bool = False,
               attention_impl: str = 'plain', remat: bool = False,
               scan_layers: bool = False, meter_period: int = 0,
               meter_step_tokens: int = 4, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs, **position_options):
    kind, options = check_stack(
        type(self).__name__, position, position_options, norm=norm,
        vocab_size=vocab_size, num_hiddens=num_hiddens,
        ffn_num_hiddens=ffn_num_hiddens, num_heads=num_heads,
        num_layers=num_layers, max_len=max_len, norm_type=norm_type,
        flags=dict(residual=residual, causal=causal, use_bias=use_bias,
                   remat=remat, scan_layers=scan_layers))
    self.position = position
    self.causal = causal

    def block(relative, rngs):
      return TransformerEncoderBlock(
          num_hiddens, ffn_num_hiddens, num_heads, dropout, norm=norm,
          residual=residual, norm_type=norm_type, relative=relative,
          use_bias=use_bias,
          attention_impl=attention_impl, dtype=dtype, param_dtype=param_dtype,
          rngs=rngs)

    self._init_layers(
        block, vocab_size=vocab_size, num_hiddens=num_hiddens,
        num_heads=num_heads, num_layers=num_layers, dropout=dropout,
        kind=kind, options=options, max_len=max_len, norm=norm,
        norm_type=norm_type, causal=causal, remat=remat,
        scan_layers=scan_layers, dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    self._init_cache_fields()
    self._init_meter(meter_period, meter_step_tokens, dtype=dtype,
                     param_dtype=param_dtype, rngs=rngs)

  _self_attention = 'attention'

  @overload
  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = ...,
               *, mask: jax.Array | None = ..., bias: jax.Array | None = ...,
               causal: bool | None = ..., positions: jax.Array | None = ...,
               deterministic: bool | None = ...,
               return_hidden: Literal[False] = ...,
               decode: bool = ...) -> jax.Array:
    ...

  @overload
  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = ...,
               *, mask: jax.Array | None = ..., bias: jax.Array | None = ...,
               causal: bool | None = ..., positions: jax.Array | None = ...,
               deterministic: bool | None = ...,
               return_hidden: Literal[True], decode: bool = ...
               ) -> tuple[jax.Array, list[jax.Array]]:
    ...

  def __call__(self, inputs: jax.Array, valid_lens: jax.Array | None = None,
               *, mask: jax.Array | None = None,
               bias: jax.Array | None = None, causal: bool | None = None,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               return_hidden: bool = False, decode: bool = False
               ) -> jax.Array | tuple[jax.Array, list[jax.Array]]:
    """Encodes a batch.

    Args:
      inputs: tokens (B, L) int in [0, vocab_size), or features (B, L,
        num_hiddens) float (already embedded: they skip the embedding, not
        the absolute encoding). Concrete token ids outside [0, vocab_size)
        raise ValueError; traced ones (under jit) cannot be checked, and as
        with nnx.Embed an id outside the range gives NaN or another row:
        check such batches with stack.check_token_ids first. selfattn's own
        batches are in range (tests/tasks/test_tasks.py).
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
      return_hidden: also return the hidden states: the embedded input and
        each block's output (before the final norm), num_layers + 1 arrays.
      decode: one step against the caches made by `init_cache`, for an
        encoder built causal (ValueError otherwise), as
        TransformerDecoder's decode: the inputs are the next L tokens,
        their positions continue from the cache unless `positions` are
        given, and a step past the caches' end raises ValueError eagerly or
        gives NaN under jit. valid_lens, mask and bias are refused in a
        decode step (right padding needs no mask under causal attention).

    Returns:
      (B, L, num_hiddens); with return_hidden=True the pair (that, those
      num_layers + 1 hidden states).
    """
    inputs = check_tokens(inputs, 'inputs',
                          takes_ids=self.embedding is not None)
    if decode:
      return self._decode(inputs, valid_lens, mask=mask, bias=bias,
                          causal=causal, positions=positions,
                          deterministic=deterministic,
                          return_hidden=return_hidden)
    if causal is None:
      causal = self.causal
    elif self.causal and not causal:
      raise ValueError('causal=False on an encoder built with causal=True: '
                       'build it with causal=False for bidirectional calls')
    causal = bool(causal)
    if valid_lens is not None:
      valid_lens = jnp.asarray(valid_lens)     # [2] too, as token lists are
    length = inputs.shape[1]
    target = (inputs.shape[0], self.num_heads, length, length)
    # causal stays a flag (not an (L, L) mask) down to the attention, so the
    # chunked path builds it per block.
    attn_mask = masks.attention_mask(target, valid_lens=valid_lens, mask=mask)
    key_lens = None
    if mask is None and valid_lens is not None and jnp.ndim(valid_lens) == 1:
      # Key lengths alone stay lengths down to the attention, which then
      # builds the same mask itself, and attention_impl='pallas' on a
      # Hopper hands them to its kernels (which take lengths, not masks).
      attn_mask, key_lens = None, valid_lens
    X = self.embed(inputs, positions=positions, deterministic=deterministic)

    def run(blk, X, attn_mask, key_lens, bias, positions):
      return blk(X, attn_mask, valid_lens=key_lens, bias=bias, causal=causal,
                 positions=positions, deterministic=deterministic)

    X, hidden = run_blocks(self, run, X, attn_mask, key_lens, bias, positions,
                           remat=self.remat, keep_hidden=return_hidden)
    return (X, hidden) if return_hidden else X

  def _decode(self, inputs, valid_lens, *, mask, bias, causal, positions,
              deterministic, return_hidden):
    """One cached step of a causal encoder (see __call__'s decode)."""
    if not self.causal or causal is False:
      raise ValueError('decode=True needs an encoder built with causal=True '
                       '(cached decoding is causal)')
    for name, value in (('valid_lens', valid_lens), ('mask', mask),
                        ('bias', bias)):
      if value is not None:
        raise ValueError(f'{name} cannot be used with decode=True: a decode '
                         f'step attends causally to the cache (right padding '
                         f'needs no mask)')
    if return_hidden:
      raise ValueError('return_hidden cannot be used with decode=True')
    b, length = inputs.shape[:2]
    positions, start, overflow = self._start_decode(b, length, positions)
    X = self.embed(inputs, positions=positions, deterministic=deterministic)

    def run(blk, X, positions, start):
      return blk(X, positions=positions, deterministic=deterministic,
                 decode=True, cache_start=start)

    # remat is for training passes; a decode step has no backward pass.
    X, _ = run_blocks(self, run, X, positions, start, remat=False)
    return poison(overflow, X)


def attention_weights(model: nnx.Module, *args, **kwargs
                      ) -> tuple[object, list[jax.Array]]:
  """Calls model(*args, **kwargs) and returns (its output, every attention
  layer's (B, H, Lq, Lk) weights in module order), via nnx.capture: nothing is
  left on the model."""
  out, inter = nnx.capture(model, nnx.Intermediate)(*args, **kwargs)
  return out, [weights for _, weights in captured_attention(inter)]


def captured_attention(inter) -> list[tuple[tuple, jax.Array]]:
  """(path, (B, H, Lq, Lk) weights) of every attention call nnx.capture
  recorded in `inter`, in module order; a scanned stack's (scan_layers),
  sown once per module stacked on a leading layer axis, come per layer as
  the unscanned stack's would, each path with its layer index after the
  stack's."""
  found = [(path, value[...] if hasattr(value, 'get_value') else value)
           for path, value in nnx.to_flat_state(inter)
           if path[-1] == 'attention_weights']
  out, i = [], 0
  while i < len(found):
    path, value = found[i]
    if value.ndim == 4:
      out.append((path, value))
      i += 1
      continue
    stack = path[:-2]
    j = i
    while j < len(found) and found[j][0][:-2] == stack:
      j += 1
    group = found[i:j]
    out += [(stack + (layer,) + p[-2:], w[layer])
            for layer in range(group[0][1].shape[0]) for p, w in group]
    i = j
  return out

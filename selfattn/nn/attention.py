"""Masked softmax and multi-head attention, with the names of the d2l chapter.

One implementation of scaled dot-product attention (`dot_product_attention`)
serves every positional encoding: a relative encoding is an object with three
hooks (`RelativePosition` in positions/offsets.py) that may rotate queries and keys,
add a term to the logits, and add a term to the output values.

Shapes use B batch, H heads, Lq / Lk query / key length, D head width.
"""

from __future__ import annotations

import functools
import math
from typing import Protocol

import jax
import jax.numpy as jnp
from absl import logging
from flax import nnx

from selfattn.nn import chunked
from selfattn.nn import masks
# The fused path's test of what cuDNN takes (re-exported: attention.cudnn_*).
from selfattn.nn.cudnn_flash import cudnn_takes  # noqa: F401
from selfattn.nn.cudnn_flash import cudnn_traceable  # noqa: F401
from selfattn.nn.layers import Dropout
from selfattn.nn.layers import dropout_layer  # noqa: F401  (re-exported)


class RelativeTerms(Protocol):
  """What dot_product_attention asks of a relative positional encoding."""

  def rotate(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    ...

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array | None:
    ...

  def values(self, weights: jax.Array, v: jax.Array,
             q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array | None:
    ...


def _softmax_with_mask(logits: jax.Array, mask: jax.Array | None) -> jax.Array:
  """Softmax over the last axis in float32; masked entries get exactly 0.

  A row with no valid entry returns all zeros rather than NaN or a uniform row.
  The fill value is the float32 minimum, not d2l's -1e6, so it stays finite
  whatever the input dtype.
  """
  x = logits.astype(jnp.float32)
  if mask is None:
    return jax.nn.softmax(x, axis=-1)
  x = jnp.where(mask, x, jnp.finfo(jnp.float32).min)
  # `initial`: an empty key axis (Lk = 0) has no max; no row is below it.
  x = x - jax.lax.stop_gradient(jnp.max(
      x, axis=-1, keepdims=True, initial=jnp.finfo(jnp.float32).min))
  e = jnp.where(mask, jnp.exp(x), 0.0)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def masked_softmax(X: jax.Array, valid_lens: jax.Array | None = None, *,
                   mask: jax.Array | None = None) -> jax.Array:
  """d2l's masked softmax over the last axis, dtype-safe.

  Args:
    X: (B, ..., Lq, Lk) logits, any float dtype.
    valid_lens: None, (B,) or (B, Lq): keys at index >= the length get weight 0.
    mask: optional boolean array with X's number of axes, broadcastable to X;
      True = keep.

  Returns:
    Weights of X's shape and dtype. Rows sum to 1 over the kept keys; a row
    with no kept key is all zeros (never NaN).
  """
  X = jnp.asarray(X)
  if not jnp.issubdtype(X.dtype, jnp.floating):
    raise TypeError(f'X must be float logits; got {X.dtype}')
  if X.ndim < 1:
    raise ValueError('X must have at least one axis (the keys); got a scalar')
  if valid_lens is not None and X.ndim < 3:
    raise ValueError(f'with valid_lens, X must be (B, ..., Lq, Lk) logits, '
                     f'at least 3 axes; got shape {tuple(X.shape)}')
  full_mask = None
  if mask is not None:
    full_mask = jnp.asarray(mask)
    if full_mask.dtype != jnp.bool_:
      raise TypeError(f'mask must be boolean (True = keep); got {full_mask.dtype}')
    if full_mask.ndim != X.ndim or any(
        m not in (1, x) for m, x in zip(full_mask.shape, X.shape)):
      raise ValueError(f'mask of shape {full_mask.shape} must have the '
                       f'{X.ndim} axes of X {X.shape}, each 1 or equal')
  if valid_lens is not None:
    valid_lens = masks.check_valid_lens(valid_lens, X.shape[0])
    lens_mask = masks.make_length_mask(valid_lens, X.shape[-2],
                                       X.shape[-1])[:, 0]
    # (B, Lq|1, Lk) -> (B, 1, ..., Lq|1, Lk) to broadcast over middle axes.
    lens_mask = lens_mask.reshape(
        lens_mask.shape[:1] + (1,) * (X.ndim - 3) + lens_mask.shape[1:])
    full_mask = lens_mask if full_mask is None else full_mask & lens_mask
  return _softmax_with_mask(X, full_mask).astype(X.dtype)


def dot_product_attention(
    q_BxHxLqxD: jax.Array,
    k_BxHxLkxD: jax.Array,
    v_BxHxLkxD: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    causal: bool = False,
    relative: RelativeTerms | None = None,
    q_positions: jax.Array | None = None,
    k_positions: jax.Array | None = None,
    dropout: nnx.Dropout | None = None,
    deterministic: bool | None = None,
) -> tuple[jax.Array, jax.Array]:
  """Scaled dot-product attention with optional relative-position terms.

  Args:
    q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD: per-head queries, keys, values.
    mask: boolean with four axes broadcastable to (B, H, Lq, Lk); True =
      attend (see masks.py for the convention).
    bias: float with four axes broadcastable to (B, H, Lq, Lk), added to the
      scaled logits.
    causal: key j attends to query i iff j <= i + (Lk - Lq).
    relative: hooks of a relative encoding (rotate q/k, logit term, value term).
    q_positions, k_positions: (B, Lq), (B, Lk) int positions that the relative
      encoding sees, or None for 0..L-1 (see positions/).
    dropout: applied to the attention weights; `deterministic` (None: the
      dropout module's own mode, set by model.train() / model.eval()).

  Returns:
    (output (B, H, Lq, D) in v's dtype, weights (B, H, Lq, Lk) in float32).
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  masks.check_heads(q, k, v, broadcast=True)
  for name, x in (('q', q), ('k', k), ('v', v)):
    if not jnp.issubdtype(x.dtype, jnp.floating):
      # An int q would take the 1/sqrt(D) scale as 0: uniform weights.
      raise TypeError(f'{name} must be float; got {x.dtype}')
  masks.check_positions(q_positions, q.shape[0], q.shape[2], 'q_positions')
  masks.check_positions(k_positions, q.shape[0], k.shape[2], 'k_positions')
  masks.check_built_for(relative, q.shape[1], q.shape[-1])
  _check_causal_skew(relative, causal, mask,
                     q_positions if q_positions is not None else k_positions)
  target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
  mask = masks.attention_mask(target, mask=mask, causal=causal)
  k, v = masks.clear_unused_keys(k, v, mask)    # padding holding NaN / inf
  # The scale is the projected head's, taken before `rotate` (PoPE widens q
  # and k to 2D features but keeps 1/sqrt(D), as its reference code does).
  scale = 1.0 / math.sqrt(q.shape[-1])
  if relative is not None:
    q, k = relative.rotate(q, k, q_positions, k_positions)
  # Scale the queries once; relative logit terms computed from q share the scale.
  q = q * jnp.asarray(scale, q.dtype)
  logits = jnp.einsum('bhqd,bhkd->bhqk', q, k,
                      preferred_element_type=jnp.float32)
  if relative is not None:
    extra = relative.logits(q, k, q_positions, k_positions)
    if extra is not None:
      logits = logits + extra.astype(jnp.float32)
  if bias is not None:
    logits = logits + masks.check_bias(bias, target).astype(jnp.float32)
  weights = _softmax_with_mask(logits, mask)
  used = weights
  if dropout is not None:
    used = dropout(weights, deterministic=deterministic)
  out = jnp.einsum('bhqk,bhkd->bhqd', used.astype(v.dtype), v)
  if relative is not None:
    extra = relative.values(used, v, q_positions, k_positions)
    if extra is not None:
      out = out + extra.astype(out.dtype)
  return out, weights


IMPLEMENTATIONS = ('plain', 'fused', 'chunked', 'auto', 'pallas')
# 'auto' attends in blocks from this many keys on: below it the (L, L) weights
# are small and the plain path is as fast (BENCHMARKS.md, chunked section).
AUTO_CHUNKED_FROM = 1024


def can_fuse(relative: RelativeTerms | None) -> bool:
  """Whether jax.nn.dot_product_attention can compute this encoding: every
  term but Shaw's value term is a rotation or a logit bias."""
  return getattr(relative, 'fusable', True)


@functools.cache
def _warn_cudnn_refused(message: str) -> None:
  """Logged once per distinct refusal (every trace would repeat it)."""
  logging.warning('attention_impl=fused: cuDNN refused the call (%s); XLA '
                  'runs it instead', message)


def fused_attention(q_BxHxLqxD: jax.Array, k_BxHxLkxD: jax.Array,
                    v_BxHxLkxD: jax.Array, *, mask: jax.Array | None = None,
                    bias: jax.Array | None = None, causal: bool = False,
                    relative: RelativeTerms | None = None,
                    q_positions: jax.Array | None = None,
                    k_positions: jax.Array | None = None) -> jax.Array:
  """The same attention through `jax.nn.dot_product_attention`. The
  encoding's rotation is applied first and its logit term goes in as a bias;
  no weights are returned and there is no dropout on them (callers fall back
  to dot_product_attention for those, and for Shaw's value term).

  The implementation is chosen here, not left to jax.nn: its default
  (implementation=None) is XLA on every backend in JAX 0.10-0.12, so cuDNN would
  never run. Where the dtype, head width and lengths suit cuDNN
  (`cudnn_takes`), the call is lowered per platform
  (jax.lax.platform_dependent): cuDNN's fused kernel for 'cuda', XLA's
  attention elsewhere; if cuDNN refuses the call while tracing, XLA's runs
  instead (logged once). A host without a CUDA device cannot trace cuDNN
  (`cudnn_traceable`) and lowers XLA's attention for every platform. A causal mask alone on a square score matrix reaches cuDNN as its
  own causal mask; other masks and logit terms as an (B, H, Lq, Lk) bias:
  fused, but not O(L) memory.

  Returns (B, H, Lq, D). A query row with no allowed key gets zeros, as in
  dot_product_attention and chunked_attention; keys that no query may attend
  to are zeroed first, so NaN or inf in padding never reaches valid outputs.
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  if not can_fuse(relative):
    raise ValueError('this encoding has a value term; use dot_product_attention')
  target = (q.shape[0], q.shape[1], q.shape[2], k.shape[2])
  # Causal attention and nothing else on a square score matrix: cuDNN can
  # take it as its own causal mask instead of an (L, L) bias.
  only_causal = causal and mask is None and q.shape[2] == k.shape[2]
  mask = masks.attention_mask(target, mask=mask, causal=causal)
  k, v = masks.clear_unused_keys(k, v, mask)
  terms = []
  scale = 1.0 / math.sqrt(q.shape[-1])     # of the head before `rotate`
  if relative is not None:
    q, k = relative.rotate(q, k, q_positions, k_positions)
    scaled = q * jnp.asarray(scale, q.dtype)
    extra = relative.logits(scaled, k, q_positions, k_positions)
    if extra is not None:
      terms.append(extra)
  if bias is not None:
    terms.append(masks.check_bias(bias, target))
  total = None
  for term in terms:
    total = term.astype(q.dtype) if total is None else total + term.astype(q.dtype)
  if total is not None:
    total = jnp.broadcast_to(total, target)
  if mask is not None:
    mask = jnp.broadcast_to(mask, target)
  width = v.shape[-1]
  if q.shape[-1] != width:
    # jax.nn.dot_product_attention wants one head width for q, k and v; an
    # encoding that widens q and k (PoPE) gets v padded with zero columns,
    # which leaves the first `width` output columns exact.
    v = jnp.pad(v, [(0, 0)] * 3 + [(0, q.shape[-1] - width)])
  args = (q.transpose(0, 2, 1, 3), k.transpose(0, 2, 1, 3),
          v.transpose(0, 2, 1, 3))
  causal_alone = only_causal and total is None

  def attend(implementation: str) -> jax.Array:
    # cuDNN takes a causal mask alone as its own is_causal (no (L, L)
    # mask); XLA gets the mask, which keeps every row's own key.
    is_causal = implementation == 'cudnn' and causal_alone
    used_mask = None if is_causal else mask
    try:
      return jax.nn.dot_product_attention(*args, bias=total, mask=used_mask,
                                          scale=scale, is_causal=is_causal,
                                          implementation=implementation)
    except (ValueError, NotImplementedError) as e:
      # cuDNN's trace-time refusals (a shape, a GPU or a cuDNN version it
      # does not support); compile-time failures are not caught here.
      if implementation != 'cudnn':
        raise
      _warn_cudnn_refused(str(e).split('\n')[0])
      return attend('xla')

  takes = cudnn_takes(q.dtype, q.shape[-1], lq=q.shape[2], lk=k.shape[2],
                      has_bias=total is not None or (
                          mask is not None and not causal_alone))
  if takes and cudnn_traceable():
    # Chosen per lowering platform, not by the host's default backend: a
    # step lowered for 'cuda' holds cuDNN's kernel, one for 'cpu' or 'tpu'
    # XLA's attention, from the same trace.
    out = jax.lax.platform_dependent(
        cuda=functools.partial(attend, 'cudnn'),
        default=functools.partial(attend, 'xla'))
  else:
    out = attend('xla')
  out = out.transpose(0, 2, 1, 3)[..., :width]
  if mask is not None:
    # jax.nn's softmax spreads a row with no allowed key uniformly; the other
    # paths return zeros there.
    out = jnp.where(jnp.any(mask, axis=-1, keepdims=True), out,
                    jnp.zeros((), out.dtype))
  return out


def _dropout_key(dropout: Dropout) -> jax.Array:
  """One key from the dropout module's stream, as nnx.Dropout draws it."""
  dropout.check_stream()
  rngs = dropout.rngs
  if isinstance(rngs, nnx.Rngs):
    return rngs[dropout.rng_collection]()
  return rngs()


def _keep_last(_previous, new):
  return new


def capturing(module: nnx.Module) -> bool:
  """True inside `nnx.capture(...)`: the only time attention weights are sown.

  Sowing outside capture would mutate the module on every call, which breaks
  jax.jit / grad / vmap over closures and makes nnx.jit trace twice. Flax marks
  the modules of a capture with `__captures__` (flax/nnx/module.py, `sow`);
  tests/nn/test_attention.py checks that capture still returns the weights.
  """
  return hasattr(module, '__captures__')


def check_cache_fit(batch: int, num_new: int, start: jax.Array,
                    cache_batch: int, max_length: int) -> jax.Array:
  """The checks of one decode step against a cache of (cache_batch,
  max_length): a wrong batch or more new tokens than the cache holds raise;
  running past its end raises when `start` is concrete. Returns `overflow`
  (a bool scalar) for `poison` under jit, where nothing can be raised."""
  if batch != cache_batch:
    raise ValueError(f'decode=True with a batch of {batch} but the cache was '
                     f'made by init_cache(batch_size={cache_batch}, ...): '
                     f'call init_cache with batch_size={batch}')
  if num_new > max_length:
    raise ValueError(f'decode=True with {num_new} tokens at once but the '
                     f'cache holds max_length={max_length}: call init_cache '
                     f'with a larger max_length')
  overflow = start + num_new > max_length
  if not isinstance(start, jax.core.Tracer) and bool(overflow):
    raise ValueError(f'decode=True past the end of the cache: {int(start)} '
                     f'tokens are cached and {num_new} more do not fit in '
                     f'max_length={max_length}; call init_cache with a larger '
                     f'max_length')
  return overflow


def poison(overflow: jax.Array, out: jax.Array) -> jax.Array:
  """out, or NaN everywhere when `overflow` (a traced bool) is set: under
  jit a decode step past the cache's end cannot raise, and its numbers would
  be wrong (writes past the end are clamped onto the last slots), so they
  are made impossible to miss instead."""
  return jnp.where(overflow, jnp.asarray(jnp.nan, out.dtype), out)


def _check_causal_skew(relative: RelativeTerms | None, causal: bool,
                       mask: jax.Array | None, positions) -> None:
  """Refuses Huang's causal skew (HuangRelative(causal=True)) in a call
  that is plainly not causal: the skew keeps only offsets <= 0, and above
  the diagonal reads leftover entries that only a causal mask hides. A call
  with a mask (which may be causal) or explicit positions (Huang then
  gathers per offset, right for any) is left alone."""
  if (getattr(relative, 'causal', False) and not causal and mask is None
      and positions is None):
    raise ValueError(f'relative={type(relative).__name__}(causal=True) uses '
                     f'the causal skew: call with causal=True (or build it '
                     f'with causal=False)')


class MultiHeadAttention(nnx.Module):
  """d2l's multi-head attention: W_q, W_k, W_v of width num_hiddens, W_o.

  Calls: see `__call__`.

  Attention weights (B, H, Lq, Lk), float32, are returned only on request:
  `_, inter = nnx.capture(model, nnx.Intermediate)(...)` gives them under
  `attention_weights` of each attention module. Plain calls store nothing.

  Args:
    num_hiddens: width of queries, keys and values after projection (split
      into num_heads heads).
    num_heads: number of heads; must divide num_hiddens.
    dropout: dropout rate on the attention weights (needs a 'dropout' rng
      stream only when > 0).
    use_bias: biases in the four projections.
    in_features: width of the queries (default num_hiddens).
    kv_features: width of keys and values (default in_features).
    out_features: width of the output (default num_hiddens).
    relative: a relative positional encoding's hooks, or None.
    attention_impl: 'plain' (dot_product_attention), 'fused'
      (jax.nn.dot_product_attention: cuDNN's fused kernel on a GPU for
      bfloat16/float16 heads a multiple of 8 up to 128 wide, even lengths
      with a mask or bias (cudnn_takes), XLA otherwise; see
      fused_attention),
      'chunked' (chunked.chunked_attention: online softmax over key blocks,
      memory O(L) instead of O(L^2), every encoding) or 'auto' (chunked from
      AUTO_CHUNKED_FROM keys on, plain below) or 'pallas'
      (pallas_attention.pallas_attention: Pallas flash-attention forward
      and backward kernels that compute ALiBi, T5 and Shaw terms per block
      from their small tables; Triton on a GPU, Mosaic on a TPU, Pallas
      interpret mode on the CPU, so for correctness there, not speed).
      'fused' falls back to 'plain' while dropout is active and for Shaw's
      value term; 'pallas' falls back to 'plain' unless the encoding is none,
      alibi, t5, shaw (those classes, not subclasses) or rotation-only
      (rope, pope, a user's), there are no explicit
      positions, no float bias, no dropout and no decode step, and the masks
      are key padding only (valid_lens (B,), a mask of shape (B|1, 1, 1,
      Lk)) plus `causal`; every implementation falls back to 'plain' while
      weights are captured.
    dtype, param_dtype: computation and parameter dtypes.
    rngs: needs a 'params' stream (and 'dropout' when dropout > 0).
  """

  def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, *,
               use_bias: bool = False, in_features: int | None = None,
               kv_features: int | None = None, out_features: int | None = None,
               relative: RelativeTerms | None = None,
               attention_impl: str = 'plain', dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if attention_impl not in IMPLEMENTATIONS:
      raise ValueError(f'attention_impl={attention_impl!r} is unknown; valid: '
                       f'{", ".join(IMPLEMENTATIONS)}')
    # Integers (16.0 failed deep in nnx.Linear; num_heads=2.0 ran with float
    # head widths), then num_heads | num_hiddens.
    num_hiddens = masks.check_size(num_hiddens, 'num_hiddens')
    num_heads = masks.check_size(num_heads, 'num_heads')
    use_bias = masks.check_flag(use_bias, 'use_bias')
    if num_hiddens % num_heads:
      raise ValueError(f'num_hiddens={num_hiddens} is not divisible by '
                       f'num_heads={num_heads}')
    in_features = (num_hiddens if in_features is None
                   else masks.check_size(in_features, 'in_features'))
    kv_features = (in_features if kv_features is None
                   else masks.check_size(kv_features, 'kv_features'))
    out_features = (num_hiddens if out_features is None
                    else masks.check_size(out_features, 'out_features'))
    self.num_heads = num_heads
    self.num_hiddens = num_hiddens
    self.dtype = dtype

    def linear(n_in, n_out):
      return nnx.Linear(n_in, n_out, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)

    self.W_q = linear(in_features, num_hiddens)
    self.W_k = linear(kv_features, num_hiddens)
    self.W_v = linear(kv_features, num_hiddens)
    self.W_o = linear(num_hiddens, out_features)
    self.dropout = dropout_layer(dropout, rngs)
    masks.check_built_for(relative, num_heads, num_hiddens // num_heads)
    self.relative = relative
    self.attention_impl = attention_impl
    self.cache: nnx.Dict | None = nnx.data(None)   # init_cache fills it

  def _split_heads(self, x_BxLxF: jax.Array) -> jax.Array:
    b, length, _ = x_BxLxF.shape
    x = x_BxLxF.reshape(b, length, self.num_heads, -1)
    return x.transpose(0, 2, 1, 3)

  def init_cache(self, batch_size: int, max_length: int, dtype=None) -> None:
    """Empty key/value cache for `decode=True` calls: (B, H, max_length, D)
    keys and values, their positions (B, max_length) and the fill index, as
    `nnx.Cache` variables (so nnx.jit carries them). Sizes are integers
    >= 1 (TypeError, ValueError)."""
    batch_size = masks.check_size(batch_size, 'batch_size')
    max_length = masks.check_size(max_length, 'max_length')
    dtype = dtype or self.dtype or jnp.float32
    head_dim = self.num_hiddens // self.num_heads
    shape = (batch_size, self.num_heads, max_length, head_dim)
    self.cache = nnx.Dict({
        'key': nnx.Cache(jnp.zeros(shape, dtype)),
        'value': nnx.Cache(jnp.zeros(shape, dtype)),
        'positions': nnx.Cache(jnp.zeros((batch_size, max_length), jnp.int32)),
        'index': nnx.Cache(jnp.zeros((), jnp.int32))})

  def drop_cache(self) -> None:
    """Removes the cache init_cache made: the module's state is then what
    it was before decoding (a checkpoint of it restores into a fresh
    module; a jitted step over it does not carry the cache)."""
    self.cache = None

  def _decode_step(self, q, k, v, positions, start=None):
    """Writes k, v (B, H, Lq, D) into the cache at `start`; returns every
    cached key, value, the query and key positions, the causal mask over
    the cache and `overflow` (a bool scalar: the step ran past the cache's
    end). start None: this module owns the cache (a standalone
    MultiHeadAttention), keeps its fill index and checks the fit; given, a
    stack owns it (CacheMixin: one counter, one check, one poisoning for
    every layer) and overflow is False here."""
    if self.cache is None:
      raise ValueError('decode=True needs a cache: call init_cache(batch_size, '
                       'max_length) first')
    cache = self.cache
    b, _, lq, _ = q.shape
    cache_batch, _, max_length, _ = cache['key'].shape
    owned = start is None
    if owned:
      start = cache['index'][...]
      overflow = check_cache_fit(b, lq, start, cache_batch, max_length)
    else:
      overflow = jnp.zeros((), bool)
    if positions is None:
      positions = jnp.broadcast_to(start + jnp.arange(lq, dtype=jnp.int32),
                                   (b, lq))
    positions = jnp.asarray(positions, jnp.int32)
    zero = jnp.zeros((), jnp.int32)
    for name, new in (('key', k), ('value', v)):
      cache[name][...] = jax.lax.dynamic_update_slice(
          cache[name][...], new.astype(cache[name].dtype),
          (zero, zero, start, zero))
    cache['positions'][...] = jax.lax.dynamic_update_slice(
        cache['positions'][...], positions, (zero, start))
    if owned:
      cache['index'][...] = start + lq
    query_index = start + jnp.arange(lq)
    causal = jnp.arange(max_length)[None, :] <= query_index[:, None]
    return (cache['key'][...], cache['value'][...], positions,
            cache['positions'][...], causal[None, None], overflow)

  def __call__(self, queries: jax.Array, keys: jax.Array | None = None,
               values: jax.Array | None = None,
               valid_lens: jax.Array | None = None, *,
               mask: jax.Array | None = None,
               bias: jax.Array | None = None,
               causal: bool = False,
               positions: jax.Array | None = None,
               key_positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False,
               cache_start: jax.Array | None = None) -> jax.Array:
    """Attends from the queries to the keys.

    Args:
      queries: (B, Lq, in_features).
      keys: (B, Lk, kv_features), default the queries.
      values: (B, Lk, kv_features), default the keys.
      valid_lens: (B,) or (B, Lq), or None.
      mask: boolean, four axes broadcastable to (B, H, Lq, Lk); see masks.py.
      bias: float, broadcastable like mask, added to the logits.
      causal: key j attends to query i only if j <= i (aligned at the end
        when Lq != Lk).
      positions: (B, Lq), the positions a relative encoding sees (None:
        0..L-1).
      key_positions: (B, Lk); default: `positions` in self-attention (keys
        not given), else 0..Lk-1.
      deterministic: None uses the module's mode (`model.train()` /
        `model.eval()`; modules start in eval mode).
      decode: one step of cached self-attention (call `init_cache` first):
        the queries are the next Lq tokens; their keys and values join the
        cache, they attend causally to every cached position, and their
        positions continue from the cache (or are `positions`, for
        randomized encodings). The cache holds `max_length` tokens: a step
        that would run past it raises ValueError when the fill index is
        concrete (eager calls); under jit (nnx.jit, nnx.scan), where it
        cannot raise, that step's outputs and every later one's are NaN
        (`poison`), never silently wrong numbers. A batch size other than
        init_cache's, or more new tokens than max_length, raises ValueError
        always.
      cache_start: set by a stack that owns its layers' caches
        (stack.CacheMixin): where this step's tokens go. The stack then
        keeps the one fill counter, checks the fit and poisons the output
        once; None (a module used on its own): the module does all three.

    Padding never changes valid outputs, whatever it holds: keys that no
    query may attend to are zeroed before use on every path, so NaN or inf
    there stays out (the projections' parameter gradients still see the raw
    inputs).

    Returns:
      (B, Lq, out_features).
    """
    keys = queries if keys is None else keys
    values = keys if values is None else values
    for name, x, linear in (('queries', queries, self.W_q),
                            ('keys', keys, self.W_k),
                            ('values', values, self.W_v)):
      if x.ndim != 3 or x.shape[2] != linear.in_features:
        raise ValueError(f'{name} must be (B, L, {linear.in_features}) '
                         f'(this module\'s in_features/kv_features); got '
                         f'shape {tuple(x.shape)}')
    if (keys.shape[0] not in (1, queries.shape[0])
        or values.shape[:2] != keys.shape[:2]):
      raise ValueError(f'queries, keys and values must share the batch (keys '
                       f'may have 1), and keys and values their length; got '
                       f'{queries.shape}, {keys.shape}, {values.shape}')
    masks.check_positions(positions, *queries.shape[:2])
    masks.check_positions(key_positions, *keys.shape[:2], 'key_positions')
    if 0 in queries.shape[:2] or 0 in keys.shape[:2]:
      raise ValueError(f'attention needs at least one example and one '
                       f'position; got queries {queries.shape}, keys '
                       f'{keys.shape}')
    if key_positions is None and keys is queries:
      key_positions = positions      # self-attention: keys are the queries
    q = self._split_heads(self.W_q(queries))
    # Keys shared by every example are projected once, then spread to the
    # batch: the kernel paths (fused, pallas) take no batch broadcast.
    k, v = (jnp.broadcast_to(x, (q.shape[0],) + x.shape[1:]) for x in (
        self._split_heads(self.W_k(keys)), self._split_heads(self.W_v(values))))
    if decode:
      if keys is not queries:
        raise ValueError('decode=True is for self-attention: pass the new '
                         'tokens as queries only')
      if mask is not None and self.cache is not None:
        # Over the whole cache, (B, H, Lq, max_length); checked before the
        # step writes the cache, so a refused call changes nothing.
        mask = masks.check_mask(
            mask, q.shape[:3] + self.cache['key'].shape[2:3])
      k, v, positions, key_positions, step_mask, overflow = self._decode_step(
          q, k, v, positions, start=cache_start)
      mask = step_mask if mask is None else mask & step_mask
      causal = False                 # step_mask is the causal mask over the cache
      out = self._attend(
          q, k, v, valid_lens, mask=mask, bias=bias, causal=causal,
          positions=positions, key_positions=key_positions,
          deterministic=deterministic)
      return out if cache_start is not None else poison(overflow, out)
    _check_causal_skew(self.relative, causal, mask, positions)
    return self._attend(q, k, v, valid_lens, mask=mask, bias=bias,
                        causal=causal, positions=positions,
                        key_positions=key_positions,
                        deterministic=deterministic)

  def _attend(self, q, k, v, valid_lens, *, mask, bias, causal, positions,
              key_positions, deterministic) -> jax.Array:
    """Per-head q, k, v -> (B, Lq, out_features) by the chosen path."""
    target = (q.shape[0], self.num_heads, q.shape[2], k.shape[2])
    dropping = (self.dropout.rate > 0 and not (
        self.dropout.deterministic if deterministic is None else deterministic))
    if self._chunks(k.shape[2]):
      # causal stays a flag: the chunked path builds it per block.
      mask = masks.attention_mask(target, valid_lens=valid_lens, mask=mask)
      out = chunked.chunked_attention(
          q, k, v, mask=mask, bias=bias, causal=causal, relative=self.relative,
          q_positions=positions, k_positions=key_positions,
          dropout_rate=self.dropout.rate if dropping else 0.0,
          dropout_rng=_dropout_key(self.dropout) if dropping else None)
      return self._merge_heads(out)
    if (self.attention_impl == 'pallas' and not dropping
        and not capturing(self)):
      out = self._pallas(q, k, v, valid_lens, mask=mask, bias=bias,
                         causal=causal, positions=positions,
                         key_positions=key_positions)
      if out is not None:
        return self._merge_heads(out)
    if (self.attention_impl == 'fused' and can_fuse(self.relative)
        and not dropping and not capturing(self)):
      # causal stays a flag: alone on a square matrix it reaches cuDNN as
      # its own causal mask instead of an (L, L) one.
      out = fused_attention(
          q, k, v, mask=masks.attention_mask(target, valid_lens=valid_lens,
                                             mask=mask),
          bias=bias, causal=causal, relative=self.relative,
          q_positions=positions, k_positions=key_positions)
      return self._merge_heads(out)
    mask = masks.attention_mask(target, valid_lens=valid_lens, mask=mask,
                                causal=causal)
    out, weights = dot_product_attention(
        q, k, v, mask=mask, bias=bias, relative=self.relative,
        q_positions=positions, k_positions=key_positions,
        dropout=self.dropout, deterministic=deterministic)
    if capturing(self):
      self.sow(nnx.Intermediate, 'attention_weights', weights,
               reduce_fn=_keep_last)
    return self._merge_heads(out)

  def _pallas(self, q, k, v, valid_lens, *, mask, bias, causal, positions,
              key_positions) -> jax.Array | None:
    """pallas_attention's (B, H, Lq, D) output, or None where it does not
    apply (the caller then takes the plain path)."""
    from selfattn.nn import pallas_attention   # Pallas loads only when asked for
    if (not pallas_attention.supports(self.relative) or bias is not None
        or positions is not None or key_positions is not None):
      return None
    b, lk = q.shape[0], k.shape[2]
    target = (b, self.num_heads, q.shape[2], lk)
    key_valid = None
    if valid_lens is not None:
      valid_lens = masks.check_valid_lens(valid_lens, b)
      if valid_lens.ndim != 1:
        return None                  # one length per query: not key padding
      key_valid = masks.make_length_mask(valid_lens, q.shape[2], lk)[:, 0, 0]
      if mask is None:
        # As lengths, which the Hopper kernel takes (a mask it does not).
        return pallas_attention.pallas_attention(
            q, k, v, relative=self.relative, causal=causal,
            key_lengths=valid_lens)
    if mask is not None:
      mask = masks.check_mask(mask, target)
      if mask.shape[1] != 1 or mask.shape[2] != 1:
        return None                  # per head or per query: not key padding
      keys = jnp.broadcast_to(mask[:, 0, 0, :], (b, lk))
      key_valid = keys if key_valid is None else key_valid & keys
    if key_valid is not None:
      key_valid = jnp.broadcast_to(key_valid, (b, lk))
    return pallas_attention.pallas_attention(
        q, k, v, relative=self.relative, causal=causal, key_valid=key_valid)

  def _chunks(self, num_keys: int) -> bool:
    if capturing(self):
      return False
    return (self.attention_impl == 'chunked' or (
        self.attention_impl == 'auto' and num_keys >= AUTO_CHUNKED_FROM))

  def _merge_heads(self, out_BxHxLqxD: jax.Array) -> jax.Array:
    b, _, lq, _ = out_BxHxLqxD.shape
    return self.W_o(out_BxHxLqxD.transpose(0, 2, 1, 3).reshape(
        b, lq, self.num_hiddens))

"""Masked softmax and multi-head attention, with the names of the d2l chapter.

One implementation of scaled dot-product attention (`dot_product_attention`)
serves every positional encoding: a relative encoding is an object with three
hooks (`RelativePosition` in positions.py) that may rotate queries and keys,
add a term to the logits, and add a term to the output values.

Shapes use B batch, H heads, Lq / Lk query / key length, D head width.
"""

from __future__ import annotations

import math
import warnings
from typing import Protocol

import jax
import jax.numpy as jnp
from flax import nnx


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


def valid_lens_to_mask(valid_lens: jax.Array, num_queries: int,
                       num_keys: int) -> jax.Array:
  """Boolean key mask from d2l-style `valid_lens`.

  Args:
    valid_lens: (B,) one length per sequence, or (B, Lq) one per query.
    num_queries: Lq.
    num_keys: Lk.

  Returns:
    (B, 1, Lk) for 1-D lengths or (B, Lq, Lk) for 2-D lengths; True = attend.
  """
  valid_lens = jnp.asarray(valid_lens)
  key_idx = jnp.arange(num_keys)
  if valid_lens.ndim == 1:
    return key_idx[None, None, :] < valid_lens[:, None, None]
  if valid_lens.ndim == 2:
    if valid_lens.shape[1] != num_queries:
      raise ValueError(f'valid_lens of shape {valid_lens.shape} does not match '
                       f'{num_queries} queries')
    return key_idx[None, None, :] < valid_lens[:, :, None]
  raise ValueError(f'valid_lens must be (B,) or (B, Lq); got {valid_lens.shape}')


def combine_masks(valid_lens: jax.Array | None, mask: jax.Array | None,
                  num_queries: int, num_keys: int) -> jax.Array | None:
  """Merges `valid_lens` and a boolean key-padding mask into one (B, Lq|1, Lk) mask."""
  result = None
  if valid_lens is not None:
    result = valid_lens_to_mask(valid_lens, num_queries, num_keys)
  if mask is not None:
    mask = jnp.asarray(mask, dtype=bool)
    if mask.ndim != 2 or mask.shape[1] != num_keys:
      raise ValueError(f'mask must be a (B, Lk={num_keys}) key-padding mask; '
                       f'got shape {mask.shape}')
    mask = mask[:, None, :]
    result = mask if result is None else result & mask
  return result


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
  x = x - jax.lax.stop_gradient(jnp.max(x, axis=-1, keepdims=True))
  e = jnp.where(mask, jnp.exp(x), 0.0)
  total = jnp.sum(e, axis=-1, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def masked_softmax(X: jax.Array, valid_lens: jax.Array | None = None, *,
                   mask: jax.Array | None = None) -> jax.Array:
  """d2l's masked softmax over the last axis, dtype-safe.

  Args:
    X: (B, ..., Lq, Lk) logits, any float dtype.
    valid_lens: None, (B,) or (B, Lq): keys at index >= the length get weight 0.
    mask: optional boolean array broadcastable to X; True = keep.

  Returns:
    Weights of X's shape and dtype. Rows sum to 1 over the kept keys; a row
    with no kept key is all zeros (never NaN).
  """
  num_queries, num_keys = X.shape[-2], X.shape[-1]
  full_mask = mask
  if valid_lens is not None:
    lens_mask = valid_lens_to_mask(valid_lens, num_queries, num_keys)
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
    relative: RelativeTerms | None = None,
    q_positions: jax.Array | None = None,
    k_positions: jax.Array | None = None,
    dropout: nnx.Dropout | None = None,
    deterministic: bool = True,
) -> tuple[jax.Array, jax.Array]:
  """Scaled dot-product attention with optional relative-position terms.

  Args:
    q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD: per-head queries, keys, values.
    mask: boolean, broadcastable to (B, H, Lq, Lk); True = attend.
    relative: hooks of a relative encoding (rotate q/k, logit term, value term).
    q_positions, k_positions: (B, Lq), (B, Lk) int positions that the relative
      encoding sees, or None for 0..L-1 (see positions.py).
    dropout: applied to the attention weights unless deterministic.
    deterministic: disables dropout.

  Returns:
    (output (B, H, Lq, D) in v's dtype, weights (B, H, Lq, Lk) in float32).
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  if relative is not None:
    q, k = relative.rotate(q, k, q_positions, k_positions)
  # Scale the queries once; relative logit terms computed from q share the scale.
  q = q * jnp.asarray(1.0 / math.sqrt(q.shape[-1]), q.dtype)
  logits = jnp.einsum('bhqd,bhkd->bhqk', q, k,
                      preferred_element_type=jnp.float32)
  if relative is not None:
    extra = relative.logits(q, k, q_positions, k_positions)
    if extra is not None:
      logits = logits + extra.astype(jnp.float32)
  weights = _softmax_with_mask(logits, mask)
  used = weights
  if dropout is not None and not deterministic:
    used = dropout(weights, deterministic=False)
  out = jnp.einsum('bhqk,bhkd->bhqd', used.astype(v.dtype), v)
  if relative is not None:
    extra = relative.values(used, v, q_positions, k_positions)
    if extra is not None:
      out = out + extra.astype(out.dtype)
  return out, weights


def _keep_last(_previous, new):
  return new


class MultiHeadAttention(nnx.Module):
  """d2l's multi-head attention: W_q, W_k, W_v, W_o of width num_hiddens.

  Call as `attn(queries, keys, values, valid_lens=None, *, mask=None,
  deterministic=True)` with queries (B, Lq, F), keys and values (B, Lk, F),
  `valid_lens` (B,) or (B, Lq), or `mask` a boolean (B, Lk) key-padding mask
  (True = valid; use it for left padding). `positions` (B, Lq) and
  `key_positions` (B, Lk, default `positions`) are the positions a relative
  encoding sees (None: 0..L-1). Returns (B, Lq, num_hiddens).

  The attention weights of the latest call, (B, H, Lq, Lk) in float32, are sown
  as `nnx.Intermediate` under the name `attention_weights`: read them with
  `attn.attention_weights[...]`, or collect and clear them from a whole model
  with `nnx.pop(model, nnx.Intermediate)`. Under `jax.jit` they cost nothing
  unless returned.
  """

  def __init__(self, num_hiddens: int, num_heads: int, dropout: float = 0.0, *,
               use_bias: bool = False, in_features: int | None = None,
               relative: RelativeTerms | None = None, dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if num_hiddens % num_heads:
      raise ValueError(f'num_hiddens={num_hiddens} is not divisible by '
                       f'num_heads={num_heads}')
    in_features = num_hiddens if in_features is None else in_features
    self.num_heads = num_heads
    self.num_hiddens = num_hiddens

    def linear(n_in):
      return nnx.Linear(n_in, num_hiddens, use_bias=use_bias, dtype=dtype,
                        param_dtype=param_dtype, rngs=rngs)

    self.W_q = linear(in_features)
    self.W_k = linear(in_features)
    self.W_v = linear(in_features)
    self.W_o = linear(num_hiddens)
    self.dropout = nnx.Dropout(dropout, rngs=rngs)
    self.relative = relative

  def _split_heads(self, x_BxLxF: jax.Array) -> jax.Array:
    b, length, _ = x_BxLxF.shape
    x = x_BxLxF.reshape(b, length, self.num_heads, -1)
    return x.transpose(0, 2, 1, 3)

  def __call__(self, queries: jax.Array, keys: jax.Array, values: jax.Array,
               valid_lens: jax.Array | None = None, *,
               mask: jax.Array | None = None,
               positions: jax.Array | None = None,
               key_positions: jax.Array | None = None,
               deterministic: bool = True) -> jax.Array:
    if key_positions is None:
      key_positions = positions      # self-attention: keys are the queries
    q = self._split_heads(self.W_q(queries))
    k = self._split_heads(self.W_k(keys))
    v = self._split_heads(self.W_v(values))
    key_mask = combine_masks(valid_lens, mask, q.shape[2], k.shape[2])
    if key_mask is not None:
      key_mask = key_mask[:, None]  # (B, 1, Lq|1, Lk): broadcast over heads
    out, weights = dot_product_attention(
        q, k, v, mask=key_mask, relative=self.relative, q_positions=positions,
        k_positions=key_positions, dropout=self.dropout,
        deterministic=deterministic)
    with warnings.catch_warnings():
      # Outside nnx.capture, Flax 0.12 still stores the value on the module
      # (the convenience documented above) but warns that this is deprecated.
      warnings.simplefilter('ignore', DeprecationWarning)
      self.sow(nnx.Intermediate, 'attention_weights', weights,
               reduce_fn=_keep_last)
    b, _, lq, _ = out.shape
    return self.W_o(out.transpose(0, 2, 1, 3).reshape(b, lq, self.num_hiddens))

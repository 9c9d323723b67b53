"""Memory-efficient attention for every positional encoding.

Rabe & Staats (2021), "Self-attention does not need O(n^2) memory", with the
FlashAttention recurrence: queries are split into blocks (lax.map) and, for
each query block, keys are visited block by block (lax.scan) keeping only a
running maximum m, a running normaliser l and an unnormalised output acc:

    s     = q_blk k_blk^T / sqrt(D) + encoding term + bias   (masked to -inf)
    m'    = max(m, rowmax(s));   p = exp(s - m');   a = exp(m - m')
    l'    = a l + rowsum(p);     acc' = a acc + p v_blk (+ Shaw's value term)
    out   = acc / l

so nothing of size (Lq, Lk) exists at once; the largest temporary is one
(B, H, query_chunk, key_chunk) block. The scan body is wrapped in
jax.checkpoint, so the backward pass recomputes each block instead of storing
its weights: the residuals are the carries, O(Lq Lk / key_chunk * B H D).

Every encoding works because its hooks (positions.RelativePosition) compute
their terms from explicit query and key positions: each block passes the
positions of its own queries and keys (0..L-1 when the caller gave none).
Rotations (RoPE) are applied once to the whole q and k, which costs O(L D).
An encoding whose default path (no positions) differs from its positions
path supplies its own per-block term (RelativePosition.blockwise_logits):
Transformer-XL's default offsets are unbounded, while with positions they
clip at +-(max_len - 1), so the chunked path reads XL's unbounded table per
block and matches the plain path at every length.

Dropout drops each block's weights with a key folded from the block's
indices, so its random pattern differs from dot_product_attention's (same
distribution, not the same draws).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp

from selfattn.nn import masks

# Block sizes: a (B, H, 256, 256) float32 block of logits is 2 MB per head
# and example, small enough for the CPU's caches, large enough to be a decent
# matrix product. Measured on the 2-core CPU (width 256, 8 heads, L = 2048,
# forward+backward over plain): 128x128 0.66 / 0.91 (none / shaw), 256x256
# 0.55 / 0.93, 512x512 0.73 / 1.26. Rabe & Staats use 1024 x 4096 on TPU.
QUERY_CHUNK = 256
KEY_CHUNK = 256


def _pad_axis(x: jax.Array, axis: int, size: int, value) -> jax.Array:
  extra = size - x.shape[axis]
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def _block(x: jax.Array | None, axis: int, start: jax.Array, size: int):
  """The block [start, start + size) of x along axis, unless x broadcasts
  along it (size 1)."""
  if x is None or x.shape[axis] == 1:
    return x
  return jax.lax.dynamic_slice_in_dim(x, start, size, axis)


def _positions(pos: jax.Array | None, length: int, padded: int) -> jax.Array:
  """(B|1, padded) int32 positions; padding continues the count (its rows or
  keys are discarded or masked, so only finiteness matters)."""
  if pos is None:
    return jnp.arange(padded, dtype=jnp.int32)[None]
  pos = jnp.asarray(pos, jnp.int32)
  tail = pos[:, -1:] + jnp.arange(1, padded - length + 1, dtype=jnp.int32)
  return jnp.concatenate([pos, tail], axis=1) if padded > length else pos


def _far_side(reach: int | None, q_pos: jax.Array, k_pos: jax.Array):
  """+1 when every offset k_pos - q_pos in the block is >= reach, -1 when
  every one is <= -reach, else 0 (None without a reach)."""
  if reach is None:
    return None
  lowest = k_pos.min() - q_pos.max()
  highest = k_pos.max() - q_pos.min()
  return jnp.where(lowest >= reach, 1, jnp.where(highest <= -reach, -1, 0))


def _edge_positions(side: jax.Array, reach: int):
  """Query and key positions one offset of side * reach apart, shaped (1, 1):
  the one query position broadcasts over the block's queries, since beyond
  the reach every query sees the edge key alike."""
  return (jnp.zeros((1, 1), jnp.int32),
          jnp.reshape(side * reach, (1, 1)).astype(jnp.int32))


def _term(side, near, far, shape):
  """An encoding's term for one block, float32, of `shape`. Blocks wholly
  beyond the encoding's reach (side != 0) take `far`: the term of one key at
  the edge offset, the same for every key of the block (logits), or computed
  from the summed weights (values, which are linear in them)."""
  if side is None:
    out = near()
    return None if out is None else jnp.broadcast_to(
        out.astype(jnp.float32), shape)
  if jax.eval_shape(near) is None:       # e.g. Shaw without value tables
    return None
  as_block = lambda f: (lambda: jnp.broadcast_to(f().astype(jnp.float32), shape))
  return jax.lax.cond(side != 0, as_block(far), as_block(near))


def chunked_attention(
    q_BxHxLqxD: jax.Array,
    k_BxHxLkxD: jax.Array,
    v_BxHxLkxD: jax.Array,
    *,
    mask: jax.Array | None = None,
    bias: jax.Array | None = None,
    causal: bool = False,
    relative=None,
    q_positions: jax.Array | None = None,
    k_positions: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    query_chunk: int | None = None,
    key_chunk: int | None = None,
) -> jax.Array:
  """dot_product_attention's output without its (Lq, Lk) weights.

  Args:
    q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD: per-head queries, keys, values.
    mask, bias, causal, relative, q_positions, k_positions: as in
      attention.dot_product_attention. Pass causal=True rather than a causal
      mask: it is computed per block, never as an (Lq, Lk) array, and key
      blocks wholly above the diagonal are skipped (lax.cond), about half
      the work at Lq == Lk. Keys no query may attend to (by `mask`) are
      zeroed first, so NaN or inf in padding never reaches valid outputs.
    dropout_rate, dropout_rng: dropout on the attention weights (off when the
      rate is 0 or the key is None).
    query_chunk, key_chunk: block sizes (default QUERY_CHUNK, KEY_CHUNK;
      clipped to the lengths; lengths that are not multiples are padded and
      the padding masked).

  Returns:
    (B, H, Lq, D) in v's dtype. A query with no allowed key gets zeros, as in
    dot_product_attention.
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  b, h, lq, d = q.shape
  lk = k.shape[2]
  target = (b, h, lq, lk)
  if mask is not None:
    mask = masks.check_mask(mask, target)
    k, v = masks.clear_unused_keys(k, v, mask)    # padding holding NaN / inf
  if bias is not None:
    bias = masks.check_bias(bias, target)
  if relative is not None:
    q, k = relative.rotate(q, k, q_positions, k_positions)
  q = q * jnp.asarray(1.0 / math.sqrt(d), q.dtype)

  qc = min(query_chunk or QUERY_CHUNK, lq)
  kc = min(key_chunk or KEY_CHUNK, lk)
  nq, nk = -(-lq // qc), -(-lk // kc)
  lq_pad, lk_pad = nq * qc, nk * kc
  q = _pad_axis(q, 2, lq_pad, 0)
  k, v = _pad_axis(k, 2, lk_pad, 0), _pad_axis(v, 2, lk_pad, 0)
  q_pos = _positions(q_positions, lq, lq_pad)
  k_pos = _positions(k_positions, lk, lk_pad)
  if mask is not None:
    if mask.shape[2] != 1:
      mask = _pad_axis(mask, 2, lq_pad, True)
    if mask.shape[3] != 1:
      mask = _pad_axis(mask, 3, lk_pad, False)
  if bias is not None:
    if bias.shape[2] != 1:
      bias = _pad_axis(bias, 2, lq_pad, 0)
    if bias.shape[3] != 1:
      bias = _pad_axis(bias, 3, lk_pad, 0)
  dropping = dropout_rate > 0 and dropout_rng is not None
  reach = getattr(relative, 'reach', None)
  own_block_logits = None
  if relative is not None and q_positions is None and k_positions is None:
    own_block_logits = relative.blockwise_logits(lq, lk, lq_pad, lk_pad)
  cx = _Call(b=b, h=h, lq=lq, lk=lk, qc=qc, kc=kc, causal=causal,
             relative=relative, reach=reach, own_block_logits=own_block_logits,
             mask=mask, bias=bias, dropout_rng=dropout_rng if dropping else None,
             keep_prob=1.0 - dropout_rate)
  keys = (jnp.arange(nk), _stack(k, kc), _stack(v, kc),
          jnp.moveaxis(k_pos.reshape(k_pos.shape[0], nk, kc), 1, 0))
  qpos_blocks = jnp.moveaxis(q_pos.reshape(q_pos.shape[0], nq, qc), 1, 0)
  out = jax.lax.map(functools.partial(_query_block, cx, keys, v.shape[-1]),
                    (jnp.arange(nq), _stack(q, qc), qpos_blocks))
  out = jnp.moveaxis(out, 0, 2).reshape(b, h, lq_pad, -1)[:, :, :lq]
  return out.astype(v.dtype)


# --------------------------------------------------------------------------
# One query block against every key block (the online softmax).
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class _Call:
  """What every block of one chunked_attention call shares: sizes, the
  padded mask and bias, the encoding, dropout (dropout_rng None: off)."""
  b: int
  h: int
  lq: int
  lk: int
  qc: int
  kc: int
  causal: bool
  relative: Any
  reach: int | None
  own_block_logits: Callable | None
  mask: jax.Array | None
  bias: jax.Array | None
  dropout_rng: jax.Array | None
  keep_prob: float


def _stack(x: jax.Array, chunk: int) -> jax.Array:
  """(B, H, n * chunk, ...) -> (n, B, H, chunk, ...): blocks to iterate."""
  return jnp.moveaxis(x.reshape(*x.shape[:2], -1, chunk, *x.shape[3:]), 2, 0)


def _query_block(cx: _Call, keys, width: int, xs) -> jax.Array:
  """(B, H, qc, width): query block i's output over every key block, each
  rematerialized in the backward (jax.checkpoint)."""
  i, q_blk, qpos_blk = xs
  carry = (jnp.zeros((cx.b, cx.h, cx.qc, width), jnp.float32),
           jnp.full((cx.b, cx.h, cx.qc, 1), -jnp.inf, jnp.float32),
           jnp.zeros((cx.b, cx.h, cx.qc, 1), jnp.float32))
  body = jax.checkpoint(
      lambda c, x: _key_step(cx, i, q_blk, qpos_blk, c, x), prevent_cse=False)
  (acc, _, l), _ = jax.lax.scan(body, carry, keys)
  return jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)


def _key_step(cx: _Call, i, q_blk, qpos_blk, carry, xs):
  """_attend_block, skipped for a key block wholly above the causal
  diagonal: its first key is later than the block's last query may see,
  so it would add p = 0 everywhere and leave the carry as it is."""
  if not cx.causal:
    return _attend_block(cx, i, q_blk, qpos_blk, carry, xs)
  above = xs[0] * cx.kc > i * cx.qc + (cx.qc - 1) + (cx.lk - cx.lq)
  return jax.lax.cond(above, lambda c, _: (c, None),
                      lambda c, x: _attend_block(cx, i, q_blk, qpos_blk, c, x),
                      carry, xs)


def _attend_block(cx: _Call, i, q_blk, qpos_blk, carry, xs):
  """One online-softmax update of (acc, m, l) by key block j."""
  acc, m, l = carry
  j, k_blk, v_blk, kpos_blk = xs
  side = _far_side(cx.reach, qpos_blk, kpos_blk)
  s = _block_scores(cx, i, j, q_blk, k_blk, qpos_blk, kpos_blk, side)
  # The result does not depend on m, so its gradient is exactly zero.
  m_new = jax.lax.stop_gradient(jnp.maximum(m, s.max(-1, keepdims=True)))
  m_safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
  p = jnp.exp(s - m_safe)                       # masked entries: exp(-inf) = 0
  alpha = jnp.exp(m - m_safe)                   # m = -inf (nothing yet): 0
  l = alpha * l + p.sum(-1, keepdims=True)
  if cx.dropout_rng is not None:
    key = jax.random.fold_in(jax.random.fold_in(cx.dropout_rng, i), j)
    p = jnp.where(jax.random.bernoulli(key, cx.keep_prob, p.shape),
                  p / cx.keep_prob, 0.0)
  pv = jnp.einsum('bhqk,bhkd->bhqd', p.astype(v_blk.dtype), v_blk,
                  preferred_element_type=jnp.float32)
  relative = cx.relative
  if relative is not None:            # a None value term is skipped
    extra = _term(side, lambda: relative.values(p, v_blk, qpos_blk, kpos_blk),
                  lambda: relative.values(p.sum(-1, keepdims=True),
                                          v_blk[:, :, :1],
                                          *_edge_positions(side, cx.reach)),
                  (cx.b, cx.h, cx.qc, v_blk.shape[-1]))
    if extra is not None:
      pv = pv + extra
  return (alpha * acc + pv, m_new, l), None


def _block_scores(cx: _Call, i, j, q_blk, k_blk, qpos_blk, kpos_blk, side):
  """(B, H, qc, kc) float32 logits of query block i and key block j: q.k,
  the encoding's term (its edge value on a far block), the bias; -inf
  where the key is padding, in the causal future or masked."""
  qc, kc, relative = cx.qc, cx.kc, cx.relative
  s = jnp.einsum('bhqd,bhkd->bhqk', q_blk, k_blk,
                 preferred_element_type=jnp.float32)
  if relative is not None:
    if cx.own_block_logits is not None:
      near = lambda: cx.own_block_logits(q_blk, k_blk, i * qc, j * kc)
    else:
      near = lambda: relative.logits(q_blk, k_blk, qpos_blk, kpos_blk)
    extra = _term(side, near,
                  lambda: relative.logits(q_blk, k_blk[:, :, :1],
                                          *_edge_positions(side, cx.reach)),
                  (cx.b, cx.h, qc, kc))
    if extra is not None:
      s = s + extra
  if cx.bias is not None:
    s = s + _block(_block(cx.bias, 2, i * qc, qc), 3, j * kc, kc).astype(
        jnp.float32)
  q_index = i * qc + jnp.arange(qc)[:, None]
  k_index = j * kc + jnp.arange(kc)[None, :]
  keep = k_index < cx.lk
  if cx.causal:
    keep = keep & (k_index <= q_index + (cx.lk - cx.lq))
  keep = keep[None, None]
  if cx.mask is not None:
    keep = keep & _block(_block(cx.mask, 2, i * qc, qc), 3, j * kc, kc)
  return jnp.where(keep, s, -jnp.inf)

"""Every positional encoding, looked up by name.

Absolute encodings (`none`, `sinusoidal`, `learned`) are added to the token
embeddings once, before the first layer. Relative encodings (`shaw`, `huang`,
`rope`, `pope`, `alibi`, `t5`, `xl`) act inside every attention layer through three hooks
that `attention.dot_product_attention` calls:

  rotate(q, k, q_pos, k_pos) -> (q, k)   rotary rotates queries and keys
                               (PoPE maps them to 2D polar features; the
                               softmax scale stays 1/sqrt(D) of the input);
  logits(q, k, q_pos, k_pos) -> (.., Lq, Lk)  a term added to the scaled
                               logits (q arrives already scaled by 1/sqrt(D));
  values(w, v, q_pos, k_pos) -> (B, H, Lq, D) a term added to the attention
                               output (Shaw).

Positions: q_pos (B, Lq) and k_pos (B, Lk) int32, or None for 0..L-1. Explicit
positions serve randomized positional encodings (Ruoss et al. 2023: a sorted
random subset of a larger range) and decoding against cached keys. Offsets are
`k_pos - q_pos` (key position minus query position) everywhere; with None,
`j - i`. Padding never moves the offset between two valid tokens, so relative
encodings give the same outputs for a left-padded sequence as for the unpadded
one. With positions None every encoding runs exactly the code it ran before
positions existed (bit for bit).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from selfattn.attention import dropout_layer
from selfattn.bounded import BoundedParam
from selfattn.bounded import clamp


# --------------------------------------------------------------------------
# Absolute encodings.
# --------------------------------------------------------------------------

def sinusoidal_table(num_steps: int, num_hiddens: int, dtype=jnp.float32
                     ) -> jax.Array:
  """The chapter's table: P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(.).

  Returns (num_steps, num_hiddens). Works for odd num_hiddens (the last column
  is a sine) and for any number of steps: it is a formula, not a parameter.
  """
  return sinusoid_at(jnp.arange(num_steps), num_hiddens, dtype)


def sinusoid_at(positions: jax.Array, num_hiddens: int, dtype=jnp.float32
                ) -> jax.Array:
  """Rows of the chapter's table at any positions: (...,) -> (..., num_hiddens)."""
  position = jnp.asarray(positions, jnp.float32)[..., None]
  column = jnp.arange(num_hiddens)
  even_column = (column - column % 2).astype(jnp.float32)   # 2j for 2j and 2j+1
  angle = position / jnp.power(10000.0, even_column / num_hiddens)
  return jnp.where(column % 2 == 0, jnp.sin(angle), jnp.cos(angle)).astype(dtype)


class SinusoidalEncoding(nnx.Module):
  """d2l's PositionalEncoding: X + P[:, :L], then dropout.

  X: (B, L, num_hiddens) -> (B, L, num_hiddens). `P` is (1, max_len,
  num_hiddens); sequences longer than max_len still work because the table is
  computed from the formula for the length it is given.

  Args: num_hiddens (the model width), dropout rate, max_len (rows of `P`),
  rngs ('dropout' stream only when dropout > 0).
  """

  def __init__(self, num_hiddens: int, dropout: float = 0.0,
               max_len: int = 1000, *, rngs: nnx.Rngs):
    self.num_hiddens = num_hiddens
    self.max_len = max_len
    self.dropout = dropout_layer(dropout, rngs)

  @property
  def P(self) -> jax.Array:
    return sinusoidal_table(self.max_len, self.num_hiddens)[None]

  trainable = False     # its picture never changes: TensorBoard logs it once

  def table(self, length: int) -> jax.Array:
    """(length, num_hiddens) rows of P, computed for any length."""
    return sinusoidal_table(length, self.num_hiddens)

  def picture(self) -> jax.Array:
    """(positions, num_hiddens): the first 128 rows of P."""
    return self.table(min(self.max_len, 128))

  def __call__(self, X: jax.Array, *, positions: jax.Array | None = None,
               deterministic: bool | None = None) -> jax.Array:
    """X (B, L, num_hiddens) + P rows 0..L-1, or P rows at `positions` (B, L)."""
    if positions is None:
      X = X + self.table(X.shape[1]).astype(X.dtype)[None]
    else:
      X = X + sinusoid_at(positions, self.num_hiddens).astype(X.dtype)
    return self.dropout(X, deterministic=deterministic)


class LearnedEncoding(nnx.Module):
  """A trainable table P of shape (1, max_len, num_hiddens): X + P[:, :L], dropout.

  init='normal' draws N(0, 1/2), the mean square of the sinusoidal table, so
  both start with the same magnitude; init='sinusoidal' starts from the table.

  Args: num_hiddens, dropout rate, max_len (rows; longer inputs raise), init,
  param_dtype, rngs ('params'; 'dropout' when dropout > 0).
  """

  def __init__(self, num_hiddens: int, dropout: float = 0.0,
               max_len: int = 1000, *, init: str = 'normal',
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if init not in ('normal', 'sinusoidal'):
      raise ValueError(f'init={init!r} is unknown; valid: normal, sinusoidal')
    if init == 'normal':
      table = jax.random.normal(rngs.params(), (1, max_len, num_hiddens))
      table = table * math.sqrt(0.5)
    else:
      table = sinusoidal_table(max_len, num_hiddens)[None]
    self.max_len = max_len
    self.P = nnx.Param(table.astype(param_dtype))
    self.dropout = dropout_layer(dropout, rngs)

  trainable = True

  def picture(self) -> jax.Array:
    """(positions, num_hiddens): the first 128 rows of P."""
    return self.table(min(self.max_len, 128))

  def table(self, length: int) -> jax.Array:
    """(length, num_hiddens) rows of P; raises ValueError past max_len."""
    if length > self.max_len:
      raise ValueError(f'sequence length {length} exceeds the learned '
                       f'encoding max_len={self.max_len}')
    return self.P[0, :length]

  def __call__(self, X: jax.Array, *, positions: jax.Array | None = None,
               deterministic: bool | None = None) -> jax.Array:
    """X (B, L, num_hiddens) + P rows 0..L-1, or P rows at `positions` (B, L),
    which must lie in [0, max_len): concrete positions outside raise
    ValueError; traced ones (under jit, where a data-dependent check cannot
    raise) are clipped into range, so keep them in range upstream (config
    validation checks max_random_len)."""
    if positions is None:
      X = X + self.table(X.shape[1]).astype(X.dtype)[None]
    else:
      if not isinstance(positions, jax.core.Tracer):
        low, high = int(jnp.min(positions)), int(jnp.max(positions))
        if low < 0 or high >= self.max_len:
          raise ValueError(f'positions must lie in [0, max_len={self.max_len}) '
                           f'for the learned encoding; got values from {low} '
                           f'to {high}')
      X = X + jnp.take(self.P[0], positions, axis=0, mode='clip').astype(X.dtype)
    return self.dropout(X, deterministic=deterministic)


class NoEncoding(nnx.Module):
  """No position information: dropout only (so every variant sees dropout).

  Args: num_hiddens (unused, for a uniform signature), dropout rate, rngs.
  """

  trainable = False

  def __init__(self, num_hiddens: int, dropout: float = 0.0, *,
               rngs: nnx.Rngs):
    del num_hiddens
    self.dropout = dropout_layer(dropout, rngs)

  def picture(self) -> None:
    return None

  def __call__(self, X: jax.Array, *, positions: jax.Array | None = None,
               deterministic: bool | None = None) -> jax.Array:
    del positions
    return self.dropout(X, deterministic=deterministic)


# --------------------------------------------------------------------------
# Relative encodings.
# --------------------------------------------------------------------------

def relative_offsets(num_queries: int, num_keys: int) -> jax.Array:
  """(Lq, Lk) int32 matrix of offsets j - i."""
  return (jnp.arange(num_keys, dtype=jnp.int32)[None, :]
          - jnp.arange(num_queries, dtype=jnp.int32)[:, None])


def position_offsets(q_pos: jax.Array | None, k_pos: jax.Array | None,
                     num_queries: int, num_keys: int) -> jax.Array:
  """Offsets k_pos - q_pos: (Lq, Lk) when both are None, else (B, Lq, Lk).

  A None side counts 0..L-1.
  """
  if q_pos is None and k_pos is None:
    return relative_offsets(num_queries, num_keys)
  if q_pos is None:
    q_pos = jnp.arange(num_queries, dtype=jnp.int32)[None]
  if k_pos is None:
    k_pos = jnp.arange(num_keys, dtype=jnp.int32)[None]
  return (jnp.asarray(k_pos, jnp.int32)[:, None, :]
          - jnp.asarray(q_pos, jnp.int32)[:, :, None])


def _per_head(offsets_term: jax.Array) -> jax.Array:
  """(Lq, Lk) -> (1, 1, Lq, Lk); (B, Lq, Lk) -> (B, 1, Lq, Lk)."""
  return offsets_term[None, None] if offsets_term.ndim == 2 else offsets_term[:, None]


def gather_offsets(by_offset: jax.Array, index: jax.Array) -> jax.Array:
  """(B, H, Lq, R) values per offset bucket, (B, Lq, Lk) bucket per key ->
  (B, H, Lq, Lk)."""
  b, h, lq, _ = by_offset.shape
  index = jnp.broadcast_to(index[:, None], (b, h, lq, index.shape[-1]))
  return jnp.take_along_axis(by_offset, index, axis=-1)


def fold_by_bucket(weights: jax.Array, bucket: jax.Array, num_buckets: int
                   ) -> jax.Array:
  """Sums (B, H, Lq, Lk) weights into buckets given per key by (B, Lq, Lk):
  (B, H, Lq, num_buckets). One segment sum: O(B H Lq Lk), never
  (Lq, Lk, num_buckets)."""
  b, h, lq, lk = weights.shape
  row = jnp.arange(b * h * lq, dtype=jnp.int32).reshape(b, h, lq, 1)
  ids = row * num_buckets + jnp.broadcast_to(bucket[:, None], (b, h, lq, lk))
  folded = jax.ops.segment_sum(weights.reshape(-1), ids.reshape(-1),
                               num_segments=b * h * lq * num_buckets)
  return folded.reshape(b, h, lq, num_buckets)


def relative_to_absolute(x: jax.Array) -> jax.Array:
  """Huang et al.'s "skew": (..., L, 2L-1) by offset -> (..., L, L) by key.

  Column c of x holds offset c - (L - 1); the result is out[i, j] =
  x[i, j - i + L - 1]. One pad, two reshapes and a slice, no gather, no
  (L, L, D) tensor.
  """
  *lead, length, width = x.shape
  if width != 2 * length - 1:
    raise ValueError(f'expected (..., L, 2L-1); got {x.shape}')
  x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (0, 1)])   # (..., L, 2L)
  x = x.reshape(*lead, length * 2 * length)
  x = x[..., length - 1: length - 1 + length * (2 * length - 1)]
  return x.reshape(*lead, length, 2 * length - 1)[..., :length]


def causal_relative_to_absolute(x: jax.Array) -> jax.Array:
  """Music Transformer's causal skew: (..., L, L) by offset -> (..., L, L) by
  key, for keys at or before the query.

  Column c of x holds offset c - (L - 1) (offsets -(L-1)..0); the result has
  out[i, j] = x[i, j - i + L - 1] for j <= i. Entries above the diagonal are
  leftovers that a causal mask must hide. Pad one column on the left,
  reshape to (L + 1, L), drop the first row (Huang et al. 2018, sec. 3.4.1):
  O(L D + L^2) memory with L rather than 2L - 1 offsets.
  """
  *lead, length, width = x.shape
  if width != length:
    raise ValueError(f'expected (..., L, L); got {x.shape}')
  x = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])   # (..., L, L+1)
  return x.reshape(*lead, length + 1, length)[..., 1:, :]


class RelativePosition(nnx.Module):
  """Base class: a relative encoding that changes nothing (override hooks).

  `picture()` is a 2-D view of what the encoding learned (rows: offsets or
  buckets) for TensorBoard, or None when it has no table; `trainable` says
  whether that picture can change during training.
  """

  trainable = False
  # An offset distance at and beyond which the logit term depends only on
  # the query and the offset's sign, and the value term only on the summed
  # weights (clipped or bucketed tables); None when terms never stop changing.
  # The chunked path computes blocks wholly beyond it from one edge key.
  reach: int | None = None

  def picture(self) -> jax.Array | None:
    return None

  def rotate(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    return q, k

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array | None:
    return None

  def values(self, weights: jax.Array, v: jax.Array,
             q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array | None:
    return None

  def blockwise_logits(self, num_queries: int, num_keys: int,
                       padded_queries: int, padded_keys: int):
    """The logit term per block for the chunked path on default positions.

    Called once per attention call when no positions are given (queries at
    0..Lq-1, keys at 0..Lk-1; the blocks pad them to padded_queries and
    padded_keys, continuing the count). Returns None to have each block call
    `logits` with its own positions, which is exact for every encoding whose
    default path equals its positions path; or a function
    (q_blk, k_blk, q_start, k_start) -> (B, H, qc, kc) for an encoding whose
    default path cannot be written with positions (XL's unbounded offsets).
    """
    return None


def _table_init(stddev: float = 0.5):
  # Relative tables start clearly non-zero so position information exists at
  # initialisation (a zero table would leave the model permutation-equivariant).
  return nnx.initializers.normal(stddev)


class ShawRelative(RelativePosition):
  """Shaw, Uszkoreit & Vaswani (2018) relative position representations.

  Offsets are clipped to [-k, k]; tables a^K and a^V have 2k+1 rows of width
  D (one table shared by all heads, as in the paper, or one per head).
    e_ij = q_i . (k_j + a^K[clip(j-i)]) / sqrt(D)
    z_i  = sum_j alpha_ij (v_j + a^V[clip(j-i)])
  Never builds the (L, L, D) tensor: the key term is q against the 2k+1 rows,
  gathered to (Lq, Lk); the value term folds alpha into 2k+1 buckets first.

  Args: num_heads, head_dim D, clip_distance k, relative_values (learn a^V),
  shared_heads (one table for all heads), param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, clip_distance: int = 16,
               relative_values: bool = True, shared_heads: bool = True,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if clip_distance < 1:
      raise ValueError(f'clip_distance must be >= 1; got {clip_distance}')
    self.clip_distance = clip_distance
    self.shared_heads = shared_heads
    shape = ((2 * clip_distance + 1, head_dim) if shared_heads
             else (num_heads, 2 * clip_distance + 1, head_dim))
    init = _table_init()
    self.a_K = nnx.Param(init(rngs.params(), shape, param_dtype))
    self.a_V = (nnx.Param(init(rngs.params(), shape, param_dtype))
                if relative_values else None)

  trainable = True

  @property
  def reach(self) -> int:
    return self.clip_distance          # offsets beyond +-k share the edge rows

  def picture(self) -> jax.Array:
    """(offsets -k..k [x heads], D): the key table a^K."""
    table = self.a_K[...]
    return table.reshape(-1, table.shape[-1])

  @property
  def fusable(self) -> bool:
    """The value term a^V needs the weights themselves: no fused kernel."""
    return self.a_V is None

  def _against_table(self, x: jax.Array, table: jax.Array) -> jax.Array:
    # (B, H, L, D) x table -> (B, H, L, 2k+1)
    table = table.astype(x.dtype)
    if self.shared_heads:
      return jnp.einsum('bhqd,rd->bhqr', x, table)
    return jnp.einsum('bhqd,hrd->bhqr', x, table)

  def _bucket(self, q_pos, k_pos, lq: int, lk: int) -> jax.Array:
    k_ = self.clip_distance
    return jnp.clip(position_offsets(q_pos, k_pos, lq, lk), -k_, k_) + k_

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    lq, lk = q.shape[2], k.shape[2]
    q_dot_a = self._against_table(q, self.a_K[...])            # (B, H, Lq, 2k+1)
    bucket = self._bucket(q_pos, k_pos, lq, lk)                # (Lq|B.., Lk)
    if bucket.ndim == 3:
      return gather_offsets(q_dot_a, bucket)
    rows = jnp.arange(lq)[:, None]
    return q_dot_a[:, :, rows, bucket]                          # (B, H, Lq, Lk)

  def fold_weights(self, weights: jax.Array) -> jax.Array:
    """(B, H, Lq, Lk) attention weights -> (B, H, Lq, 2k+1) per clipped offset."""
    lq, lk = weights.shape[-2:]
    k_ = self.clip_distance
    offsets = relative_offsets(lq, lk)
    # Offsets at or beyond the clip fall into the two edge buckets.
    left = jnp.sum(jnp.where(offsets <= -k_, weights, 0), axis=-1)
    right = jnp.sum(jnp.where(offsets >= k_, weights, 0), axis=-1)
    # Each interior offset r in (-k, k) meets at most one key: j = i + r.
    inner = jnp.arange(-k_ + 1, k_)
    key = jnp.arange(lq)[:, None] + inner[None, :]              # (Lq, 2k-1)
    in_range = (key >= 0) & (key < lk)
    gathered = weights[..., jnp.arange(lq)[:, None], jnp.clip(key, 0, lk - 1)]
    middle = jnp.where(in_range, gathered, 0)
    return jnp.concatenate([left[..., None], middle, right[..., None]], axis=-1)

  def values(self, weights: jax.Array, v: jax.Array,
             q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array | None:
    if self.a_V is None:
      return None
    if q_pos is None and k_pos is None:
      folded = self.fold_weights(weights)                     # (B, H, Lq, 2k+1)
    else:
      lq, lk = weights.shape[-2:]
      folded = fold_by_bucket(weights, self._bucket(q_pos, k_pos, lq, lk),
                              2 * self.clip_distance + 1)
    folded = folded.astype(v.dtype)
    table = self.a_V[...].astype(v.dtype)
    spec = 'bhqr,rd->bhqd' if self.shared_heads else 'bhqr,hrd->bhqd'
    return jnp.einsum(spec, folded, table)


class HuangRelative(RelativePosition):
  """Music Transformer (Huang et al. 2018) relative logits, bidirectional.

  One learned embedding per offset in [-(max_len-1), max_len-1] (unclipped
  within max_len; longer sequences reuse the edge rows). S_rel = Q E^T is
  (L, 2L-1) and is skewed into (L, L): memory O(L D + L^2), not O(L^2 D).
  Without positions, self-attention only (Lq == Lk); with explicit positions
  (randomized encodings, cached decoding) any Lq, Lk.

  causal=True (set by decoders) uses the paper's memory-saving causal skew:
  only the L offsets -(L-1)..0, and the caller's causal mask hides the rest.

  Args: num_heads, head_dim D, max_len (offsets within +-(max_len-1) get their
  own row), shared_heads, causal, param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, max_len: int = 1024,
               shared_heads: bool = False, causal: bool = False,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.max_len = max_len
    self.causal = causal
    self.shared_heads = shared_heads
    rows = 2 * max_len - 1
    shape = (rows, head_dim) if shared_heads else (num_heads, rows, head_dim)
    self.E = nnx.Param(_table_init()(rngs.params(), shape, param_dtype))

  trainable = True

  @property
  def reach(self) -> int:
    return self.max_len - 1            # longer offsets reuse the edge rows

  def picture(self) -> jax.Array:
    """([heads x] offsets -(max_len-1)..(max_len-1), D): the table E."""
    table = self.E[...]
    return table.reshape(-1, table.shape[-1])

  def embeddings(self, length: int) -> jax.Array:
    """Rows for offsets -(L-1)..(L-1): (2L-1, D), or (H, 2L-1, D) per head."""
    table = self.E[...]
    if length <= self.max_len:
      start = self.max_len - length
      return table[..., start:start + 2 * length - 1, :]
    offsets = jnp.clip(jnp.arange(-(length - 1), length),
                       -(self.max_len - 1), self.max_len - 1)
    return jnp.take(table, offsets + self.max_len - 1, axis=-2)

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    if q_pos is not None or k_pos is not None:
      # Any positions: q against every row, then gather each key's offset
      # (clipped to the table, like the skew path beyond max_len).
      spec = 'bhqd,rd->bhqr' if self.shared_heads else 'bhqd,hrd->bhqr'
      by_offset = jnp.einsum(spec, q, self.E[...].astype(q.dtype))
      reach = self.max_len - 1
      offsets = position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
      return gather_offsets(by_offset, jnp.clip(offsets, -reach, reach) + reach)
    length = q.shape[2]
    if k.shape[2] != length:
      raise ValueError('huang relative attention needs self-attention '
                       f'(Lq == Lk); got {length} and {k.shape[2]}')
    table = self.embeddings(length).astype(q.dtype)
    spec = 'bhqd,rd->bhqr' if self.shared_heads else 'bhqd,hrd->bhqr'
    if self.causal:   # offsets -(L-1)..0 are the table's first L rows
      return causal_relative_to_absolute(
          jnp.einsum(spec, q, table[..., :length, :]))
    return relative_to_absolute(jnp.einsum(spec, q, table))


class RotaryEncoding(RelativePosition):
  """RoPE (Su et al.): rotate dimension pairs (2j, 2j+1) by position * theta_j.

  theta_j = base^(-2j/D), the chapter's frequencies; q_i . k_j then depends on
  j - i only. With odd D the last dimension is left unrotated.

  Args: head_dim D, rope_base (10000: the chapter's frequencies). No parameters.
  """

  def __init__(self, head_dim: int, *, rope_base: float = 10000.0):
    if not rope_base > 0:
      raise ValueError(f'rope_base must be > 0; got {rope_base}')
    self.head_dim = head_dim
    self.rope_base = rope_base

  def _rotate(self, x: jax.Array, pos: jax.Array | None = None) -> jax.Array:
    length, d = x.shape[-2], x.shape[-1]
    pairs = d // 2
    theta = self.rope_base ** (-2.0 * jnp.arange(pairs) / d)
    if pos is None:
      angle = jnp.arange(length, dtype=jnp.float32)[:, None] * theta[None, :]
    else:   # (B, L) -> (B, 1, L, pairs), broadcast over heads
      angle = (jnp.asarray(pos, jnp.float32)[:, None, :, None]
               * theta[None, None, None, :])
    cos, sin = jnp.cos(angle).astype(x.dtype), jnp.sin(angle).astype(x.dtype)
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos],
                        axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return jnp.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)

  def rotate(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    return self._rotate(q, q_pos), self._rotate(k, k_pos)


POPE_DELTA_INITS = ('zero', 'uniform')


class PolarEncoding(RelativePosition):
  """PoPE (Gopalakrishnan, Csordas, Schmidhuber & Mozer, ICML 2026, arXiv
  2509.10534): RoPE without its what-where interaction term.

  Every one of the D elements of a query (key) becomes one complex number
  (D frequencies, not RoPE's D/2 pairs):
    magnitude  softplus(q_tc)          softplus(k_sc)            (eq. 3)
    phase      t * theta_c             s * theta_c + delta_c     (eqs. 4, 8)
    theta_c = base^(-(c-1)/D), c = 1..D (RoPE's frequency range, twice as
  many frequencies). The logit is Re(q~^H k~) = sum_c x_q x_k + y_q y_k
  (eq. 10) = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c +
  delta_c): the content enters only through the non-negative magnitudes, the
  position only through the phase, so the score of a key at a given offset
  no longer depends on the angle of its content (RoPE's entangling term).

  Head dimension and values: `rotate` maps queries and keys of width D to
  2D real features [mu cos(phi), mu sin(phi)] (concatenated halves), so the
  logit is an ordinary dot product and every attention path (plain, fused,
  chunked, cached decoding, explicit or randomized positions) runs it
  unchanged. The softmax scale stays 1/sqrt(D) of the projected head (as the
  reference code), not 1/sqrt(2D): attention takes the scale from the width
  before `rotate`. Values are not touched and keep width D; the model's
  width and head count are unchanged, so PoPE's logits cost one (L, L, 2D)
  contraction per head instead of RoPE's (L, L, D) (BENCHMARKS.md measures
  it).

  delta (H, D) is a learned phase bias per head and frequency, one per layer
  (as the paper's figures plot it), kept in [-2*pi, 0]: it is a
  `bounded.BoundedParam`, clamped in the forward pass and projected back
  into the interval after every optimiser step (steps.train_step). Init
  'zero' (the paper: important for length generalization) or 'uniform'
  (Uniform(-2*pi, 0): slightly better in-distribution fit).

  Args: num_heads, head_dim D, rope_base (theta, 10000), delta_init,
  param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *,
               rope_base: float = 10000.0, delta_init: str = 'zero',
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if not rope_base > 0:
      raise ValueError(f'rope_base must be > 0; got {rope_base}')
    if delta_init not in POPE_DELTA_INITS:
      raise ValueError(f'pope_delta_init={delta_init!r} is unknown; valid: '
                       f'{", ".join(POPE_DELTA_INITS)}')
    self.head_dim = head_dim
    self.rope_base = rope_base
    shape = (num_heads, head_dim)
    if delta_init == 'zero':
      delta = jnp.zeros(shape, param_dtype)
    else:
      delta = jax.random.uniform(rngs.params(), shape, param_dtype,
                                 minval=-2 * math.pi, maxval=0.0)
    self.delta = BoundedParam(delta, bounds=(-2 * math.pi, 0.0))

  trainable = True

  def picture(self) -> jax.Array:
    """(heads, frequencies): the phase bias delta."""
    return clamp(self.delta)

  def frequencies(self) -> jax.Array:
    """theta_c = base^(-(c-1)/D), c = 1..D: (D,) float32."""
    d = self.head_dim
    return self.rope_base ** (-jnp.arange(d, dtype=jnp.float32) / d)

  def _polar(self, x: jax.Array, pos: jax.Array | None,
             phase_bias: jax.Array | None) -> jax.Array:
    """(B, H, L, D) -> (B, H, L, 2D): [softplus(x) cos(phi), softplus(x) sin(phi)]."""
    length = x.shape[-2]
    theta = self.frequencies()
    if pos is None:
      angle = jnp.arange(length, dtype=jnp.float32)[:, None] * theta  # (L, D)
    else:   # (B, L) -> (B, 1, L, D), broadcast over heads
      angle = jnp.asarray(pos, jnp.float32)[:, None, :, None] * theta
    if phase_bias is not None:        # (H, D) -> (H, 1, D)
      angle = angle + phase_bias[:, None, :]
    magnitude = jax.nn.softplus(x.astype(jnp.float32))
    polar = jnp.concatenate([magnitude * jnp.cos(angle),
                             magnitude * jnp.sin(angle)], axis=-1)
    return polar.astype(x.dtype)

  def rotate(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Queries (B, H, Lq, D), keys (B, H, Lk, D) -> (B, H, L, 2D) each; the
    phase bias delta goes on the keys (eq. 8)."""
    return (self._polar(q, q_pos, None),
            self._polar(k, k_pos, clamp(self.delta)))


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al.'s head slopes (`get_slopes` in the ALiBi code, as
  `_get_alibi_slopes` in the randomized-positional-encodings code).

  H a power of two: 2^(-8h/H), h = 1..H. Otherwise the slopes of the closest
  smaller power of two n, then every other slope of 2n for the remaining
  H - n heads (H=3: [1/16, 1/256, 1/4]).
  """
  if num_heads < 1:
    raise ValueError(f'num_heads={num_heads} must be positive')
  n = 1 << (num_heads.bit_length() - 1)      # the largest power of 2 <= H
  slopes = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
  if n == num_heads:
    return slopes
  extra = 2.0 ** (-8.0 * np.arange(1, 2 * n + 1) / (2 * n))
  return np.concatenate([slopes, extra[0::2][:num_heads - n]])


class ALiBi(RelativePosition):
  """ALiBi (Press et al.), bidirectional, added to the scaled logits.

  Default: the reference suite's asymmetric form (Ruoss et al.'s code), which
  tells left from right: for offset o = key - query,
      bias = -slope_h * o               for o >= 0 (the query and keys right)
      bias = -slope_h * (|o| - 0.5)     for o < 0  (keys left)
  symmetric=True gives -slope_h * |o|, under which an encoder is exactly
  reversal-equivariant (it cannot tell a string from its reverse, so it cannot
  solve sort or odds_first); the asymmetric form is the default because the
  published numbers used it.

  Args: num_heads (slopes: alibi_slopes), symmetric. No parameters.
  """

  def __init__(self, num_heads: int, *, symmetric: bool = False):
    self.num_heads = num_heads
    self.symmetric = symmetric

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    offsets = position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
    distance = jnp.abs(offsets).astype(jnp.float32)
    if not self.symmetric:
      distance = distance - 0.5 * (offsets < 0)
    slopes = jnp.asarray(alibi_slopes(self.num_heads), jnp.float32)
    return -slopes[None, :, None, None] * _per_head(distance)


def xl_sinusoid(offsets: jax.Array, width: int) -> jax.Array:
  """Transformer-XL's relative embedding phi: [sin(p w), cos(p w)]
  concatenated (not interleaved), w_i = 10000^(-2i/width). (R,) -> (R, width)."""
  inv_freq = 10000.0 ** (-2.0 * jnp.arange(width // 2) / width)
  angle = jnp.asarray(offsets, jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


class TransformerXLRelative(RelativePosition):
  """Transformer-XL relative attention (Dai et al. 2019), as the reference
  suite computes it, non-causal: for query t and key s,

    logit = ((q_t + u_h) . k_s + (q_t + v_h) . R_h(s - t)) / sqrt(D)

  R = phi(offset) W_r (phi: xl_sinusoid over the model width H*D; W_r one
  learned projection per layer, split into heads); u, v (H, D) learned global
  biases, initialised N(0, 0.02). The content term q.k is the attention's own;
  this hook adds the rest. Offsets are key minus query, unbounded on the
  default path (Lq == Lk); explicit positions or Lq != Lk clip offsets to
  +-(max_len - 1).

  Args: num_heads, head_dim D, max_len (offset range when clipped),
  param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, max_len: int = 1024,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    width = num_heads * head_dim
    self.num_heads, self.head_dim, self.max_len = num_heads, head_dim, max_len
    self.W_r = nnx.Linear(width, width, use_bias=False,
                          param_dtype=param_dtype, rngs=rngs)
    init = nnx.initializers.normal(0.02)
    self.u = nnx.Param(init(rngs.params(), (num_heads, head_dim), param_dtype))
    self.v = nnx.Param(init(rngs.params(), (num_heads, head_dim), param_dtype))

  trainable = True

  def picture(self) -> jax.Array:
    """(offsets -16..16, H * D): the projected relative embeddings R."""
    return self.embeddings(jnp.arange(-16, 17)).reshape(33, -1)

  def embeddings(self, offsets: jax.Array) -> jax.Array:
    """R for (R,) offsets: (R, H, D)."""
    phi = xl_sinusoid(offsets, self.num_heads * self.head_dim)
    return self.W_r(phi).reshape(-1, self.num_heads, self.head_dim)

  def _content_bias_and_query(self, q: jax.Array, k: jax.Array):
    """u . k_s as (B, H, 1, Lk), and q + v (B, H, Lq, D); q arrives scaled
    by 1/sqrt(D), so u and v are scaled alike."""
    scale = 1.0 / math.sqrt(self.head_dim)
    u = (self.u[...] * scale).astype(q.dtype)
    v = (self.v[...] * scale).astype(q.dtype)
    content_bias = jnp.einsum('hd,bhkd->bhk', u, k)[:, :, None, :]
    return content_bias, q + v[None, :, None, :]

  def blockwise_logits(self, num_queries: int, num_keys: int,
                       padded_queries: int, padded_keys: int):
    """The default path's unbounded offsets, per block: R for every offset
    the padded blocks can meet is projected once (O(L) rows, as the default
    path does), and a block of queries from q_start and keys from k_start
    reads its qc + kc - 1 consecutive rows and skews them to (qc, kc). Lq !=
    Lk returns None: the default path clips there, like the positions path."""
    if num_queries != num_keys:
      return None
    first = -(padded_queries - 1)
    table = self.embeddings(jnp.arange(first, padded_keys))

    def term(q, k, q_start, k_start):
      qc, kc = q.shape[2], k.shape[2]
      content_bias, qv = self._content_bias_and_query(q, k)
      # Row r holds offset (k_start - q_start - (qc - 1)) + r, so query a
      # and key b (offset k_start + b - q_start - a) read row b - a + qc - 1.
      rows = jax.lax.dynamic_slice_in_dim(
          table, k_start - q_start - (qc - 1) - first, qc + kc - 1, axis=0)
      by_offset = jnp.einsum('bhqd,rhd->bhqr', qv, rows.astype(q.dtype))
      index = jnp.arange(kc)[None, :] - jnp.arange(qc)[:, None] + qc - 1
      return content_bias + gather_offsets(by_offset, index[None])

    return term

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    content_bias, qv = self._content_bias_and_query(q, k)
    lq, lk = q.shape[2], k.shape[2]
    if q_pos is None and k_pos is None and lq == lk:
      table = self.embeddings(jnp.arange(-(lq - 1), lq)).astype(q.dtype)
      rel = relative_to_absolute(jnp.einsum('bhqd,rhd->bhqr', qv, table))
    else:
      reach = self.max_len - 1
      table = self.embeddings(jnp.arange(-reach, reach + 1)).astype(q.dtype)
      offsets = position_offsets(q_pos, k_pos, lq, lk)
      index = jnp.clip(offsets, -reach, reach) + reach
      if index.ndim == 2:
        index = index[None]
      by_offset = jnp.einsum('bhqd,rhd->bhqr', qv, table)
      rel = gather_offsets(by_offset, jnp.broadcast_to(
          index, (q.shape[0],) + index.shape[1:]))
    return content_bias + rel


def t5_bucket(offset: jax.Array, num_buckets: int = 32,
              max_distance: int = 128) -> jax.Array:
  """T5's bidirectional relative-position bucket of offset j - i.

  Half the buckets per direction (the upper half for keys after the query);
  within a direction, distances below num_buckets/4 get exact buckets, larger
  ones log-spaced buckets up to max_distance, and the last bucket takes the rest.
  """
  half = num_buckets // 2
  bucket = jnp.where(offset > 0, half, 0)
  distance = jnp.abs(offset)
  max_exact = half // 2
  log_ratio = (jnp.log(jnp.maximum(distance, 1).astype(jnp.float32) / max_exact)
               / math.log(max_distance / max_exact))
  large = max_exact + (log_ratio * (half - max_exact)).astype(jnp.int32)
  large = jnp.minimum(large, half - 1)
  return bucket + jnp.where(distance < max_exact, distance, large)


class T5RelativeBias(RelativePosition):
  """T5 relative bias: one learned scalar per head per bucket, added to logits.

  Args: num_heads, num_buckets (even, >= 4; half per direction), max_distance
  (distances beyond it share the last bucket), param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, *, num_buckets: int = 32,
               max_distance: int = 128, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if num_buckets < 4 or num_buckets % 2:
      raise ValueError(f'num_buckets must be even and >= 4; got {num_buckets}')
    if max_distance <= num_buckets // 4:
      raise ValueError(f'max_distance must be > num_buckets / 4 = '
                       f'{num_buckets // 4} (the exact buckets); got '
                       f'{max_distance}')
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.bias = nnx.Param(
        _table_init()(rngs.params(), (num_buckets, num_heads), param_dtype))

  trainable = True

  @property
  def reach(self) -> int:
    return self.max_distance           # distances beyond share the last bucket

  def picture(self) -> jax.Array:
    """(buckets, heads): the learned bias per bucket."""
    return self.bias[...]

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    buckets = t5_bucket(position_offsets(q_pos, k_pos, q.shape[2], k.shape[2]),
                        self.num_buckets, self.max_distance)
    bias = self.bias[...][buckets]                      # (B.., Lq, Lk, H)
    if buckets.ndim == 2:
      return jnp.moveaxis(bias, -1, 0)[None]             # (1, H, Lq, Lk)
    return jnp.moveaxis(bias, -1, 1)                     # (B, H, Lq, Lk)


# --------------------------------------------------------------------------
# Lookup by name.
# --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PositionKind:
  """How one encoding is built: absolute (added once) or relative (per layer)."""
  name: str
  relative: bool
  options: dict[str, Any]   # option name -> default
  build: Callable[..., nnx.Module]


POSITIONS: dict[str, PositionKind] = {
    kind.name: kind for kind in [
        PositionKind(
            'none', False, {},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs:
            NoEncoding(num_hiddens, dropout, rngs=rngs)),
        PositionKind(
            'sinusoidal', False, {},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs:
            SinusoidalEncoding(num_hiddens, dropout, max_len, rngs=rngs)),
        PositionKind(
            'learned', False, {'init': 'normal'},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs, **o:
            LearnedEncoding(num_hiddens, dropout, max_len,
                            param_dtype=param_dtype, rngs=rngs, **o)),
        PositionKind(
            'shaw', True,
            {'clip_distance': 16, 'relative_values': True,
             'shared_heads': True},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            ShawRelative(num_heads, head_dim, param_dtype=param_dtype,
                         rngs=rngs, **o)),
        PositionKind(
            'huang', True, {'shared_heads': False},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            HuangRelative(num_heads, head_dim, max_len=max_len,
                          param_dtype=param_dtype, rngs=rngs, **o)),
        PositionKind(
            'rope', True, {'rope_base': 10000.0},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            RotaryEncoding(head_dim, **o)),
        PositionKind(
            'pope', True, {'rope_base': 10000.0, 'pope_delta_init': 'zero'},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs,
            rope_base, pope_delta_init:
            PolarEncoding(num_heads, head_dim, rope_base=rope_base,
                          delta_init=pope_delta_init,
                          param_dtype=param_dtype, rngs=rngs)),
        PositionKind(
            'alibi', True, {'alibi_symmetric': False},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs,
            alibi_symmetric:
            ALiBi(num_heads, symmetric=alibi_symmetric)),
        PositionKind(
            'xl', True, {},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs:
            TransformerXLRelative(num_heads, head_dim, max_len=max_len,
                                  param_dtype=param_dtype, rngs=rngs)),
        PositionKind(
            't5', True, {'num_buckets': 32, 'max_distance': 128},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            T5RelativeBias(num_heads, param_dtype=param_dtype, rngs=rngs,
                           **o)),
    ]
}
POSITION_NAMES: tuple[str, ...] = tuple(POSITIONS)
RELATIVE_NAMES: tuple[str, ...] = tuple(n for n, k in POSITIONS.items()
                                        if k.relative)


def option_types() -> dict[str, type]:
  """Every encoding option and its type, from the registry above: the one
  list that configs/default.py (placeholders) and config validation read."""
  types: dict[str, type] = {}
  for kind in POSITIONS.values():
    for name, default in kind.options.items():
      types.setdefault(name, type(default))
  return types


def build_abstract(name: str, options: dict[str, Any], *, num_hiddens: int,
                   num_heads: int, max_len: int) -> None:
  """Builds the encoding without allocating anything (nnx.eval_shape), so
  its constructor's checks of its options run: the one place options are
  validated. Raises the constructor's ValueError."""
  kind, options = get_position(name, options)
  shared = dict(max_len=max_len, param_dtype=jnp.float32)
  if kind.relative:
    build = lambda: kind.build(num_heads=num_heads,
                               head_dim=num_hiddens // num_heads,
                               rngs=nnx.Rngs(0), **shared, **options)
  else:
    build = lambda: kind.build(num_hiddens=num_hiddens, dropout=0.0,
                               rngs=nnx.Rngs(0), **shared, **options)
  nnx.eval_shape(build)


def get_position(name: str, options: dict[str, Any] | None = None
                 ) -> tuple[PositionKind, dict[str, Any]]:
  """Looks up an encoding by name and checks its options.

  Returns the kind and its options with defaults filled in. Raises ValueError
  naming the valid encodings, or the valid options of this encoding.
  """
  if name not in POSITIONS:
    raise ValueError(f'unknown position encoding {name!r}; valid: '
                     f'{", ".join(POSITIONS)}')
  kind = POSITIONS[name]
  options = dict(options or {})
  unknown = sorted(set(options) - set(kind.options))
  if unknown:
    valid = ', '.join(kind.options) or 'none'
    raise ValueError(f'position encoding {name!r} takes no option(s) '
                     f'{", ".join(unknown)}; its options: {valid}')
  return kind, {**kind.options, **options}

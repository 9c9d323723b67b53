"""Offsets between positions, the skews and gathers that turn per-offset
terms into per-key ones, and the base class of every relative encoding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx


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

  An instance goes to one attention layer, `MultiHeadAttention(...,
  relative=encoding)` or `dot_product_attention(..., relative=)` (the
  stacks build one per layer from `position=`), which calls its hooks per
  head; positions q_pos (B, Lq) and k_pos (B, Lk) int, or None for 0..L-1:
    rotate(q (B, H, Lq, D), k (B, H, Lk, D), q_pos, k_pos) -> (q, k)
      (RoPE; PoPE returns 2D-wide features);
    logits(q scaled by 1/sqrt(D), k, q_pos, k_pos) -> a term broadcastable
      to (B, H, Lq, Lk) added to the scaled logits, or None;
    values(weights (B, H, Lq, Lk), v (B, H, Lk, Dv), q_pos, k_pos) -> a term
      (B, H, Lq, Dv) added to the output, or None (Shaw's a^V).

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

  def built_for(self) -> tuple[int | None, int | None]:
    """(heads, head width) this encoding's tables were made for; None where
    it takes any (MultiHeadAttention refuses one built for another shape)."""
    return None, None

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

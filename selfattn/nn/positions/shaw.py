"""Shaw, Uszkoreit & Vaswani (2018): learned key and value embeddings per
clipped offset."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.masks import check_flag
from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition
from selfattn.nn.positions.offsets import _table_init
from selfattn.nn.positions.offsets import fold_by_bucket
from selfattn.nn.positions.offsets import gather_offsets
from selfattn.nn.positions.offsets import position_offsets
from selfattn.nn.positions.offsets import relative_offsets


class ShawRelative(RelativePosition):
  """Shaw, Uszkoreit & Vaswani (2018) relative position representations.

  Offsets are clipped to [-k, k]; tables a^K and a^V have 2k+1 rows of width
  D (one table shared by all heads, as in the paper, or one per head).
    e_ij = q_i . (k_j + a^K[clip(j-i)]) / sqrt(D)
    z_i  = sum_j alpha_ij (v_j + a^V[clip(j-i)])
  Never builds the (L, L, D) tensor: the key term is q against the 2k+1 rows,
  gathered to (Lq, Lk); the value term folds alpha into 2k+1 buckets first.

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: logits and values, shapes in RelativePosition's docstring.

  Args: num_heads, head_dim D, clip_distance k, relative_values (learn a^V),
  shared_heads (one table for all heads), param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, clip_distance: int = 16,
               relative_values: bool = True, shared_heads: bool = True,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    num_heads = check_size(num_heads, 'num_heads')
    head_dim = check_size(head_dim, 'head_dim')
    clip_distance = check_size(clip_distance, 'clip_distance')
    relative_values = check_flag(relative_values, 'relative_values')
    shared_heads = check_flag(shared_heads, 'shared_heads')
    self.clip_distance = clip_distance
    self.shared_heads = shared_heads
    shape = ((2 * clip_distance + 1, head_dim) if shared_heads
             else (num_heads, 2 * clip_distance + 1, head_dim))
    init = _table_init()
    self.a_K = nnx.Param(init(rngs.params(), shape, param_dtype))
    self.a_V = (nnx.Param(init(rngs.params(), shape, param_dtype))
                if relative_values else None)

  trainable = True

  def built_for(self) -> tuple[int | None, int | None]:
    shape = self.a_K.shape       # (rows, D) shared, (H, rows, D) per head
    return (None if len(shape) == 2 else shape[0]), shape[-1]

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
    if v.shape[-1] != self.a_V.shape[-1]:
      # The term adds rows of a^V to the output: the value width is its.
      raise ValueError(f'Shaw\'s value table a^V is {self.a_V.shape[-1]} '
                       f'wide; v has width {v.shape[-1]} (relative_values '
                       f'needs values as wide as the keys)')
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

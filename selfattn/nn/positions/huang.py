"""The Music Transformer's relative logits (Huang et al. 2018), with its skew."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.masks import check_flag
from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition
from selfattn.nn.positions.offsets import _table_init
from selfattn.nn.positions.offsets import causal_relative_to_absolute
from selfattn.nn.positions.offsets import gather_offsets
from selfattn.nn.positions.offsets import position_offsets
from selfattn.nn.positions.offsets import relative_to_absolute


class HuangRelative(RelativePosition):
  """Music Transformer (Huang et al. 2018) relative logits, bidirectional.

  One learned embedding per offset in [-(max_len-1), max_len-1] (unclipped
  within max_len; longer sequences reuse the edge rows). S_rel = Q E^T is
  (L, 2L-1) and is skewed into (L, L): memory O(L D + L^2), not O(L^2 D).
  Without positions, self-attention only (Lq == Lk); with explicit positions
  (randomized encodings, cached decoding) any Lq, Lk.

  causal=True (set by decoders) uses the paper's memory-saving causal skew:
  only the L offsets -(L-1)..0, and the caller's causal mask hides the rest.

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: logits, shapes in RelativePosition's docstring.

  Args: num_heads, head_dim D, max_len (offsets within +-(max_len-1) get their
  own row), shared_heads, causal, param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, max_len: int = 1024,
               shared_heads: bool = False, causal: bool = False,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    num_heads = check_size(num_heads, 'num_heads')
    head_dim = check_size(head_dim, 'head_dim')
    max_len = check_size(max_len, 'max_len')    # 2 max_len - 1 table rows
    shared_heads = check_flag(shared_heads, 'shared_heads')
    causal = check_flag(causal, 'causal')
    self.max_len = max_len
    self.causal = causal
    self.shared_heads = shared_heads
    rows = 2 * max_len - 1
    shape = (rows, head_dim) if shared_heads else (num_heads, rows, head_dim)
    self.E = nnx.Param(_table_init()(rngs.params(), shape, param_dtype))

  trainable = True

  def built_for(self) -> tuple[int | None, int | None]:
    shape = self.E.shape       # (rows, D) shared, (H, rows, D) per head
    return (None if len(shape) == 2 else shape[0]), shape[-1]

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

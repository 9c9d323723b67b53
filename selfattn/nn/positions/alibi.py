"""ALiBi (Press et al.): a linear bias per head."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.nn.masks import check_flag
from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition
from selfattn.nn.positions.offsets import _per_head
from selfattn.nn.positions.offsets import position_offsets


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al.'s head slopes (`get_slopes` in the ALiBi code, as
  `_get_alibi_slopes` in the randomized-positional-encodings code).

  H a power of two: 2^(-8h/H), h = 1..H. Otherwise the slopes of the closest
  smaller power of two n, then every other slope of 2n for the remaining
  H - n heads (H=3: [1/16, 1/256, 1/4]).
  """
  num_heads = check_size(num_heads, 'num_heads')
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

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: logits, shapes in RelativePosition's docstring.

  Args: num_heads (slopes: alibi_slopes), symmetric. No parameters.
  """

  def __init__(self, num_heads: int, *, symmetric: bool = False):
    self.num_heads = check_size(num_heads, 'num_heads')
    self.symmetric = check_flag(symmetric, 'symmetric')

  def built_for(self) -> tuple[int | None, int | None]:
    return self.num_heads, None

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    offsets = position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
    distance = jnp.abs(offsets).astype(jnp.float32)
    if not self.symmetric:
      distance = distance - 0.5 * (offsets < 0)
    slopes = jnp.asarray(alibi_slopes(self.num_heads), jnp.float32)
    return -slopes[None, :, None, None] * _per_head(distance)

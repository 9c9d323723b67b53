"""T5 relative bias: a learned scalar per head per log-spaced bucket."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition
from selfattn.nn.positions.offsets import _table_init
from selfattn.nn.positions.offsets import position_offsets


def check_buckets(num_buckets: int, max_distance: int) -> None:
  """Refuses a bucketing whose buckets would not all be used or would go
  negative (half per direction, a quarter of them exact)."""
  # Integers first (32.0 failed as a table shape), then their ranges.
  check_size(num_buckets, 'num_buckets', None)
  check_size(max_distance, 'max_distance', None)
  if num_buckets < 4 or num_buckets % 2:
    raise ValueError(f'num_buckets must be even and >= 4; got {num_buckets}')
  if max_distance <= num_buckets // 4:
    raise ValueError(f'max_distance must be > num_buckets / 4 = '
                     f'{num_buckets // 4} (the exact buckets); got '
                     f'{max_distance}')


def t5_bucket(offset: jax.Array, num_buckets: int = 32,
              max_distance: int = 128) -> jax.Array:
  """T5's bidirectional relative-position bucket of offset j - i.

  Half the buckets per direction (the upper half for keys after the query);
  within a direction, distances below num_buckets/4 get exact buckets, larger
  ones log-spaced buckets up to max_distance, and the last bucket takes the rest.
  """
  check_buckets(num_buckets, max_distance)
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

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: logits, shapes in RelativePosition's docstring.

  Args: num_heads, num_buckets (even, >= 4; half per direction), max_distance
  (distances beyond it share the last bucket), param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, *, num_buckets: int = 32,
               max_distance: int = 128, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    check_buckets(num_buckets, max_distance)
    num_heads = check_size(num_heads, 'num_heads')
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.bias = nnx.Param(
        _table_init()(rngs.params(), (num_buckets, num_heads), param_dtype))

  trainable = True

  def built_for(self) -> tuple[int | None, int | None]:
    return self.bias.shape[1], None

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

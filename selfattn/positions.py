"""Every positional encoding, looked up by name.

Absolute encodings (`none`, `sinusoidal`, `learned`) are added to the token
embeddings once, before the first layer. Relative encodings (`shaw`, `huang`,
`rope`, `alibi`, `t5`) act inside every attention layer through three hooks
that `attention.dot_product_attention` calls:

  rotate(q, k) -> (q, k)      rotary rotates queries and keys;
  logits(q, k) -> (.., Lq, Lk) a term added to the scaled logits (q arrives
                               already scaled by 1/sqrt(D));
  values(w, v) -> (B, H, Lq, D) a term added to the attention output (Shaw).

Offsets are `j - i` (key index minus query index) everywhere. Padding never
moves the offset between two valid tokens, so relative encodings give the same
outputs for a left-padded sequence as for the unpadded one.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx


# --------------------------------------------------------------------------
# Absolute encodings.
# --------------------------------------------------------------------------

def sinusoidal_table(num_steps: int, num_hiddens: int, dtype=jnp.float32
                     ) -> jax.Array:
  """The chapter's table: P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(.).

  Returns (num_steps, num_hiddens). Works for odd num_hiddens (the last column
  is a sine) and for any number of steps: it is a formula, not a parameter.
  """
  position = jnp.arange(num_steps, dtype=jnp.float32)[:, None]
  column = jnp.arange(num_hiddens)
  even_column = (column - column % 2).astype(jnp.float32)   # 2j for 2j and 2j+1
  angle = position / jnp.power(10000.0, even_column / num_hiddens)
  return jnp.where(column % 2 == 0, jnp.sin(angle), jnp.cos(angle)).astype(dtype)


class SinusoidalEncoding(nnx.Module):
  """d2l's PositionalEncoding: X + P[:, :L], then dropout.

  X: (B, L, num_hiddens) -> (B, L, num_hiddens). `P` is (1, max_len,
  num_hiddens); sequences longer than max_len still work because the table is
  computed from the formula for the length it is given.
  """

  def __init__(self, num_hiddens: int, dropout: float = 0.0,
               max_len: int = 1000, *, rngs: nnx.Rngs):
    self.num_hiddens = num_hiddens
    self.max_len = max_len
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  @property
  def P(self) -> jax.Array:
    return sinusoidal_table(self.max_len, self.num_hiddens)[None]

  def table(self, length: int) -> jax.Array:
    """(length, num_hiddens) rows of P, computed for any length."""
    return sinusoidal_table(length, self.num_hiddens)

  def __call__(self, X: jax.Array, *, deterministic: bool = True) -> jax.Array:
    X = X + self.table(X.shape[1]).astype(X.dtype)[None]
    return self.dropout(X, deterministic=deterministic)


class LearnedEncoding(nnx.Module):
  """A trainable table P of shape (1, max_len, num_hiddens): X + P[:, :L], dropout.

  init='normal' draws N(0, 1/2), the mean square of the sinusoidal table, so
  both start with the same magnitude; init='sinusoidal' starts from the table.
  """

  def __init__(self, num_hiddens: int, dropout: float = 0.0,
               max_len: int = 1000, *, init: str = 'normal',
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if init == 'normal':
      table = jax.random.normal(rngs.params(), (1, max_len, num_hiddens))
      table = table * math.sqrt(0.5)
    elif init == 'sinusoidal':
      table = sinusoidal_table(max_len, num_hiddens)[None]
    else:
      raise ValueError(f"learned init={init!r}; valid: 'normal', 'sinusoidal'")
    self.max_len = max_len
    self.P = nnx.Param(table.astype(param_dtype))
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def table(self, length: int) -> jax.Array:
    """(length, num_hiddens) rows of P; raises ValueError past max_len."""
    if length > self.max_len:
      raise ValueError(f'sequence length {length} exceeds the learned '
                       f'encoding max_len={self.max_len}')
    return self.P[0, :length]

  def __call__(self, X: jax.Array, *, deterministic: bool = True) -> jax.Array:
    X = X + self.table(X.shape[1]).astype(X.dtype)[None]
    return self.dropout(X, deterministic=deterministic)


class NoEncoding(nnx.Module):
  """No position information: dropout only (so every variant sees dropout)."""

  def __init__(self, num_hiddens: int, dropout: float = 0.0, *,
               rngs: nnx.Rngs):
    del num_hiddens
    self.dropout = nnx.Dropout(dropout, rngs=rngs)

  def __call__(self, X: jax.Array, *, deterministic: bool = True) -> jax.Array:
    return self.dropout(X, deterministic=deterministic)


# --------------------------------------------------------------------------
# Relative encodings.
# --------------------------------------------------------------------------

def relative_offsets(num_queries: int, num_keys: int) -> jax.Array:
  """(Lq, Lk) int32 matrix of offsets j - i."""
  return (jnp.arange(num_keys, dtype=jnp.int32)[None, :]
          - jnp.arange(num_queries, dtype=jnp.int32)[:, None])


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


class RelativePosition(nnx.Module):
  """Base class: a relative encoding that changes nothing (override hooks)."""

  def rotate(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return q, k

  def logits(self, q: jax.Array, k: jax.Array) -> jax.Array | None:
    return None

  def values(self, weights: jax.Array, v: jax.Array) -> jax.Array | None:
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

  def _against_table(self, x: jax.Array, table: jax.Array) -> jax.Array:
    # (B, H, L, D) x table -> (B, H, L, 2k+1)
    table = table.astype(x.dtype)
    if self.shared_heads:
      return jnp.einsum('bhqd,rd->bhqr', x, table)
    return jnp.einsum('bhqd,hrd->bhqr', x, table)

  def logits(self, q: jax.Array, k: jax.Array) -> jax.Array:
    lq, lk = q.shape[2], k.shape[2]
    k_ = self.clip_distance
    q_dot_a = self._against_table(q, self.a_K[...])            # (B, H, Lq, 2k+1)
    bucket = jnp.clip(relative_offsets(lq, lk), -k_, k_) + k_  # (Lq, Lk)
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

  def values(self, weights: jax.Array, v: jax.Array) -> jax.Array | None:
    if self.a_V is None:
      return None
    folded = self.fold_weights(weights).astype(v.dtype)       # (B, H, Lq, 2k+1)
    table = self.a_V[...].astype(v.dtype)
    spec = 'bhqr,rd->bhqd' if self.shared_heads else 'bhqr,hrd->bhqd'
    return jnp.einsum(spec, folded, table)


class HuangRelative(RelativePosition):
  """Music Transformer (Huang et al. 2018) relative logits, bidirectional.

  One learned embedding per offset in [-(max_len-1), max_len-1] (unclipped
  within max_len; longer sequences reuse the edge rows). S_rel = Q E^T is
  (L, 2L-1) and is skewed into (L, L): memory O(L D + L^2), not O(L^2 D).
  Self-attention only (Lq == Lk).
  """

  def __init__(self, num_heads: int, head_dim: int, *, max_len: int = 1024,
               shared_heads: bool = False, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    self.max_len = max_len
    self.shared_heads = shared_heads
    rows = 2 * max_len - 1
    shape = (rows, head_dim) if shared_heads else (num_heads, rows, head_dim)
    self.E = nnx.Param(_table_init()(rngs.params(), shape, param_dtype))

  def embeddings(self, length: int) -> jax.Array:
    """Rows for offsets -(L-1)..(L-1): (2L-1, D), or (H, 2L-1, D) per head."""
    table = self.E[...]
    if length <= self.max_len:
      start = self.max_len - length
      return table[..., start:start + 2 * length - 1, :]
    offsets = jnp.clip(jnp.arange(-(length - 1), length),
                       -(self.max_len - 1), self.max_len - 1)
    return jnp.take(table, offsets + self.max_len - 1, axis=-2)

  def logits(self, q: jax.Array, k: jax.Array) -> jax.Array:
    length = q.shape[2]
    if k.shape[2] != length:
      raise ValueError('huang relative attention needs self-attention '
                       f'(Lq == Lk); got {length} and {k.shape[2]}')
    table = self.embeddings(length).astype(q.dtype)
    spec = 'bhqd,rd->bhqr' if self.shared_heads else 'bhqd,hrd->bhqr'
    return relative_to_absolute(jnp.einsum(spec, q, table))


class RotaryEncoding(RelativePosition):
  """RoPE (Su et al.): rotate dimension pairs (2j, 2j+1) by position * theta_j.

  theta_j = base^(-2j/D), the chapter's frequencies; q_i . k_j then depends on
  j - i only. With odd D the last dimension is left unrotated.
  """

  def __init__(self, head_dim: int, *, rope_base: float = 10000.0):
    self.head_dim = head_dim
    self.rope_base = rope_base

  def _rotate(self, x: jax.Array) -> jax.Array:
    length, d = x.shape[-2], x.shape[-1]
    pairs = d // 2
    theta = self.rope_base ** (-2.0 * jnp.arange(pairs) / d)
    angle = jnp.arange(length, dtype=jnp.float32)[:, None] * theta[None, :]
    cos, sin = jnp.cos(angle).astype(x.dtype), jnp.sin(angle).astype(x.dtype)
    even, odd = x[..., 0:2 * pairs:2], x[..., 1:2 * pairs:2]
    rotated = jnp.stack([even * cos - odd * sin, even * sin + odd * cos],
                        axis=-1).reshape(*x.shape[:-1], 2 * pairs)
    return jnp.concatenate([rotated, x[..., 2 * pairs:]], axis=-1)

  def rotate(self, q: jax.Array, k: jax.Array) -> tuple[jax.Array, jax.Array]:
    return self._rotate(q), self._rotate(k)


def alibi_slopes(num_heads: int) -> np.ndarray:
  """Press et al.'s head slopes 2^(-8h/H), h = 1..H."""
  return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


class ALiBi(RelativePosition):
  """ALiBi, bidirectional: logits get -slope_h * |j - i| (not scaled by 1/sqrt(D))."""

  def __init__(self, num_heads: int):
    self.num_heads = num_heads

  def logits(self, q: jax.Array, k: jax.Array) -> jax.Array:
    distance = jnp.abs(relative_offsets(q.shape[2], k.shape[2]))
    slopes = jnp.asarray(alibi_slopes(self.num_heads), jnp.float32)
    return -slopes[None, :, None, None] * distance[None, None]


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
  """T5 relative bias: one learned scalar per head per bucket, added to logits."""

  def __init__(self, num_heads: int, *, num_buckets: int = 32,
               max_distance: int = 128, param_dtype=jnp.float32,
               rngs: nnx.Rngs):
    if num_buckets < 4 or num_buckets % 2:
      raise ValueError(f'num_buckets must be even and >= 4; got {num_buckets}')
    self.num_buckets = num_buckets
    self.max_distance = max_distance
    self.bias = nnx.Param(
        _table_init()(rngs.params(), (num_buckets, num_heads), param_dtype))

  def logits(self, q: jax.Array, k: jax.Array) -> jax.Array:
    buckets = t5_bucket(relative_offsets(q.shape[2], k.shape[2]),
                        self.num_buckets, self.max_distance)
    return jnp.moveaxis(self.bias[...][buckets], -1, 0)[None]   # (1, H, Lq, Lk)


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
            'alibi', True, {},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            ALiBi(num_heads)),
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


def get_position(name: str, options: dict[str, Any] | None = None
                 ) -> tuple[PositionKind, dict[str, Any]]:
  """Looks up an encoding by name and checks its options.

  Returns the kind and its options with defaults filled in. Raises ValueError
  naming the valid encodings, or the valid options of this encoding.
  """
  if name not in POSITIONS:
    raise ValueError(f'unknown position encoding {name!r}; valid: '
                     f'{", ".join(POSITION_NAMES)}')
  kind = POSITIONS[name]
  options = dict(options or {})
  unknown = sorted(set(options) - set(kind.options))
  if unknown:
    valid = ', '.join(kind.options) or 'none'
    raise ValueError(f'position encoding {name!r} takes no option(s) '
                     f'{", ".join(unknown)}; its options: {valid}')
  return kind, {**kind.options, **options}

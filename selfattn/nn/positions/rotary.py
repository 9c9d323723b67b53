"""Rotations of queries and keys: RoPE (Su et al.) and PoPE (Gopalakrishnan
et al. 2025)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.bounded import bounded_param
from selfattn.nn.bounded import clamp
from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition


class RotaryEncoding(RelativePosition):
  """RoPE (Su et al.): rotate dimension pairs (2j, 2j+1) by position * theta_j.

  theta_j = base^(-2j/D), the chapter's frequencies; q_i . k_j then depends on
  j - i only. With odd D the last dimension is left unrotated.

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: rotate, shapes in RelativePosition's docstring.

  Args: head_dim D, rope_base (10000: the chapter's frequencies). No parameters.
  """

  def __init__(self, head_dim: int, *, rope_base: float = 10000.0):
    if not rope_base > 0:
      raise ValueError(f'rope_base must be > 0; got {rope_base}')
    self.head_dim = check_size(head_dim, 'head_dim')
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
  `bounded.bounded_param`, clamped in the forward pass and projected back
  into the interval after every optimiser step (selfattn's train_step; a
  training loop of your own calls `selfattn.project_bounded(model)` after
  each update, a Linen one through nnx.bridge
  `selfattn.project_bounded_params(params)`, or an entry that steps out
  stops learning). Init 'zero' (the paper: important for length generalization) or 'uniform'
  (Uniform(-2*pi, 0): slightly better in-distribution fit).

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: rotate, shapes in RelativePosition's docstring.

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
    num_heads = check_size(num_heads, 'num_heads')
    self.head_dim = head_dim = check_size(head_dim, 'head_dim')
    self.rope_base = rope_base
    shape = (num_heads, head_dim)
    if delta_init == 'zero':
      delta = jnp.zeros(shape, param_dtype)
    else:
      delta = jax.random.uniform(rngs.params(), shape, param_dtype,
                                 minval=-2 * math.pi, maxval=0.0)
    self.delta = bounded_param(delta, bounds=(-2 * math.pi, 0.0))

  trainable = True

  def built_for(self) -> tuple[int | None, int | None]:
    heads, width = self.delta.shape
    return heads, width

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

"""Absolute encodings: added to the token embeddings once, before the first layer."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from selfattn.nn import masks
from selfattn.nn.layers import dropout_layer


def sinusoidal_table(num_steps: int, num_hiddens: int, dtype=jnp.float32
                     ) -> jax.Array:
  """The chapter's table: P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(.).

  Returns (num_steps, num_hiddens). Works for odd num_hiddens (the last column
  is a sine) and for any number of steps: it is a formula, not a parameter.
  Both are integers (jnp.arange would round 4.5 up to 5 rows or columns).
  """
  num_steps = masks.check_size(num_steps, 'num_steps', 0)
  return sinusoid_at(jnp.arange(num_steps), num_hiddens, dtype)


def sinusoid_at(positions: jax.Array, num_hiddens: int, dtype=jnp.float32
                ) -> jax.Array:
  """Rows of the chapter's table at any positions: (...,) -> (..., num_hiddens)."""
  num_hiddens = masks.check_size(num_hiddens, 'num_hiddens')
  position = jnp.asarray(positions, jnp.float32)[..., None]
  column = jnp.arange(num_hiddens)
  even_column = (column - column % 2).astype(jnp.float32)   # 2j for 2j and 2j+1
  angle = position / jnp.power(10000.0, even_column / num_hiddens)
  return jnp.where(column % 2 == 0, jnp.sin(angle), jnp.cos(angle)).astype(dtype)


def _check_input(X: jax.Array, positions: jax.Array | None,
                 num_hiddens: int) -> None:
  """Refuses X that is not (B, L, num_hiddens), or positions not (B, L)
  (or (1, L), the same for every example, as MultiHeadAttention takes)."""
  if X.ndim != 3 or X.shape[2] != num_hiddens:
    raise ValueError(f'X must be (B, L, {num_hiddens}) (the encoding\'s '
                     f'num_hiddens); got shape {tuple(X.shape)}')
  masks.check_positions(positions, *X.shape[:2])


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
    self.num_hiddens = masks.check_size(num_hiddens, 'num_hiddens')
    self.max_len = masks.check_size(max_len, 'max_len')
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
    _check_input(X, positions, self.num_hiddens)
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
    num_hiddens = masks.check_size(num_hiddens, 'num_hiddens')
    max_len = masks.check_size(max_len, 'max_len')
    if init == 'normal':
      table = jax.random.normal(rngs.params(), (1, max_len, num_hiddens))
      table = table * math.sqrt(0.5)
    else:
      table = sinusoidal_table(max_len, num_hiddens)[None]
    self.max_len = max_len
    self.P = nnx.Param(table.astype(param_dtype))
    self.dropout = dropout_layer(dropout, rngs)

  trainable = True

  @property
  def position_limit(self) -> int:
    """How many positions the table addresses (0..max_len-1): a cache for
    more would read its last row for every later token."""
    return self.max_len

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
    _check_input(X, positions, self.P.shape[-1])
    if positions is None:
      X = X + self.table(X.shape[1]).astype(X.dtype)[None]
    else:
      if not isinstance(positions, jax.core.Tracer):
        # NumPy, not jnp: inside a traced function (a while_loop body) jnp
        # would stage even a concrete array's min into the trace.
        concrete = np.asarray(positions)
        low, high = int(concrete.min()), int(concrete.max())
        if low < 0 or high >= self.max_len:
          raise ValueError(f'positions must lie in [0, max_len={self.max_len}) '
                           f'for the learned encoding; got values from {low} '
                           f'to {high}')
      X = X + jnp.take(self.P[0], positions, axis=0, mode='clip').astype(X.dtype)
    return self.dropout(X, deterministic=deterministic)


class NoEncoding(nnx.Module):
  """No position information: dropout only (so every variant sees dropout).

  Args: num_hiddens (the width X must have, as for the other absolute
  encodings), dropout rate, rngs.
  """

  trainable = False

  def __init__(self, num_hiddens: int, dropout: float = 0.0, *,
               rngs: nnx.Rngs):
    self.num_hiddens = masks.check_size(num_hiddens, 'num_hiddens')
    self.dropout = dropout_layer(dropout, rngs)

  def picture(self) -> None:
    return None

  def __call__(self, X: jax.Array, *, positions: jax.Array | None = None,
               deterministic: bool | None = None) -> jax.Array:
    _check_input(X, positions, self.num_hiddens)
    return self.dropout(X, deterministic=deterministic)

"""Small layers shared by attention, the encodings and the stacks: dropout,
d2l's position-wise FFN and AddNorm (with the layer-norm placement switch and
the choice of LayerNorm or RMSNorm)."""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.masks import check_flag
from selfattn.nn.masks import check_size

NORMS = ('post', 'pre', 'none')
# LayerNorm (the chapter's) or RMSNorm (no centring, no bias: Zhang & Sennrich
# 2019; PoPE's JSB recipe and most recent language models use it).
NORM_TYPES = ('layernorm', 'rmsnorm')


def check_norm_type(norm_type: str) -> None:
  if norm_type not in NORM_TYPES:
    raise ValueError(f'norm_type={norm_type!r}; valid: {", ".join(NORM_TYPES)}')


def make_norm(norm_type: str, num_hiddens: int, *, dtype=None,
              param_dtype=jnp.float32,
              rngs: nnx.Rngs) -> nnx.LayerNorm | nnx.RMSNorm:
  """A LayerNorm or an RMSNorm over the last axis (num_hiddens), epsilon 1e-6
  for both (Flax's default)."""
  check_norm_type(norm_type)
  cls = nnx.LayerNorm if norm_type == 'layernorm' else nnx.RMSNorm
  return cls(num_hiddens, dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class Dropout(nnx.Dropout):
  """nnx.Dropout whose active call without a random stream says how to give
  one: Flax's own error ('no `rngs` argument was provided to Dropout')
  puzzles a user who passed nnx.Rngs(params=0) to the model."""

  def __call__(self, inputs, *, deterministic: bool | None = None,
               rngs=None) -> jax.Array:
    active = not (self.deterministic if deterministic is None
                  else deterministic)
    if active and self.rate > 0 and rngs is None:
      self.check_stream()
    return super().__call__(inputs, deterministic=deterministic, rngs=rngs)

  def check_stream(self) -> None:
    """ValueError unless the module holds a random stream (active dropout
    needs one: here, and where the chunked path draws its key)."""
    if self.rngs is None:
      raise ValueError(
          f'dropout={self.rate} is active (model.train() or '
          f'deterministic=False) but the module was built without a '
          f"'dropout' rng stream: build it with nnx.Rngs(params=..., "
          f'dropout=...), or call model.eval() / pass deterministic=True')


def dropout_layer(rate: float, rngs: nnx.Rngs) -> Dropout:
  """Dropout that starts in eval mode (d2l's call default; model.train()
  turns it on) and takes a 'dropout' (or 'default') rng stream only if rate
  > 0 and the stream exists: Rngs(params=0), or a Linen init with one key,
  builds the module; calling it with dropout on then needs rngs (a
  ValueError that says so)."""
  if not 0 <= rate < 1:
    # 1 would zero every activation; past it, nnx.Dropout scales by a
    # negative keep rate. Neither trains.
    raise ValueError(f'dropout must be in [0, 1); got {rate}')
  has_stream = 'dropout' in rngs or 'default' in rngs
  return Dropout(rate, deterministic=True,
                 rngs=rngs if rate > 0 and has_stream else None)


class PositionWiseFFN(nnx.Module):
  """d2l's position-wise FFN: dense2(relu(dense1(X))). (B, L, F) -> (B, L, out).

  Args: num_inputs F, ffn_num_hiddens (the inner width), ffn_num_outputs,
  dtype / param_dtype, rngs (a 'params' stream).
  """

  def __init__(self, num_inputs: int, ffn_num_hiddens: int, ffn_num_outputs: int,
               *, dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    # Positive: a zero-width layer runs and adds only a bias, an FFN that
    # silently does nothing.
    num_inputs = check_size(num_inputs, 'num_inputs')
    ffn_num_hiddens = check_size(ffn_num_hiddens, 'ffn_num_hiddens')
    ffn_num_outputs = check_size(ffn_num_outputs, 'ffn_num_outputs')
    self.num_inputs = num_inputs
    self.dense1 = nnx.Linear(num_inputs, ffn_num_hiddens, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)
    self.dense2 = nnx.Linear(ffn_num_hiddens, ffn_num_outputs, dtype=dtype,
                             param_dtype=param_dtype, rngs=rngs)

  def __call__(self, X: jax.Array) -> jax.Array:
    """X (..., num_inputs) -> (..., ffn_num_outputs)."""
    if jnp.shape(X)[-1:] != (self.num_inputs,):
      raise ValueError(f'X must have num_inputs = {self.num_inputs} features '
                       f'on its last axis; got shape {tuple(jnp.shape(X))}')
    return self.dense2(jax.nn.relu(self.dense1(X)))


class AddNorm(nnx.Module):
  """d2l's AddNorm, generalised: wraps a sublayer f with skip and LayerNorm.

    norm='post' (the chapter): LayerNorm(X + Dropout(f(X)))
    norm='pre':                X + Dropout(f(LayerNorm(X)))
    norm='none':               X + Dropout(f(X))
  residual=False drops the `X +`. Call as `addnorm(X, f, deterministic=...)`:
  X (..., num_hiddens) and f(X) of the same shape (with residual) -> that
  shape.
  norm_type='rmsnorm' puts an RMSNorm where LayerNorm is (the attribute stays
  `ln`, so parameter paths keep their names).

  Args: num_hiddens (the norm's width), dropout rate, norm, residual,
  norm_type ('layernorm' or 'rmsnorm'), dtype / param_dtype, rngs ('params',
  and 'dropout' when dropout > 0).
  """

  def __init__(self, num_hiddens: int, dropout: float = 0.0, *,
               norm: str = 'post',
               residual: bool = True, norm_type: str = 'layernorm', dtype=None,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    if norm not in NORMS:
      raise ValueError(f'norm={norm!r}; valid: {", ".join(NORMS)}')
    check_norm_type(norm_type)
    num_hiddens = check_size(num_hiddens, 'num_hiddens')
    self.norm = norm
    self.residual = check_flag(residual, 'residual')
    self.num_hiddens = num_hiddens
    self.ln = (make_norm(norm_type, num_hiddens, dtype=dtype,
                         param_dtype=param_dtype, rngs=rngs)
               if norm != 'none' else None)
    self.dropout = dropout_layer(dropout, rngs)

  def __call__(self, X: jax.Array, sublayer: Callable[[jax.Array], jax.Array],
               *, deterministic: bool | None = None) -> jax.Array:
    """X (..., num_hiddens), sublayer f -> f's output (X's shape with the
    residual) with the skip, dropout and norm of `norm`."""
    if self.ln is not None and jnp.shape(X)[-1:] != (self.num_hiddens,):
      raise ValueError(f'X must have num_hiddens = {self.num_hiddens} '
                       f'features (the norm\'s width) on its last axis; got '
                       f'shape {tuple(jnp.shape(X))}')
    Y = sublayer(self.ln(X) if self.norm == 'pre' else X)
    Y = self.dropout(Y, deterministic=deterministic)
    if self.residual:
      if jnp.shape(Y) != jnp.shape(X):
        raise ValueError(f'the sublayer must keep X\'s shape for the residual '
                         f'X + f(X); X is {tuple(jnp.shape(X))}, f(X) '
                         f'{tuple(jnp.shape(Y))}')
      Y = X + Y
    return self.ln(Y) if self.norm == 'post' else Y

"""Parameters kept inside an interval by the training step.

PoPE's phase bias delta must stay in [-2*pi, 0] (Gopalakrishnan et al. 2025
clamp it). Clamping only in the forward pass leaves the stored value free to
drift out, where its gradient is zero and it can never come back; so the
parameter is its own Variable type and the optimiser step projects it back
into its interval after every update (`project`), as projected gradient
descent does. Modules still clamp in the forward pass, so a user's own
training loop that skips `project` gets the bounded value too.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx


class BoundedParam(nnx.Param):
  """An nnx.Param with metadata `bounds=(low, high)`; `project` clips it."""


def clamp(variable: BoundedParam) -> jax.Array:
  """The variable's value clipped to its bounds (for the forward pass).

  The gradient is 1 on the closed interval and 0 outside, as PyTorch's clamp
  (the reference implementation's); jnp.clip would halve it on the bounds,
  where PoPE's zero-initialised delta starts."""
  low, high = variable.get_metadata()['bounds']
  x = variable[...]
  return jnp.where((x >= low) & (x <= high), x, jnp.clip(x, low, high))


def project(params: Any) -> Any:
  """Clips every BoundedParam of a parameter tree (an nnx.State from
  nnx.split, or a module's state) to its bounds; other leaves unchanged."""
  def one(leaf):
    if isinstance(leaf, BoundedParam):
      low, high = leaf.get_metadata()['bounds']
      return leaf.replace(jnp.clip(leaf[...], low, high))
    return leaf
  return jax.tree.map(one, params,
                      is_leaf=lambda x: isinstance(x, nnx.Variable))

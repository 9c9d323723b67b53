"""Parameters kept inside an interval by the training step.

PoPE's phase bias delta must stay in [-2*pi, 0] (Gopalakrishnan et al. 2025
clamp it). Clamping only in the forward pass leaves the stored value free to
drift out, where its gradient is zero and it can never come back; so the
parameter is its own Variable type and the optimiser step projects it back
into its interval after every update (`project`), as projected gradient
descent does. Modules still clamp in the forward pass, so a user's own
training loop that skips the projection gets the bounded value in its
outputs, but a parameter that left its interval stops learning there: such
a loop calls `project_bounded(model)` after each update.
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


def project_bounded(module: nnx.Module) -> None:
  """In place: clips every BoundedParam of `module` (and its submodules) to
  its bounds. A training loop of your own calls it after each optimiser
  update (e.g. after `nnx.Optimizer.update`, inside or outside `nnx.jit`),
  as selfattn's train_step projects its parameters: without it a bounded
  parameter that steps out of its interval gets zero gradient there and
  never comes back (the forward pass still clamps it)."""
  nnx.update(module, project(nnx.state(module, BoundedParam)))

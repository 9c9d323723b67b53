"""Parameters kept inside an interval by the training step.

PoPE's phase bias delta must stay in [-2*pi, 0] (Gopalakrishnan et al. 2025
clamp it). Clamping only in the forward pass leaves the stored value free to
drift out, where its gradient is zero and it can never come back; so the
parameter carries its interval as metadata (`bounded_param`) and the
optimiser step projects it back after every update
(`project_bounded_params`), as projected gradient descent does. Modules
still clamp in the forward pass, so a user's own training loop that skips
the projection gets the bounded value in its outputs, but a parameter that
left its interval stops learning there: such a loop calls
`project_bounded(model)` (NNX, in place) or `project_bounded_params(params)`
(a Linen model holding selfattn modules through nnx.bridge) after each
update.

The parameter is a plain nnx.Param with metadata `bounds=(low, high)`, not
a Param subclass: nnx.bridge files a subclass under a Linen collection of its
own name, outside 'params', where a Linen training loop would never train it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from flax.nnx import bridge

BOUNDS = 'bounds'


def bounded_param(value: jax.Array, bounds: tuple[float, float]) -> nnx.Param:
  """An nnx.Param whose metadata `bounds=(low, high)`
  `project_bounded_params` clips it to."""
  low, high = bounds
  if not low < high:
    raise ValueError(f'bounds must be (low, high) with low < high; got {bounds}')
  return nnx.Param(value, **{BOUNDS: (float(low), float(high))})


def bounds_of(leaf: Any) -> tuple[float, float] | None:
  """The (low, high) of a bounded parameter: an nnx.Variable, or the
  nnx.bridge box a Linen variables tree holds it in; None for anything else."""
  if isinstance(leaf, nnx.Variable):
    return leaf.get_metadata().get(BOUNDS)
  if isinstance(leaf, bridge.NNXMeta):
    return leaf.metadata.get(BOUNDS)
  return None


def is_bounded(path: Any, leaf: Any) -> bool:
  """An nnx filter: the bounded parameters (nnx.state(module, is_bounded))."""
  del path
  return bounds_of(leaf) is not None


def clamp(variable: nnx.Variable) -> jax.Array:
  """The variable's value clipped to its bounds (for the forward pass).

  The gradient is 1 on the closed interval and 0 outside, as PyTorch's clamp
  (the reference implementation's); jnp.clip would halve it on the bounds,
  where PoPE's zero-initialised delta starts."""
  low, high = bounds_of(variable)
  x = variable[...]
  return jnp.where((x >= low) & (x <= high), x, jnp.clip(x, low, high))


def project_bounded_params(params: Any) -> Any:
  """Clips every bounded parameter of a tree to its bounds; other leaves
  unchanged. The tree: an nnx.State (nnx.split, nnx.state), or a Linen
  variables or 'params' dict of a model holding selfattn modules through
  nnx.bridge (call it on the params after each optimiser update)."""
  def one(leaf):
    bounds = bounds_of(leaf)
    if bounds is None:
      return leaf
    low, high = bounds
    if isinstance(leaf, bridge.NNXMeta):
      return leaf.replace_boxed(jnp.clip(leaf.unbox(), low, high))
    return leaf.replace(jnp.clip(leaf[...], low, high))
  return jax.tree.map(one, params, is_leaf=lambda x: isinstance(
      x, (nnx.Variable, bridge.NNXMeta)))


def project_bounded(module: nnx.Module) -> None:
  """In place: clips every bounded parameter of `module` (and its
  submodules) to its bounds. A training loop of your own calls it after each
  optimiser update (e.g. after `nnx.Optimizer.update`, inside or outside
  `nnx.jit`), as selfattn's train_step projects its parameters: without it a
  bounded parameter that steps out of its interval gets zero gradient there
  and never comes back (the forward pass still clamps it). A Linen model
  (nnx.bridge) calls `project_bounded_params(params)` instead."""
  nnx.update(module, project_bounded_params(nnx.state(module, is_bounded)))

"""Running a test's module calls as compiled programs.

Called outside a jit, a Flax module runs operation by operation, and JAX
compiles each operation on its own for every new shape: a test that builds
a model and takes its outputs and gradients that way pays for 100-300 small
XLA compiles of about 20 ms each on a CPU. On 2026-11-29 those compiles
were 166 s of the commit tier's ~760 s of CPU (py-spy and a log of every
compile). Under `nnx.jit` the same call is one program. The library runs
under jit in training, so comparing compiled programs checks what is used.

Tests that check eager behaviour stay eager: an error raised while a call
runs, a Python-side check on concrete values, eager against compiled.
"""

from __future__ import annotations

from typing import Any, Callable

from flax import nnx


def compiled(fn: Callable[..., Any], *args: Any) -> Any:
  """fn(*args) as one `nnx.jit` program. Modules among args keep their
  state (a cache written by fn stays written); fn may close over arrays
  (they become constants of the program) and Python values (causal=True)."""
  return nnx.jit(fn)(*args)


# A module's call and its cached decode step, compiled once per module and
# shape and reused across calls and tests; keyword arguments are traced
# arrays (positions=, mask=). The step writes the caches back to the module.
forward = nnx.jit(lambda module, *args, **kwargs: module(*args, **kwargs))
decode_step = nnx.jit(lambda module, *args, **kwargs: module(
    *args, decode=True, **kwargs))


def grads(loss: Callable[[nnx.Module], Any], module: nnx.Module) -> nnx.State:
  """nnx.grad(loss)(module), compiled: the gradient of every parameter."""
  return nnx.jit(nnx.grad(loss))(module)

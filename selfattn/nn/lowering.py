"""Lowering for a GPU or TPU from a host that has neither.

`jax.jit(f).trace(*args).lower(lowering_platforms=(p,))` builds the StableHLO
module for platform p without a device; Pallas lowers its kernels in Python at
that point (Triton for 'cuda', Mosaic for 'tpu'). From JAX 0.11 on, a Pallas
GPU kernel asks which GPU it is lowered for (its compute capability decides the
Triton target) and, with no GPU present, refuses ('No supported GPU devices
found, please specify an abstract GPU device'). Lowering inside an abstract
mesh whose device names the GPU answers that question without one. Its axis
is Auto, not Explicit: an Explicit mesh types every array's sharding, and a
cached decode step then fails to lower (its one-token update is typed as
sharded, the cache as not).

This is the one place that names the H100 target: the lowering tests for
it go through `lowered_text` (tests for other GPUs, or of the refusal
without it, build their own), and so should a script that reads a kernel's
IR.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import jax

# The GPU the kernels are written for (the lent H100s): SM 9.0, 132 SMs.
GPU_DEVICE_KIND = 'NVIDIA H100 80GB HBM3'
GPU_NUM_CORES = 132


@contextlib.contextmanager
def abstract_target(platform: str) -> Iterator[None]:
  """Inside it, lowering for `platform` needs no device of that kind.

  For 'cuda' on a host without a GPU, an abstract one-device mesh on an H100;
  otherwise (a TPU lowers without one; a GPU host answers for itself)
  nothing."""
  if platform != 'cuda' or jax.default_backend() == 'gpu':
    yield
    return
  from jax.sharding import AbstractDevice
  from jax.sharding import AbstractMesh
  from jax.sharding import AxisType
  mesh = AbstractMesh((1,), ('x',), (AxisType.Auto,),
                      abstract_device=AbstractDevice(
                          device_kind=GPU_DEVICE_KIND,
                          num_cores=GPU_NUM_CORES, platform='cuda'))
  with jax.sharding.use_abstract_mesh(mesh):
    yield


def lower(fn: Callable[..., Any], *args: Any, platform: str
          ) -> jax.stages.Lowered:
  """`jax.jit(fn)` traced on `args` (arrays or ShapeDtypeStructs) and
  lowered for `platform` ('cuda', 'tpu' or 'cpu') alone."""
  with abstract_target(platform):
    return jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,))


def lowered_text(fn: Callable[..., Any], *args: Any, platform: str) -> str:
  """The StableHLO text of `lower(fn, *args, platform=platform)`."""
  return lower(fn, *args, platform=platform).as_text()

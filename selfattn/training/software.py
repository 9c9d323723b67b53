"""Which software stack produced a result: recorded in every run's summary.json.

JAX's numerics move between releases (XLA's fusion and reduction order), so a
number trained under one stack need not reproduce bit for bit under another.
A run records the stack it ran on, so that a reader of a committed study knows
which stack made which number (the committed runs from before this record
have it backfilled by scripts/backfill_versions.py).
"""

from __future__ import annotations

import importlib.metadata
import platform
from typing import Any

# The distributions whose versions decide a run's numbers or its files.
PACKAGES = ('jax', 'jaxlib', 'flax', 'optax', 'orbax-checkpoint', 'numpy')


def _version(package: str) -> str | None:
  try:
    return importlib.metadata.version(package)
  except importlib.metadata.PackageNotFoundError:
    return None


def versions() -> dict[str, Any]:
  """{'python': '3.12.1', 'jax': '0.12.0.1', ..., 'backend': 'cpu',
  'device_kind': 'cpu'}: the interpreter, each of `PACKAGES` (None where not
  installed) and the devices JAX runs on."""
  import jax
  device = jax.devices()[0]
  record: dict[str, Any] = {'python': platform.python_version()}
  record.update({name: _version(name) for name in PACKAGES})
  record['backend'] = jax.default_backend()
  record['device_kind'] = device.device_kind
  return record

"""Helpers for tests that train: reading checkpoints and running the CLI."""

import os
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from selfattn import checkpoints

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def saved_params(workdir, step=None):
  """Parameters of a checkpoint (the latest by default) as a flat list of arrays."""
  mngr = checkpoints.manager(workdir, 100)
  step = mngr.latest_step() if step is None else step
  # Restore onto this process's first device, whatever mesh saved it.
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  item = os.path.join(os.path.abspath(workdir), 'checkpoints', str(step), 'default')
  metadata = ocp.StandardCheckpointer().metadata(item).item_metadata
  target = jax.tree.map(
      lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
  params = mngr.restore(step, args=ocp.args.StandardRestore(target))['params']
  mngr.close()
  return [np.asarray(x) for x in jax.tree.leaves(params)]


def cli(workdir, *overrides, config='configs/tiny.py', env=None, wait=True):
  """Runs `python -m selfattn.main` in a subprocess from the repository root."""
  cmd = [sys.executable, '-m', 'selfattn.main', f'--config={config}',
         f'--workdir={workdir}', *overrides]
  full_env = {**os.environ, 'PYTHONPATH': ROOT, **(env or {})}
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True,
                        text=True, timeout=600)

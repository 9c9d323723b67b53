"""Helpers for tests that train: reading checkpoints and running the CLI."""

import os
import shutil
import subprocess
import sys

import jax
import numpy as np
import orbax.checkpoint as ocp

from selfattn.training import checkpoints

# This file is tests/support/runs.py: the checkout is three up.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def saved_params(workdir, step=None, part='params'):
  """Parameters of a checkpoint (the latest by default) as a flat list of
  arrays; part=None: its whole state (step, parameters, optimizer state)."""
  mngr = checkpoints.manager(workdir, 100)
  step = mngr.latest_step() if step is None else step
  # Restore onto this process's first device, whatever mesh saved it.
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  item = os.path.join(os.path.abspath(workdir), 'checkpoints', str(step), 'default')
  metadata = ocp.StandardCheckpointer().metadata(item).item_metadata
  target = jax.tree.map(
      lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), metadata)
  state = mngr.restore(step, args=ocp.args.StandardRestore(target))
  mngr.close()
  return [np.asarray(x) for x in jax.tree.leaves(
      state if part is None else state[part])]


def subprocess_env(*, xla_cache: str | os.PathLike | None = None,
                   **extra) -> dict[str, str]:
  """The environment of a training subprocess: the repository importable, and
  XLA's compiled programs cached on disk across the session's subprocesses
  (conftest makes the directory). Every tiny-config run compiles the same
  programs; the cache cuts the suite's time, and changes no number (it
  stores the executables, keyed by program and options). Not for the
  benchmark, whose compile times it would falsify.

  A process the test kills passes its own `xla_cache` directory: JAX
  writes an entry in place, and a kill in the middle of a write would leave
  the session's cache a truncated entry, which every later reader would
  warn about on stderr."""
  env = {**os.environ, 'PYTHONPATH': ROOT}
  cache = xla_cache or os.environ.get('SELFATTN_TEST_XLA_CACHE')
  if cache:
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS='0')
  if 'XLA_FLAGS' in extra:      # added to the suite's flags (conftest), not instead
    extra = {**extra, 'XLA_FLAGS': ' '.join(
        filter(None, [env.get('XLA_FLAGS'), extra['XLA_FLAGS']]))}
  return {**env, **extra}


def smoke_env() -> dict[str, str]:
  """The environment of `bench.py --smoke`, whose numbers are not
  measurements: the suite's compile shortcut kept (XLA_FLAGS from
  conftest), but no shared XLA cache, so its compile times are real ones."""
  env = {**os.environ, 'PYTHONPATH': ROOT}
  env.pop('JAX_COMPILATION_CACHE_DIR', None)
  return env


TINY = 'configs/tiny.py'


def cli(workdir, *overrides, config=TINY, env=None, wait=True,
        xla_cache=None):
  """Runs `python -m selfattn.main` in a subprocess from the repository root
  (`xla_cache`: subprocess_env's, for a process the test will kill).
  A run of configs/tiny.py draws no figures: importing
  Matplotlib, compiling the attention probe and drawing were about 1.2 s
  of each 6-second run, and no test of a subprocess run reads its images (the
  in-process runs check them: test_train.py, test_tensorboard.py)."""
  if config == TINY:
    overrides = ('--config.eval.figures=False', *overrides)
  cmd = [sys.executable, '-m', 'selfattn.main', f'--config={config}',
         f'--workdir={workdir}', *overrides]
  full_env = subprocess_env(xla_cache=xla_cache, **(env or {}))
  if not wait:
    return subprocess.Popen(cmd, cwd=ROOT, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  return subprocess.run(cmd, cwd=ROOT, env=full_env, capture_output=True,
                        text=True, timeout=600)


def thirty_steps_config():
  """configs/tiny.py for 30 steps with checkpoints at 10, 20 and 30, and
  no figures (the tiny_config fixture's docstring says why)."""
  from configs import tiny
  config = tiny.get_config()
  config.eval.figures = False
  config.train.num_steps = config.eval.every = 30
  config.train.checkpoint_every = 10
  return config


def crashed_copy(workdir, dest, step: int):
  """dest: a copy of `workdir` as a crash right after checkpoint `step`
  would leave it (its config.json and that checkpoint only)."""
  os.makedirs(os.path.join(dest, 'checkpoints'))
  shutil.copy(os.path.join(workdir, 'config.json'),
              os.path.join(dest, 'config.json'))
  shutil.copytree(os.path.join(workdir, 'checkpoints', str(step)),
                  os.path.join(dest, 'checkpoints', str(step)))
  return dest

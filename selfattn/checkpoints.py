"""Orbax checkpoints of the train state, and the config stored beside them.

Restoring uses the shardings of the state built for the current mesh, so a
checkpoint written on 8 devices restores on 1 and the reverse.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import orbax.checkpoint as ocp

from selfattn.config_checks import ConfigError

CONFIG_FILE = 'config.json'
# Fields that shape the parameters, the data or the schedule: a resumed run
# must agree on them or it would not continue the same run.
_MUST_MATCH = ('seed', 'task', 'model', 'train.batch_size', 'train.num_steps',
               'train.learning_rate', 'train.warmup_steps',
               'train.weight_decay', 'train.grad_clip', 'train.schedule')


def manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'), options=options)


def save(mngr: ocp.CheckpointManager, step: int, state: Any) -> None:
  mngr.save(step, args=ocp.args.StandardSave(state))


def restore_latest(mngr: ocp.CheckpointManager, state: Any
                   ) -> tuple[Any, int] | None:
  """(state, step) from the latest checkpoint, laid out like `state`; or None."""
  step = mngr.latest_step()
  if step is None:
    return None
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  return mngr.restore(step, args=ocp.args.StandardRestore(target)), step


def _lookup(config: dict, dotted: str):
  value = config
  for part in dotted.split('.'):
    value = value.get(part) if isinstance(value, dict) else None
  return value


def _differences(stored: dict, current: dict, prefix: str = '') -> list[str]:
  out = []
  for key in sorted(set(stored) | set(current)):
    a, b = stored.get(key), current.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += _differences(a, b, f'{prefix}{key}.')
    elif a != b:
      out.append(f'config.{prefix}{key}: stored {a!r}, now {b!r}')
  return out


def check_or_store_config(workdir: str, config: ml_collections.ConfigDict,
                          write: bool) -> None:
  """Stores the config in a new workdir; in a used one, refuses a config
  that would not continue the same run (raises ConfigError)."""
  path = os.path.join(workdir, CONFIG_FILE)
  current = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    with open(path) as f:
      stored = json.load(f)
    problems = []
    for field in _MUST_MATCH:
      a, b = _lookup(stored, field), _lookup(current, field)
      if isinstance(a, dict) and isinstance(b, dict):
        problems += _differences(a, b, field + '.')
      elif a != b:
        problems.append(f'config.{field}: stored {a!r}, now {b!r}')
    if problems:
      raise ConfigError(
          f'workdir {workdir} holds a run with a different config; use a new '
          f'--workdir or the stored config ({path}). Differences: '
          + '; '.join(problems))
  if write:
    # Atomic, so another process reading it sees no file or the whole file.
    os.makedirs(workdir, exist_ok=True)
    with open(path + '.tmp', 'w') as f:
      json.dump(current, f, indent=2, sort_keys=True)
    os.replace(path + '.tmp', path)

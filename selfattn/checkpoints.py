"""Orbax checkpoints of the train state, and the config stored beside them.

Restoring uses the shardings of the state built for the current mesh, so a
checkpoint written on 8 devices restores on 1 and the reverse.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from typing import Any, Iterator

import jax
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from selfattn.config_checks import ConfigError

CONFIG_FILE = 'config.json'
LOCK_FILE = '.lock'
# Fields that shape the parameters, the data or the schedule: a resumed run
# must agree on them or it would not continue the same run.
_MUST_MATCH = ('seed', 'task', 'model', 'train.batch_size', 'train.num_steps',
               'train.learning_rate', 'train.warmup_steps',
               'train.weight_decay', 'train.grad_clip', 'train.schedule',
               'train.final_lr_fraction', 'train.b2', 'train.init_from')

# Fields added to the config after runs were already stored, with the value
# that reproduces what those runs computed: a stored config without the field
# reads as having it, so upgrading selfattn does not strand a half-finished run.
_ADDED_FIELDS = {'model.attention_impl': 'plain', 'model.remat': False,
                 'model.scan_layers': False, 'train.init_from': '',
                 # 2026-11-24: PoPE's task, the music task, the published
                 # recipes' optimiser settings (defaults = the old behaviour).
                 'task.max_shift': 15, 'task.transpose': 0,
                 'train.final_lr_fraction': 0.0, 'train.b2': 0.999,
                 # 2026-11-25: RMSNorm for the published recipes.
                 'model.norm_type': 'layernorm',
                 # 2026-11-26: the meter (issue 34).
                 'task.crop_align': 1, 'model.meter_period': 0,
                 'model.meter_step_tokens': 4}


def manager(workdir: str, keep: int) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
  return ocp.CheckpointManager(
      os.path.join(os.path.abspath(workdir), 'checkpoints'), options=options)


def save(mngr: ocp.CheckpointManager, step: int, state: Any) -> None:
  """Starts saving `state` as checkpoint `step`, with a checksum of its
  arrays in the step's metadata; raises CheckpointError at once when the
  directory cannot be written.

  Orbax starts background threads that wait for each other's signals; when
  its first write fails they wait out a 300 s barrier (and keep the process
  alive at exit). A probe write first turns the common failures (read-only
  or missing permission) into an immediate error before any thread starts.

  The checksum (state_checksum: SHA-256 of each array's bytes, computed here
  on the host from the state being saved) goes into orbax's own step
  metadata (`<step>/_CHECKPOINT_METADATA`, key CHECKSUM_KEY), which orbax
  commits with the checkpoint: a step directory holds both or neither.
  Restoring verifies it (restore_latest).
  """
  directory = str(mngr.directory)
  probe = os.path.join(directory, f'.write-probe-{os.getpid()}')
  try:
    os.makedirs(directory, exist_ok=True)
    os.mkdir(probe)
    os.rmdir(probe)
  except OSError as e:
    raise CheckpointError(f'cannot write checkpoint step {step} to '
                          f'{directory}: {e.strerror or e}') from None
  checksum = state_checksum(state)
  metadata = {} if checksum is None else {CHECKSUM_KEY: checksum}
  with _failures_as_checkpoint_error(f'saving checkpoints to {directory} '
                                     f'(at step {step})'):
    mngr.save(step, args=ocp.args.StandardSave(state),
              custom_metadata=metadata)


def wait(mngr: ocp.CheckpointManager) -> None:
  """Waits for the pending save; a failed background write (a full disk)
  raises CheckpointError, in one line."""
  with _failures_as_checkpoint_error(f'writing a checkpoint to '
                                     f'{mngr.directory}'):
    mngr.wait_until_finished()


@contextlib.contextmanager
def _failures_as_checkpoint_error(what: str):
  # Orbax reports a failed background write as whatever its thread raised
  # (OSError, or ValueError('RESOURCE_EXHAUSTED: ... No space left on
  # device')), from this save or from the next one.
  try:
    yield
  except CheckpointError:
    raise
  except Exception as e:   # noqa: BLE001 - any failure of the write itself
    reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if len(reason) > 300:
      reason = reason[:150] + ' ... ' + reason[-140:]
    raise CheckpointError(f'{what} failed: {reason}') from None


# --------------------------------------------------------------------------
# Checksums.
# --------------------------------------------------------------------------

CHECKSUM_KEY = 'selfattn_checksum'
_STEP_METADATA = '_CHECKPOINT_METADATA'     # orbax's per-step metadata file


def state_checksum(state: Any) -> dict[str, Any] | None:
  """{'algorithm': 'sha256', 'leaves': {tree path: hex digest}}: a SHA-256 of
  each array's dtype, shape and bytes, on the host. Independent of the
  mesh (a checkpoint saved on 8 devices verifies when restored on 1). None
  when some array is sharded over other processes, so that this process
  cannot read it whole (then nothing is recorded or verified)."""
  flat = jax.tree_util.tree_flatten_with_path(state)[0]
  values = []
  for _, leaf in flat:
    if isinstance(leaf, jax.Array):
      if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
        leaf = jax.random.key_data(leaf)
      if not leaf.is_fully_addressable:
        if not leaf.sharding.is_fully_replicated:
          return None
        leaf = leaf.addressable_data(0)
    values.append(leaf)
  values = jax.device_get(values)        # one transfer for the whole state
  leaves = {}
  for (path, _), value in zip(flat, values):
    value = np.ascontiguousarray(value)
    digest = hashlib.sha256(f'{value.dtype.str}{value.shape}'.encode())
    digest.update(value.tobytes())
    leaves[jax.tree_util.keystr(path)] = digest.hexdigest()
  return {'algorithm': 'sha256', 'leaves': leaves}


class _Damaged(Exception):
  """A checkpoint that restores but is not what was saved."""


def _stored_checksum(path: str) -> dict[str, Any] | None:
  """The checksum recorded in step directory `path`; None for a checkpoint
  saved before checksums were recorded. _Damaged when orbax's step metadata
  is missing or unreadable (orbax writes it with every checkpoint)."""
  try:
    with open(os.path.join(path, _STEP_METADATA)) as f:
      metadata = json.load(f)
  except (OSError, ValueError) as e:
    raise _Damaged(f'its {_STEP_METADATA} is missing or unreadable '
                   f'({type(e).__name__})') from None
  if not isinstance(metadata, dict):
    raise _Damaged(f'its {_STEP_METADATA} is not a JSON object')
  return (metadata.get('custom_metadata') or {}).get(CHECKSUM_KEY)


def _verify(stored: dict[str, Any], restored: Any) -> None:
  """Raises _Damaged naming the arrays whose bytes differ from the saved ones."""
  actual = state_checksum(restored)
  if actual is None:
    return
  if stored.get('algorithm') != actual['algorithm']:
    raise _Damaged(f'unknown checksum algorithm {stored.get("algorithm")!r}')
  expected = stored.get('leaves') or {}
  bad = sorted(k for k in set(expected) | set(actual['leaves'])
               if expected.get(k) != actual['leaves'].get(k))
  if bad:
    more = f' and {len(bad) - 1} more' if len(bad) > 1 else ''
    raise _Damaged(f'checksum mismatch: {len(bad)} of {len(expected)} arrays '
                   f'differ from the saved ones ({bad[0]}{more})')


def _restore_verified(path: str, target: Any, step: int) -> Any:
  """The state in step directory `path`, laid out like `target`, verified
  against its stored checksum; raises on any damage."""
  stored = _stored_checksum(path)
  # A standalone checkpointer: a failed restore leaves no state behind in a
  # manager that the next attempt could trip over.
  restored = ocp.StandardCheckpointer().restore(
      os.path.join(path, 'default'), target)
  if stored is None:
    logging.warning('checkpoint at step %d in %s was saved without a checksum '
                    '(by an older selfattn): restored unverified', step,
                    os.path.dirname(path))
  else:
    _verify(stored, restored)
  return restored


def _reason(e: Exception) -> str:
  if isinstance(e, _Damaged):
    return str(e)
  first = str(e).splitlines()[0][:200] if str(e) else ''
  return f'{type(e).__name__}: {first}'


# --------------------------------------------------------------------------
# Restoring.
# --------------------------------------------------------------------------

def restore_latest(mngr: ocp.CheckpointManager, state: Any
                   ) -> tuple[Any, int] | None:
  """(state, step) from the newest checkpoint that restores and matches its
  checksum, laid out like `state`; None when there is no checkpoint.

  A checkpoint that fails to restore (truncated file, missing metadata, an
  emptied step directory) or restores other bytes than were saved (a
  checksum mismatch) is skipped with a one-line warning naming it and why,
  and moved aside to `<step>.damaged` (kept for inspection; the run will
  write that step again); the next older one is tried: at most the steps
  since it are lost. Raises CheckpointError when checkpoints exist but none
  restores. For a workdir that is not this run's, use restore_latest_read_only.
  """
  directory = str(mngr.directory)

  def move_aside(step: int, reason: str) -> None:
    path = os.path.join(directory, str(step))
    # The same step may be damaged again after it was rewritten: keep both.
    aside, n = f'{path}.damaged', 1
    while os.path.exists(aside):
      aside, n = f'{path}.damaged.{n}', n + 1
    logging.warning('skipping checkpoint at step %d, which does not '
                    'restore (%s); moved to %s', step, reason, aside)
    if jax.process_index() == 0:
      os.replace(path, aside)
    mngr.reload()

  return _newest_that_restores(directory, mngr.all_steps(), state, move_aside)


def restore_latest_read_only(workdir: str, state: Any
                             ) -> tuple[Any, int] | None:
  """restore_latest for another run's workdir (config.train.init_from),
  which it never modifies: no checkpoint manager is opened on it (orbax's
  creates and cleans up directories) and damaged checkpoints are skipped
  with a warning but left in place."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  names = os.listdir(directory) if os.path.isdir(directory) else []
  # Finished steps only: orbax writes into `<step>.orbax-checkpoint-tmp-*`
  # and renames it when the checkpoint is complete.
  steps = [int(name) for name in names if name.isdigit()
           and os.path.isdir(os.path.join(directory, name))]

  def leave(step: int, reason: str) -> None:
    logging.warning('skipping checkpoint at step %d of %s, which does not '
                    'restore (%s); left in place', step, workdir, reason)

  return _newest_that_restores(directory, steps, state, leave)


def _newest_that_restores(directory: str, steps, state: Any, on_damaged
                          ) -> tuple[Any, int] | None:
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  problems = []
  for step in sorted(steps, reverse=True):
    try:
      return _restore_verified(os.path.join(directory, str(step)), target,
                               step), step
    except Exception as e:     # orbax raises many types for damaged files
      reason = _reason(e)
      on_damaged(step, reason)
      problems.append(f'step {step} ({reason})')
  if problems:
    raise CheckpointError(
        f'no checkpoint in {directory} restores: {"; ".join(problems)}')
  return None


def write_json(path: str, value: Any, sort_keys: bool = False) -> None:
  """Writes `value` to `path` atomically: another process (or the next run
  after a crash or a full disk) sees the old file or the whole new one,
  never a part. The temp file is removed when the write fails."""
  directory = os.path.dirname(path) or '.'
  os.makedirs(directory, exist_ok=True)
  temp = f'{path}.tmp-{os.getpid()}'
  try:
    with open(temp, 'w') as f:
      json.dump(value, f, indent=2, sort_keys=sort_keys)
      f.flush()
      os.fsync(f.fileno())
    os.replace(temp, path)
  except BaseException:
    with contextlib.suppress(OSError):
      os.remove(temp)
    raise


class CheckpointError(RuntimeError):
  """Every checkpoint of a workdir is damaged."""


@contextlib.contextmanager
def workdir_lock(workdir: str, enabled: bool = True) -> Iterator[None]:
  """Holds an exclusive lock on workdir/.lock while a run uses the workdir.

  A second live process gets a ConfigError naming the holder; the kernel
  drops the lock when its holder dies, so a killed run never blocks the next.
  Only process 0 of a multi-process run takes it. A run refused with a
  ConfigError leaves no trace in a workdir that did not exist: the lock
  and the directories made for it are removed again.
  """
  if not enabled:
    yield
    return
  made = _missing_directories(workdir)
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, LOCK_FILE)
  try:
    handle = open(path, 'a+')
  except OSError as e:
    raise ConfigError(f'cannot open the lock file {path}: {e.strerror}; '
                      f'remove it (no live run holds a lock that is not a '
                      f'file) or use another --workdir') from None
  try:
    try:
      fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      handle.seek(0)
      holder = handle.read().strip() or 'unknown'
      raise ConfigError(f'workdir {workdir} is in use by another live run '
                        f'(pid {holder}, lock {path}); wait for it or use '
                        f'another --workdir') from None
    try:
      try:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
      except OSError as e:    # e.g. a disk already full when the run starts
        raise ConfigError(f'cannot write the lock file {path}: '
                          f'{e.strerror or e}; free space or use another '
                          f'--workdir') from None
      yield
    except ConfigError:
      if made and os.listdir(workdir) == [LOCK_FILE]:
        os.remove(path)
        for directory in made:          # deepest first; only if still empty
          if not os.listdir(directory):
            os.rmdir(directory)
      raise
  finally:
    handle.close()         # releases the lock


def _missing_directories(workdir: str) -> list[str]:
  """The directories os.makedirs(workdir) would create, deepest first."""
  missing, path = [], os.path.abspath(workdir)
  while not os.path.exists(path):
    missing.append(path)
    path = os.path.dirname(path)
  return missing


def _lookup(config: dict, dotted: str):
  value = config
  for part in dotted.split('.'):
    value = value.get(part) if isinstance(value, dict) else None
  return value


def _with_added_fields(stored: dict) -> dict:
  for dotted, value in _ADDED_FIELDS.items():
    *parents, leaf = dotted.split('.')
    node = stored
    for part in parents:
      node = node.setdefault(part, {})
    node.setdefault(leaf, value)
  return stored


def _differences(stored: dict, current: dict, prefix: str = '') -> list[str]:
  out = []
  for key in sorted(set(stored) | set(current)):
    a, b = stored.get(key), current.get(key)
    if isinstance(a, dict) and isinstance(b, dict):
      out += _differences(a, b, f'{prefix}{key}.')
    elif a != b:
      out.append(f'config.{prefix}{key}: stored {a!r}, now {b!r}')
  return out


def has_checkpoints(workdir: str) -> bool:
  """Whether workdir/checkpoints holds any step directory."""
  directory = os.path.join(workdir, 'checkpoints')
  return os.path.isdir(directory) and any(
      name.split('.')[0].isdigit() for name in os.listdir(directory))


def init_from_problem(config: ml_collections.ConfigDict) -> str | None:
  """Why config.train.init_from cannot start this run, in one line (None
  when it can or is unset): it must be a workdir with checkpoints and a
  stored config whose model is this one."""
  source = config.train.init_from
  if not source:
    return None
  path = os.path.join(source, CONFIG_FILE)
  if not (os.path.isdir(source) and has_checkpoints(source)
          and os.path.exists(path)):
    return (f'config.train.init_from={source!r} is not a workdir with '
            f'checkpoints and a {CONFIG_FILE}')
  with open(path) as f:
    stored = _with_added_fields(json.load(f))
  current = json.loads(config.to_json_best_effort())
  # How attention is executed and dropout do not shape the parameters.
  free = ('attention_impl', 'remat', 'dropout')
  shaping = lambda model: {k: v for k, v in model.items() if k not in free}
  differences = _differences(shaping(stored.get('model', {})),
                             shaping(current['model']), 'model.')
  if differences:
    return (f'config.train.init_from={source!r} holds a different model, '
            f'whose parameters cannot start this one: ' + '; '.join(differences))
  return None


def check_or_store_config(workdir: str, config: ml_collections.ConfigDict,
                          write: bool) -> None:
  """Stores the config in a new workdir; in a used one, refuses a config
  that would not continue the same run (raises ConfigError)."""
  path = os.path.join(workdir, CONFIG_FILE)
  current = json.loads(config.to_json_best_effort())
  if os.path.exists(path):
    stored = _with_added_fields(read_json_object(path, 'the stored config'))
    problems = []
    for field in _MUST_MATCH:
      a, b = _lookup(stored, field), _lookup(current, field)
      if isinstance(a, dict) and isinstance(b, dict):
        problems += _differences(a, b, field + '.')
      elif a != b:
        problems.append(f'config.{field}: stored {a!r}, now {b!r}')
    if problems:
      hint = ''
      if any(p.startswith('config.train.num_steps') for p in problems):
        hint = (f'. The learning-rate schedule is built for num_steps, so a '
                f'run cannot be lengthened in place; to train longer, start a '
                f'new workdir from this one\'s parameters with '
                f'--config.train.init_from={workdir}')
      raise ConfigError(
          f'workdir {workdir} holds a run with a different config; use a new '
          f'--workdir or the stored config ({path}). Differences: '
          + '; '.join(problems) + hint)
  elif has_checkpoints(workdir):
    raise ConfigError(
        f'workdir {workdir} holds checkpoints but no {CONFIG_FILE}, so they '
        f'cannot be checked against this config; put its {CONFIG_FILE} back or '
        f'use a new --workdir (--config.train.init_from=DIR starts from '
        f'another run\'s parameters)')
  if write and _read_text(path) != json.dumps(current, indent=2,
                                             sort_keys=True):
    # Atomic, so another process reading it sees no file or the whole file;
    # left alone when it already holds this config (its mtime included).
    try:
      write_json(path, current, sort_keys=True)
    except OSError as e:      # e.g. a disk already full when the run starts
      raise ConfigError(f'cannot write {path}: {e.strerror or e}; free space '
                        f'or use another --workdir') from None


def read_json_object(path: str, what: str) -> dict:
  """A JSON object from `path`, or a ConfigError in one line naming the
  file and what to do (empty, truncated, not JSON, not an object, a
  directory, unreadable)."""
  try:
    with open(path) as f:
      value = json.load(f)
  except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
    reason = e.strerror if isinstance(e, OSError) and e.strerror else (
        ' '.join(str(e).split()))
    raise ConfigError(f'{path} ({what}) cannot be read: {reason}; fix or '
                      f'delete it, or use a new --workdir') from None
  if not isinstance(value, dict):
    raise ConfigError(f'{path} ({what}) holds a JSON {type(value).__name__}, '
                      f'not an object; fix or delete it, or use a new '
                      f'--workdir')
  return value


def _read_text(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read()
  except OSError:
    return None

"""Orbax checkpoints of the train state: saving with a checksum, restoring
the newest one that restores and matches it (damaged ones moved aside).

Restoring uses the shardings of the state built for the current mesh, so a
checkpoint written on 8 devices restores on 1 and the reverse. The workdir
around the checkpoints (its lock, config.json, JSON files) is workdir.py's.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from selfattn.errors import CheckpointError


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
  Restoring verifies it (restore_latest, read_params).
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


def _verify(stored: dict[str, Any], restored: Any, partial: bool) -> None:
  """Raises _Damaged naming the arrays whose bytes differ from the saved ones:
  every saved array, or with `partial` those restored (a part of the state
  read on its own)."""
  actual = state_checksum(restored)
  if actual is None:
    return
  if stored.get('algorithm') != actual['algorithm']:
    raise _Damaged(f'unknown checksum algorithm {stored.get("algorithm")!r}')
  expected = stored.get('leaves') or {}
  names = set(actual['leaves']) | (set() if partial else set(expected))
  bad = sorted(k for k in names if expected.get(k) != actual['leaves'].get(k))
  if bad:
    more = f' and {len(bad) - 1} more' if len(bad) > 1 else ''
    raise _Damaged(f'checksum mismatch: {len(bad)} of {len(names)} arrays '
                   f'differ from the saved ones ({bad[0]}{more})')


def _restore_verified(path: str, target: Any, step: int,
                      partial: bool = False) -> Any:
  """The state in step directory `path`, laid out like `target` (arrays or
  ShapeDtypeStructs, with their shardings), verified against its stored
  checksum; raises on any damage. With `partial`, `target` may name a part
  of the state ({'params': ...}): only that part is read and verified."""
  stored = _stored_checksum(path)
  directory = os.path.join(path, 'default')
  target = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
  if partial:
    # Orbax's partial restore drops saved arrays the target does not name
    # and fills in ones it names but the checkpoint lacks: compare the
    # names first, so a layout of another model is refused in words.
    saved = _stored_tree(directory)
    for key in target:
      differences = _tree_differences(saved[key], target[key])
      if differences:
        raise _Damaged(f"its {key} are not this layout's: "
                       + '; '.join(differences))
    restored = ocp.PyTreeCheckpointer().restore(
        directory, args=ocp.args.PyTreeRestore(
            item=target, partial_restore=True,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target)))
  else:
    # A standalone checkpointer: a failed restore leaves no state behind in
    # a manager that the next attempt could trip over.
    restored = ocp.StandardCheckpointer().restore(directory, target)
  if stored is None:
    logging.warning('checkpoint at step %d in %s was saved without a checksum '
                    '(by an older selfattn): restored unverified', step,
                    os.path.dirname(path))
  else:
    _verify(stored, restored, partial)
  return restored


def _reason(e: Exception) -> str:
  if isinstance(e, _Damaged):
    return str(e)
  first = str(e).splitlines()[0] if str(e) else ''
  # TensorStore appends the repr of a method, not its text.
  first = first.split('See full TensorStore details')[0].rstrip(' .;[')
  return f'{type(e).__name__}: {first[:200]}'


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
  restores. For a workdir that is not this run's, use read_params.
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


def saved_steps(workdir: str) -> list[int]:
  """The steps of workdir's finished checkpoints, ascending."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  names = os.listdir(directory) if os.path.isdir(directory) else []
  # Finished steps only: orbax writes into `<step>.orbax-checkpoint-tmp-*`
  # and renames it when the checkpoint is complete.
  return sorted(int(name) for name in names if name.isdigit()
                and os.path.isdir(os.path.join(directory, name)))


def _leaf_name(path) -> str:
  """A tree path as 'a/b/0': the same for an nnx.State (attribute keys) and
  orbax's metadata tree of it (dict keys)."""
  parts = []
  for key in path:
    for attribute in ('key', 'name', 'idx'):
      if hasattr(key, attribute):
        parts.append(str(getattr(key, attribute)))
        break
  # nnx keeps each parameter's array in a `value` attribute: not a name.
  return '/'.join(parts[:-1] if parts[-1:] == ['value'] else parts)


def _stored_tree(directory: str) -> Any:
  """The metadata tree of the state saved in `directory` (a step's
  `default`): shapes and dtypes, no array read."""
  handler = ocp.PyTreeCheckpointHandler()
  try:
    # The handler joins paths with `/`: a pathlib.Path does, a str does not.
    return handler.metadata(pathlib.Path(directory)).tree
  finally:
    handler.close()


def _tree_differences(stored: Any, wanted: Any, limit: int = 4) -> list[str]:
  """How the arrays of `stored` (orbax metadata) and `wanted` (arrays or
  ShapeDtypeStructs) differ in names and shapes: at most `limit` lines,
  then a count; [] when they match."""
  shapes = lambda t: {_leaf_name(p): tuple(leaf.shape) for p, leaf
                      in jax.tree_util.tree_flatten_with_path(t)[0]}
  stored, wanted = shapes(stored), shapes(wanted)
  differences = []
  for name in sorted(set(stored) | set(wanted)):
    a, b = stored.get(name), wanted.get(name)
    if a is None:
      differences.append(f'{name}: not in the checkpoint')
    elif b is None:
      differences.append(f'{name}: not in this model')
    elif a != b:
      differences.append(f'{name}: stored {a}, this model {b}')
  if len(differences) > limit:
    differences = differences[:limit] + [f'{len(differences) - limit} more']
  return differences


def parameter_shape_differences(workdir: str, params: Any,
                                limit: int = 4) -> list[str] | None:
  """How the parameters of workdir's newest checkpoint differ in shape from
  `params` (arrays or ShapeDtypeStructs), read from orbax's metadata
  without loading an array: at most `limit` lines, then a count; [] when
  they match. None when there is no checkpoint or its metadata does not
  read (a damaged one, which restoring then reports)."""
  steps = saved_steps(workdir)
  if not steps:
    return None
  path = os.path.join(os.path.abspath(workdir), 'checkpoints', str(steps[-1]),
                      'default')
  try:
    stored_params = _stored_tree(path)['params']
  except Exception:    # noqa: BLE001 - orbax raises many types for damage
    return None
  return _tree_differences(stored_params, params, limit)


def read_params(workdir: str, params: Any, step: int | None = None
                ) -> tuple[Any, int] | None:
  """(parameters, step) of another run's checkpoint at `step`, or of its
  newest that restores, laid out like `params` (arrays or
  ShapeDtypeStructs with their shardings: Trainer.params_layout()) and
  verified against the checksums saved with them. Only the parameters are
  read, not the optimiser state (twice their size for Adam).

  The workdir is never modified (a study choosing among a run's
  checkpoints, config.train.init_from, load_model): no checkpoint manager
  is opened on it (orbax's creates and cleans up directories). Without
  `step`, damaged checkpoints are skipped with a warning and left in place;
  None when there is no checkpoint, CheckpointError when none restores.
  With `step`, CheckpointError when that one does not restore."""
  directory = os.path.join(os.path.abspath(workdir), 'checkpoints')
  target = {'params': params}
  if step is not None:
    try:
      restored = _restore_verified(os.path.join(directory, str(step)), target,
                                   step, partial=True)
    except Exception as e:     # orbax raises many types for damaged files
      raise CheckpointError(f'checkpoint at step {step} of {workdir} does '
                            f'not restore ({_reason(e)})') from None
    return restored['params'], step

  def leave(step: int, reason: str) -> None:
    logging.warning('skipping checkpoint at step %d of %s, which does not '
                    'restore (%s); left in place', step, workdir, reason)

  found = _newest_that_restores(directory, saved_steps(workdir), target, leave,
                                partial=True)
  return None if found is None else (found[0]['params'], found[1])


def _newest_that_restores(directory: str, steps, state: Any, on_damaged,
                          partial: bool = False) -> tuple[Any, int] | None:
  problems = []
  for step in sorted(steps, reverse=True):
    try:
      return _restore_verified(os.path.join(directory, str(step)), state,
                               step, partial), step
    except Exception as e:     # orbax raises many types for damaged files
      reason = _reason(e)
      on_damaged(step, reason)
      problems.append(f'step {step} ({reason})')
  if problems:
    raise CheckpointError(
        f'no checkpoint in {directory} restores: {"; ".join(problems)}')
  return None

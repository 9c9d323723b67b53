"""A run's workdir, around its checkpoints: the lock that keeps a second
live run out, config.json and whether a stored config continues the same
run (with fields added since runs were stored read as their old
behaviour), config.train.init_from's checks, and atomic JSON files.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Iterator

import ml_collections
from absl import logging

from selfattn import tasks
from selfattn.nn import positions
from selfattn.errors import ConfigError

CONFIG_FILE = 'config.json'
SUMMARY_FILE = 'summary.json'
LOCK_FILE = '.lock'
# The step of the run's latest evaluation (a resume from a checkpoint at an
# evaluation step knows whether that evaluation was made before the stop),
# and every evaluation so far (summary.json's history across resumes).
EVALUATED_FILE = 'evaluated.json'
# Fields that shape the parameters, the data or the schedule: a resumed run
# must agree on them or it would not continue the same run.
_MUST_MATCH = ('seed', 'task', 'model', 'train.batch_size', 'train.num_steps',
               'train.learning_rate', 'train.warmup_steps',
               'train.weight_decay', 'train.grad_clip', 'train.schedule',
               'train.final_lr_fraction', 'train.b2', 'train.init_from',
               'train.early_stop_patience', 'train.early_stop_metric',
               # The loss of every step; translation's batches.
               'train.label_smoothing', 'train.batch_tokens')
# With early stopping on, also what its evaluations measure and when: the
# record from before a resume is compared with the evaluations after it.
_MUST_MATCH_EARLY_STOPPING = ('eval.lengths', 'eval.every', 'eval.num_examples')
# Model fields that change how attention is executed, not what it computes
# (the same maths to rounding, the same parameters): a resume may change them,
# so a run started on a CPU continues on a GPU with its kernels. The change is
# returned by check_or_store_config and recorded in EXECUTION_FILE by the run.
EXECUTION_FIELDS = ('attention_impl', 'gpu_kernel', 'remat')
# Each resume that changed EXECUTION_FIELDS: a JSON list of {step, field,
# stored, now}, so config.json (the latest values) does not hide how the
# steps before `step` were executed.
EXECUTION_FILE = 'execution_changes.json'

# Fields added to the config after runs were already stored, with the value
# that reproduces what those runs computed: a stored config without the field
# reads as having it, so upgrading selfattn does not strand a half-finished run.
_ADDED_FIELDS = {'model.attention_impl': 'plain', 'model.remat': False,
                 'model.scan_layers': False, 'train.init_from': '',
                 # 2026-11-24: the published recipes' optimiser settings
                 # (defaults = the old behaviour). The task options added
                 # since (PoPE's max_shift, the music task's transpose and
                 # crop_align, a researcher's register_task) are filled from
                 # tasks.DEFAULT_OPTIONS by with_added_fields.
                 'train.final_lr_fraction': 0.0, 'train.b2': 0.999,
                 # 2026-11-25: RMSNorm for the published recipes.
                 'model.norm_type': 'layernorm',
                 # 2026-11-26: the meter (issue 34).
                 'model.meter_period': 0,
                 'model.meter_step_tokens': 4,
                 # 2026-11-26: translation (issue 33).
                 'model.tie_embeddings': False, 'train.label_smoothing': 0.0,
                 'train.batch_tokens': 0,
                 # 2026-11-27: early stopping (issue 49's convergence runs).
                 'train.early_stop_patience': 0,
                 'train.early_stop_metric': 'loss',
                 # 2026-11-30: the GPU kernel preference (issue 47).
                 'model.gpu_kernel': 'auto',
                 # 2026-11-25: free-running evaluation through the cache
                 # (the fixed point before); 2026-11-29: the switch to skip
                 # TensorBoard images (always made before).
                 'eval.free_running': 'fixed_point', 'eval.figures': True}


def _evaluated_record(workdir: str) -> dict:
  path = os.path.join(workdir, EVALUATED_FILE)
  try:
    with open(path) as f:
      record = json.load(f)
  except FileNotFoundError:
    return {}
  except (OSError, ValueError):
    record = None
  if not isinstance(record, dict):
    logging.warning('%s cannot be read: the evaluation at the resumed step '
                    'is made again, and summary.json\'s history starts '
                    'there', path)
    return {}
  return record


def last_evaluated(workdir: str) -> int:
  """The step of the workdir's latest evaluation (EVALUATED_FILE), or -1
  without a readable record (a run from before the record: its evaluation
  at the resumed step is made again, to the same numbers)."""
  step = _evaluated_record(workdir).get('step')
  return step if isinstance(step, int) else -1


def evaluation_settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """What an evaluation measures: a resume may change it (without early
  stopping), and a history measured two ways is not one curve."""
  e = config.eval
  return {'lengths': list(e.lengths), 'num_examples': e.num_examples,
          'free_running': e.free_running}


def evaluation_history(workdir: str, up_to: int,
                       settings: dict[str, Any]) -> list[dict[str, Any]]:
  """The evaluations ({step, eval}) EVALUATED_FILE records up to step
  `up_to` (a resume's checkpoint: later ones are made again), if they
  measured what `settings` (evaluation_settings) measures; else [] (and
  for a record from before it held them)."""
  record = _evaluated_record(workdir)
  history = record.get('history')
  if not isinstance(history, list):
    return []
  if record.get('settings') != settings:
    before = record.get('settings') or 'what the record does not name'
    logging.warning('the evaluations before this resume measured %s, these '
                    'measure %s: summary.json\'s history starts at the '
                    'resume', before, settings)
    return []
  return [h for h in history
          if isinstance(h, dict) and isinstance(h.get('step'), int)
          and h['step'] <= up_to]


def record_evaluation(workdir: str, history: list[dict[str, Any]],
                      settings: dict[str, Any]) -> None:
  """EVALUATED_FILE after an evaluation: its step (history's last), the
  whole history and what it measured (evaluation_settings)."""
  write_json(os.path.join(workdir, EVALUATED_FILE),
             {'step': history[-1]['step'], 'history': history,
              'settings': settings})


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


@contextlib.contextmanager
def workdir_lock(workdir: str, enabled: bool = True) -> Iterator[None]:
  """Holds an exclusive lock on workdir/.lock while a run uses the workdir.

  A second live process gets a ConfigError naming the holder; the kernel
  drops the lock when its holder dies, so a killed run never blocks the next.
  Only process 0 of a multi-process run takes it. A run that fails before
  writing anything (refused with a ConfigError, or an init_from source whose
  checkpoints do not restore) leaves no trace in a workdir that did not
  exist: the lock and the directories made for it are removed again.
  """
  if not enabled:
    yield
    return
  made = _missing_directories(workdir)
  try:
    os.makedirs(workdir, exist_ok=True)
  except OSError as e:
    # os.access can pass where creating fails (root on a read-only or
    # virtual file system, say): said here in one line, and what was made
    # before the failure removed again.
    _remove_empty(made)
    raise ConfigError(f'cannot create the workdir {workdir}: '
                      f'{e.strerror or e}') from None
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
    except BaseException:
      # Only what this run made and left holding nothing but the lock.
      if made and os.listdir(workdir) == [LOCK_FILE]:
        os.remove(path)
        _remove_empty(made)
      raise
  finally:
    handle.close()         # releases the lock


def _remove_empty(directories: list[str]) -> None:
  """Removes each of `directories` (deepest first) that exists and is
  empty: what a refused run made, and nothing it did not."""
  for directory in directories:
    if os.path.isdir(directory) and not os.listdir(directory):
      os.rmdir(directory)


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


def with_added_fields(stored: dict) -> dict:
  """`stored` (a config.json's dict), with every field added since it was
  written set to the value that reproduces what it computed; in place.
  A task option it lacks reads as its default, which every other task
  ignores (so a task registered later does not strand older runs), and an
  encoding option as unset (None: the encoding's own default)."""
  added = {**{f'task.{name}': default
              for name, default in tasks.DEFAULT_OPTIONS.items()},
           **{f'model.{name}': None for name in positions.option_types()},
           **_ADDED_FIELDS}
  for dotted, value in added.items():
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
  if not (os.path.isdir(source) and has_checkpoints(source)
          and os.path.exists(os.path.join(source, CONFIG_FILE))):
    return (f'config.train.init_from={source!r} is not a workdir with '
            f'checkpoints and a {CONFIG_FILE}')
  # How attention is executed and dropout do not shape the parameters.
  shaping = lambda model: _without(model, EXECUTION_FIELDS + ('dropout',))
  differences = init_from_differences(config, 'model', shaping)
  if differences:
    return (f'config.train.init_from={source!r} holds a different model, '
            f'whose parameters cannot start this one: ' + '; '.join(differences))
  return None


def init_from_differences(config: ml_collections.ConfigDict, section: str,
                          keep=lambda fields: fields) -> list[str]:
  """How config.<section> differs from the one stored by
  config.train.init_from's run (its `keep`-filtered fields), one
  'config.<section>.<field>: stored .., now ..' line each."""
  source = config.train.init_from
  stored = with_added_fields(read_json_object(
      os.path.join(source, CONFIG_FILE),
      f'the config of config.train.init_from={source!r}'))
  current = json.loads(config.to_json_best_effort())
  resolve = _with_vocab_size if section == 'task' else (lambda x: x)
  return _differences(keep(resolve(stored.get(section, {}))),
                      keep(resolve(current[section])), section + '.')


def _with_vocab_size(task: dict) -> dict:
  """config.task as a dict, with an unset vocab_size as the size the task
  takes (its fixed or default alphabet): stated or left unset, it is the
  same run."""
  spec = tasks.TASKS.get(task.get('name'))
  if spec is None or task.get('vocab_size') is not None:
    return task
  return {**task, 'vocab_size': (spec.fixed_vocab if spec.fixed_vocab
                                 is not None else spec.default_vocab)}


def _without(fields: dict, names: tuple[str, ...]) -> dict:
  return {k: v for k, v in fields.items() if k not in names}


def check_or_store_config(workdir: str, config: ml_collections.ConfigDict,
                          write: bool) -> list[tuple[str, Any, Any]]:
  """Stores the config in a new workdir; in a used one, refuses a config
  that would not continue the same run (raises ConfigError). Returns the
  EXECUTION_FIELDS the config changes from the stored one, as
  (dotted field, stored, now): allowed, and for the caller to record."""
  path = os.path.join(workdir, CONFIG_FILE)
  current = json.loads(config.to_json_best_effort())
  changed: list[tuple[str, Any, Any]] = []
  if os.path.exists(path):
    stored = with_added_fields(read_json_object(path, 'the stored config'))
    problems = []
    # A finished run evaluates nothing more, so only one that will resume
    # has a record to protect.
    early_stopping = (bool(_lookup(stored, 'train.early_stop_patience'))
                      and finished_summary(workdir, config.train.num_steps)
                      is None)
    for field in _MUST_MATCH + (_MUST_MATCH_EARLY_STOPPING if early_stopping
                                else ()):
      a, b = _lookup(stored, field), _lookup(current, field)
      if field == 'model' and isinstance(a, dict) and isinstance(b, dict):
        changed += [(f'model.{k}', a.get(k), b.get(k))
                    for k in EXECUTION_FIELDS if a.get(k) != b.get(k)]
        a, b = _without(a, EXECUTION_FIELDS), _without(b, EXECUTION_FIELDS)
      if field == 'task' and isinstance(a, dict) and isinstance(b, dict):
        a, b = _with_vocab_size(a), _with_vocab_size(b)
      if isinstance(a, dict) and isinstance(b, dict):
        problems += _differences(a, b, field + '.')
      elif a != b:
        problems.append(f'config.{field}: stored {a!r}, now {b!r}')
    if problems:
      hint = ''
      if any(p.startswith('config.train.num_steps') for p in problems):
        hint = (f'. The learning-rate schedule is built for num_steps, so a '
                f'run\'s length cannot be changed in place; to train longer, start a '
                f'new workdir from this one\'s parameters with '
                f'--config.train.init_from={workdir}')
      if early_stopping and any(p.startswith('config.eval.') for p in problems):
        hint += ('. With early stopping on, the evaluations before and after '
                 'a resume are compared, so they must measure the same thing '
                 'at the same steps')
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
  if write:
    store_config(workdir, config)
  return changed


def store_config(workdir: str, config: ml_collections.ConfigDict) -> None:
  """Writes the config as the workdir's config.json (once
  check_or_store_config accepted it): atomic, so another process reading it
  sees no file or the whole file; left alone when it already holds this
  config (its mtime included)."""
  path = os.path.join(workdir, CONFIG_FILE)
  current = json.loads(config.to_json_best_effort())
  if _read_text(path) == json.dumps(current, indent=2, sort_keys=True):
    return
  try:
    write_json(path, current, sort_keys=True)
  except OSError as e:      # e.g. a disk already full when the run starts
    raise ConfigError(f'cannot write {path}: {e.strerror or e}; free space '
                      f'or use another --workdir') from None


def record_execution_changes(workdir: str, step: int,
                             changed: list[tuple[str, Any, Any]]) -> None:
  """Appends a resume's EXECUTION_FIELDS changes (check_or_store_config's
  list), from `step` on, to workdir/EXECUTION_FILE."""
  path = os.path.join(workdir, EXECUTION_FILE)
  records = []
  if os.path.exists(path):
    try:
      with open(path) as f:
        records = json.load(f)
    except (OSError, ValueError):
      records = None
    if not isinstance(records, list):
      # Kept aside, not overwritten: it is the only record of those steps.
      os.replace(path, path + '.damaged')
      logging.warning('%s could not be read as a list; moved to %s.damaged '
                      'and begun again', path, path)
      records = []
  records += [{'step': step, 'field': field, 'stored': a, 'now': b}
              for field, a, b in changed]
  write_json(path, records)


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


def finished_summary(workdir: str, num_steps: int) -> dict[str, Any] | None:
  """The workdir's summary if its run trained to num_steps or stopped
  early (config.train.early_stop_patience); else None."""
  path = os.path.join(workdir, SUMMARY_FILE)
  if not os.path.exists(path):
    return None
  summary = read_json_object(path, 'the summary of a finished run')
  finished = summary.get('step') == num_steps or summary.get('stopped_early')
  return summary if finished else None

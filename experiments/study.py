"""A study is a list of runs, one workdir each, named after what varies.

Rerunning the same study command skips finished runs (their summary.json is
read back, nothing is retrained or rewritten), resumes unfinished ones from
their latest checkpoint (train_and_evaluate does that), and returns every
finished summary, so the caller can re-collect results.md, results.json and the
plots from whatever has finished. Killing the runner loses at most one
checkpoint interval of the one run in progress.

Filters (`seeds`, `tasks`, `positions`) select runs by their tags, and
`shard=(i, n)` keeps every n-th run starting at i, so that n machines (or n
processes) split a study without coordinating: each writes only its own runs'
workdirs, and any of them can collect the results of all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterable, Iterator, Sequence

import jax
from jax.experimental.compilation_cache import compilation_cache
import ml_collections
from absl import logging

from selfattn.training import workdir as workdir_lib
from selfattn.errors import ConfigError
from selfattn.errors import DataError
from selfattn.errors import NonFiniteError
from selfattn.errors import TrainingInterrupted
from selfattn.training.config_checks import validate_config
from selfattn.training.timing import duration
from selfattn.training.train import kernel_choice
from selfattn.training.train import train_and_evaluate


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of a study.

  name: the run's workdir under the study's, e.g. 'position=rope,seed=0'.
  config: the full config.
  tags: what varies, for filtering and grouping: task, position, seed, ...
  """
  name: str
  config: ml_collections.ConfigDict
  tags: dict[str, Any]


def parse_shard(text: str | None) -> tuple[int, int]:
  """'i/n' -> (i, n) with 0 <= i < n; None -> (0, 1). An empty one is
  refused: like an empty --positions it would silently mean every run."""
  if text is None:
    return 0, 1
  if not text:
    raise ValueError('--shard is empty: give i/n, e.g. 0/4 (or leave the '
                     'flag out to train every run)')
  try:
    index, count = (int(part) for part in text.split('/'))
  except ValueError:
    raise ValueError(f'--shard={text!r} must look like i/n, e.g. 0/4') from None
  if not 0 <= index < count:
    raise ValueError(f'--shard={text!r}: need 0 <= i < n')
  return index, count


def parse_duration(text: str) -> float:
  """'90m', '2h30m', '45s', '1h' (units h, m, s, largest first) ->
  seconds > 0; ValueError otherwise."""
  # ASCII digits, at most 7 a unit: no other script's digits, no overflow.
  match = re.fullmatch(r'(?:([0-9]{1,7})h)?(?:([0-9]{1,7})m)?'
                       r'(?:([0-9]{1,7})s)?', text.strip())
  if not text.strip() or match is None:
    raise ValueError(f'{text!r} is not a duration; write it like 90m, 2h30m '
                     f'or 45s')
  hours, minutes, seconds = (int(g or 0) for g in match.groups())
  total = 3600 * hours + 60 * minutes + seconds
  if total <= 0:
    raise ValueError(f'{text!r}: the duration must be longer than 0')
  return float(total)


def select(runs: Sequence[Run], *, seeds: Iterable[int] | None = None,
           tasks: Iterable[str] | None = None,
           positions: Iterable[str] | None = None,
           shard: tuple[int, int] = (0, 1)) -> list[Run]:
  """The runs that pass every filter, then this shard's share of them.

  A filter of None (or empty) keeps everything; a filter on a tag that a run
  does not have keeps that run.
  """
  wanted = {'seed': seeds, 'task': tasks, 'position': positions}
  kept = []
  for run in runs:
    ok = all(not values or key not in run.tags or run.tags[key] in set(values)
             for key, values in wanted.items())
    if ok:
      kept.append(run)
  index, count = shard
  return kept[index::count]


# A run whose loss became non-finite is a finished outcome, not a crash: the
# study records it here and moves on, and a restart does not retrain it.
DIVERGED_FILE = 'diverged.json'


class StudyStopped(BaseException):
  """SIGINT or SIGTERM outside a training run (scoring, collecting). A
  BaseException, as KeyboardInterrupt is: code that catches Exception to
  re-raise it as its own error (a checkpoint restore) lets it through."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum


@contextlib.contextmanager
def stops_in_one_line() -> Iterator[None]:
  """Makes SIGINT/SIGTERM end a study driver with one line and exit status
  128 + signal in every phase. Training has its own handler (a checkpoint,
  then TrainingInterrupted); around it, a stop request raises StudyStopped
  where the driver is (scoring, probing, collecting), whose files are
  written atomically, so nothing finished is lost and a rerun resumes."""
  def request(signum, frame):
    del frame
    raise StudyStopped(signum)
  previous = {}
  if threading.current_thread() is threading.main_thread():
    previous = {s: signal.signal(s, request)
                for s in (signal.SIGINT, signal.SIGTERM)}
  try:
    yield
  except StudyStopped as e:
    print(f'[study] stopped: {e} received outside training (scoring or '
          f'collecting); every finished run and score is kept: rerun the '
          f'same command to resume', file=sys.stderr, flush=True)
    raise SystemExit(128 + e.signum) from None
  finally:
    for signum, handler in previous.items():
      signal.signal(signum, handler)


def finished_run_names(workdir: str) -> list[str]:
  """The folders (relative to workdir, sorted) holding a run summary
  anywhere under workdir; a run's own subfolders (checkpoints) and hidden
  ones (.xla_cache) are not searched."""
  names = []
  for root, dirs, files in os.walk(workdir):
    dirs[:] = sorted(d for d in dirs if not d.startswith('.'))
    if workdir_lib.SUMMARY_FILE in files:
      names.append(os.path.relpath(root, workdir))
      dirs[:] = []
  return names


def finished_summary(run: Run, workdir: str) -> dict[str, Any] | None:
  """The run's summary if it trained to its last step, {'diverged': message}
  if it stopped on a non-finite loss; else None. A run directory whose
  stored config is not the one the study would train under that name (the
  same workdir given another --task, a driver's runs in another's workdir)
  raises ConfigError, as resuming it would: its numbers are not this run's."""
  path = os.path.join(workdir, run.name)
  if os.path.isdir(path):
    workdir_lib.check_or_store_config(path, run.config, write=False)
  marker = os.path.join(path, DIVERGED_FILE)
  if os.path.exists(marker):
    try:
      return workdir_lib.read_json_object(marker, 'a diverged run\'s record')
    except ConfigError as e:
      # The marker's existence is the outcome; its text only says how. An
      # unreadable one (a kill while an older version wrote it) still means
      # the run diverged, and is not retrained.
      return {'diverged': f'(its record is unreadable: {e})'}
  return workdir_lib.finished_summary(path, run.config.train.num_steps)


def diverged(summary: dict[str, Any]) -> bool:
  """Whether a study outcome is a diverged run (it has no evaluation)."""
  return 'diverged' in summary


@contextlib.contextmanager
def shared_compilations(workdir: str) -> Iterator[None]:
  """Runs that differ only in seed compile the same programs (the seed is an
  argument of every compiled step, steps.batch_generator): while inside,
  keep XLA's executables on disk under the study, so the second seed of a
  cell reuses the first one's. Measured on configs/tiny.py: first step +
  evaluation 8.4 s for seed 0, 1.5 s for seed 1 with no new cache entry. An
  explicitly configured cache directory wins.

  On leaving, the process's settings come back and JAX's cache object is
  dropped: a caller that runs a study in-process (the tests) does not go on
  writing every later compilation into that study's folder."""
  if jax.config.jax_compilation_cache_dir:
    yield
    return
  min_seconds = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update('jax_compilation_cache_dir',
                    os.path.join(workdir, '.xla_cache'))
  jax.config.update('jax_persistent_cache_min_compile_time_secs', 0.0)
  try:
    yield
  finally:
    jax.config.update('jax_compilation_cache_dir', None)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', min_seconds)
    compilation_cache.reset_cache()


def distinct_but_seed(runs: Iterable[Run]) -> list[Run]:
  """The first run of each config that differs from the others' in more than
  its seed (a study repeats each config per seed; a config's validity does
  not depend on the seed)."""
  seen, out = set(), []
  for run in runs:
    unseeded = run.config.copy_and_resolve_references()
    unseeded.seed = 0
    key = unseeded.to_json_best_effort(sort_keys=True)
    if key not in seen:
      seen.add(key)
      out.append(run)
  return out


def refuse_invalid_configs(runs: Sequence[Run]) -> None:
  """Every config a study is about to train, checked before the first one
  trains (validate_config, the check each run makes before it trains): a
  bad config in the tenth run would otherwise stop the study after nine had
  trained. One line on stderr naming the run, and exit status 2, as a run
  refused while training says it."""
  for run in distinct_but_seed(runs):
    try:
      validate_config(run.config, num_devices=jax.device_count())
    except (ConfigError, DataError) as e:
      print(f'error: {run.name}: {e}', file=sys.stderr)
      sys.exit(2)


def execute(runs: Sequence[Run], workdir: str, *, verbose: bool = True,
            after_each: Callable[[Run, dict[str, Any]], None] | None = None,
            deadline: float | None = None
            ) -> dict[str, dict[str, Any]]:
  """Trains every run that has not finished; returns {name: summary} of all
  finished runs among `runs` (the ones trained now and the ones found done).

  deadline: a time.monotonic() after which no run is started (the runs
  left are not trained and not in the result; rerunning continues): for an
  allocation or session of limited time, whose end would otherwise kill a
  run that then restarts where its checkpoints are not kept.

  after_each(run, summary), if given, follows each run trained now that did
  not diverge (a study's per-run scoring), inside the run's time, so that an
  interrupted study has its finished runs scored, not only trained.
  Prints a progress line per run (i of N, the run's time, the ETA of the rest
  from the mean time of the runs trained in this invocation).
  """
  with shared_compilations(workdir):
    summaries, todo = {}, []
    for run in runs:
      summary = finished_summary(run, workdir)
      if summary is None:
        todo.append(run)
      else:
        summaries[run.name] = summary
    refuse_invalid_configs(todo)
    say = print if verbose else logging.info
    say(f'[study] {workdir}: {len(summaries)} of {len(runs)} runs finished, '
        f'{len(todo)} to train')
    spent = []
    for i, run in enumerate(todo):
      if deadline is not None and time.monotonic() >= deadline:
        say(f'[study] stopping between runs: the time given '
            f'(--stop_between_runs_after) has passed; {len(todo) - i} run(s) '
            f'left untrained, rerun the command to train them')
        break
      start = time.perf_counter()
      logging.info('study run %s', run.name)
      try:
        with contextlib.redirect_stdout(io.StringIO()):
          summaries[run.name] = train_and_evaluate(
              run.config, os.path.join(workdir, run.name))
      except TrainingInterrupted as e:
        # The run saved a checkpoint; rerunning the study resumes it.
        print(f'[study] stopped: {e}', file=sys.stderr)
        sys.exit(128 + e.signum)
      except (ConfigError, DataError) as e:
        # A run refused before it trained (its workdir locked by another live
        # study, an invalid config, a damaged data file): one line, as the
        # training CLI says it.
        print(f'error: {run.name}: {e}', file=sys.stderr)
        sys.exit(2)
      except NonFiniteError as e:
        summaries[run.name] = {'diverged': str(e)}
        workdir_lib.write_json(os.path.join(workdir, run.name, DIVERGED_FILE),
                               summaries[run.name])
        say(f'[study] {run.name} diverged (recorded, not retried): {e}')
      else:
        if after_each is not None:
          with kernel_choice(run.config):   # scored as it was trained
            after_each(run, summaries[run.name])
      spent.append(time.perf_counter() - start)
      left = len(todo) - i - 1
      # No ETA for runs the deadline will not start (the next line says so).
      stopping = deadline is not None and time.monotonic() >= deadline
      eta = ('' if stopping or not left else
             f', ETA {duration(sum(spent) / len(spent) * left)}')
      say(f'[study] run {i + 1} of {len(todo)} done: {run.name} in '
          f'{duration(spent[-1])}; {left} left{eta}')
    return summaries


def collect(runs: Sequence[Run], workdir: str) -> dict[str, dict[str, Any]]:
  """{name: summary} of every finished run of `runs`, training nothing (what
  other shards have finished counts too)."""
  out = {}
  for run in runs:
    summary = finished_summary(run, workdir)
    if summary is not None:
      out[run.name] = summary
  return out

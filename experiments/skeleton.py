"""The one skeleton every study of training runs shares: its flags, checked with a
one-line error before anything runs; the resumable run loop with scoring
after each run; collection; and the main function.

A study is a `Study`: its scales, the tags its runs can be filtered by, its
report's title, the runs of a scale, optionally data to prepare and a score
per run, and a report body. `main(study)` is its absl main (`main_of(fn,
title)` for the two studies that are one function, not a sweep):

  python -m experiments.STUDY --workdir=DIR [--scale=S] [--seeds=N]
      [--positions=a,b] [--tasks=a,b] [--shard=i/n] [--collect_only] [--quick]
      [--stop_between_runs_after=2h30m]

Rerunning the same command skips finished runs, resumes the unfinished one
from its checkpoint, scores what finished unscored, and rewrites the results
from every finished run (those other shards finished too).

Exit status: 0 when every chosen run has finished; STOPPED_BETWEEN_RUNS (75,
sysexits' EX_TEMPFAIL, "try again") when --stop_between_runs_after left
chosen runs untrained, so that a job script can tell a study to requeue from
a finished one; 2 for bad input; 128 + n for signal n.
"""

from __future__ import annotations

import os
import re
import sys
import time
from typing import Any, Callable, Sequence

from absl import flags

from experiments import common
from experiments import study
from selfattn import tasks
from selfattn.errors import ConfigError
from selfattn.errors import DataError
from selfattn.nn import positions
from selfattn.training.cli_checks import stray_arguments_problem
from selfattn.training.cli_checks import workdir_problem
from selfattn.training.train import kernel_choice
from selfattn.training.log_setup import configure_logging

SCALE = flags.DEFINE_string('scale', None, "The study's scale (each study "
                            'lists its own; default: its CPU study).')
POSITIONS = flags.DEFINE_list('positions', None, 'Only these encodings '
                              "(labels of the study's encodings).")
TASKS = flags.DEFINE_list('tasks', None, 'Only these tasks (studies over '
                          'tasks).')
SHARD = flags.DEFINE_string('shard', None, 'i/n: train every n-th selected '
                            'run from the i-th (n machines or processes '
                            'split a study without coordinating).')
COLLECT_ONLY = flags.DEFINE_bool('collect_only', False,
                                 'Train nothing; re-collect the results.')
STOP_AFTER = flags.DEFINE_string(
    'stop_between_runs_after', None,
    'Start no run after this long (90m, 2h30m), counted from the study\'s '
    'start: it stops between runs and reports the finished ones; rerunning '
    'the command trains the rest. For an allocation of limited time, set it '
    'to the allocation less the longest run and the report.')

FILTER_FLAGS = {'position': POSITIONS, 'task': TASKS}
DEFAULT_SEEDS = 5
# sysexits.h's EX_TEMPFAIL: the same command, run again, continues.
STOPPED_BETWEEN_RUNS = 75


class Study:
  """What one study adds to the skeleton. Subclasses set the attributes and
  implement `runs` and `report`; the rest has defaults."""

  scales: tuple[str, ...] = ()
  default_scale: str = ''
  default_seeds: int = DEFAULT_SEEDS     # without --seeds (quick: 1)
  # Tags of the runs that --positions / --tasks filter, with their valid
  # values (`filter_values`).
  filters: tuple[str, ...] = ('position',)
  # Whether --steps sets its runs' length (common.study_steps; not in
  # quick mode, which has its own).
  takes_steps: bool = False
  # Its results.md's title, the mark of the workdir's owner; title_stem,
  # the fixed start of a title that grows with the study's runs.
  title: str = ''
  title_stem: str | None = None

  def report_title(self) -> tuple[str, str | None]:
    """(title, stem) of the report: checked against the workdir's
    results.md before any run trains or any figure is drawn, so that a
    study sharing another's workdir is refused before it overwrites the
    other's figures (common.check_report_owner)."""
    return self.title, self.title_stem

  def filter_values(self) -> dict[str, Sequence[str]]:
    """{tag: every valid value} for each tag in `filters`."""
    raise NotImplementedError

  def prepare(self, scale: str) -> Any:
    """What the runs, scores and report share (data, floors); None by
    default. Raise StudyError for data that cannot be had (also from
    `results`, for a finished run that cannot be read)."""
    return None

  def runs(self, scale: str, seeds: int, context: Any) -> list[study.Run]:
    raise NotImplementedError

  def score(self, run: study.Run, path: str, context: Any) -> None:
    """Called after each run trained now (and for finished runs not yet
    scored, see `results`): the study's per-run evaluation, if any."""

  def results(self, runs: Sequence[study.Run], workdir: str, context: Any, *,
              score_missing: bool) -> dict[str, Any]:
    """{name: result} of every finished run; by default its summary."""
    return study.collect(runs, workdir)

  def report(self, workdir: str, runs: list[study.Run], results: dict,
             scale: str, context: Any) -> str:
    """Writes results.md (and .json, plots); returns the markdown."""
    raise NotImplementedError


class TaskSweep(Study):
  """A sweep of model variants over tasks (the chapter's exercises): the
  subclass names its tasks and implements `sweep_runs(tasks, seeds, quick)`
  and `sweep_report(workdir, runs, summaries, quick)`; --tasks filters, and
  --positions names variants where `filters` has 'position' (a name with a
  comma by its folder name, flag_spelling)."""
  scales = ('cpu', 'quick')
  default_scale = 'cpu'
  filters: tuple[str, ...] = ('task',)
  tasks: tuple[str, ...] = ()
  quick_tasks: tuple[str, ...] = ()

  def filter_values(self) -> dict[str, Sequence[str]]:
    values: dict[str, Sequence[str]] = {'task': self.tasks}
    if 'position' in self.filters:
      values['position'] = self.variant_names()
    return values

  def variant_names(self) -> tuple[str, ...]:
    """Every variant's name (its runs' position tag) at either scale, read
    from the first task's runs (a sweep gives every task the same
    variants)."""
    runs = (self.sweep_runs(self.tasks[:1], 1, False)
            + self.sweep_runs(self.quick_tasks[:1], 1, True))
    return tuple(dict.fromkeys(run.tags['position'] for run in runs))

  def runs(self, scale: str, seeds: int, context: Any) -> list[study.Run]:
    quick = scale == 'quick'
    return self.sweep_runs(self.quick_tasks if quick else self.tasks, seeds,
                           quick)

  def report(self, workdir: str, runs: list[study.Run], results: dict,
             scale: str, context: Any) -> str:
    return self.sweep_report(workdir, runs, results, scale == 'quick')

  def sweep_runs(self, tasks: Sequence[str], seeds: int, quick: bool
                 ) -> list[study.Run]:
    raise NotImplementedError

  def sweep_report(self, workdir: str, runs: list[study.Run], summaries: dict,
                   quick: bool) -> str:
    raise NotImplementedError


def scored_results(runs: Sequence[study.Run], workdir: str, result_file: str,
                   evaluate, *, score_missing: bool) -> dict[str, Any]:
  """{name: evaluate(run, path) with the run's label and seed} for every
  finished run that did not diverge. score_missing: score the ones without
  their result_file yet (a study stopped between training and scoring),
  else leave them out (--collect_only trains and scores nothing)."""
  out = {}
  for run in runs:
    summary = study.finished_summary(run, workdir)
    if summary is None or study.diverged(summary):
      continue
    path = os.path.join(workdir, run.name)
    if not score_missing and not os.path.exists(os.path.join(path, result_file)):
      continue
    with kernel_choice(run.config):       # scored as it was trained
      scores = evaluate(run, path)
    out[run.name] = {**scores, 'label': run.tags['position'],
                     'seed': run.tags['seed']}
  return out


class StudyError(Exception):
  """Input the study cannot run with: printed as one line, exit status 2."""


def _refuse_arguments(argv: list[str]) -> None:
  """absl passes on what is not a flag: a study takes none."""
  problem = stray_arguments_problem(argv)
  if problem:
    common.fail(problem)


# The skeleton's flags and --steps, which a one-function study (main_of)
# does not read.
STUDY_FLAGS = ('scale', 'positions', 'tasks', 'shard', 'collect_only', 'steps',
               'stop_between_runs_after')


def _refuse_flags(names: Sequence[str], why: str) -> None:
  """A flag given on the command line that this study would ignore."""
  given = [f'--{name}' for name in names if flags.FLAGS[name].present]
  if given:
    common.fail(f'{", ".join(given)}: {why}')


def _check_workdir(workdir: str, collect_only: bool) -> None:
  problem = workdir_problem(workdir)    # the training CLI's check
  if problem:
    common.fail(problem)
  if collect_only and not os.path.isdir(workdir):
    common.fail(f'--collect_only: {workdir} does not exist, so there is '
                f'nothing to collect (a mistyped --workdir?)')


def finished_elsewhere(workdir: str, runs: Sequence[study.Run]) -> int:
  """How many run folders under workdir hold a summary but are not among
  `runs` (a rerun with fewer --seeds, say, whose report silently shrank)."""
  names = {run.name for run in runs}
  return sum(name not in names for name in study.finished_run_names(workdir))


def chosen_scale(spec: Study) -> str:
  if common.QUICK.value:
    return 'quick'
  if SCALE.value == '':
    common.fail(f'--scale is empty: name one of {", ".join(spec.scales)} '
                f'(or leave the flag out for {spec.default_scale})')
  scale = SCALE.value or spec.default_scale
  if scale not in spec.scales:
    common.fail(f'--scale={scale!r} is not a scale of this study; valid: '
                f'{", ".join(spec.scales)}')
  return scale


def chosen_seeds(scale: str, default: int = DEFAULT_SEEDS) -> int:
  """The study's default seeds (five unless it says otherwise; one in quick
  mode); an explicit --seeds wins."""
  if not flags.FLAGS['seeds'].present:
    return 1 if scale == 'quick' else default
  if common.SEEDS.value < 1:
    common.fail(f'--seeds={common.SEEDS.value}: a study needs at least one '
                f'seed')
  return common.SEEDS.value


# Every value selfattn knows for a filter's tag (the live registries).
_KNOWN = {'position': lambda: tuple(positions.POSITIONS),
          'task': lambda: tuple(tasks.TASKS)}


def flag_spelling(value: str) -> str:
  """A variant's folder name, which --positions / --tasks also take (the
  flag splits on commas, so a name holding one has no other spelling
  there): each run of commas and spaces as one underscore ('learned,
  dropout 0.1' -> 'learned_dropout_0.1'); the task sweeps name their run
  folders with it."""
  return re.sub(r'[,\s]+', '_', value)


def chosen_filters(spec: Study) -> dict[str, list[str] | None]:
  """{tag: requested values or None}, each value checked against the
  study's (by its name, or by flag_spelling of it); a filter flag the study
  does not take is refused. Every bad filter is named in the one error
  line, not only the first."""
  valid = spec.filter_values()
  out, problems = {}, []
  for tag, flag in FILTER_FLAGS.items():
    requested = flag.value
    # A value that is no name of the study may be one's flag spelling (if
    # it is exactly one's).
    spelled: dict[str, list[str]] = {}
    for v in valid.get(tag, ()):
      spelled.setdefault(flag_spelling(v), []).append(v)
    if requested and tag in valid:
      requested = [v if v in valid[tag] or len(spelled.get(v, ())) != 1
                   else spelled[v][0] for v in requested]
    if flag.present and not requested:
      # An empty shell variable, say: it would have meant "every run".
      problems.append(f'--{flag.name} is empty: name at least one, or leave '
                      f'it out for all')
      continue
    if tag not in spec.filters:
      if requested:
        problems.append(f'--{flag.name}: this study has no {tag}s to filter')
      continue
    ambiguous = [v for v in (requested or ()) if v not in valid[tag]
                 and len(spelled.get(v, ())) > 1]
    refused = [v for v in (requested or ())
               if v not in valid[tag] and v not in ambiguous]
    # An encoding or task selfattn has but this study does not train is
    # "not in this study", not "unknown".
    known = _KNOWN.get(tag, tuple)()
    for v in ambiguous:
      problems.append(f'--{flag.name}: {v} spells more than one name '
                      f'({"; ".join(spelled[v])})')
    for what, values in (('unknown', [v for v in refused if v not in known]),
                         ('not in this study',
                          [v for v in refused if v in known])):
      if values:
        shown = [flag_spelling(v) if ',' in v else v for v in valid[tag]]
        # The flag splits at commas: say how to name what holds one.
        note = ('; a name with a comma goes by its folder name, commas and '
                'spaces as underscores'
                if any(',' in v for v in valid[tag]) else '')
        problems.append(f'--{flag.name}: {", ".join(values)} {what} '
                        f'(valid: {", ".join(shown)}{note})')
    out[tag] = requested
  if problems:
    common.fail('; '.join(problems))
  return out


def _check_filters_in_plan(runs: Sequence[study.Run],
                           filters: dict[str, list[str] | None],
                           scale: str) -> None:
  """A requested value that no run of this scale carries (--quick trains
  four encodings): refused by name, where it used to be dropped silently
  and the others trained."""
  problems = []
  for tag, requested in filters.items():
    if not requested:
      continue
    # A run without the tag is kept by any filter (study.select).
    planned = list(dict.fromkeys(run.tags[tag] for run in runs
                                 if tag in run.tags))
    missing = [v for v in requested if v not in planned]
    if missing:
      problems.append(f'--{FILTER_FLAGS[tag].name}: {", ".join(missing)} '
                      f'not among this study\'s runs at --scale={scale} '
                      f'(there: {", ".join(planned)})')
  if problems:
    common.fail('; '.join(problems))


def chosen_stop_after() -> float | None:
  """--stop_between_runs_after in seconds (None: unset)."""
  if STOP_AFTER.value is None:
    return None
  if COLLECT_ONLY.value:
    common.fail('--stop_between_runs_after: --collect_only trains nothing')
  try:
    return study.parse_duration(STOP_AFTER.value)
  except ValueError as e:
    common.fail(f'--stop_between_runs_after: {e}')
  raise AssertionError('unreachable')


def chosen_shard() -> tuple[int, int]:
  try:
    return study.parse_shard(SHARD.value)
  except ValueError as e:
    common.fail(str(e))
  raise AssertionError('unreachable')


def main(spec: Study):
  """The study's absl main. A damaged file of a run (a truncated
  summary.json, say) or of the data is one line naming it, exit status 2."""
  def run(argv):
    _refuse_arguments(argv)
    try:
      with study.stops_in_one_line():
        _main(spec)
    except (ConfigError, DataError) as e:
      common.fail(str(e))
  return run


def main_of(fn: Callable[[str, int, bool], Any], title: str):
  """The absl main of a study that is one function rather than a sweep of
  runs (chapter.py's computations; exercise1_depth.py, whose analyses sit
  around its small sweeps): fn(workdir, seeds, quick), with `main`'s checks
  (no stray arguments, --workdir given, a workdir whose results.md is
  another's than `title` refused before fn runs) and its one-line
  failures."""
  def run(argv):
    _refuse_arguments(argv)
    configure_logging()
    if not common.WORKDIR.value:
      common.fail('--workdir is required')
    _refuse_flags(STUDY_FLAGS, 'this study takes only --workdir, --seeds and '
                  '--quick')
    if common.SEEDS.value < 1:
      common.fail(f'--seeds={common.SEEDS.value}: a study needs at least '
                  f'one seed')
    _check_workdir(common.WORKDIR.value, collect_only=False)
    try:
      common.check_report_owner(common.WORKDIR.value, title)
      with study.stops_in_one_line():
        fn(common.WORKDIR.value, common.SEEDS.value, common.QUICK.value)
    except (ConfigError, DataError) as e:
      common.fail(str(e))
  return run


def _results(spec: Study, runs, workdir: str, context: Any, *,
             score_missing: bool) -> dict[str, Any]:
  """spec.results, with a finished run it cannot read (StudyError) as a
  one-line error."""
  try:
    return spec.results(runs, workdir, context, score_missing=score_missing)
  except StudyError as e:
    common.fail(str(e))


def _main(spec: Study) -> None:
  configure_logging()
  workdir = common.WORKDIR.value
  if not workdir:
    common.fail('--workdir is required')
  if common.QUICK.value and flags.FLAGS['scale'].present:
    common.fail('--quick is --scale=quick: give one of them')
  scale = chosen_scale(spec)
  if flags.FLAGS['steps'].present and (
      not spec.takes_steps or scale == 'quick'):
    common.fail('--steps: this study\'s runs have their length set by its scale'
                + (' (here quick)' if spec.takes_steps else ''))
  _check_workdir(workdir, COLLECT_ONLY.value)
  title, stem = spec.report_title()
  if not title and not stem:
    raise TypeError(f'{type(spec).__name__} names no report title')
  common.check_report_owner(workdir, title, stem)
  seeds = chosen_seeds(scale, spec.default_seeds)
  filters = chosen_filters(spec)
  shard = chosen_shard()
  stop_after = chosen_stop_after()
  # Counted from here: preparing data and scoring earlier runs take time
  # of the allocation too.
  deadline = None if stop_after is None else time.monotonic() + stop_after
  try:
    context = spec.prepare(scale)
  except StudyError as e:
    common.fail(str(e))
  runs = spec.runs(scale, seeds, context)
  _check_filters_in_plan(runs, filters, scale)
  chosen = study.select(runs, tasks=filters.get('task'),
                        positions=filters.get('position'), shard=shard)
  if not COLLECT_ONLY.value:
    if not chosen:
      common.fail(f'no run of this study at --scale={scale} matches the '
                  f'filters and shard given')
    # Finished earlier, but stopped before it was scored.
    _results(spec, runs, workdir, context, score_missing=True)
    study.execute(chosen, workdir, after_each=lambda r, _: spec.score(
        r, os.path.join(workdir, r.name), context), deadline=deadline)
  if COLLECT_ONLY.value and not study.collect(runs, workdir):
    # An empty report would replace whatever results.md the folder holds.
    common.fail(f'--collect_only: {workdir} holds no finished run of this '
                f'study at --scale={scale}; nothing to collect')
  left_out = finished_elsewhere(workdir, runs)
  if left_out:
    print(f'[study] note: {left_out} finished run(s) in {workdir} are not '
          f'runs of this selection (other seeds or settings): the report '
          f'leaves them out', file=sys.stderr)
  results = _results(spec, runs, workdir, context,
                     score_missing=not COLLECT_ONLY.value)
  # Finished as the tables read them (a diverged run is an outcome).
  with common.planned_runs(len(runs), len(study.collect(runs, workdir))):
    print(spec.report(workdir, runs, results, scale, context))
  untrained = 0 if COLLECT_ONLY.value else len(chosen) - len(
      study.collect(chosen, workdir))
  if untrained and deadline is not None and time.monotonic() >= deadline:
    print(f'[study] stopped between runs (--stop_between_runs_after): '
          f'{untrained} chosen run(s) left untrained; the report above covers '
          f'the finished ones, and the same command trains the rest '
          f'(exit status {STOPPED_BETWEEN_RUNS})', file=sys.stderr)
    raise SystemExit(STOPPED_BETWEEN_RUNS)

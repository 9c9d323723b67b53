"""What every experiment driver shares: flags, sweeps through the resumable
study runner, results tables (mean and std over seeds), paired-by-seed
lines and the band plot. Every study's main is skeleton.py's (the probes
over finished studies, stack_check, translation_baselines and
translation_punctuation, have their own)."""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import statistics
import sys
from typing import Any, Callable, Iterable

import matplotlib

matplotlib.use('Agg')
import matplotlib.pyplot as plt  # noqa: E402
import ml_collections  # noqa: E402
import numpy as np  # noqa: E402
import scipy.stats  # noqa: E402
from absl import flags  # noqa: E402

from configs import default  # noqa: E402
from experiments import budget  # noqa: E402
from experiments import study  # noqa: E402
from selfattn.errors import ConfigError  # noqa: E402

WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory: one '
                              'TensorBoard subdirectory per run, results.md, PNGs.')
SEEDS = flags.DEFINE_integer('seeds', 5, 'Seeds per setting (default: the '
                             "study's own; five for most, three for the "
                             'convergence checks, one with --quick).')
QUICK = flags.DEFINE_bool('quick', False, 'A one-minute version (for tests).')
# One definition for the studies that take it (absl refuses a flag defined
# twice in a process, and a test imports several studies): each study's
# default is its own (study_steps).
STEPS = flags.DEFINE_integer('steps', None, 'Training steps per run (each '
                             'study has its own default).')
QUICK_BANNER = ('> **QUICK MODE: a smoke test of the pipeline (few steps, small '
                'model, one seed). These numbers are not results.**')


def fail(message: str, status: int = 2) -> None:
  """Ends a driver with one line, `error: message`, on stderr; status 2 is
  a usage error, as for a bad config or an absl flag."""
  print(f'error: {message}', file=sys.stderr)
  raise SystemExit(status)


def base_config(**task) -> ml_collections.ConfigDict:
  """The default config with fewer log lines, for sweeps."""
  config = default.get_config()
  config.train.log_every = 250
  for key, value in task.items():
    config.task[key] = value
  return config


def variant(base: ml_collections.ConfigDict, **model) -> ml_collections.ConfigDict:
  """A copy of `base` with these config.model fields replaced."""
  config = copy.deepcopy(base)
  for key, value in model.items():
    config.model[key] = value
  return config


def sweep(settings: Iterable[tuple[str, ml_collections.ConfigDict]],
          workdir: str, seeds: int) -> dict[str, list[dict]]:
  """Runs every (name, config) for `seeds` seeds through the resumable study
  runner (finished runs are skipped, unfinished ones resumed):
  {name: [summary per seed]}."""
  settings = list(settings)
  runs = []
  for name, config in settings:
    for seed in range(seeds):
      config = copy.deepcopy(config)
      config.seed = seed
      runs.append(study.Run(f'{name},seed={seed}', config,
                            {'setting': name, 'seed': seed}))
  done = study.execute(runs, workdir)
  return {name: [done[f'{name},seed={seed}'] for seed in range(seeds)]
          for name, _ in settings}


def encoding_runs(base: ml_collections.ConfigDict, seeds: int,
                  labels: Iterable[str],
                  encodings: dict[str, tuple[str, dict, dict]]
                  ) -> list[study.Run]:
  """One run per (seed, encoding label) of a study over encodings, seed-major
  (a partial study has every encoding at a few seeds). encodings: label ->
  (config.model.position, config.model options, config.task options). Runs
  are named position=<label without spaces>,seed=<seed>."""
  runs = []
  for seed in range(seeds):
    for label in labels:
      position, model_options, task_options = encodings[label]
      config = copy.deepcopy(base)
      config.seed = seed
      config.model.position = position
      for name, value in model_options.items():
        config.model[name] = value
      for name, value in task_options.items():
        config.task[name] = value
      runs.append(study.Run(f'position={label.replace(" ", "")},seed={seed}',
                            config, {'position': label, 'seed': seed}))
  return runs


def variant_runs(tasks: Iterable[str], seeds: int,
                 variants: list[tuple[str, dict]], base_of: Callable,
                 folder: Callable[[str], str]) -> list[study.Run]:
  """Runs of a sweep over tasks and model variants: task-major, then seed,
  then variant, named <task>/<folder(variant)>,seed=<seed> and tagged with
  task, position (the variant's name) and seed. base_of(task) is the
  task's base config; each variant's dict replaces config.model fields."""
  runs = []
  for task in tasks:
    base = base_of(task)
    for seed in range(seeds):
      for name, model in variants:
        config = variant(base, **model)
        config.seed = seed
        runs.append(study.Run(f'{task}/{folder(name)},seed={seed}', config,
                              {'task': task, 'position': name, 'seed': seed}))
  return runs


def by_label(runs: Iterable[study.Run], summaries: dict,
             task: str | None = None) -> dict[str, list[dict]]:
  """{position tag: [summary of each finished seed]} in the runs' order
  (of one task's runs when task is given); labels with no finished run are
  left out."""
  out: dict[str, list[dict]] = {}
  for run in runs:
    if run.name in summaries and task in (None, run.tags.get('task')):
      out.setdefault(run.tags['position'], []).append(summaries[run.name])
  return out


def by_task(runs: list[study.Run], summaries: dict
            ) -> dict[str, dict[str, list[dict]]]:
  """{task tag: by_label of that task's runs} in the runs' order, for the
  tasks with a finished run."""
  tasks = dict.fromkeys(run.tags['task'] for run in runs)
  out = {task: by_label(runs, summaries, task) for task in tasks}
  return {task: results for task, results in out.items() if results}


def seed_count(results_by_task: dict[str, dict[str, list[dict]]]) -> int:
  """The most finished seeds of any (task, label) in by_task's result."""
  return max((len(summaries) for results in results_by_task.values()
              for summaries in results.values()), default=0)


def finite(values: list[float]) -> list[float]:
  """The values that are not NaN (NaN marks a diverged run)."""
  return [v for v in values if not math.isnan(v)]


def mean_std(values: list[float]) -> str:
  """'mean ± std' over seeds; NaN values (diverged runs) are left out and
  counted."""
  finite_values = finite(values)
  lost = len(values) - len(finite_values)
  note = f' ({lost} of {len(values)} diverged)' if lost else ''
  if not finite_values:
    return f'all {lost} diverged'
  if len(finite_values) == 1:
    return f'{finite_values[0]:.3f}' + note
  return (f'{statistics.mean(finite_values):.3f} ± '
          f'{statistics.stdev(finite_values):.3f}' + note)


def accuracy(summary: dict, length: int, metric: str = 'token_accuracy') -> float:
  """The metric at `length`; NaN for a run that diverged (no evaluation)."""
  if study.diverged(summary):
    return math.nan
  return summary['eval'][str(length)][metric]


def steps_to(summary: dict, length: int, threshold: float = 0.99) -> int | None:
  """First evaluated step with token accuracy >= threshold at `length`."""
  for entry in summary.get('history', []):
    # An entry without the length: a resume that changed eval.lengths.
    metrics = entry['eval'].get(str(length))
    if metrics is not None and metrics['token_accuracy'] >= threshold:
      return entry['step']
  return None


def seed_interval(means: list[float]) -> tuple[float, float]:
  """95% t-interval of the mean of per-seed means: the seed, not the pair,
  as the unit of replication (pairs of one seed share its data stream)."""
  k = len(means)
  if k < 2:
    raise ValueError('an interval across seeds needs at least two seeds')
  t = scipy.stats.t.ppf(0.975, df=k - 1)
  half = t * statistics.stdev(means) / np.sqrt(k)
  centre = statistics.mean(means)
  return float(centre - half), float(centre + half)


# What paired_by_seed says where no two seeds have every member finished.
NO_PAIRS = 'fewer than two seeds with every encoding finished.'


def seed_differences(by_label: dict, a: tuple, b: tuple,
                     scale: float = 1.0) -> list[float]:
  """Per seed, in seed order, scale x (mean over group a minus mean over
  group b), for the seeds that have every member of both (by_label: label
  -> seed -> value)."""
  seeds = sorted(set.intersection(*[set(by_label.get(x, {})) for x in a + b]))
  return [scale * (statistics.mean(by_label[x][s] for x in a)
                   - statistics.mean(by_label[x][s] for x in b))
          for s in seeds]


def paired_by_seed(by_label: dict, a: tuple[str, ...], b: tuple[str, ...],
                   name: str, *, unit: str, scale: float = 1.0,
                   digits: int = 4, seed_digits: int | None = None) -> str:
  """One report line: mean over group a minus mean over group b, per seed
  (the seeds that have every member of both), with a t-interval across
  seeds.

  by_label maps label -> seed -> value; differences are multiplied by scale
  (100 for fractions read as points) and printed with `digits` decimals
  (`seed_digits` for the per-seed list; default the same).
  """
  diffs = seed_differences(by_label, a, b, scale)
  if len(diffs) < 2:
    return f'{name}: {NO_PAIRS}'
  lo, hi = seed_interval(diffs)
  per_seed = digits if seed_digits is None else seed_digits
  return (f'{name}: {statistics.mean(diffs):+.{digits}f} {unit} over '
          f'{len(diffs)} seeds (95% t-interval across seeds '
          f'[{lo:+.{digits}f}, {hi:+.{digits}f}]; per seed '
          + ', '.join(f'{d:+.{per_seed}f}' for d in diffs) + ')')


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join(':---' if i == 0 else '---:' for i in range(len(header))) + '|']
  lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
  return '\n'.join(lines)


def accuracy_table(results: dict[str, list[dict]], lengths: list[int],
                   label: str = 'setting') -> str:
  """Mean ± std token accuracy per length for every setting."""
  header = [label] + [f'len {n}' for n in lengths]
  rows = [[name] + [mean_std([accuracy(s, n) for s in runs]) for n in lengths]
          for name, runs in results.items()]
  return markdown_table(header, rows)


# What a report says above last_interval_table's table.
LAST_INTERVAL_NOTE = (
    'Token accuracy at the last evaluation minus the one before, mean over '
    'seeds (how many seeds rose). The learning rate decays to zero over the '
    'schedule, so a flat end does not show convergence; a rising one shows the '
    'budget ended first.')


def last_interval_table(results: dict[str, list[dict]], lengths) -> str:
  """Per encoding and length, the change in token accuracy over the last
  evaluation interval: mean over the seeds and how many rose (a run's
  summary history; diverged runs, runs evaluated once and, per length,
  runs whose last two evaluations lack it left out; '-' where none is
  left)."""
  rows = []
  for name, summaries in results.items():
    pairs = [s['history'][-2:] for s in summaries
             if not study.diverged(s) and len(s.get('history', [])) >= 2]
    if not pairs:
      continue
    cells = []
    for n in lengths:
      changes = [last['eval'][str(n)]['token_accuracy']
                 - before['eval'][str(n)]['token_accuracy']
                 for before, last in pairs
                 if str(n) in before['eval'] and str(n) in last['eval']]
      mean = sum(changes) / len(changes) if changes else None
      # Rounding keeps a tiny fall from printing as '-0.000'.
      cells.append('-' if mean is None else
                   f'{round(mean, 3) + 0.0:+.3f} '
                   f'({sum(c > 0 for c in changes)} of {len(changes)} up)')
    rows.append([name, *cells])
  if not rows:
    return ''
  return markdown_table(
      ['encoding'] + [f'len {n}' for n in lengths], rows)


def band(ax, x, curves, *, color, label: str, alpha: float = 0.12,
         **line) -> None:
  """The studies' one picture of seeds: the mean of `curves` (seeds x
  points) as a line, and a min-max band around it when there are several."""
  curves = np.asarray(curves, dtype=float)
  ax.plot(x, curves.mean(0), color=color, label=label, **line)
  if len(curves) > 1:
    ax.fill_between(x, curves.min(0), curves.max(0), color=color,
                    alpha=alpha, lw=0)


def _save_accuracy_plot(fig, ax, title: str, path: str) -> None:
  """The accuracy plots' common finish: 0-1 axis, title, legend, saved."""
  ax.set_ylim(0, 1.02)
  ax.set_title(title)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_accuracy_vs_length(results: dict[str, list[dict]], lengths: list[int],
                            train_max: int, title: str, path: str,
                            chance: float | None = None) -> None:
  """Mean over seeds per setting, with a min-max band when there are several
  seeds (diverged runs left out)."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colors = plt.get_cmap('tab20').colors   # 20 distinct colours, not the default 10
  for i, (name, runs) in enumerate(results.items()):
    finite = [s for s in runs if not study.diverged(s)]
    if not finite:
      continue
    acc = [[accuracy(s, n) for n in lengths] for s in finite]
    band(ax, lengths, acc, color=colors[i % 20], label=name,
         marker='osD^v<>'[i % 7])
  ax.axvline(train_max, color='gray', ls='--', lw=1, label='longest trained')
  if chance is not None:
    ax.axhline(chance, color='gray', ls=':', lw=1, label='chance')
  ax.set_xscale('log', base=2)
  ax.set_xlabel('evaluation length (line: mean over seeds; band: min-max)')
  ax.set_ylabel('token accuracy')
  _save_accuracy_plot(fig, ax, title, path)


def plot_accuracy_vs_step(results: dict[str, list[dict]], length: int,
                          title: str, path: str) -> bool:
  """Token accuracy at `length` at each evaluation of the runs' histories:
  per setting the mean over seeds with a min-max band (diverged runs and
  runs evaluated at other steps than the setting's first kept run left out;
  a setting some of whose evaluations lack `length` is not drawn).
  Draws nothing and returns False where no setting has two evaluations."""
  curves = {}
  # Colours by position in `results`, drawn or not, as plot_accuracy_vs_length
  # gives them: the same dict draws each setting in one colour in both.
  for i, (name, runs) in enumerate(results.items()):
    histories = [s['history'] for s in runs
                 if not study.diverged(s) and len(s.get('history', [])) >= 2]
    if not histories:
      continue
    steps = [h['step'] for h in histories[0]]
    same = [h for h in histories if [e['step'] for e in h] == steps]
    if all(str(length) in e['eval'] for h in same for e in h):
      curves[name] = (i, steps, [[e['eval'][str(length)]['token_accuracy']
                                  for e in h] for h in same])
  if not curves:
    return False
  fig, ax = plt.subplots(figsize=(7, 4.5))
  colors = plt.get_cmap('tab20').colors
  for name, (i, steps, acc) in curves.items():
    band(ax, steps, acc, color=colors[i % 20], label=name,
         marker='osD^v<>'[i % 7], markersize=3)
  ax.set_xlabel('training step (line: mean over seeds; band: min-max)')
  ax.set_ylabel(f'token accuracy at length {length}')
  _save_accuracy_plot(fig, ax, title, path)
  return True


def check_report_owner(workdir: str, title: str,
                       stem: str | None = None) -> None:
  """ConfigError where workdir's results.md is another study's (or this
  one's for another task: compare_positions names its task in the title).
  Its title is the owner's mark: the same title, or one under the same
  `stem` (a title that grows with the study's runs), is this study's
  report. The skeleton asks before any run trains or any plot is drawn
  (Study.report_title), write_results again before writing."""
  path = os.path.join(workdir, 'results.md')
  try:
    with open(path) as f:
      first = f.readline().rstrip('\n')
  except FileNotFoundError:
    return
  old = first.removeprefix('# ')
  if old == title or (stem is not None and old.startswith(stem)):
    return
  raise ConfigError(
      f'{path} is the report {old!r}, not this study\'s '
      f'({title or stem!r}): another '
      f'study, or this one with another task, shares the workdir. It is '
      f'left as it is. Give each study its own --workdir (or remove that '
      f'results.md to replace it)')


# (planned, finished) runs of the study whose report is being written, set
# by the skeleton around its report (planned_runs); None elsewhere.
_PLAN: tuple[int, int] | None = None


@contextlib.contextmanager
def planned_runs(planned: int, finished: int):
  """Within it, write_results says when a report covers only `finished` of
  the study's `planned` runs (an interrupted or sharded study)."""
  global _PLAN
  previous, _PLAN = _PLAN, (planned, finished)
  try:
    yield
  finally:
    _PLAN = previous


def _runs_section() -> tuple[str, str] | None:
  """("Runs", ...) for a report that covers part of its study's plan."""
  if _PLAN is None or _PLAN[1] >= _PLAN[0]:
    return None
  planned, finished = _PLAN
  others = planned - finished
  rest = ('the other one has' if others == 1
          else f'the {others} others have')
  return ('Runs', f'{finished} of the {planned} runs this study plans at this '
                  f'scale and seed count {"has" if finished == 1 else "have"} '
                  f'finished here; {rest} not (the study\'s command without '
                  f'--positions, --tasks or --shard trains them), so the tables '
                  f'above hold at most the finished runs.')


def write_results(workdir: str, title: str, sections: list[tuple[str, str]],
                  data: Any = None, stem: str | None = None) -> str:
  """workdir/results.md (and results.json with `data`); returns the markdown.
  Under --quick (or --scale=quick) both say, in the file itself, that they
  are a smoke test. A results.md there under another title is another
  study's and is refused (ConfigError), unless its title starts with
  `stem`: the fixed part of a title that grows with the study's runs. Then
  a section "Runs" where the report covers part of its plan
  (planned_runs), and last, where it holds finished runs, "Budget", names the budgets of the finished runs under
  workdir and how many were still improving (experiments/budget.py)."""
  quick = flags.FLAGS.is_parsed() and (QUICK.value or (
      'scale' in flags.FLAGS and flags.FLAGS['scale'].value == 'quick'))
  banner = (QUICK_BANNER + '\n\n') if quick else ''
  # Every report names its runs' budgets (experiments/budget.py).
  budget_of_runs = budget.budget_section(workdir) if os.path.isdir(workdir) else None
  runs_of_plan = _runs_section()
  sections = (list(sections) + ([runs_of_plan] if runs_of_plan else [])
              + ([budget_of_runs] if budget_of_runs else []))
  text = (f'# {title}\n\n' + banner
          + '\n\n'.join(f'## {h}\n\n{body}' for h, body in sections) + '\n')
  if quick and isinstance(data, dict):
    data = {'quick_mode_smoke_test': True, **data}
  os.makedirs(workdir, exist_ok=True)
  check_report_owner(workdir, title, stem)
  with open(os.path.join(workdir, 'results.md'), 'w') as f:
    f.write(text)
  if data is not None:
    with open(os.path.join(workdir, 'results.json'), 'w') as f:
      json.dump(data, f, indent=2, default=str)
  return text


def trained_model(config: ml_collections.ConfigDict, path: str,
                  step: int | None = None):
  """The model of a finished run in `path`: its latest checkpoint, or
  that of `step` (a study choosing among the kept ones). Read only:
  collecting results never moves a run's checkpoints."""
  from selfattn.training.trained import load_model
  return load_model(path, step, config).model


def small(config: ml_collections.ConfigDict, steps: int = 300
          ) -> ml_collections.ConfigDict:
  """The quick-mode shrink: width 32, lengths 4-8, `steps` steps."""
  config.task.min_len, config.task.max_len = 4, 8
  config.model.num_hiddens, config.model.ffn_num_hiddens = 32, 64
  config.train.num_steps, config.train.batch_size = steps, 32
  config.train.warmup_steps, config.train.log_every = steps // 10, 100
  config.train.checkpoint_every = config.eval.every = steps
  config.eval.lengths, config.eval.num_examples = [8, 16], 128
  return config


def study_steps(default: int) -> int:
  """--steps if given, else the study's `default`."""
  return default if STEPS.value is None else STEPS.value

"""Do section 5's two readings hold when the models train until their fit
of the longest trained length stops improving? (EXPERIMENTS.md section 5
measured them at 2,000 steps, with many cells still learning: randomized
positions fit the trained lengths worse and extrapolate better; fixed PoPE
fits and extrapolates worse than fixed RoPE.)

  python -m experiments.length_generalization_convergence \
      --workdir=experiments/results/lengthgen_convergence
  python -m experiments.length_generalization_convergence --workdir=... --quick

Section 5's protocol (configs/chomsky.py:small: Adam at a constant 1e-3),
except the budget:
  * training runs up to CAP_STEPS, the loop evaluates every length of the
    protocol (8, 16 and 17-48, 128 examples each) every EVAL_EVERY steps,
    and stops after PATIENCE evaluations in a row without a new highest
    token accuracy at length 16, the longest trained
    (config.train.early_stop_patience);
  * the run is read at the first evaluation with the highest of those: its
    score (token accuracy over 17-48, the reference's) and its accuracy at
    16. The choice looks only at length 16, and the score only at longer
    lengths, so it does not flatter the score.
The learning rate is constant, so a run's first 2,000 steps are those of a
2,000-step run of the same seed: its evaluation at step 2,000 is the short
budget, on the same stack (the committed section 5 runs trained on JAX
0.10.2 on the CPU or 0.11.2 on a GPU; the report says how far their scores
are from these, per stack).

Tasks reverse_string (where section 5's randomization cost fit at 16 and
still raised the score, -0.09 and +0.09) and duplicate_string (the task
furthest from fitting 16 at 2,000 steps, 0.58-0.85), encodings rope and
pope, fixed and randomized, seeds 0-2: 24 runs, seed-major (a study stopped
part way has every cell at a few seeds; --tasks runs one task's first).

Sized before it ran (2026-12-02, this 2-core CPU): section 5's runs trained
at 17-50 steps/s and evaluated the 34 lengths in about 12 s, so a run costs
about 1 minute per 1,000 steps with its evaluation: up to 10-14 minutes at
the cap, the 24 runs up to about 5 hours. Measured: 3.3-6.3 minutes a
reverse_string run and 5.5-12.4 a duplicate_string run, alone; most runs
reached the cap (experiments/results/timings.txt). Resumable like every
study.
"""

from __future__ import annotations

import os
import statistics

from absl import app

from experiments import common
from experiments import convergence
from experiments import length_generalization as lengthgen
from experiments import skeleton
from experiments import study
from selfattn.training import report as report_lib
from selfattn.training import workdir as workdir_lib
from selfattn.training.cli_checks import parse_flags

SHORT_STEPS = 2_000
# The quick scale's stand-in for it (its cap is convergence.QUICK's 40).
QUICK_SHORT_STEPS = 20
CAP_STEPS = 10_000
EVAL_EVERY = 1_000
PATIENCE = 3
# Token accuracy, not loss: a run that fits length 16 exactly keeps lowering
# its loss there (1e-4 to 1e-5 nats and on, seen in the first run) without
# changing an output, so a loss-based stop would run every such run to the
# cap.
STOP_METRIC = 'token_accuracy'
TASKS = ('reverse_string', 'duplicate_string')
POSITIONS = ('rope', 'pope')
QUICK_TASKS = ('reverse_string',)
# The 2,000-step study (its committed runs of the same seeds: the stack
# check); --short_dir replaces it.
SHORT_DIR = 'experiments/results/lengthgen'


def study_runs(scale: str, seeds: int, tasks=TASKS, positions=POSITIONS
               ) -> list[study.Run]:
  """Section 5's runs of `tasks` x `positions` x {fixed, randomized} with
  the convergence budget, seed-major."""
  runs = lengthgen.study_runs('quick' if scale == 'quick' else 'small',
                              seeds, tasks, positions)
  for run in runs:
    convergence.with_budget(run.config, scale, cap=CAP_STEPS,
                            every=EVAL_EVERY, patience=PATIENCE,
                            metric=STOP_METRIC)
  return runs


def label(task: str, position: str, randomized: bool) -> str:
  """A cell's name in the report."""
  return f'{task} {position}{" rand." if randomized else ""}'


# step -> the loop's evaluation ({length: metrics}) of a run.
evaluations = convergence.loop_evaluations


def short_step(config) -> int:
  """The step a run is read at for the short budget: SHORT_STEPS, or the
  quick scale's stand-in when the cap is below it."""
  return (SHORT_STEPS if config.train.num_steps > SHORT_STEPS
          else QUICK_SHORT_STEPS)


def read_run(run: study.Run, workdir: str) -> dict:
  """A finished run's readings: at the chosen step (the first with the
  highest accuracy at the longest trained length) and at the short
  budget's step (short_step)."""
  path = os.path.join(workdir, run.name)
  history = evaluations(path)
  chosen = convergence.highest_step(path)
  max_len = run.config.task.max_len

  def reading(step: int) -> dict:
    if step not in history:
      # The early-stopping record and the history disagree (a history
      # lost or reset on a resume): the run cannot be read as planned.
      raise skeleton.StudyError(
          f'{path}: no evaluation at step {step} in '
          f'{workdir_lib.EVALUATED_FILE} (it has {sorted(history)}); '
          f'retrain the run (delete its folder)')
    evaluation = history[step]
    return {'step': step,
            'score': report_lib.generalization_score(evaluation, max_len),
            'trained': evaluation[str(max_len)]['token_accuracy']}

  return {**run.tags, 'stopped_at': convergence.stopped_at(workdir, run.name),
          'chosen': reading(chosen), 'short': reading(short_step(run.config))}


def committed_run(short_dir: str, run: study.Run) -> tuple[float, str] | None:
  """(score, stack) of the 2,000-step study's run of the same name, or
  None; stack: its summary's JAX version and backend."""
  t = run.tags
  path = os.path.join(short_dir, lengthgen.run_name(
      t['task'], t['position'], t['random'], t['seed']), 'summary.json')
  if not os.path.exists(path):
    return None
  summary = workdir_lib.read_json_object(path, 'a 2,000-step run summary')
  versions = summary.get('versions') or {}
  stack = (f'JAX {versions.get("jax", "unrecorded")} on '
           f'{versions.get("backend", "an unrecorded backend")}')
  return summary['score'], stack


def paired(by_cell: dict, a: tuple, b: tuple) -> str:
  """Mean over cells a minus mean over cells b, per seed (the seeds that
  have every cell of both), in points: 'mean [95% t-interval across
  seeds] (n seeds)', or the one seed's difference, or '–'."""
  diffs = common.seed_differences(by_cell, a, b, scale=100)
  if not diffs:
    return '–'
  if len(diffs) == 1:
    return f'{diffs[0]:+.2f} (1 seed)'
  lo, hi = common.seed_interval(diffs)
  return (f'{statistics.mean(diffs):+.2f} [{lo:+.2f}, {hi:+.2f}] '
          f'({len(diffs)} seeds: ' + ', '.join(f'{d:+.1f}' for d in diffs)
          + ')')


# The fixed start of the report's title (skeleton.Study.title_stem).
TITLE = 'Length generalization to convergence'


def report(workdir: str, runs: list[study.Run], results: dict,
           short_dir: str | None) -> str:
  """results.md, results.json and the curves' plot; short_dir: the
  2,000-step study to compare the step-2,000 scores with (None: none)."""
  cells = list(dict.fromkeys(
      (r.tags['task'], r.tags['position'], r.tags['random']) for r in runs))
  by_cell: dict[tuple, dict[int, dict]] = {}
  for r in results.values():
    by_cell.setdefault((r['task'], r['position'], r['random']),
                       {})[r['seed']] = r
  short_step_read = short_step(runs[0].config)
  short_name = f'{short_step_read:,} steps'
  budgets = ((short_name, 'short'), ('to convergence', 'chosen'))
  config = runs[0].config
  trained = f'accuracy at {config.task.max_len}'
  scored = (f'score ({config.task.max_len + 1}-'
            f'{max(config.eval.lengths)})')

  rows = []
  for cell in cells:
    rs = [by_cell[cell][s] for s in sorted(by_cell.get(cell, {}))]
    if not rs:
      continue
    for name, key in budgets:
      converged = key == 'chosen'
      rows.append([
          label(*cell), name,
          ', '.join(str(r['stopped_at']) for r in rs) if converged else '',
          ', '.join(str(r[key]['step']) for r in rs),
          common.mean_std([r[key]['trained'] for r in rs]),
          common.mean_std([r[key]['score'] for r in rs]), len(rs)])
  table = common.markdown_table(
      ['cell', 'budget', 'stopped at (per seed)', 'read at step', trained,
       scored, 'runs'], rows)

  def values(key: str, what: str) -> dict:
    return {cell: {s: r[key][what] for s, r in by_seed.items()}
            for cell, by_seed in by_cell.items()}

  tasks = list(dict.fromkeys(c[0] for c in cells))
  positions = list(dict.fromkeys(c[1] for c in cells))
  # (name, cells a, cells b) for each task alone and, with several tasks,
  # for all of them (a seed's difference averages its tasks).
  scopes = [(task, (task,)) for task in tasks]
  if len(tasks) > 1:
    scopes.append(('both tasks', tuple(tasks)))
  comparisons = []
  for position in positions:
    comparisons.append((f'{position}: randomized minus fixed', position,
                        True, position, False))
  if {'rope', 'pope'} <= set(positions):
    comparisons.append(('pope minus rope, fixed', 'pope', False, 'rope',
                        False))
    comparisons.append(('pope minus rope, randomized', 'pope', True, 'rope',
                        True))
  comparison_rows = {}
  for what in ('score', 'trained'):
    short, long = values('short', what), values('chosen', what)
    change = convergence.change_with_budget(short, long)
    rows = [
        [name, scope, *(paired(by, tuple((t, pa, ra) for t in scope_tasks),
                               tuple((t, pb, rb) for t in scope_tasks))
                        for by in (short, long, change))]
        for name, pa, ra, pb, rb in comparisons
        for scope, scope_tasks in scopes]
    # A scope no seed has finished yet (a partial study) has no row.
    comparison_rows[what] = [row for row in rows
                             if any(cell != '–' for cell in row[2:])]
  header = ['comparison', 'tasks', short_name, 'to convergence',
            'change (convergence minus ' + short_name + ')']
  sections_of_lines = [
      (f'Paired by seed: {heading}', common.markdown_table(
          header, comparison_rows[what]))
      for what, heading in (('score', scored), ('trained', trained))]

  run_of = {run.name: run for run in runs}
  drift: dict[str, list[float]] = {}       # stack -> differences
  for name, r in results.items():
    committed = short_dir and committed_run(short_dir, run_of[name])
    if committed:
      score, stack = committed
      drift.setdefault(stack, []).append(r['short']['score'] - score)
  # Finished but left out of every table (study.diverged).
  diverged = [run.name for run in runs if run.name not in results
              and study.finished_summary(run, workdir) is not None]
  t = config.train
  body = [
      ('Protocol', (
          f"Section 5's protocol (configs/chomsky.py:small: Adam at a "
          f'constant {t.learning_rate:g}, batch {t.batch_size}) trained up to '
          f'{t.num_steps:,} steps, every length evaluated every '
          f'{config.eval.every:,} steps, training stopped after '
          f'{t.early_stop_patience} evaluation(s) in a row without a new '
          f'highest token accuracy at length {config.task.max_len} (the '
          f'longest trained); read at the first evaluation with the highest. '
          f'The '
          f'{short_name} rows are the same runs read at step '
          f'{short_step_read:,} (a constant learning rate makes them the '
          f'{short_step_read:,}-step protocol). '
          f'Comparisons: in points, mean [95% t-interval across seeds, the '
          f'unit of replication] and each seed\'s difference; over both '
          f'tasks a seed\'s difference averages its two.')),
      ('Accuracy (mean ± std over seeds)', table),
      *sections_of_lines,
  ]
  if diverged:
    body.append(('Diverged', (
        f'{len(diverged)} finished run(s) diverged and are in no table or '
        f'comparison: {", ".join(diverged)}.')))
  if drift:
    body.append(('Against the committed 2,000-step runs', (
        f'Score at step {short_step_read:,} here minus the committed score '
        f'of the same run in {short_dir}, by the stack the committed run '
        f'trained on (this study: its runs\' summary.json): ' + '; '.join(
            f'{stack}: mean {100 * statistics.mean(d):+.2f} points, '
            f'largest {100 * max(d, key=abs):+.2f}, over {len(d)} '
            f'run{"s" if len(d) != 1 else ""}'
            for stack, d in sorted(drift.items())) + '.')))
  plot = os.path.join(workdir, 'score_by_step.png')
  if plot_curves(workdir, runs, results, plot):
    body.append(('Score and fit by step', '![score and fit by step]'
                 '(score_by_step.png)'))
  return common.write_results(workdir, TITLE, body, results)


def plot_curves(workdir: str, runs: list[study.Run], results: dict,
                path: str) -> bool:
  """Per task: accuracy at the longest trained length (top) and the score
  (bottom) by step, one line per run, one colour per encoding, dashed for
  randomized; the read step starred, the short budget's step dotted."""
  if not results:
    return False
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  tasks = list(dict.fromkeys(r['task'] for r in results.values()))
  fig, axes = plt.subplots(2, len(tasks), figsize=(5 * len(tasks), 7),
                           squeeze=False)
  colors = {p: f'C{i}' for i, p in enumerate(POSITIONS)}
  config_of = {run.name: run.config for run in runs}
  shown = set()
  for name, r in sorted(results.items()):
    max_len = config_of[name].task.max_len
    history = evaluations(os.path.join(workdir, name))
    steps = sorted(history)
    column = tasks.index(r['task'])
    key = (r['task'], r['position'], r['random'])    # one legend per task
    style = dict(color=colors.get(r['position'], 'k'),
                 ls='--' if r['random'] else '-', marker='.',
                 label=None if key in shown else
                 r['position'] + (' rand.' if r['random'] else ''))
    shown.add(key)
    for row, read in ((0, lambda e: e[str(max_len)]['token_accuracy']),
                      (1, lambda e: report_lib.generalization_score(e, max_len))):
      ax = axes[row][column]
      ax.plot(steps, [read(history[s]) for s in steps], **style)
      best = r['chosen']['step']
      ax.plot([best], [read(history[best])], color=style['color'],
              marker='*', markersize=10)
  for column, task in enumerate(tasks):
    axes[0][column].set_title(task)
    axes[0][column].set_ylabel('token accuracy at the longest trained length')
    axes[1][column].set_ylabel('score: token accuracy over longer lengths')
    for row in (0, 1):
      axes[row][column].set_xlabel('training step (dotted: the short budget)')
      axes[row][column].axvline(short_step(runs[0].config), color='gray',
                                ls=':', lw=1)
      axes[row][column].grid(alpha=0.3)
    axes[0][column].legend(fontsize=8)
  fig.suptitle('One line per seed (dashed: randomized); * the step read')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return True


class LengthGeneralizationConvergence(convergence.Study):
  title = TITLE
  filters = ('task', 'position')

  def filter_values(self):
    return {'task': TASKS, 'position': POSITIONS}

  def runs(self, scale, seeds, context):
    if scale == 'quick':
      return study_runs(scale, seeds, QUICK_TASKS, ('rope',))
    return study_runs(scale, seeds)

  def results(self, runs, workdir, context, *, score_missing):
    out = {}
    for run in runs:
      summary = study.finished_summary(run, workdir)
      if summary is not None and not study.diverged(summary):
        out[run.name] = read_run(run, workdir)
    return out

  def report(self, workdir, runs, results, scale, context):
    # A quick run has no committed counterpart.
    return report(workdir, runs, results, None if scale == 'quick'
                  else convergence.short_dir(SHORT_DIR))


STUDY = LengthGeneralizationConvergence()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

"""Every positional encoding on one task: ranking table, accuracy-vs-length plot.

  python -m experiments.compare_positions --workdir=runs/compare [--task=reverse] [--seeds=5] [--positions=a,b] [--steps=N] [--quick]
  tensorboard --logdir runs/compare      # one run per encoding and seed, HParams tab

Trains each encoding with configs/default.py (lengths 1-16) and evaluates at
8, 16, 32 and 64 (a task whose output is not aligned with its input reads it
after the input: layout placeholders). --quick: a small model, four
encodings, one seed. --steps: train that many steps instead of the config's
2,000 (the cosine decay stretched to them after the same 100 warmup steps;
an evaluation every tenth of them, at least 100 steps apart; refused with
--quick).
A study like the others (experiments/skeleton.py): rerunning the command
skips finished runs and resumes the unfinished one; --positions trains only
those encodings; --shard splits the runs; --collect_only trains nothing. The
report ranks every encoding with a finished run by its mean token accuracy at
the longest trained length (ties in the order of
selfattn.nn.positions.POSITION_NAMES). The committed study,
experiments/results/compare, trained nine encodings on 2026-11-23 and PoPE's
five seeds on 2026-12-02 (--positions=pope); experiments/results/compare_long
is the same at --steps=10000.
"""

from __future__ import annotations

import os

from absl import app
from absl import flags

from experiments import common
from experiments import skeleton
from experiments import study
from selfattn.nn.positions import POSITION_NAMES
from selfattn.tasks import TASK_NAMES
from selfattn.tasks import TASKS
from selfattn.tasks import get_task
from selfattn.training.cli_checks import parse_flags

_TASK = flags.DEFINE_enum('task', 'reverse', list(TASK_NAMES), 'Task to train on.')
BINARY = ('parity_check', 'even_pairs')
QUICK_ENCODINGS = ('none', 'sinusoidal', 'shaw', 'rope')
ENCODINGS = {name: (name, {}, {}) for name in POSITION_NAMES}


def task_config(task: str, quick: bool):
  config = common.base_config(name=task)
  config.train.num_steps = common.study_steps(config.train.num_steps)
  config.eval.every = max(100, config.train.num_steps // 10)
  if task in BINARY:
    config.task.vocab_size = 2
  layouts = TASKS[task].layouts
  if config.task.layout not in layouts:
    # A task whose output is not aligned with its input (duplicate_string,
    # say): outputs read after the input, as the suite's paper lays it out.
    config.task.layout = 'placeholders' if 'placeholders' in layouts else (
        layouts[0])
  return common.small(config) if quick else config


def report(workdir: str, runs: list[study.Run], summaries: dict, quick: bool,
           task: str) -> str:
  """results.md/.json and the plot from the finished runs' summaries; an
  encoding without one is left out."""
  base = task_config(task, quick)
  results = {f'position={label}': r
             for label, r in common.by_label(runs, summaries).items()}
  seeds = max((len(r) for r in results.values()), default=0)
  lengths = list(base.eval.lengths)
  inside = max(n for n in lengths if n <= base.task.max_len)
  def mean_inside(runs):   # diverged runs left out; all diverged ranks last
    values = common.finite([common.accuracy(s, inside) for s in runs])
    return sum(values) / len(values) if values else -1.0

  ranked = sorted(results.items(), key=lambda kv: -mean_inside(kv[1]))
  chance = get_task(task, base.task.vocab_size).chance
  header = ['rank', 'encoding'] + [f'len {n}' for n in lengths]
  rows = [[i + 1, name.split('=')[1]] +
          [common.mean_std([common.accuracy(s, n) for s in runs]) for n in lengths]
          for i, (name, runs) in enumerate(ranked)]
  table = common.markdown_table(header, rows)
  by_encoding = {n.split('=')[1]: r for n, r in results.items()}
  plot = os.path.join(workdir, f'accuracy_vs_length_{task}.png')
  common.plot_accuracy_vs_length(
      by_encoding, lengths,
      base.task.max_len, f'{task}: token accuracy by evaluation length', plot,
      chance=chance)
  sections = [
      ('Setup', f'configs/default.py{" (quick: width 32)" if quick else ""} '
       f'with task={task}, trained on lengths '
       f'{base.task.min_len}-{base.task.max_len} for {base.train.num_steps} '
       f'steps, {seeds} seed(s); token accuracy, mean ± std over seeds; chance '
       f'{chance:.3f}. Ranked by accuracy at length {inside}.'),
      ('Ranking', table),
      ('Plot', f'![accuracy vs length]({os.path.basename(plot)})')]
  curve = os.path.join(workdir, f'accuracy_vs_step_{task}.png')
  if common.plot_accuracy_vs_step(
      by_encoding, inside,
      f'{task}: token accuracy at length {inside} during training', curve):
    sections.append(('Training curve',
                     f'![accuracy at length {inside} by step]'
                     f'({os.path.basename(curve)})'))
  changes = common.last_interval_table(
      {name.split('=')[1]: r for name, r in ranked}, lengths)
  if changes:
    sections.append((
        'Change over the last evaluation interval',
        f'{common.LAST_INTERVAL_NOTE}\n\n{changes}'))
  return common.write_results(
      workdir, title(task), sections,
      data={'task': task, 'chance': chance, 'lengths': lengths,
            'accuracy': {n: [s.get('eval') for s in r] for n, r in results.items()}})


def title(task: str) -> str:
  """The report's title: one task's (a workdir holds one task's study)."""
  return f'Every encoding on {task}'


class ComparePositions(skeleton.Study):
  """One task (--task), every encoding; --scale: cpu (configs/default.py)
  or quick (a small model, four encodings, one seed)."""
  scales = ('cpu', 'quick')
  default_scale = 'cpu'
  takes_steps = True

  def filter_values(self):
    return {'position': POSITION_NAMES}

  def runs(self, scale, seeds, context):
    quick = scale == 'quick'
    labels = QUICK_ENCODINGS if quick else POSITION_NAMES
    return common.encoding_runs(task_config(_TASK.value, quick), seeds,
                                labels, ENCODINGS)

  def report_title(self):
    return title(_TASK.value), None

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, scale == 'quick', _TASK.value)


STUDY = ComparePositions()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

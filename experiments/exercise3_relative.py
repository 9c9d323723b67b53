"""Exercise 3: learned embeddings per query-key offset (Shaw 2018, Huang 2018).

  python -m experiments.exercise3_relative --workdir=runs/exercise3 [--seeds=5] [--tasks=a,b]
      [--positions='shaw k=2,alibi'] [--steps=N] [--quick]

Shaw's relative attention with clipping distance k in {2, 4, 8, 16, 64}, keys
only vs keys and values, one table shared by the heads vs one per head,
against absolute encodings (sinusoidal, learned) and the other relative
families (huang, rope, alibi, t5). Tasks: reverse (position-absolute), shift
and window_sum (translation-invariant). Trained on lengths 1-16, evaluated at
8, 16 and at 2x and 4x the longest trained length. A study like the others
(experiments/skeleton.py): resumable, --tasks, --positions (the variants'
names), --shard, --collect_only.
"""

import os

from absl import app

from experiments import common
from experiments import skeleton
from experiments import study
from selfattn.tasks import get_task
from selfattn.training.cli_checks import parse_flags

STEPS = 1000      # training steps per run (--steps overrides)
TASKS = ('reverse', 'shift', 'window_sum')
QUICK_TASKS = ('shift',)


def settings(quick: bool):
  """(name, model overrides) of every variant."""
  if quick:
    return [('shaw k=2', {'position': 'shaw', 'clip_distance': 2}),
            ('shaw k=2 keys only', {'position': 'shaw', 'clip_distance': 2,
                                    'relative_values': False}),
            ('sinusoidal', {'position': 'sinusoidal'})]
  out = [(f'shaw k={k}', {'position': 'shaw', 'clip_distance': k})
         for k in (2, 4, 8, 16, 64)]
  out += [('shaw k=16 keys only', {'position': 'shaw', 'clip_distance': 16,
                                   'relative_values': False}),
          ('shaw k=16 per head', {'position': 'shaw', 'clip_distance': 16,
                                  'shared_heads': False})]
  out += [(name, {'position': name}) for name in
          ('sinusoidal', 'learned', 'huang', 'rope', 'alibi', 't5')]
  return out


def task_base(task: str, quick: bool):
  base = common.base_config(name=task)
  base.train.num_steps = common.study_steps(STEPS)
  base.eval.every = max(100, common.study_steps(STEPS) // 5)
  return common.small(base, steps=200) if quick else base


# The report's title, the owner's mark on its workdir (skeleton.Study.title).
TITLE = 'Exercise 3: relative position embeddings per query-key offset'
CLIPPING = (2, 4, 8, 16, 64)


def accuracy_by_seed(runs: list[study.Run], summaries: dict, task: str,
                     length: int) -> dict[str, dict[int, float]]:
  """label -> seed -> token accuracy at `length` of `task`'s finished runs."""
  out: dict[str, dict[int, float]] = {}
  for run in runs:
    summary = summaries.get(run.name)
    # A diverged run has no accuracy: its seed pairs with nothing.
    if (summary is not None and not study.diverged(summary)
        and run.tags['task'] == task):
      out.setdefault(run.tags['position'], {})[run.tags['seed']] = (
          common.accuracy(summary, length))
  return out


def clipping_lines(runs: list[study.Run], summaries: dict, task: str,
                   lengths) -> list[str]:
  """Each Shaw clipping distance minus the next larger one that has runs,
  paired by seed, at each of `lengths`, in points; empty where no pair has
  two seeds (a one-seed study)."""
  lines = []
  for n in lengths:
    by = accuracy_by_seed(runs, summaries, task, n)
    present = [f'shaw k={k}' for k in CLIPPING if f'shaw k={k}' in by]
    for a, b in zip(present, present[1:]):
      lines.append(common.paired_by_seed(
          by, (a,), (b,), f'{a} minus {b} at length {n}', unit='points',
          scale=100, digits=1))
  if all(line.endswith(common.NO_PAIRS) for line in lines):
    return []
  return lines


def report(workdir: str, runs: list[study.Run], summaries: dict,
           quick: bool) -> str:
  results_by_task = common.by_task(runs, summaries)
  seeds = common.seed_count(results_by_task)
  sections, data = [], {}
  for task, results in results_by_task.items():
    base = task_base(task, quick)
    lengths = list(base.eval.lengths)
    chance = get_task(task, base.task.vocab_size).chance
    plot = os.path.join(workdir, f'accuracy_vs_length_{task}.png')
    common.plot_accuracy_vs_length(results, lengths, base.task.max_len,
                                   f'{task}: relative vs absolute encodings',
                                   plot, chance=chance)
    sections.append((f'{task} (chance {chance:.3f})',
                     common.accuracy_table(results, lengths, 'encoding') +
                     f'\n\n![{task}]({os.path.basename(plot)})'))
    beyond = [n for n in lengths if n > base.task.max_len]
    lines = clipping_lines(runs, summaries, task, beyond)
    if lines:
      sections.append((
          f'{task}: clipping distance, paired by seed',
          'Each clipping distance minus the next larger one beyond the '
          'trained lengths (95% t-interval across seeds, the unit of '
          'replication):\n\n' + '\n'.join(f'- {line}' for line in lines)))
    table = common.last_interval_table(results, lengths)
    if table:
      sections.append((
          f'{task}: change over the last evaluation interval',
          f'{common.LAST_INTERVAL_NOTE}\n\n{table}'))
    data[task] = {n: [s.get('eval') for s in r] for n, r in results.items()}
  base = task_base(runs[0].tags['task'], quick)
  return common.write_results(
      workdir, TITLE,
      [('Setup', f'configs/default.py (2 layers, width '
        f'{32 if quick else 64}, pre-LN), '
        f'{200 if quick else common.study_steps(STEPS)} '
        f'steps, trained on lengths {base.task.min_len}-{base.task.max_len}; '
        f'token accuracy, mean ± std over {seeds} seed(s).')] + sections,
      data=data)


class Exercise3(skeleton.TaskSweep):
  """--scale: cpu (three tasks, thirteen variants); quick (shift, three
  variants, one seed)."""
  title = TITLE
  tasks, quick_tasks = TASKS, QUICK_TASKS
  filters = ('task', 'position')     # --positions='shaw k=2,alibi'
  takes_steps = True

  def sweep_runs(self, tasks, seeds, quick):
    # <task>/<variant with underscores>,seed=<seed>: the committed folders,
    # which --positions also takes.
    return common.variant_runs(tasks, seeds, settings(quick),
                               lambda task: task_base(task, quick),
                               skeleton.flag_spelling)

  def sweep_report(self, workdir, runs, summaries, quick):
    return report(workdir, runs, summaries, quick)


STUDY = Exercise3()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

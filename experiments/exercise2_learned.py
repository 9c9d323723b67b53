"""Exercise 2: a learnable positional encoding.

  python -m experiments.exercise2_learned --workdir=runs/exercise2 [--seeds=5] [--tasks=a,b] [--positions=a,b] [--quick]

A learned absolute table P against the chapter's sinusoidal table, and a
learned table initialised from the sinusoidal one: accuracy at the trained
lengths, steps to reach 99% token accuracy, accuracy beyond the trained
lengths (rows of P past 16 are never updated), and the position-position
cosine similarity of each table after training. The sinusoidal and learned
tables are also trained with the chapter's dropout (0.1), which the other
synthetic-task studies leave at 0 (music and translation train with it). A study like the others (experiments/skeleton.py):
resumable, --tasks, --positions (a variant by its folder name:
learned_dropout_0.1, learned_sinusoidal_init), --shard, --collect_only
(which redraws the cosine pictures only where seed 0's checkpoints are
still there).
"""

import os

import matplotlib.pyplot as plt
import numpy as np
from absl import app

from experiments import common
from experiments import skeleton
from experiments import study
from selfattn.training.cli_checks import parse_flags

STEPS = 2000      # training steps per run (--steps overrides)
TASKS = ('reverse', 'sort')
QUICK_TASKS = ('reverse',)
SETTINGS = [('sinusoidal', {'position': 'sinusoidal'}),
            ('learned', {'position': 'learned'}),
            ('learned, sinusoidal init', {'position': 'learned',
                                          'init': 'sinusoidal'})]
# The chapter's models train with dropout (0.1 after adding P, on the attention
# weights and in every AddNorm); the other synthetic-task studies use none.
DROPOUT_SETTINGS = [(f'{name}, dropout 0.1', {**model, 'dropout': 0.1})
                    for name, model in SETTINGS[:2]]


def cosine_similarity(table: np.ndarray) -> np.ndarray:
  unit = table / np.maximum(np.linalg.norm(table, axis=-1, keepdims=True), 1e-9)
  return unit @ unit.T


def task_base(task: str, quick: bool):
  base = common.base_config(name=task)
  base.train.num_steps = common.study_steps(STEPS)
  base.eval.every = 100
  base.model.max_len = 64
  if quick:
    base = common.small(base, steps=200)
    base.eval.every = 50
  return base


def draw_tables(workdir: str, task: str, runs: list[study.Run], inside: int,
                max_len: int) -> None:
  """The position-position cosine similarity of seed 0's trained tables,
  read from its checkpoints; left as it is where they are gone (a clone of
  the committed study holds summaries, not checkpoints)."""
  seed0 = {r.tags['position']: r for r in runs
           if r.tags['task'] == task and r.tags['seed'] == 0}
  models = []
  for name, _ in SETTINGS:
    run = seed0.get(name)
    if run is None:
      return
    try:
      models.append(common.trained_model(run.config,
                                         os.path.join(workdir, run.name)))
    except FileNotFoundError:
      return
  fig, axes = plt.subplots(1, len(SETTINGS), figsize=(4 * len(SETTINGS), 3.8))
  for ax, (name, _), model in zip(axes, SETTINGS, models):
    table = np.asarray(model.encoder.pos_encoding.table(max_len))
    im = ax.imshow(cosine_similarity(table), cmap='viridis', vmin=-1, vmax=1)
    ax.axvline(inside - 0.5, color='w', lw=0.8)
    ax.axhline(inside - 0.5, color='w', lw=0.8)
    ax.set_title(name, fontsize=9)
    ax.set_xlabel('position')
  axes[0].set_ylabel('position')
  fig.colorbar(im, ax=axes, shrink=0.8)
  fig.savefig(os.path.join(workdir, f'cosine_similarity_{task}.png'), dpi=100)
  plt.close(fig)


# The report's title, the owner's mark on its workdir (skeleton.Study.title).
TITLE = 'Exercise 2: a learnable positional encoding'


def report(workdir: str, runs: list[study.Run], summaries: dict,
           quick: bool) -> str:
  results_by_task = common.by_task(runs, summaries)
  seeds = common.seed_count(results_by_task)
  sections, data = [], {}
  for task, results in results_by_task.items():
    base = task_base(task, quick)
    lengths = list(base.eval.lengths)
    inside = base.task.max_len
    rows = []
    for name, task_summaries in results.items():
      reached = [common.steps_to(s, inside) for s in task_summaries]
      rows.append([name, common.mean_std([common.accuracy(s, inside)
                                          for s in task_summaries]),
                   ', '.join('never' if r is None else str(r) for r in reached)]
                  + [common.mean_std([common.accuracy(s, n)
                                      for s in task_summaries])
                     for n in lengths if n > inside])
    header = (['encoding', f'acc at {inside} (trained)', 'steps to 99%']
              + [f'acc at {n}' for n in lengths if n > inside])
    draw_tables(workdir, task, runs, inside, base.model.max_len)
    plot = os.path.join(workdir, f'accuracy_vs_length_{task}.png')
    common.plot_accuracy_vs_length(results, lengths, inside,
                                   f'{task}: learned vs sinusoidal', plot)
    sections.append((task, common.markdown_table(header, rows) +
                     f'\n\n![cosine similarity](cosine_similarity_{task}.png)'
                     f'\n\n![accuracy vs length]({os.path.basename(plot)})'))
    data[task] = {n: [{'eval': s.get('eval'),
                       'steps_to_99': common.steps_to(s, inside)}
                      for s in r] for n, r in results.items()}
  base = task_base(runs[0].tags['task'], quick)
  return common.write_results(
      workdir, TITLE,
      [('Setup', f'configs/default.py, {base.train.num_steps} steps, trained '
        f'on lengths {base.task.min_len}-{base.task.max_len}, evaluated every '
        f'{base.eval.every} steps (steps to 99% is the first evaluation at or '
        f'above 0.99 at the longest trained length); {seeds} seed(s), mean ± '
        f'std, steps to 99% per seed. Dropout 0 except in the rows marked '
        f'dropout 0.1 (the chapter\'s rate: after adding P, on the attention '
        f'weights and in every AddNorm). White lines in the pictures mark the '
        f'longest trained position.')] + sections,
      data=data)


class Exercise2(skeleton.TaskSweep):
  """--scale: cpu (reverse and sort, five variants); quick (reverse, one
  seed, 200 steps)."""
  title = TITLE
  # --positions=learned_dropout_0.1: a variant by its folder name (the
  # names hold commas, which the flag would split).
  filters = ('task', 'position')
  tasks, quick_tasks = TASKS, QUICK_TASKS
  takes_steps = True

  def sweep_runs(self, tasks, seeds, quick):
    return common.variant_runs(tasks, seeds, SETTINGS + DROPOUT_SETTINGS,
                               lambda task: task_base(task, quick),
                               skeleton.flag_spelling)

  def sweep_report(self, workdir, runs, summaries, quick):
    return report(workdir, runs, summaries, quick)


STUDY = Exercise2()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

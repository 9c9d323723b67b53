"""Length generalization on the reference protocol of Deletang et al. (2023) and
Ruoss et al. (2023): tasks x encodings x {fixed, randomized} x seeds.

  python -m experiments.length_generalization --workdir=runs/lengthgen
  python -m experiments.length_generalization --workdir=runs/lengthgen --scale=full   # the papers' scale
  python -m experiments.length_generalization --workdir=runs/lengthgen --shard=0/4    # one of 4 machines

Resumable: rerunning the command skips finished runs, resumes the unfinished
one from its checkpoint and rewrites results.md, results.json and the plots
from every finished run (also those other shards finished). --tasks,
--positions and --seeds select part of the study. The protocol (lengths,
steps, model) of each --scale is configs/chomsky.py's.

Scoring, as the reference: a run's score is its token accuracy averaged
over every test length above the training range; a cell reports mean ± std and
the max over seeds (the papers report the max).
"""

from __future__ import annotations

import copy
import os
import statistics

import numpy as np
from absl import app

from configs import chomsky
from experiments import common
from experiments import skeleton
from experiments import study
from selfattn.training.cli_checks import parse_flags

TASKS = ('even_pairs', 'parity_check', 'reverse_string', 'bucket_sort',
         'missing_duplicate_string', 'duplicate_string')
POSITIONS = ('none', 'sinusoidal', 'learned', 'rope', 'alibi', 'xl', 'shaw',
             'pope')
QUICK_TASKS, QUICK_POSITIONS = ('reverse_string', 'parity_check'), ('none', 'rope')


def run_name(task: str, position: str, randomized: bool, seed: int) -> str:
  return f'task={task},position={position},random={int(randomized)},seed={seed}'


def study_runs(scale: str, seeds: int, tasks=TASKS, positions=POSITIONS
               ) -> list[study.Run]:
  """Every run of the study, in the order they are trained: seed-major, so a
  partial study already has every cell at a few seeds."""
  base = chomsky.get_config(scale)
  runs = []
  for seed in range(seeds):
    for task in tasks:
      for position in positions:
        for randomized in (False, True):
          if randomized and position == 'none':
            continue      # nothing to randomize
          config = copy.deepcopy(base)
          config.seed = seed
          config.task.name = task
          config.model.position = position
          config.model.randomize_positions = randomized
          runs.append(study.Run(
              run_name(task, position, randomized, seed), config,
              {'task': task, 'position': position, 'random': randomized,
               'seed': seed}))
  return runs


# --------------------------------------------------------------------------
# Results.
# --------------------------------------------------------------------------

def _cell(scores: list[float]) -> str:
  if not scores:
    return '–'
  text = common.mean_std(scores)
  return f'{text} (max {max(scores):.3f}, n={len(scores)})'


def _columns(by_cell: dict, tasks, positions):
  """(task, encoding, {seed: fixed score}, {seed: randomized score}) of every
  encoding that has a randomized counterpart ('none' has not)."""
  for task in tasks:
    for position in positions:
      if position != 'none':
        yield (task, position, by_cell.get((task, position, False), {}),
               by_cell.get((task, position, True), {}))


def _pairs(by_cell: dict, tasks, positions):
  """(task, encoding, seed, randomized minus fixed score) of every finished
  pair, in the order task, encoding, seed."""
  for task, position, fixed, rand in _columns(by_cell, tasks, positions):
    for seed in sorted(set(fixed) & set(rand)):
      yield task, position, seed, rand[seed] - fixed[seed]


def paired_differences(by_cell: dict, tasks, positions) -> list[float]:
  """Randomized minus fixed score, paired by (task, encoding, seed)."""
  return [diff for *_, diff in _pairs(by_cell, tasks, positions)]


def per_seed_differences(by_cell: dict, tasks, positions) -> dict[int, list[float]]:
  """{seed: randomized minus fixed score of every (task, encoding) pair that
  seed has finished}."""
  out: dict[int, list[float]] = {}
  for _, _, seed, diff in _pairs(by_cell, tasks, positions):
    out.setdefault(seed, []).append(diff)
  return out


def breakdown(by_cell: dict, tasks, positions) -> str:
  """The paired differences by task and by encoding: mean and how many of
  them are positive (randomized higher)."""
  groups: dict[str, dict[str, list[float]]] = {'task': {}, 'encoding': {}}
  for task, position, _, diff in _pairs(by_cell, tasks, positions):
    groups['task'].setdefault(task, []).append(diff)
    groups['encoding'].setdefault(position, []).append(diff)
  return ' '.join(
      f'Per {kind}: ' + '; '.join(
          f'{name} {statistics.mean(v):+.3f} ({sum(d > 0 for d in v)} of '
          f'{len(v)} positive)' for name, v in by_name.items()) + '.'
      for kind, by_name in groups.items() if by_name)


def per_seed_table(by_cell: dict, tasks, positions) -> str:
  """Markdown table task x encoding of every seed's difference, seed order."""
  cells: dict = {}
  for task, position, _, diff in _pairs(by_cell, tasks, positions):
    cells.setdefault((task, position), []).append(f'{diff:+.3f}')
  encodings = [p for p in positions if p != 'none']
  return common.markdown_table(
      ['task'] + encodings,
      [[t] + [' '.join(cells.get((t, p), ['–'])) for p in encodings]
       for t in tasks])


def max_over_seeds_differences(by_cell: dict, tasks, positions
                               ) -> dict[tuple[str, str], float]:
  """{(task, encoding): best randomized seed minus best fixed seed}.

  Ruoss et al. report the max over seeds, so this is the statistic their
  +12.0% average is made of. A cell counts only once both of its columns have
  the same seeds finished: a max over five seeds against a max over four
  would favour the fuller column.
  """
  return {(task, position): max(rand.values()) - max(fixed.values())
          for task, position, fixed, rand in _columns(by_cell, tasks, positions)
          if fixed and set(fixed) == set(rand)}


def bootstrap_ci(values: list[float], level: float = 0.95,
                 draws: int = 10000) -> tuple[float, float]:
  """Percentile bootstrap interval of the mean (fixed seed: reproducible)."""
  rng = np.random.default_rng(0)
  values = np.asarray(values)
  means = rng.choice(values, (draws, len(values))).mean(axis=1)
  return (float(np.quantile(means, (1 - level) / 2)),
          float(np.quantile(means, (1 + level) / 2)))


def plot_task(task: str, summaries: dict[str, dict], positions, path: str,
              train_max: int, chance: float) -> None:
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), sharey=True)
  colors = plt.get_cmap('tab10').colors
  for ax, randomized in zip(axes, (False, True)):
    for i, position in enumerate(positions):
      runs = [s for s in summaries.values() if s['task'] == task
              and s['position'] == position
              and s['randomize_positions'] == randomized]
      if not runs:
        continue
      lengths = sorted(int(n) for n in runs[0]['eval'])
      acc = np.array([[r['eval'][str(n)]['token_accuracy'] for n in lengths]
                      for r in runs])
      common.band(ax, lengths, acc, color=colors[i % 10], lw=1.4,
                  alpha=0.15, label=f'{position} (n={len(runs)})')
    ax.axvline(train_max, color='gray', ls='--', lw=1)
    ax.axhline(chance, color='gray', ls=':', lw=1)
    ax.set_title(f'{task}: {"randomized" if randomized else "fixed"} positions')
    ax.set_xlabel('test length (line: mean over seeds; band: min-max)')
    ax.set_ylim(0, 1.02)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=7)
  axes[0].set_ylabel('token accuracy')
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


# The report's title, the owner's mark on its workdir (skeleton.Study.title).
TITLE = 'Length generalization'


def report(workdir: str, runs: list[study.Run], summaries: dict[str, dict],
           scale: str) -> str:
  """results.md, results.json and one plot per task from the finished runs."""
  tasks = list(dict.fromkeys(r.tags['task'] for r in runs))
  positions = list(dict.fromkeys(r.tags['position'] for r in runs))
  # A diverged run has no score; it is named in the status, not averaged.
  diverged = sorted(n for n, s in summaries.items() if study.diverged(s))
  summaries = {n: s for n, s in summaries.items() if n not in diverged}
  base = chomsky.get_config(scale)
  trained = str(base.task.max_len)      # the longest training length
  by_cell: dict = {}
  in_distribution: dict = {}
  for run in runs:
    if run.name in summaries:
      t = run.tags
      cell = (t['task'], t['position'], t['random'])
      summary = summaries[run.name]
      by_cell.setdefault(cell, {})[t['seed']] = summary['score']
      if trained in summary['eval']:
        in_distribution.setdefault(cell, {})[t['seed']] = (
            summary['eval'][trained]['token_accuracy'])
  header = ['task'] + sum([[f'{p}'] if p == 'none' else
                           [f'{p}', f'{p} rand.'] for p in positions], [])
  def table(cells, text):
    rows = []
    for task in tasks:
      row = [task]
      for p in positions:
        for randomized in ((False,) if p == 'none' else (False, True)):
          row.append(text(list(cells.get((task, p, randomized), {}).values())))
      rows.append(row)
    return common.markdown_table(header, rows)

  in_diffs = paired_differences(in_distribution, tasks, positions)
  fit = (f'Token accuracy at length {trained}, the longest trained (mean ± '
         f'std over seeds): how well each cell learned the task before any '
         f'extrapolation.\n\n'
         f'{table(in_distribution, lambda v: common.mean_std(v) if v else "–")}')
  if in_diffs:
    fit += (f'\n\nRandomized minus fixed at length {trained}, paired by '
            f'(task, encoding, seed) over {len(in_diffs)} pairs: mean '
            f'{statistics.mean(in_diffs):+.4f}; randomized is lower in '
            f'{sum(d < 0 for d in in_diffs)} of them. '
            f'{breakdown(in_distribution, tasks, positions)}')
  diffs = paired_differences(by_cell, tasks, positions)
  if len(diffs) >= 2:
    lo, hi = bootstrap_ci(diffs)
    positive = sum(d > 0 for d in diffs)
    paired = (f'Randomized minus fixed, paired by (task, encoding, seed) over '
              f'{len(diffs)} pairs: mean {statistics.mean(diffs):+.4f}, 95% '
              f'bootstrap CI [{lo:+.4f}, {hi:+.4f}]; randomized is higher in '
              f'{positive} of {len(diffs)} pairs. Ruoss et al. report '
              f'+12.0% averaged over their tasks and encodings (max over seeds).')
  else:
    paired = 'Not enough paired runs yet for the randomized-vs-fixed comparison.'
  by_seed = per_seed_differences(by_cell, tasks, positions)
  if len(by_seed) >= 2:
    means = [statistics.mean(v) for _, v in sorted(by_seed.items())]
    lo, hi = common.seed_interval(means)
    paired += (' Per seed: ' + ', '.join(
        f'seed {seed} {statistics.mean(v):+.4f} ({len(v)} pairs)'
        for seed, v in sorted(by_seed.items()))
        + f'; across the {len(means)} seeds (the unit of replication): mean '
        f'{statistics.mean(means):+.4f}, 95% t-interval [{lo:+.4f}, {hi:+.4f}].')
  best = max_over_seeds_differences(by_cell, tasks, positions)
  if best:
    paired += (f' Max over seeds, the papers\' statistic (best randomized '
               f'seed minus best fixed seed, averaged over {len(best)} (task, '
               f'encoding) cells with the same seeds finished): '
               f'{statistics.mean(best.values()):+.4f}; randomized is higher in '
               f'{sum(d > 0 for d in best.values())} of {len(best)} cells.')
  if diffs:
    paired += (f' {breakdown(by_cell, tasks, positions)}\n\n'
               f'Every pair\'s difference (randomized minus fixed score), '
               f'seeds in order:\n\n{per_seed_table(by_cell, tasks, positions)}')
  done = len(summaries) + len(diverged)
  protocol = (
      f'scale={scale}: layout {base.task.layout}, one length per batch uniform '
      f'in {base.task.min_len}-{base.task.max_len}, evaluated at '
      f'{len(base.eval.lengths)} lengths from {min(base.eval.lengths)} to '
      f'{max(base.eval.lengths)} ({base.eval.num_examples} examples each), {base.train.num_steps} steps of batch {base.train.batch_size}, '
      f'lr {base.train.learning_rate} ({base.train.schedule}), '
      f'{base.model.num_layers} layers, width {base.model.num_hiddens}, '
      f'{base.model.num_heads} heads, norm {base.model.norm}, dropout '
      f'{base.model.dropout}; randomized positions from '
      f'[0, {base.model.max_random_len}). Cell: score mean ± std over seeds '
      f'(max over seeds, number of seeds). Score: token accuracy averaged '
      f'over the test lengths above {base.task.max_len}.')
  sections = [
      ('Status', f'{done} of {len(runs)} runs finished.'
       + (f' {len(diverged)} diverged (non-finite loss; left out of the '
          f'scores): {", ".join(diverged)}.' if diverged else '')
       + ('' if scale != 'quick' else
          ' QUICK MODE: a smoke test of the pipeline, not a result.')),
      ('Protocol', protocol),
      ('Scores', table(by_cell, _cell)),
      ('Randomized vs fixed', paired),
      ('In distribution', fit),
      ('Plots', '\n'.join(f'![{t}](accuracy_vs_length_{t}.png)' for t in tasks)),
  ]
  os.makedirs(workdir, exist_ok=True)
  for task in [t for t in tasks if any(s['task'] == t for s in summaries.values())]:
    chance = next((s['chance'] for s in summaries.values() if s['task'] == task),
                  0.5)
    plot_task(task, summaries, positions,
              os.path.join(workdir, f'accuracy_vs_length_{task}.png'),
              base.task.max_len, chance)
  data = {'scale': scale, 'protocol': protocol, 'paired_differences': diffs,
          'in_distribution_differences': in_diffs,
          'max_over_seeds_differences': {f'{t}/{p}': d
                                         for (t, p), d in best.items()},
          'diverged': diverged,
          'runs': {name: {'task': s['task'], 'position': s['position'],
                          'randomized': s['randomize_positions'],
                          'seed': s['config']['seed'], 'score': s['score'],
                          'train_seconds': s['train_seconds'],
                          'accuracy': {n: m['token_accuracy']
                                       for n, m in s['eval'].items()}}
                   for name, s in summaries.items()}}
  return common.write_results(workdir, TITLE, sections, data)


class LengthGeneralization(skeleton.Study):
  """--scale: quick (a smoke test), small (the CPU study, EXPERIMENTS.md's
  defaults), full (the papers')."""
  title = TITLE
  scales = ('quick', 'small', 'full')
  default_scale = 'small'
  filters = ('task', 'position')

  def filter_values(self):
    return {'task': TASKS, 'position': POSITIONS}

  def runs(self, scale, seeds, context):
    quick = scale == 'quick'
    return study_runs(scale, seeds, QUICK_TASKS if quick else TASKS,
                      QUICK_POSITIONS if quick else POSITIONS)

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, scale)


STUDY = LengthGeneralization()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

"""Every positional encoding on one task: ranking table, accuracy-vs-length plot.

  python -m experiments.compare_positions --workdir=runs/compare [--task=reverse] [--seeds=5] [--positions=a,b] [--quick]
  tensorboard --logdir runs/compare      # one run per encoding and seed, HParams tab

Trains each encoding with configs/default.py (lengths 1-16) and evaluates at
8, 16, 32 and 64. --quick: a small model, four encodings, one seed.
--positions: these encodings, in this order (default: every one); the
committed study (experiments/results/compare) predates PoPE and
re-collects with --positions=none,sinusoidal,learned,shaw,huang,rope,alibi,xl,t5
(scripts/recollect_studies.sh).
"""

import os

from absl import app
from absl import flags

from experiments import common
from selfattn.nn.positions import POSITION_NAMES
from selfattn.tasks import TASK_NAMES
from selfattn.tasks import get_task

_TASK = flags.DEFINE_enum('task', 'reverse', list(TASK_NAMES), 'Task to train on.')
_POSITIONS = flags.DEFINE_list(
    'positions', None, 'Encodings to compare, in this order (default: all '
    'of selfattn.nn.positions.POSITION_NAMES).')
BINARY = ('parity_check', 'even_pairs')


def task_config(task: str, quick: bool):
  config = common.base_config(name=task)
  if task in BINARY:
    config.task.vocab_size = 2
  return common.small(config) if quick else config


def compare(workdir: str, seeds: int, quick: bool, task: str = None) -> str:
  task = task or _TASK.value
  encodings = ('none', 'sinusoidal', 'shaw', 'rope') if quick else POSITION_NAMES
  if _POSITIONS.value:
    unknown = [p for p in _POSITIONS.value if p not in POSITION_NAMES]
    if unknown:
      raise SystemExit(f'error: --positions: unknown {", ".join(unknown)}; '
                       f'valid: {", ".join(POSITION_NAMES)}')
    encodings = tuple(_POSITIONS.value)
  seeds = 1 if quick else seeds
  base = task_config(task, quick)
  settings = []
  for position in encodings:
    settings.append((f'position={position}', common.variant(base, position=position)))
  results = common.sweep(settings, workdir, seeds)
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
  plot = os.path.join(workdir, f'accuracy_vs_length_{task}.png')
  common.plot_accuracy_vs_length(
      {n.split('=')[1]: r for n, r in results.items()}, lengths,
      base.task.max_len, f'{task}: token accuracy by evaluation length', plot,
      chance=chance)
  text = common.write_results(
      workdir, f'Every encoding on {task}',
      [('Setup', f'configs/default.py{" (quick: width 32)" if quick else ""} '
        f'with task={task}, trained on lengths '
        f'{base.task.min_len}-{base.task.max_len} for {base.train.num_steps} '
        f'steps, {seeds} seed(s); token accuracy, mean ± std over seeds; chance '
        f'{chance:.3f}. Ranked by accuracy at length {inside}.'),
       ('Ranking', table),
       ('Plot', f'![accuracy vs length]({os.path.basename(plot)})')],
      data={'task': task, 'chance': chance, 'lengths': lengths,
            'accuracy': {n: [s.get('eval') for s in r] for n, r in results.items()}})
  print(text)
  return text


if __name__ == '__main__':
  app.run(common.main_wrapper(compare))

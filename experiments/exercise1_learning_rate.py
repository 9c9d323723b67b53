"""Exercise 1's open hypothesis: does a lower learning rate train deep post-LN?

  python -m experiments.exercise1_learning_rate --workdir=runs/exercise1_lr [--seeds=5] [--quick]

EXPERIMENTS.md section 1's warmup sweep left post-LN at depth 12 and 24 at
chance with 100 warmup steps of 2,000 at peak learning rate 3e-3 (0 of 5
seeds each), and read the 400-step runs (2 of 5 trained at depth 12) as
suggesting that the rate's size, not the step count, breaks the deep post-LN
stack: a hypothesis. The same cells at peak rates 1e-3 and 3e-4 test it;
pre-LN at depth 12 at the same rates is the control that the lower rates
still learn the task within 2,000 steps. Everything else is the warmup
sweep's (exercise1_depth.depth_config). Resumable like every study.
"""

from absl import app

from experiments import common
from experiments import exercise1_depth
from experiments import skeleton
from selfattn.training.cli_checks import parse_flags

TITLE = 'Exercise 1: a lower learning rate for deep post-LN stacks'
RATES = (1e-3, 3e-4)
STEPS, WARMUP = 2000, 100
# (norm, depth): post-LN where it failed at 3e-3, first; then the control.
CELLS = (('post', 12), ('post', 24), ('pre', 12))


def settings(quick: bool):
  """(name, config) of every cell, named after its norm, depth, warmup,
  peak rate and steps."""
  if quick:
    cells, rates, steps, warmup = (('post', 4),), (1e-3,), 150, 50
  else:
    cells, rates, steps, warmup = CELLS, RATES, STEPS, WARMUP
  return [(f'norm={n},depth={d},warmup={warmup},lr={lr:g},steps={steps}',
           exercise1_depth.depth_config(n, d, warmup, steps, learning_rate=lr))
          for n, d in cells for lr in rates]


def exercise1_learning_rate(workdir: str, seeds: int, quick: bool) -> str:
  seeds = 1 if quick else seeds
  cells = settings(quick)
  rows, data = exercise1_depth.trainability(workdir, seeds, cells)
  header = ['norm', 'depth', 'peak learning rate', 'accuracy (len 16)',
            'per seed', 'diverged (NaN)', 'stuck near chance (< 0.6)']
  body = [[c.model.norm, c.model.num_layers, f'{c.train.learning_rate:g}']
          + rows[name] for name, c in cells]
  config = cells[0][1]
  text = common.write_results(
      workdir, TITLE,
      [('Setup',
        f'Task `precedes` (chance 0.5), width 32, lengths 4-16, '
        f'{config.train.num_steps} steps with {config.train.warmup_steps} '
        f'warmup steps (AdamW, cosine decay to the end), batch 32, as '
        f"exercise 1's warmup sweep, whose peak rate 3e-3 left post-LN at "
        f'chance at depths 12 and 24 (EXPERIMENTS.md section 1); accuracy '
        f'at length 16, mean ± std over {seeds} seed(s) (a diverged run '
        f'counts as 0.5).'),
       ('Accuracy by peak learning rate', common.markdown_table(header, body))],
      data={'trainability': data})
  print(text)
  return text


if __name__ == '__main__':
  app.run(skeleton.main_of(exercise1_learning_rate, TITLE),
          flags_parser=parse_flags)

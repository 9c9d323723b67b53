"""Exercise 3's report additions, on made-up summaries whose differences
are worked out by hand (the clipping distances paired by seed, and each
encoding's change over its last evaluation interval), and its --positions
filter."""

import pytest
from absl import flags
from absl.testing import flagsaver

from experiments import common
from experiments import exercise3_relative as exercise3
from experiments import skeleton
from experiments import study


def _summary(history: list[dict[int, float]]) -> dict:
  """A run summary whose evaluations (every 100 steps) give `history`'s
  token accuracies by length; the last is its final evaluation."""
  evals = [{str(n): {'token_accuracy': a} for n, a in h.items()}
           for h in history]
  return {'eval': evals[-1],
          'history': [{'step': 100 * (i + 1), 'eval': e}
                      for i, e in enumerate(evals)]}


def _runs(accuracies: dict[str, list[float]]):
  """(runs, summaries) of task 'reverse': one run per label and seed, its
  final accuracy at length 32 from `accuracies[label][seed]`."""
  runs, summaries = [], {}
  for label, per_seed in accuracies.items():
    for seed, acc in enumerate(per_seed):
      name = f'reverse/{label},seed={seed}'
      runs.append(study.Run(name, None, {'task': 'reverse',
                                         'position': label, 'seed': seed}))
      summaries[name] = _summary([{32: acc - 0.01}, {32: acc}])
  return runs, summaries


def test_each_clipping_distance_is_paired_with_the_next_larger_one():
  runs, summaries = _runs({'shaw k=2': [0.9, 0.8, 0.7],
                           'shaw k=4': [0.5, 0.5, 0.5],
                           'shaw k=16': [0.4, 0.45, 0.5],
                           'sinusoidal': [0.1, 0.1, 0.1]})
  lines = exercise3.clipping_lines(runs, summaries, 'reverse', [32])
  # k=8 and k=64 have no runs: k=4 pairs with k=16; sinusoidal is no
  # clipping distance.
  assert [line.split(':')[0] for line in lines] == [
      'shaw k=2 minus shaw k=4 at length 32',
      'shaw k=4 minus shaw k=16 at length 32']
  assert lines[0].startswith(
      'shaw k=2 minus shaw k=4 at length 32: +30.0 points over 3 seeds')
  assert lines[0].endswith('per seed +40.0, +30.0, +20.0)')
  assert lines[1].endswith('per seed +10.0, +5.0, +0.0)')


def test_a_diverged_run_pairs_with_nothing_and_one_seed_gives_no_lines():
  runs, summaries = _runs({'shaw k=2': [0.9, 0.8, 0.7],
                           'shaw k=4': [0.5, 0.5, 0.5]})
  summaries['reverse/shaw k=4,seed=2'] = {'diverged': True}
  lines = exercise3.clipping_lines(runs, summaries, 'reverse', [32])
  # Seeds 0 and 1 pair (+40, +30); the diverged seed 2 is left out, not NaN.
  assert lines == [line for line in lines if 'nan' not in line]
  assert lines[0].startswith('shaw k=2 minus shaw k=4 at length 32: +35.0 '
                             'points over 2 seeds')
  one_seed_runs, one_seed = _runs({'shaw k=2': [0.9], 'shaw k=4': [0.5]})
  assert exercise3.clipping_lines(one_seed_runs, one_seed, 'reverse',
                                  [32]) == []


def test_the_last_interval_table_gives_the_mean_change_and_the_seeds_up():
  rising = _summary([{16: 0.5, 32: 0.20}, {16: 0.6, 32: 0.26}])
  falling = _summary([{16: 0.5, 32: 0.30}, {16: 0.4, 32: 0.28}])
  once = _summary([{16: 0.5, 32: 0.3}])            # one evaluation: left out
  table = common.last_interval_table(
      {'rope': [rising, falling, once], 'lost': [{'diverged': True}]},
      [16, 32])
  rows = table.split('\n')
  assert rows[0] == '| encoding | len 16 | len 32 |'
  # len 16: (+0.1 - 0.1) / 2 = 0, one of two up; len 32: (+0.06 - 0.02) / 2.
  assert rows[2] == '| rope | +0.000 (1 of 2 up) | +0.020 (1 of 2 up) |'
  assert len(rows) == 3                            # no row for 'lost'
  # A length the last two evaluations lack (eval.lengths changed on a
  # resume) is left out of its cell, not a crash; a tiny fall is +0.000.
  table = common.last_interval_table(
      {'rope': [rising, _summary([{16: 0.5}, {16: 0.4996}])]}, [16, 32])
  assert table.split('\n')[2] == (
      '| rope | +0.050 (1 of 2 up) | +0.060 (1 of 1 up) |')
  table = common.last_interval_table(
      {'rope': [_summary([{16: 0.5}, {16: 0.4996}])]}, [16, 32])
  assert table.split('\n')[2] == '| rope | +0.000 (0 of 1 up) | - |'


def test_positions_selects_exercise_3s_variants_by_name(capsys):
  """--positions names the sweep's variants (exercise 3 refused it: "this
  study has no positions to filter"); a typo is refused with the names."""
  spec = exercise3.STUDY
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--positions=alibi,shaw k=2', '--tasks=shift'])
    chosen = skeleton.chosen_filters(spec)
    runs = study.select(spec.runs('cpu', 2, None), tasks=chosen['task'],
                        positions=chosen['position'])
  assert sorted(r.name for r in runs) == [
      'shift/alibi,seed=0', 'shift/alibi,seed=1',
      'shift/shaw_k=2,seed=0', 'shift/shaw_k=2,seed=1']
  with flagsaver.flagsaver():
    flags.FLAGS(['study', '--positions=shaw k=3'])
    with pytest.raises(SystemExit):
      skeleton.chosen_filters(spec)
  err = capsys.readouterr().err
  assert "--positions: shaw k=3 unknown (valid: shaw k=2, shaw k=4, " in err
  # The quick scale's own variant is a valid name too.
  assert 'shaw k=2 keys only' in err

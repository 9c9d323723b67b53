"""experiments/convergence.py's report helpers, on numbers whose paired
differences are worked out by hand."""

from experiments import convergence


def test_lines_at_budgets_pairs_each_budget_and_the_change_by_seed():
  # a - b per seed: short +1, +2, +3 (mean 2); long +3, +3, +6 (mean 4);
  # the change per seed +2, +1, +3 (mean 2).
  values = {
      'short': {'a': {0: 11, 1: 12, 2: 13}, 'b': {0: 10, 1: 10, 2: 10}},
      'long': {'a': {0: 13, 1: 13, 2: 16}, 'b': {0: 10, 1: 10, 2: 10}},
  }
  lines = convergence.lines_at_budgets(
      values, [(('a',), ('b',), 'a minus b')],
      lambda budget, name: f'{budget}: {name}',
      lambda name: f'{name}, long minus short', unit='u', digits=1)
  assert [line.split(':')[0] for line in lines] == [
      'short', 'long', 'a minus b, long minus short']
  assert lines[0].startswith('short: a minus b: +2.0 u over 3 seeds')
  assert lines[0].endswith('per seed +1.0, +2.0, +3.0)')
  assert lines[1].startswith('long: a minus b: +4.0 u over 3 seeds')
  assert lines[2].startswith('a minus b, long minus short: +2.0 u over 3 seeds')
  assert lines[2].endswith('per seed +2.0, +1.0, +3.0)')


def test_lines_at_budgets_pairs_only_seeds_present_at_both_budgets():
  values = {
      'short': {'a': {0: 1.0, 1: 2.0}, 'b': {0: 0.0, 1: 0.0}},
      'long': {'a': {0: 3.0, 1: 5.0, 2: 9.0}, 'b': {0: 0.0, 1: 0.0, 2: 0.0}},
  }
  change = convergence.lines_at_budgets(
      values, [(('a',), ('b',), 'd')], lambda budget, name: name,
      lambda name: 'change', unit='u', digits=1)[-1]
  # Seed 2 has no short run: the change pairs seeds 0 and 1 (+2, +3).
  assert change.startswith('change: +2.5 u over 2 seeds')

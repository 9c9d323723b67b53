"""The suite's tiers (support/tiers.py, conftest.py): the covering subset
keeps every value of every factor, and the default run deselects what the
extended tier holds."""

import subprocess
import sys

import pytest

from runs import ROOT
from tiers import also_extended
from tiers import covering_subset
from tiers import each_choice
from tiers import keep_in_commit_tier
from tiers import product


def test_the_covering_subset_keeps_every_value_and_alternates():
  cases = product([False, True], ['none', 'alibi', 't5', 'shaw'])
  chosen = [cases[i] for i in covering_subset(cases)]
  assert chosen == [(False, 'none'), (False, 't5'), (True, 'alibi'),
                    (True, 'shaw')]
  # Three factors, one of them a dict: every value of each is kept.
  grid = [(n, o, r) for n, o in (('shaw', {'k': 2}), ('t5', {}))
          for r in (1, 2, 3)]
  chosen = [grid[i] for i in covering_subset(grid)]
  for position in range(3):
    assert ({repr(case[position]) for case in chosen}
            == {repr(case[position]) for case in grid})
  assert len(chosen) == 3


def test_a_pairwise_subset_keeps_every_pair_of_values():
  cases = product([False, True], ['a', 'b'], ['x', 'y'])
  chosen = [cases[i] for i in covering_subset(cases, strength=2)]
  assert len(chosen) == 4                # of 8: the smallest pairwise array
  for i, j in ((0, 1), (0, 2), (1, 2)):
    assert ({(c[i], c[j]) for c in chosen} == {(c[i], c[j]) for c in cases})
  with pytest.raises(ValueError, match='strength'):
    covering_subset(cases, strength=3)
  # One factor has no pairs: every value is kept, as at strength 1.
  assert covering_subset([(v,) for v in 'abc'], strength=2) == [0, 1, 2]
  # A grid past the exhaustive search's size: the greedy cover.
  big = product(range(3), range(3), range(2))
  chosen = [big[i] for i in covering_subset(big, strength=2)]
  assert len(big) > 12
  for i, j in ((0, 1), (0, 2), (1, 2)):
    assert {(c[i], c[j]) for c in chosen} == {(c[i], c[j]) for c in big}


def test_each_choice_marks_only_the_cases_outside_the_cover():
  params = each_choice(product([False, True], ['a', 'b', 'c']),
                       always=[(True, 'c')])
  extended = [p.values for p in params if p.marks]
  kept = [p.values for p in params if not p.marks]
  assert (True, 'c') in kept
  for position in range(2):       # the kept cases cover every value
    assert {case[position] for case in kept} == {
        case[position] for case in kept + extended}
  assert sorted(kept + extended) == sorted(product([False, True],
                                                   ['a', 'b', 'c']))
  assert all(mark.name == 'extended' for p in params for mark in p.marks)
  with pytest.raises(ValueError, match='not in cases'):
    each_choice(['a', 'b'], always=['z'])


def test_hand_made_choices_mark_every_other_case_and_refuse_unknown_ones():
  cases = product([False, True], ['a', 'b'])
  params = keep_in_commit_tier(cases, (True, 'a'))
  assert [p.values for p in params] == cases          # same order, same ids
  assert [p.values for p in params if not p.marks] == [(True, 'a')]
  with pytest.raises(ValueError, match='not in cases'):
    keep_in_commit_tier(cases, (True, 'z'))
  cover = each_choice(cases)
  moved = next(p.values for p in cover if not p.marks)
  after = also_extended(cover, moved)
  assert [p.values for p in after] == [p.values for p in cover]
  assert ({p.values for p in after if not p.marks}
          == {p.values for p in cover if not p.marks} - {moved})
  with pytest.raises(ValueError, match='not in params'):
    also_extended(cover, (False, 'z'))


def test_the_default_run_deselects_the_extended_tier():
  """Collected in a child pytest: the benchmark's smoke run is deselected by
  default and collected with --extended; a test named by its node id is
  kept without --extended, beside a file whose other extended tests stay
  deselected."""
  def collected(*args):
    out = subprocess.run(
        [sys.executable, '-m', 'pytest', '-o', 'addopts=', '-p',
         'no:cacheprovider', '--co', '-q', *args],
        cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
    return {line.split('::')[1] for line in out.splitlines() if '::' in line}
  bench = 'tests/experiments/test_bench.py'
  smoke = 'test_smoke_benchmark_writes_every_key'
  imports = 'test_the_benchmark_imports_and_names_its_levels'
  assert collected('--extended', bench) == {smoke, imports}
  assert collected(
      bench, 'tests/experiments/test_experiments.py::test_exercise2_quick'
  ) == {imports, 'test_exercise2_quick'}

"""The suite's two tiers: what CI runs on every commit, and the rest.

`python -m pytest` (CI, the README's command) runs the commit tier; `python
-m pytest --extended` runs every test (conftest.py). A test or a case in the
extended tier carries the `extended` mark. What goes there, and why, is in
tests/README.md: the commit tier keeps one check of each claim, and the
extended tier what repeats one (the experiment drivers' trained runs, the
benchmark's smoke run, learning outcomes, the same claim through another
variant, and the cases of a parametrized grid beyond a covering subset,
`each_choice`); what of them only the extended tier checks is listed there.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest

EXTENDED = pytest.mark.extended
# Pairwise covers of grids of at most this many cases are the smallest, by
# search (at most 2^12 subsets); larger grids, and single values, greedy.
EXHAUSTIVE_UP_TO = 12


def covering_subset(cases: Sequence[tuple[Any, ...]], *,
                    strength: int = 1) -> list[int]:
  """Indices of cases, in their order, such that every value of every
  factor (tuple position) occurs in at least one chosen case (strength 1),
  or every pair of values of two factors that occurs in `cases` does
  (strength 2: a pairwise covering array).

  Pairs over up to EXHAUSTIVE_UP_TO cases: the smallest such subset (the
  first found). Otherwise greedy: the next case is the one with the most
  not-yet-covered items; among those, the one whose values have been chosen
  least often (so a grid of encodings x causal alternates causal instead of
  pairing every encoding with the first), then the earliest. Deterministic:
  the same cases give the same subset (xdist's workers must collect the
  same tests)."""
  # A value may be unhashable (a dict of options): its repr stands for it.
  cases = [tuple(_hashable(value) for value in case) for case in cases]
  if not cases:
    return []
  width = len(cases[0])
  if any(len(case) != width for case in cases):
    raise ValueError('every case needs the same number of factors')
  if strength not in (1, 2):
    raise ValueError(f'strength must be 1 or 2, not {strength}')
  if width < 2:
    strength = 1        # one factor has no pairs: every value is the cover

  def items(case: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    values = list(enumerate(case))
    if strength == 1:
      return values
    return [a + b for n, a in enumerate(values) for b in values[n + 1:]]

  uncovered = {item for case in cases for item in items(case)}
  if strength == 2 and len(cases) <= EXHAUSTIVE_UP_TO:
    # Pairs on a small grid: the smallest cover, the first in the order of
    # itertools.combinations (greedy can miss it: on 2 x 2 x 2 it picks
    # six cases where four cover every pair).
    for size in range(1, len(cases) + 1):
      for subset in itertools.combinations(range(len(cases)), size):
        if uncovered <= {item for i in subset for item in items(cases[i])}:
          return list(subset)
  used: Counter[tuple[int, Any]] = Counter()
  chosen: list[int] = []
  while uncovered:
    def rank(index: int) -> tuple[int, int, int]:
      new = sum(item in uncovered for item in items(cases[index]))
      return (-new, sum(used[value] for value in enumerate(cases[index])),
              index)
    best = min((i for i in range(len(cases)) if i not in chosen), key=rank)
    chosen.append(best)
    uncovered.difference_update(items(cases[best]))
    used.update(enumerate(cases[best]))
  return sorted(chosen)


def _hashable(value: Any) -> Any:
  try:
    hash(value)
  except TypeError:
    return repr(value)
  return value


def each_choice(cases: Sequence[Any], *, always: Sequence[Any] = (),
                strength: int = 1) -> list:
  """`cases` for pytest.mark.parametrize, the ones outside a covering subset
  (`covering_subset`, of `strength`) marked for the extended tier. A case
  is a tuple of factor values, or a single value (one factor); `always`
  names cases kept in the commit tier whatever the cover (a default
  setting, a known-hard one). The test ids are those pytest gives the
  plain cases."""
  as_tuples = [case if isinstance(case, tuple) else (case,) for case in cases]
  unknown = [case for case in always if case not in cases]
  if unknown:
    raise ValueError(f'always names cases that are not in cases: {unknown}')
  keep = set(covering_subset(as_tuples, strength=strength))
  keep |= {i for i, case in enumerate(cases) if case in always}
  return [pytest.param(*values, marks=() if i in keep else EXTENDED)
          for i, values in enumerate(as_tuples)]


def product(*factors: Sequence[Any]) -> list[tuple[Any, ...]]:
  """Every combination of the factors' values, first factor slowest (as
  stacked parametrize decorators order them, reversed: the ids read in
  argument order)."""
  combos: list[tuple[Any, ...]] = [()]
  for values in factors:
    combos = [combo + (value,) for combo in combos for value in values]
  return combos


def keep_in_commit_tier(cases: Sequence[tuple[Any, ...]],
                        *kept: tuple[Any, ...]) -> list:
  """`cases` for pytest.mark.parametrize: those in `kept` in the commit
  tier, every other one marked extended (a hand-made choice, for grids
  where each_choice's cover is not the right one; say at the mark which
  commit-tier test covers what is extended)."""
  unknown = [case for case in kept if case not in cases]
  if unknown:
    raise ValueError(f'kept names cases that are not in cases: {unknown}')
  return [pytest.param(*case, marks=() if case in kept else EXTENDED)
          for case in cases]


def also_extended(params: Sequence[Any], *moved: tuple[Any, ...]) -> list:
  """each_choice's params with the cases in `moved` marked extended too
  (their path checked by another commit-tier test); the ids stay."""
  values = [param.values for param in params]
  unknown = [case for case in moved if case not in values]
  if unknown:
    raise ValueError(f'moved names cases that are not in params: {unknown}')
  return [pytest.param(*param.values, marks=EXTENDED)
          if param.values in moved else param for param in params]

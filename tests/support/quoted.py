"""How the documents quote a mean with its interval across seeds (the
numbers tests of EXPERIMENTS.md's sections find these strings there)."""

import statistics

from experiments import common


def seed_interval_text(values: list[float], digits: int = 1) -> str:
  """'+m [lo, hi]' with signs: the mean of `values` (one per seed) and its
  95% t-interval across them (experiments.common.seed_interval)."""
  lo, hi = common.seed_interval(values)
  return (f'{statistics.mean(values):+.{digits}f} '
          f'[{lo:+.{digits}f}, {hi:+.{digits}f}]')

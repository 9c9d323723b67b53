"""EXPERIMENTS.md section 3's "Trained 5x longer" numbers against the
committed reports: each quoted mean ± std and paired interval is one that
experiments/results/exercise3_long (or, for the 1,000-step ones it cites,
exercise3) gives. Reads committed files only; trains nothing."""

import os
import re

from runs import ROOT


def _read(path: str) -> str:
  with open(os.path.join(ROOT, path), encoding='utf-8') as f:
    return f.read()


def _trained_longer() -> str:
  text = _read('EXPERIMENTS.md')
  start = text.index('**Trained 5x longer**')
  # Line breaks of the prose fall inside some numbers' spans.
  return re.sub(r'\s+', ' ', text[start:text.index('\n## ', start)])


def test_every_quoted_number_is_one_the_reports_give():
  reports = (_read('experiments/results/exercise3_long/results.md')
             + _read('experiments/results/exercise3/results.md'))
  text = _trained_longer()
  cells = re.findall(r'\d\.\d{3} ± \d\.\d{3}', text)
  intervals = [f'{m} [{lo}, {hi}]' for m, lo, hi in re.findall(
      r'([+-]\d+\.\d)(?: points)? \[([+-]\d+\.\d), ([+-]\d+\.\d)\]', text)]
  assert len(cells) >= 15 and len(intervals) >= 3
  # The reports print intervals as '+15.6 points over 3 seeds (95%
  # t-interval across seeds [+1.5, +29.6]'.
  found = {f'{m} [{lo}, {hi}]' for m, lo, hi in re.findall(
      r'([+-]\d+\.\d) points over \d+ seeds \(95% t-interval across seeds '
      r'\[([+-]\d+\.\d), ([+-]\d+\.\d)\]', reports)}
  assert [c for c in cells if c not in reports] == []
  assert [i for i in intervals if i not in found] == []

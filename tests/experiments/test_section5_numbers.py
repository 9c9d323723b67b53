"""EXPERIMENTS.md section 5's "Trained longer" numbers against the committed
length-generalization convergence results: a quoted cell or paired interval
that differs from what the runs give fails here. Reads committed files
only; trains nothing."""

import json
import os
import re
import statistics

import pytest

from runs import ROOT

RESULTS = os.path.join(ROOT, 'experiments/results/lengthgen_convergence')


def _trained_longer() -> str:
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = f.read()
  start = text.index('**Trained longer:')
  return text[start:text.index('\n## ', start)]


@pytest.fixture(scope='module')
def runs():
  with open(os.path.join(RESULTS, 'results.json')) as f:
    return json.load(f)


def _mean_std(values):
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


def test_the_cell_table_matches_the_runs(runs):
  text = _trained_longer()
  lines = text[text.index('| cell |'):].split('\n')
  rows = [[c.strip() for c in line.strip('|').split('|')]
          for line in lines[2:] if line.startswith('|')]
  assert len(rows) == 8
  for row in rows:
    task, position, *rand = row[0].replace('`', '').split()
    cell = sorted((r for r in runs.values()
                   if (r['task'], r['position'], r['random'])
                   == (task, position, bool(rand))),
                  key=lambda r: r['seed'])
    assert [r['seed'] for r in cell] == [0, 1, 2], row[0]
    assert row[1:] == [
        _mean_std([r['short']['trained'] for r in cell]),
        _mean_std([r['short']['score'] for r in cell]),
        ', '.join(str(r['stopped_at']) for r in cell),
        ', '.join(str(r['chosen']['step']) for r in cell),
        _mean_std([r['chosen']['trained'] for r in cell]),
        _mean_std([r['chosen']['score'] for r in cell]),
    ], row[0]


def test_every_quoted_interval_is_one_the_report_gives():
  with open(os.path.join(RESULTS, 'results.md'), encoding='utf-8') as f:
    report = f.read()
  interval = r'[+-]\d+\.\d\d \[[+-]\d+\.\d\d, [+-]\d+\.\d\d\]'
  # Line breaks of the prose fall inside some intervals.
  quoted = re.findall(interval, re.sub(r'\s+', ' ', _trained_longer()))
  assert len(quoted) >= 30
  missing = [q for q in quoted if q not in report]
  assert not missing

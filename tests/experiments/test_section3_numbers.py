"""EXPERIMENTS.md section 3's "Trained 5x longer" numbers, recomputed from
the committed runs' summaries (experiments/results/exercise3_long and, for
the 1,000-step side of a comparison, exercise3): each quoted value must be
the one its (task, variant, length, budget) gives. Reads committed files
only; trains nothing."""

import json
import os
import re
import statistics

import pytest

from quoted import seed_interval_text
from runs import ROOT

LONG, SHORT = 'exercise3_long', 'exercise3'
SEEDS = (0, 1, 2)


def _trained_longer() -> str:
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = f.read()
  start = text.index('**Trained 5x longer**')
  # Line breaks of the prose fall inside some numbers' spans.
  return re.sub(r'\s+', ' ', text[start:text.index('\n## ', start)])


def _accuracy(study, task, variant, seed, length):
  path = os.path.join(ROOT, 'experiments/results', study, task,
                      f'{variant.replace(" ", "_")},seed={seed}',
                      'summary.json')
  with open(path) as f:
    return json.load(f)['eval'][str(length)]['token_accuracy']


def _cell(task, variant, length, digits=3):
  values = [_accuracy(LONG, task, variant, s, length) for s in SEEDS]
  return (f'{statistics.mean(values):.{digits}f} ± '
          f'{statistics.stdev(values):.{digits}f}')


@pytest.mark.parametrize('task, variant, length, digits', [
    ('reverse', 'shaw k=2', 32, 3), ('reverse', 'shaw k=4', 32, 3),
    ('reverse', 'shaw k=8', 32, 3), ('reverse', 'shaw k=16', 32, 3),
    ('reverse', 'shaw k=64', 32, 3), ('reverse', 'shaw k=2', 64, 3),
    ('reverse', 'shaw k=4', 64, 3), ('reverse', 'shaw k=16 keys only', 16, 2),
    ('reverse', 'huang', 16, 2), ('reverse', 't5', 16, 2),
    ('reverse', 'alibi', 16, 2), ('reverse', 'rope', 16, 3),
    ('shift', 'alibi', 16, 3), ('window_sum', 'alibi', 16, 3),
    ('shift', 'alibi', 64, 3), ('window_sum', 'alibi', 64, 3),
    ('shift', 'sinusoidal', 64, 3), ('shift', 'learned', 64, 3),
    ('window_sum', 'sinusoidal', 64, 3), ('window_sum', 'learned', 64, 3)])
def test_each_quoted_cell_is_its_runs_mean_and_std(task, variant, length,
                                                   digits):
  assert _cell(task, variant, length, digits) in _trained_longer()


@pytest.mark.parametrize('a, b, length', [
    ('shaw k=2', 'shaw k=4', 32), ('shaw k=4', 'shaw k=8', 32),
    ('shaw k=2', 'shaw k=4', 64), ('shaw k=4', 'shaw k=8', 64)])
def test_each_quoted_clipping_pair_and_its_growth(a, b, length):
  """a minus b at 5,000 steps, paired by seed, and (at 2x) its change
  from the 1,000-step study's same seeds."""
  text = _trained_longer()
  diff = lambda study, s: 100 * (_accuracy(study, 'reverse', a, s, length)
                                 - _accuracy(study, 'reverse', b, s, length))
  long = [diff(LONG, s) for s in SEEDS]
  assert (f'{a.split()[1]} minus {b.split()[1]}'.replace('k=', 'k = ')
          in text)
  assert seed_interval_text(long) in text.replace(' points [', ' [')
  if length == 32:
    growth = [diff(LONG, s) - diff(SHORT, s) for s in SEEDS]
    assert seed_interval_text(growth) in text

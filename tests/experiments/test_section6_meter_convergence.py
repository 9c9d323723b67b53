"""EXPERIMENTS.md section 6's "With the meter, to the early stop": its
table and the per-seed numbers around it, recomputed from the committed
runs of experiments/results/music_meter_convergence, the 1,000-step music
study and the first-pass convergence study. Reads committed files only;
trains nothing."""

import json
import math
import os
import re
import statistics

import pytest

from experiments import common

from runs import ROOT

RESULTS = os.path.join(ROOT, 'experiments/results')
MARKER = '**With the meter, to the early stop**'


def _run(study, label, seed, name='music.json'):
  path = os.path.join(RESULTS, study, f'position={label},seed={seed}', name)
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


@pytest.fixture(scope='module')
def paragraph() -> str:
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = f.read()
  start = text.index(MARKER)
  return text[start:text.index('**Against the strongest floor**', start)]


def _rows(paragraph):
  lines = [l for l in paragraph.split('\n') if l.startswith('| ')]
  return [[c.strip() for c in l.strip('|').split('|')] for l in lines[1:]]


def test_the_table_is_the_runs(paragraph):
  """Each seed row: both runs' stop and best steps, test NLL, and shaw minus
  sinusoidal early-stopped and at 1,000 steps; every seed with both runs
  finished has its row."""
  rows = _rows(paragraph)
  paired = [s for s in range(3)
            if _run('music_meter_convergence', 'shaw+bar+meter', s)
            and _run('music_meter_convergence', 'sinusoidal+bar+meter', s)]
  assert [int(r[0]) for r in rows] == paired == [0, 1, 2]
  for row in rows:
    seed = int(row[0])
    cells = []
    nll = {}
    for label in ('shaw+bar+meter', 'sinusoidal+bar+meter'):
      scores = _run('music_meter_convergence', label, seed)
      stopped = _run('music_meter_convergence', label, seed,
                     'summary.json')['step']
      cells += [f'{stopped:,} / {scores["selected_step"]:,}',
                f'{scores["test_nll"]:.4f}']
      nll[label] = (scores['test_nll'],
                    _run('music', label, seed)['test_nll'])
    shaw, sinusoidal = nll['shaw+bar+meter'], nll['sinusoidal+bar+meter']
    cells += [f'{shaw[0] - sinusoidal[0]:+.4f}',
              f'{shaw[1] - sinusoidal[1]:+.4f}']
    assert row[1:] == cells, seed


def _interval(values, digits):
  lo, hi = common.seed_interval(values)
  return f'{statistics.mean(values):+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]'


def _nll(study, label, seed, split='test'):
  return _run(study, label, seed)[f'{split}_nll']


def test_the_intervals_across_the_three_seeds(paragraph):
  """Shaw minus sinusoidal with the meter, early-stopped and at 1,000
  steps, and the change between them; each run's gain over the same seed's
  early-stopped first pass; the best steps quoted per seed."""
  text = re.sub(r'\s+', ' ', paragraph)
  seeds = range(3)
  def difference(study, split='test'):
    return [_nll(study, 'shaw+bar+meter', s, split)
            - _nll(study, 'sinusoidal+bar+meter', s, split) for s in seeds]
  converged, early = difference('music_meter_convergence'), difference('music')
  change = [c - e for c, e in zip(converged, early)]
  valid = difference('music_meter_convergence', 'valid')
  assert (f'shaw minus sinusoidal with the meter is {_interval(converged, 4)} '
          f'on test (valid {_interval(valid, 4)})') in text
  assert f'at 1,000 steps it was {_interval(early, 4)}' in text
  assert f'the lead shrank by {_interval(change, 4)}' in text
  lo, hi = common.seed_interval(converged)
  assert f'within {math.ceil(1000 * max(-lo, hi)) / 1000:.3f} nats of zero' in text
  gains = {}
  for label in ('shaw', 'sinusoidal'):
    gains[label] = [_nll('music_meter_convergence', f'{label}+bar+meter', s)
                    - _nll('music_convergence', label, s) for s in seeds]
    per_seed = ', '.join(f'{-g:.3f}' for g in gains[label][:2])
    assert (f'{label} by {per_seed} and {-gains[label][2]:.3f}'
            in text), label
    assert f'({_interval(gains[label], 3)}' in text, label
    firsts = ', '.join(f'{_nll("music_convergence", label, s):.3f}'
                       for s in seeds)
    assert f'{firsts} ({label})' in text, label
  cross = [a - b for a, b in zip(gains['shaw'], gains['sinusoidal'])]
  assert (f'is {_interval(cross, 3)} on test, per seed '
          + ', '.join(f'{c:+.3f}' for c in cross)) in text
  assert sum(c > 0 for c in cross) == 2 and 'larger on two seeds' in text
  runs = [_nll('music_meter_convergence', f'{label}+bar+meter', s)
          for label in ('shaw', 'sinusoidal') for s in seeds]
  assert f'all six runs at {min(runs):.3f}-{max(runs):.3f}' in text
  best = {label: [_run('music_meter_convergence', f'{label}+bar+meter', s)
                  ['selected_step'] for s in seeds]
          for label in ('shaw', 'sinusoidal')}
  assert set(best['sinusoidal']) == {4500} and 'at 4,500 steps on every seed' in text
  first = {label: [_run('music_convergence', label, s)['selected_step']
                   for s in seeds] for label in ('shaw', 'sinusoidal')}
  def steps(values):
    return f'{values[0]:,}, {values[1]:,} and {values[2]:,}'
  assert (f'against {first["sinusoidal"][0]:,}, {first["sinusoidal"][1]:,} '
          f'(the cap) and {first["sinusoidal"][2]:,} for the same seeds') in text
  assert first['sinusoidal'][1] == 16000      # the cap, as quoted
  assert f"shaw's at {steps(best['shaw'])} against {steps(first['shaw'])}" in text
  stops = [_run('music_meter_convergence', f'{label}+bar+meter', s,
                'summary.json')['step']
           for label in ('shaw', 'sinusoidal') for s in seeds]
  assert (f'Every one of the six stopped on its own, at {min(stops):,}-'
          f'{max(stops):,} steps') in text
  # Stopped by the rule, not at the cap.
  assert all(_run('music_meter_convergence', f'{label}+bar+meter', s,
                  'summary.json').get('stopped_early')
             for label in ('shaw', 'sinusoidal') for s in seeds)


def test_the_status_row_says_what_the_paragraph_says():
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    row = next(l for l in f if l.startswith('| 6. '))
  seeds = range(3)
  converged = [_nll('music_meter_convergence', 'shaw+bar+meter', s)
               - _nll('music_meter_convergence', 'sinusoidal+bar+meter', s)
               for s in seeds]
  early = [_nll('music', 'shaw+bar+meter', s)
           - _nll('music', 'sinusoidal+bar+meter', s) for s in seeds]
  lo, hi = common.seed_interval(converged)
  assert (f'shaw minus sinusoidal {statistics.mean(converged):+.3f} '
          f'[{lo:+.3f}, {hi:+.3f}] nats on test, against '
          f'{statistics.mean(early):+.3f} at 1,000 steps') in row
  first = [_run('music_convergence', 'sinusoidal', s, 'summary.json')['step']
           for s in seeds]
  assert f'instead of {min(first):,}-{max(first):,} without the meter' in row
  runs = [_nll('music_meter_convergence', f'{label}+bar+meter', s)
          for label in ('shaw', 'sinusoidal') for s in seeds]
  assert f'all six runs at {min(runs):.3f}-{max(runs):.3f}' in row

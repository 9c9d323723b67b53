"""EXPERIMENTS.md section 6's "With the meter, to the early stop": its
table and the per-seed numbers around it, recomputed from the committed
runs of experiments/results/music_meter_convergence, the 1,000-step music
study and the first-pass convergence study. Reads committed files only;
trains nothing."""

import json
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
  assert [int(r[0]) for r in rows] == paired and len(paired) >= 2
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


def test_the_per_seed_readings(paragraph):
  text = re.sub(r'\s+', ' ', paragraph)
  def nll(study, label, seed, split='test'):
    return _run(study, label, seed)[f'{split}_nll']
  valid = [nll('music_meter_convergence', 'shaw+bar+meter', s, 'valid')
           - nll('music_meter_convergence', 'sinusoidal+bar+meter', s, 'valid')
           for s in (0, 1)]
  assert f'(valid: {valid[0]:+.4f} and {valid[1]:+.4f})' in text
  # Each early-stopped meter run's gain over the same seed's converged
  # first pass, on test.
  for label in ('shaw', 'sinusoidal'):
    gains = [nll('music_convergence', label, s)
             - nll('music_meter_convergence', f'{label}+bar+meter', s)
             for s in (0, 1)]
    assert f'{label} by {gains[0]:.3f} and {gains[1]:.3f}' in text, label
  # Shaw's third seed and its interval across the three.
  gains = [nll('music_meter_convergence', 'shaw+bar+meter', s)
           - nll('music_convergence', 'shaw', s) for s in range(3)]
  assert f'and {-gains[2]:.3f} at seed 2' in text
  lo, hi = common.seed_interval(gains)
  assert (f'{statistics.mean(gains):.3f} [{lo:.3f}, {hi:.3f}], 95% '
          f't-interval across the 3 seeds)') in text

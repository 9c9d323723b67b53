"""EXPERIMENTS.md section 4's numbers, recomputed from the committed runs'
summaries: the 2,000-step ranking table (experiments/results/compare) and
the 10,000-step paragraph (experiments/results/compare_long) and T5's and
ALiBi's at 30,000 steps (experiments/results/compare_30k), with the changes
between budgets paired by seed. Reads committed files
only; trains nothing."""

import json
import os
import re
import statistics

import pytest

from quoted import seed_interval_text
from runs import ROOT

LENGTHS = (8, 16, 32, 64)


def _section4() -> str:
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = f.read()
  start = text.index('## 4. Every encoding compared')
  return text[start:text.index('\n## ', start + 1)]


def _accuracy(study: str, encoding: str, seed: int, length: int) -> float:
  path = os.path.join(ROOT, 'experiments/results', study,
                      f'position={encoding},seed={seed}', 'summary.json')
  with open(path) as f:
    return json.load(f)['eval'][str(length)]['token_accuracy']


def _cell(study, encoding, length, seeds):
  values = [_accuracy(study, encoding, s, length) for s in range(seeds)]
  return f'{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f}'


def _table_rows(marker: str) -> dict[str, list[str]]:
  """encoding -> its cells, from the first table after `marker`."""
  text = _section4()
  lines = text[text.index(marker):].split('\n')
  first = next(i for i, line in enumerate(lines) if line.startswith('|'))
  rows = {}
  for line in lines[first + 2:]:
    if not line.startswith('|'):
      break
    cells = [c.strip() for c in line.strip('|').split('|')]
    rows[cells[1]] = cells[2:]
    # Ranked by the mean at length 16 (the longest trained), rank 1 first.
    assert cells[0] == str(len(rows)), line
  at_16 = [float(cells[1].split(' ±')[0]) for cells in rows.values()]
  assert at_16 == sorted(at_16, reverse=True)
  return rows


def test_the_2000_step_table_is_the_runs_mean_and_std():
  rows = _table_rows('trained on lengths 1-16; token accuracy')
  assert len(rows) == 10
  for encoding, cells in rows.items():
    assert cells == [_cell('compare', encoding, n, 5) for n in LENGTHS], (
        encoding)


def test_the_10000_step_table_is_the_runs_mean_and_std():
  rows = _table_rows('**Every encoding at 10,000 steps**')
  assert len(rows) == 10
  for encoding, cells in rows.items():
    assert cells[:4] == [_cell('compare_long', encoding, n, 5)
                         for n in LENGTHS], encoding


@pytest.mark.parametrize('encoding, length', [
    ('huang', 16), ('xl', 16), ('pope', 16), ('t5', 16), ('alibi', 16),
    ('rope', 32), ('none', 16)])
def test_each_quoted_change_between_budgets_is_paired_by_seed(encoding,
                                                              length):
  diffs = [100 * (_accuracy('compare_long', encoding, s, length)
                  - _accuracy('compare', encoding, s, length))
           for s in range(5)]
  quoted = re.sub(r'\s+', ' ', _section4())
  assert f'{encoding} {seed_interval_text(diffs)}' in quoted


@pytest.mark.parametrize('a, b, quoted', [
    ('rope', 'none', 'RoPE minus `none`'), ('pope', 'none', '`none` ('),
    ('rope', 'pope', 'RoPE minus PoPE')])
def test_each_quoted_pair_at_2x_after_10000_steps(a, b, quoted):
  diffs = [100 * (_accuracy('compare_long', a, s, 32)
                  - _accuracy('compare_long', b, s, 32)) for s in range(5)]
  text = re.sub(r'\s+', ' ', _section4())
  assert f'{quoted} {seed_interval_text(diffs)}' in text or (
      f'{quoted}{seed_interval_text(diffs)}' in text)


def test_pope_at_2000_steps_against_none_and_t5():
  text = re.sub(r'\s+', ' ', _section4())
  for other, quoted in (('none', 'above `none` by'), ('t5', 'PoPE minus T5')):
    diffs = [100 * (_accuracy('compare', 'pope', s, 16)
                     - _accuracy('compare', other, s, 16)) for s in range(5)]
    interval = seed_interval_text(diffs)
    if other == 'none':
      interval = interval.replace(' [', ' points [', 1)
    assert f'{quoted} {interval}' in text


def test_the_30000_step_table_is_the_runs_mean_and_std():
  rows = _table_rows('**T5 and ALiBi at 30,000 steps**')
  assert list(rows) == ['t5', 'alibi']
  for encoding, cells in rows.items():
    assert cells == [_cell('compare_30k', encoding, n, 5) for n in LENGTHS], (
        encoding)


@pytest.mark.parametrize('encoding, length', [
    ('t5', 16), ('t5', 32), ('alibi', 16)])
def test_each_quoted_change_from_10000_to_30000_steps(encoding, length):
  diffs = [100 * (_accuracy('compare_30k', encoding, s, length)
                  - _accuracy('compare_long', encoding, s, length))
           for s in range(5)]
  quoted = re.sub(r'\s+', ' ', _section4())
  assert f'{encoding} {seed_interval_text(diffs)} ' in quoted

"""EXPERIMENTS.md section 8's tables against the committed results.json: a
quoted number that differs from what the runs' own scores give fails here
(issue 49). Reads committed files only; trains and decodes nothing."""

import json
import os
import re
import statistics

import pytest

from experiments import common
from quoted import seed_interval_text
from runs import ROOT

RESULTS = os.path.join(ROOT, 'experiments/results/translation/results.json')
SPLITS = ('val', 'test_2016_flickr', 'test_2017_flickr', 'test_2017_mscoco')


def _section8() -> str:
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = f.read()
  start = text.index('## 8. Exercise 3 for translation')
  end = text.find('\n## ', start + 1)
  return text[start:end if end > 0 else None]


def _table_after(text: str, marker: str) -> list[list[str]]:
  """The body rows of the first markdown table after `marker` (its words
  matched across line breaks: the prose is reflowed), as cells."""
  at = re.search(r'\s+'.join(map(re.escape, marker.split())), text).start()
  lines = text[at:].split('\n')
  first = next(i for i, line in enumerate(lines) if line.startswith('|'))
  rows = []
  for line in lines[first + 2:]:
    if not line.startswith('|'):
      break
    rows.append([c.strip().strip('*') for c in line.strip('|').split('|')])
  return rows


@pytest.fixture(scope='module')
def by_label():
  with open(RESULTS) as f:
    runs = json.load(f)['runs']
  out = {}
  for r in runs.values():
    out.setdefault(r['label'], {})[r['seed']] = r
  return out


def _mean_std(values):
  return f'{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}'


def test_the_five_seed_table_matches_the_runs(by_label):
  rows = _table_after(_section8(), '**Results at 5 seeds**')
  checked = 0
  for row in rows:
    label = row[0]
    if label not in by_label:
      continue
    runs = list(by_label[label].values())
    bleu = lambda split: [r['splits'][split]['bleu'] for r in runs]
    assert row[1:5] == [_mean_std(bleu(s)) for s in SPLITS], label
    assert row[5] == _mean_std(
        [r['splits']['test_2016_flickr']['chrf'] for r in runs]), label
    short, long = (
        _mean_std([r['splits']['test_2016_flickr'][part]['bleu']
                   for r in runs]) for part in ('short_sources',
                                                'long_sources'))
    assert row[6].replace('*', '') == f'{short} / {long}', label
    assert row[7] == str(len(runs))
    checked += 1
  assert checked == 4


def _paired(by_label, a, b, split):
  seeds = sorted(set.intersection(*(set(by_label[x]) for x in a + b)))
  diffs = [statistics.mean(by_label[x][s]['splits'][split]['bleu'] for x in a)
           - statistics.mean(by_label[x][s]['splits'][split]['bleu']
                             for x in b) for s in seeds]
  lo, hi = common.seed_interval(diffs)
  return f'{statistics.mean(diffs):+.2f} [{lo:+.2f}, {hi:+.2f}]'


def test_the_paired_table_matches_the_runs(by_label):
  rows = _table_after(_section8(), 'Paired by seed (BLEU')
  groups = {
      'shaw minus sinusoidal': (('shaw',), ('sinusoidal',)),
      'relative (shaw, rope) minus absolute': (('shaw', 'rope'),
                                               ('sinusoidal', 'learned')),
      'rope minus shaw': (('rope',), ('shaw',)),
      'learned minus sinusoidal': (('learned',), ('sinusoidal',)),
  }
  checked = 0
  for row in rows:
    name = next(g for g in groups if row[0].startswith(g))
    a, b = groups[name]
    for cell, split in zip(row[1:], SPLITS[1:]):
      if cell:
        assert re.sub(r'\*', '', cell) == _paired(by_label, a, b, split), (
            name, split)
        checked += 1
  assert checked >= 10


def test_the_floors_and_the_pilot_match_the_committed_scores(by_label):
  with open(RESULTS) as f:
    floors = json.load(f)['floors']
  rows = _table_after(_section8(), '**Floors first**')
  names = {'copy the German source': 'copy', 'word-by-word': 'word',
           'retrieval': 'retrieval'}
  for row in rows:
    key = next(v for k, v in names.items() if row[0].startswith(k))
    assert row[1:5] == [f'{floors[key][s]["bleu"]:.2f}' for s in SPLITS]
    assert row[5] == f'{floors[key]["test_2016_flickr"]["chrf"]:.2f}'
  pilot = by_label['sinusoidal'][0]['splits']
  text = _section8()
  assert (f'beam search {pilot["val"]["bleu"]:.2f} val, '
          f'**{pilot["test_2016_flickr"]["bleu"]:.2f} test_2016_flickr**') in text


CONVERGENCE = os.path.join(
    ROOT, 'experiments/results/translation_convergence/results.json')


def test_the_convergence_pairs_match_the_runs(by_label):
  """Each pair table of the convergence check (seed 0's, then seed 1's,
  ...): sinusoidal's converged BLEU (its 3,000-step run's), shaw minus
  sinusoidal converged and at 3,000 steps, per split."""
  with open(CONVERGENCE) as f:
    converged = {(r['label'], r['seed']): r['bleu']
                 for r in json.load(f).values()}
  header = '| split | sinusoidal, converged (3,000 steps) |'
  text = _section8()
  tables = [m.start() for m in re.finditer(re.escape(header), text)]
  assert len(tables) >= 2
  for seed, at in enumerate(tables):
    rows = _table_after(text[at:], header)
    short = lambda label, split: by_label[label][seed]['splits'][split]['bleu']
    long = lambda label, split: converged[label, seed][split]
    assert [row[0] for row in rows] == list(SPLITS)
    for split, row in zip(SPLITS, rows):
      assert row[1:] == [
          f'{long("sinusoidal", split):.2f} '
          f'({short("sinusoidal", split):.2f})',
          f'{long("shaw", split) - long("sinusoidal", split):+.2f}',
          f'{short("shaw", split) - short("sinusoidal", split):+.2f}'], (
              seed, split)


def test_the_convergence_summary_matches_the_runs(by_label):
  """The three pairs' table: per split, shaw minus sinusoidal at 3,000
  steps, at the converged checkpoints, and the change, each the mean over
  the seeds both budgets have [its 95% t-interval across them]."""
  with open(CONVERGENCE) as f:
    converged = {(r['label'], r['seed']): r['bleu']
                 for r in json.load(f).values()}
  seeds = sorted(seed for label, seed in converged if label == 'sinusoidal'
                 and ('shaw', seed) in converged)
  assert len(seeds) >= 3
  rows = _table_after(_section8(), '| split | at 3,000 steps | converged |')
  assert [row[0] for row in rows] == list(SPLITS)
  for split, row in zip(SPLITS, rows):
    short = [by_label['shaw'][s]['splits'][split]['bleu']
             - by_label['sinusoidal'][s]['splits'][split]['bleu']
             for s in seeds]
    long = [converged['shaw', s][split] - converged['sinusoidal', s][split]
            for s in seeds]
    change = [b - a for a, b in zip(short, long)]
    assert row[1:] == [seed_interval_text(short, 2),
                       seed_interval_text(long, 2),
                       seed_interval_text(change, 2)], split


def test_the_rope_convergence_table_matches_the_runs(by_label):
  """RoPE's converged table: per split, rope's converged mean (its
  3,000-step runs' mean), then rope minus shaw and rope minus sinusoidal,
  converged and at 3,000 steps, each the mean over the seeds [its 95%
  t-interval across them]."""
  with open(CONVERGENCE) as f:
    converged = {(r['label'], r['seed']): r['bleu']
                 for r in json.load(f).values()}
  seeds = sorted(seed for label, seed in converged if label == 'rope')
  assert len(seeds) == 3
  rows = _table_after(_section8(), '| split | rope, converged (3,000 steps) |')
  assert [row[0] for row in rows] == list(SPLITS)
  short = lambda label, s, split: by_label[label][s]['splits'][split]['bleu']
  for split, row in zip(SPLITS, rows):
    expected = [
        f'{statistics.mean(converged["rope", s][split] for s in seeds):.2f} '
        f'({statistics.mean(short("rope", s, split) for s in seeds):.2f})']
    for other in ('shaw', 'sinusoidal'):
      expected += [
          seed_interval_text([converged['rope', s][split]
                              - converged[other, s][split] for s in seeds], 2),
          seed_interval_text([short('rope', s, split) - short(other, s, split)
                              for s in seeds], 2)]
    assert row[1:] == expected, split

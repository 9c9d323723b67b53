"""Does a source's final full stop decide whether a translation model loops?

  python -m experiments.translation_punctuation \
      --workdir=experiments/results/translation

The translation study's outputs repeat a run of three words far more often
on test_2017_flickr than on test_2016_flickr, RoPE's most of all. 99.1% of
Multi30k's training sources end with '.', as do 98.0% of test_2016_flickr's,
but only 79.3% of test_2017_flickr's and 79.6% of test_2017_mscoco's: the
rest end in a word. This probe changes only that character and translates
again, with each run's chosen checkpoint and the study's beam search, for
every run of the study that trained on all pairs (the core tier's 20, the
extras' single runs, xl, pope and shaw keys at 3 seeds):

  add    the sources of a test set that end in a letter or digit get a '.';
  strip  test_2016_flickr's sources that end with '.' lose it.

Each change is scored on the changed sentences only, against their usual
references, beside the study's committed translations of the same sentences:
sacreBLEU and the share of outputs that repeat a 3-gram. Differences are
paired by seed (each run its own model), with 95% t-intervals
across seeds. Each run's numbers are kept in its punctuation.json and its
changed translations in translations/punctuation/; the report goes to
punctuation.md in the workdir. Probes the runs of the study that are
finished and scored, and names the ones it leaves out; a row with one run
gets no interval.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

from absl import app

from experiments import common
from experiments import translation as study_lib
from selfattn.tasks.translation import bleu
from selfattn.training import checkpoints
from selfattn.tasks.translation import multi30k
from selfattn.training import workdir as workdir_lib
from selfattn.training.cli_checks import parse_flags

RESULT_FILE = 'punctuation.json'
REPORT_FILE = 'punctuation.md'
# Every all-pairs row of the study (the +short runs answer another question).
LABELS = tuple(label for labels, _ in study_lib.TIERS for label in labels
               if '+short' not in label)
# Pairs whose BLEU difference each probe reports, paired by seed: rope
# against shaw (the gap the probe was built to explain), and each relative
# encoding of the later tier against its nearest peer (study_lib.PEERS).
PEERS = (('rope', 'shaw'),) + study_lib.PEERS + (('shaw keys', 'shaw'),)
# Pairs whose difference in looping is the point (issue 49's intervention:
# does removing Shaw's value term make it loop like the encodings that put
# position into the attention weights only?).
LOOP_PEERS = (('shaw keys', 'shaw'), ('shaw keys', 'rope'))
# (intervention, test set): 'add' where sources lack a final stop, 'strip'
# where nearly all have one.
PROBES = (('add', 'test_2017_flickr'), ('add', 'test_2017_mscoco'),
          ('add', 'test_2016_flickr'), ('strip', 'test_2016_flickr'))

DEFAULT_WORKDIR = 'experiments/results/translation'


def changed_sources(sources: list[str], how: str
                    ) -> tuple[list[int], list[str]]:
  """(indices, new sources) of the sentences an intervention changes.

  'add' appends '.' to sources ending in a letter or digit (trailing
  spaces dropped); 'strip' removes the final '.' of sources ending in one.
  """
  if how not in ('add', 'strip'):
    raise ValueError(f'how={how!r}; valid: add, strip')
  indices, changed = [], []
  for i, source in enumerate(sources):
    text = source.rstrip()
    if how == 'add' and text[-1:].isalnum():
      indices.append(i)
      changed.append(text + '.')
    elif how == 'strip' and text.endswith('.'):
      indices.append(i)
      changed.append(text[:-1].rstrip())
  return indices, changed


def scores(hyps: list[str], refs: list[str]) -> dict[str, float]:
  """BLEU and the percentage of outputs repeating a 3-gram."""
  loops = sum(study_lib.repeats_a_trigram(h) for h in hyps)
  return {'bleu': bleu.score(hyps, refs)['bleu'],
          'loops_percent': 100.0 * loops / len(hyps)}


def unchanged_scores(path: str, how: str, split: str) -> dict[str, float]:
  """Scores of the run's committed translations of the sentences a probe
  leaves alone (no decoding): is a gap still there on them?"""
  sources, references = multi30k.pairs(split)
  changed = set(changed_sources(sources, how)[0])
  kept = [i for i in range(len(sources)) if i not in changed]
  given = study_lib.read_translations(*os.path.split(path), split)
  return {'sentences': len(kept),
          **scores([given[i] for i in kept], [references[i] for i in kept])}


def probe_run(run, path: str) -> dict[str, Any]:
  """The run's punctuation.json, computed once: for every probe, the scores
  of the committed translations and of the changed sources' ones, and of
  the committed translations of the sentences left unchanged."""
  target = os.path.join(path, RESULT_FILE)
  if os.path.exists(target):
    result = workdir_lib.read_json_object(target, "the probe's scores")
    missing = [(how, split) for how, split in PROBES
               if 'unchanged' not in result['probes'][f'{how} {split}']]
    for how, split in missing:      # files written before 'unchanged' was
      result['probes'][f'{how} {split}']['unchanged'] = unchanged_scores(
          path, how, split)
    if missing:
      workdir_lib.write_json(target, result)
    return result
  scored = workdir_lib.read_json_object(
      os.path.join(path, study_lib.RESULT_FILE),
      'the study scores every run before this probe reads it')
  if not study_lib.is_current(scored):
    raise ValueError(f'{path}: scored by an older beam search; run the '
                     f'study to rescore it first')
  from selfattn.training.translation_steps import TranslationTrainer
  trainer = TranslationTrainer(run.config)
  params, _ = checkpoints.read_params(path, trainer.params_layout(),
                                      scored['selected_step'])
  out_dir = os.path.join(path, 'translations', 'punctuation')
  os.makedirs(out_dir, exist_ok=True)
  result = {'selected_step': scored['selected_step'], 'probes': {}}
  for how, split in PROBES:
    sources, references = multi30k.pairs(split)
    indices, changed = changed_sources(sources, how)
    given = study_lib.read_translations(*os.path.split(path), split)
    hyps = trainer.translate_texts(params, changed, method='beam',
                                   beam_size=study_lib.BEAM_SIZE,
                                   alpha=study_lib.ALPHA)
    study_lib.write_lines(os.path.join(out_dir, f'{how}_{split}.en'), hyps)
    refs = [references[i] for i in indices]
    probe = result['probes'][f'{how} {split}'] = {
        'sentences': len(indices),
        'given': scores([given[i] for i in indices], refs),
        'changed': scores(hyps, refs),
        'unchanged': unchanged_scores(path, how, split)}
    print(f'[punctuation] {run.name}: {how} {split} ({len(indices)} '
          f'sentences): BLEU {probe["given"]["bleu"]:.2f} -> '
          f'{probe["changed"]["bleu"]:.2f}, looping '
          f'{probe["given"]["loops_percent"]:.1f}% -> '
          f'{probe["changed"]["loops_percent"]:.1f}%', flush=True)
  workdir_lib.write_json(target, result)
  return result


def report(results: dict[str, dict[int, dict]]) -> str:
  """Markdown: per probe, a table of means over seeds and paired lines.

  results maps encoding -> seed -> a run's punctuation.json.
  """
  lines = ['# Does the final full stop decide the loops?', '',
           'Written by `python -m experiments.translation_punctuation`. '
           'Means over seeds; intervals are 95% t-intervals across seeds '
           '(the seed is the unit of replication; each pair shares its seed).',
           '']
  for probe in (f'{how} {split}' for how, split in PROBES):
    value = lambda enc, which, metric: {
        seed: r['probes'][probe][which][metric]
        for seed, r in results[enc].items()}
    first = next(iter(next(iter(results.values())).values()))['probes'][probe]
    n, unchanged = first['sentences'], first['unchanged']['sentences']
    lines += [f'## {probe} ({n} sentences changed)', '']
    rows = []
    for enc in results:
      cells = [statistics.mean(value(enc, which, metric).values())
               for metric in ('bleu', 'loops_percent')
               for which in ('given', 'changed')]
      rows.append([enc, len(results[enc])] + [f'{c:.2f}' for c in cells])
    lines += [common.markdown_table(
        ['encoding', 'seeds', 'BLEU as given', 'BLEU changed',
         '% looping as given', '% looping changed'], rows), '']
    single = [enc for enc in results if len(results[enc]) < 2]
    if single:
      lines.append(f'- {", ".join(single)}: one run each, so no interval '
                   f'(an anecdote, in the table only).')
    for enc in (enc for enc in results if enc not in single):
      for metric, unit in (('bleu', 'BLEU'), ('loops_percent', 'points')):
        by = {'changed': value(enc, 'changed', metric),
              'given': value(enc, 'given', metric)}
        lines.append('- ' + common.paired_by_seed(
            by, ('changed',), ('given',), f'{enc}, {metric}: changed minus as '
            f'given', unit=unit, digits=2))
    for a, b in PEERS:
      if a not in results or b not in results:
        continue
      for which in ('given', 'changed', 'unchanged'):
        by = {enc: value(enc, which, 'bleu') for enc in (a, b)}
        name = (f'{a} minus {b}, BLEU {which}' if which != 'unchanged' else
                f'{a} minus {b}, BLEU on the {unchanged} sentences this '
                f'probe leaves alone')
        lines.append('- ' + common.paired_by_seed(
            by, (a,), (b,), name, unit='BLEU', digits=2))
    for a, b in LOOP_PEERS:
      if a in results and b in results:
        by = {enc: value(enc, 'given', 'loops_percent') for enc in (a, b)}
        lines.append('- ' + common.paired_by_seed(
            by, (a,), (b,), f'{a} minus {b}, % looping as given',
            unit='points', digits=2))
    lines.append('')
  return '\n'.join(lines)


def probe_study(workdir: str) -> str | None:
  """Probes every finished all-pairs run of the study in `workdir`, writes
  punctuation.md there and returns it (None: no run finished yet)."""
  runs = study_lib.study_runs('cpu', study_lib.TIERS[0][1], LABELS)
  results: dict[str, dict[int, dict]] = {}
  for i, run in enumerate(runs):
    path = os.path.join(workdir, run.name)
    if not os.path.exists(os.path.join(path, study_lib.RESULT_FILE)):
      # A study stopped part-way: probe what it finished, say what it left.
      print(f'[punctuation] run {i + 1}/{len(runs)}: {run.name} not yet '
            f'scored by the study; left out', flush=True)
      continue
    print(f'[punctuation] run {i + 1}/{len(runs)}: {run.name}', flush=True)
    result = probe_run(run, path)
    results.setdefault(run.tags['position'], {})[run.tags['seed']] = result
  if not results:
    return None
  text = report(results)
  with open(os.path.join(workdir, REPORT_FILE), 'w') as f:
    f.write(text + '\n')
  return text


def main(argv):
  del argv
  workdir = common.WORKDIR.value or DEFAULT_WORKDIR
  text = probe_study(workdir)
  if text is None:
    common.fail(f'{workdir}: no finished run of the translation study to '
                f'probe; run python -m experiments.translation first')
  print(text)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

"""The full-stop probe of the translation study: which sources it changes,
its paired report on made-up numbers, and the committed probe translations
against the scores stored beside them."""

import glob
import json
import os

import pytest

from data import REQUIRES_MULTI30K
from experiments import translation_punctuation as probe
from selfattn.tasks.translation import bleu
from selfattn.tasks.translation import multi30k
from selfattn.training import workdir as workdir_lib

STUDY_DIR = os.path.join(os.path.dirname(__file__), '..', '..', 'experiments',
                         'results', 'translation')


def test_only_sources_ending_in_a_word_gain_a_stop_and_only_stops_are_stripped():
  sources = ['Ein Hund.', 'Zwei Katzen ', 'Drei 3', 'Wer?', 'Ein Mann .',
             '„Hallo“']
  assert probe.changed_sources(sources, 'add') == (
      [1, 2], ['Zwei Katzen.', 'Drei 3.'])
  assert probe.changed_sources(sources, 'strip') == (
      [0, 4], ['Ein Hund', 'Ein Mann'])
  with pytest.raises(ValueError, match="how='drop'; valid: add, strip"):
    probe.changed_sources(sources, 'drop')


def test_loops_are_counted_in_percent_of_outputs():
  refs = ['a dog on a red mat .', 'two cats sleep .']
  hyps = ['a dog on a red mat on a red mat .', 'two cats sleep .']
  assert probe.scores(hyps, refs)['loops_percent'] == 50.0
  assert probe.scores(refs, refs)['bleu'] == pytest.approx(100.0)


def _made_up(bleu_given, bleu_changed, loops_given, loops_changed):
  return {'selected_step': 3000, 'probes': {
      f'{how} {split}': {
          'sentences': 7,
          'given': {'bleu': bleu_given, 'loops_percent': loops_given},
          'changed': {'bleu': bleu_changed, 'loops_percent': loops_changed},
          'unchanged': {'sentences': 93, 'bleu': bleu_given + 10,
                        'loops_percent': 1.0}}
      for how, split in probe.PROBES}}


def test_the_report_pairs_each_change_and_rope_against_shaw_by_seed():
  results = {
      'shaw': {0: _made_up(30, 31, 10, 4), 1: _made_up(32, 33, 12, 6)},
      'rope': {0: _made_up(25, 31, 30, 2), 1: _made_up(27, 35, 34, 4)},
      'alibi': {0: _made_up(20, 30, 40, 1)},
  }
  text = probe.report(results)
  # A row with one run is tabled, with no interval.
  assert '| alibi | 1 | 20.00 | 30.00 | 40.00 | 1.00 |' in text
  assert '- alibi: one run each, so no interval' in text
  assert 'alibi, bleu' not in text
  assert '## add test_2017_flickr (7 sentences changed)' in text
  # rope's BLEU gains are 6 and 8 (mean 7), its loops fall by 28 and 30.
  assert ('rope, bleu: changed minus as given: +7.00 BLEU over 2 seeds'
          in text)
  assert ('rope, loops_percent: changed minus as given: -29.00 points over '
          '2 seeds' in text)
  # rope minus shaw: -5 both seeds as given; 0 and +2 once changed.
  assert 'rope minus shaw, BLEU given: -5.00 BLEU' in text
  assert 'rope minus shaw, BLEU changed: +1.00 BLEU' in text
  # On the sentences left alone (made up as given + 10): -5 again.
  assert ('rope minus shaw, BLEU on the 93 sentences this probe leaves '
          'alone: -5.00 BLEU') in text
  # The table holds the means: rope as given 26.00 BLEU, 32.00% looping.
  assert '| rope | 2 | 26.00 | 33.00 | 32.00 | 3.00 |' in text
  # Pairs whose members are missing (xl, pope) print nothing.
  assert 'xl minus' not in text and 'pope minus' not in text


def test_the_report_pairs_pope_with_rope_when_both_have_seeds():
  results = {
      'rope': {0: _made_up(25, 31, 30, 2), 1: _made_up(27, 35, 34, 4)},
      'pope': {0: _made_up(24, 33, 30, 2), 1: _made_up(29, 34, 34, 4)},
  }
  text = probe.report(results)
  # pope - rope as given: -1, +2; changed: +2, -1.
  assert 'pope minus rope, BLEU given: +0.50 BLEU over 2 seeds' in text
  assert 'pope minus rope, BLEU changed: +0.50 BLEU over 2 seeds' in text
  assert 'rope minus shaw' not in text


def test_a_study_stopped_part_way_is_probed_where_it_finished(tmp_path, capsys):
  """Runs the study has not scored are left out by name; the finished ones
  (here with their probe already stored, so nothing decodes) are reported."""
  assert probe.probe_study(str(tmp_path)) is None
  assert not (tmp_path / probe.REPORT_FILE).exists()
  for seed, scores in ((0, (30, 31, 10, 4)), (1, (32, 33, 12, 6))):
    run = tmp_path / f'position=shaw,seed={seed}'
    run.mkdir()
    (run / 'translation.json').write_text('{}')
    (run / probe.RESULT_FILE).write_text(json.dumps(_made_up(*scores)))
  text = probe.probe_study(str(tmp_path))
  assert '| shaw | 2 | 31.00 | 32.00 | 11.00 | 5.00 |' in text
  assert '| sinusoidal |' not in text
  assert (tmp_path / probe.REPORT_FILE).read_text() == text + '\n'
  out = capsys.readouterr().out
  assert 'position=sinusoidal,seed=0 not yet scored by the study; left out' in out


@REQUIRES_MULTI30K
def test_committed_probe_translations_reproduce_their_scores():
  """Every committed probe file scores what its punctuation.json says."""
  runs = sorted(glob.glob(os.path.join(STUDY_DIR, '*', probe.RESULT_FILE)))
  if not runs:
    pytest.skip('no probe results committed yet')
  path = runs[0]
  stored = workdir_lib.read_json_object(path, 'probe scores')['probes']
  for how, split in probe.PROBES:
    sources, references = multi30k.pairs(split)
    indices, _ = probe.changed_sources(sources, how)
    with open(os.path.join(os.path.dirname(path), 'translations',
                           'punctuation', f'{how}_{split}.en'),
              encoding='utf-8') as f:
      hyps = f.read().split('\n')[:-1]
    assert len(hyps) == len(indices) == stored[f'{how} {split}']['sentences']
    refs = [references[i] for i in indices]
    assert bleu.score(hyps, refs)['bleu'] == pytest.approx(
        stored[f'{how} {split}']['changed']['bleu'], abs=1e-9)
    kept = [i for i in range(len(sources)) if i not in set(indices)]
    assert stored[f'{how} {split}']['unchanged']['sentences'] == len(kept)

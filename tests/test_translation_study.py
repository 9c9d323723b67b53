"""The translation floors and the study's scoring: word-by-word IBM Model 1
and retrieval on made-up pairs whose answers are known, the committed
translation files against the scores stored beside them, and the +short
protocol's cut against the real test set."""

import os

import numpy as np
import pytest

from data import REQUIRES_MULTI30K
from experiments import translation as translation_study
from experiments import translation_baselines as baselines
from selfattn import bleu
from selfattn import multi30k
from tiny_corpus import tiny_translation_config


def test_word_by_word_learns_the_dictionary_from_co_occurrence():
  german = ['ein hund', 'ein haus', 'der hund', 'der mann', 'ein mann',
            'das haus'] * 3
  english = ['a dog', 'a house', 'the dog', 'the man', 'a man',
             'the house'] * 3
  model = baselines.WordByWord(german, english)
  assert model.table['hund'] == 'dog' and model.table['der'] == 'the'
  assert model.table['ein'] == 'a' and model.table['haus'] == 'house'
  # Lower-cased lookup, sentence case out, unseen words copied.
  assert model.translate(['Der Mann und Katze']) == ['The man und Katze']


def test_retrieval_returns_the_nearest_training_target():
  german = ['Ein Hund läuft über die Wiese.', 'Drei Hunde schlafen.',
            'Eine Frau liest ein Buch.']
  english = ['A dog runs across the meadow.', 'Three dogs sleep.',
             'A woman reads a book.']
  model = baselines.Retrieval(german, english)
  assert model.translate(german) == english
  assert model.translate(['drei Hunde schlafen im Park']) == ['Three dogs sleep.']
  assert baselines.copy_source(['Ein Hund.']) == ['Ein Hund.']
  assert baselines.detokenize(['A', 'dog', '.']) == 'A dog.'


@pytest.mark.slow
def test_a_scored_run_commits_translations_that_reproduce_its_scores(
    tiny_multi30k, tmp_path):
  from selfattn.train import train_and_evaluate
  config = tiny_translation_config(**{'train.num_steps': 4, 'train.checkpoint_every': 2,
                          'train.keep_checkpoints': 2, 'eval.every': 4})
  path = str(tmp_path / 'run')
  train_and_evaluate(config, path)
  run = translation_study.study.Run('run', config, {'position': 'x',
                                                    'seed': 0})
  result = translation_study.evaluate_run(run, path)
  by_step = {int(k): v for k, v in result['valid_bleu_greedy_by_step'].items()}
  assert sorted(by_step) == [2, 4]
  assert by_step[result['selected_step']] == max(by_step.values())
  for split in ('val',) + multi30k.TEST_SPLITS:
    with open(os.path.join(path, 'translations', f'{split}.en'),
              encoding='utf-8') as f:
      lines = f.read().split('\n')
    assert lines[-1] == '' and len(lines) - 1 == multi30k.SIZES[split]
    _, references = multi30k.pairs(split)
    stored = result['splits'][split]
    assert bleu.score(lines[:-1], references)['bleu'] == stored['bleu']
    assert (stored['short_sources']['sentences']
            + stored['long_sources']['sentences']) == multi30k.SIZES[split]
  # Scored once: a second call reads the file back.
  assert translation_study.evaluate_run(run, path) == result


@REQUIRES_MULTI30K
def test_the_short_protocol_leaves_about_a_fifth_of_the_test_set_longer():
  from selfattn import translation_data
  tok = translation_data.tokenizer_for(8000)
  sources, _ = multi30k.pairs(translation_study.MAIN_TEST)
  lengths = np.array([len(ids) for ids in tok.encode(sources)])
  longer = float(np.mean(lengths > translation_study.SHORT_MAX_LEN))
  assert 0.17 <= longer <= 0.23, longer

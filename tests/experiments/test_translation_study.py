"""The translation floors and the study's scoring: word-by-word IBM Model 1
and retrieval on made-up pairs whose answers are known, the committed
translation files against the scores stored beside them, and the +short
protocol's cut against the real test set."""

import os
import shutil

import numpy as np
import pytest

from data import REQUIRES_MULTI30K
from experiments import translation as translation_study
from experiments import translation_baselines as baselines
from selfattn.tasks.translation import bleu
from selfattn.tasks.translation import multi30k
from selfattn.training import workdir as workdir_lib
from tiny_corpus import tiny_translation_config
from tiers import EXTENDED


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


# Extended (tests/README.md): like the other study drivers' trained runs, the
# study's scoring of a trained run. In the commit tier the translation
# trainer's BLEU equals translate_texts' output scored
# (tests/training/test_translation.py::
# test_the_trainer_steps_on_the_batch_it_shows_and_evaluates_what_it_decodes)
# and the report is written from made-up results (below).
@EXTENDED
@pytest.mark.slow
def test_a_scored_run_commits_translations_that_reproduce_its_scores(
    tiny_multi30k, tmp_path, monkeypatch):
  from selfattn.training.train import train_and_evaluate
  config = tiny_translation_config(**{'train.num_steps': 4, 'train.checkpoint_every': 2,
                          'train.keep_checkpoints': 2, 'eval.every': 4})
  path = str(tmp_path / 'run')
  train_and_evaluate(config, path)
  # A pause by a signal keeps the step it stopped at, off the schedule: not
  # a candidate, or the choice would depend on when the run was paused.
  shutil.copytree(os.path.join(path, 'checkpoints', '2'),
                  os.path.join(path, 'checkpoints', '3'))
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
  # A result from the older beam search is rescored at its own checkpoint
  # (here made the worse one, so reuse is visible), and until then it is
  # outdated, which --collect_only leaves out. The bookkeeping is what is
  # tested here, so the decoder is a stand-in that copies the source (no
  # second beam-search compile in CI).
  from selfattn.training.translation_steps import TranslationTrainer
  monkeypatch.setattr(TranslationTrainer, 'translate_texts',
                      lambda self, params, sources, **kwargs: list(sources))
  other = next(s for s in by_step if s != result['selected_step'])
  old = {k: v for k, v in result.items() if k != 'beam_search'}
  old['selected_step'] = other
  workdir_lib.write_json(os.path.join(path, translation_study.RESULT_FILE), old)
  assert translation_study._outdated(path)
  rescored = translation_study.evaluate_run(run, path)
  assert translation_study.is_current(rescored) and not translation_study._outdated(path)
  assert rescored['selected_step'] == other
  assert rescored['valid_bleu_greedy_by_step'] == result['valid_bleu_greedy_by_step']
  sources, references = multi30k.pairs('val')
  assert rescored['splits']['val']['bleu'] == bleu.score(sources, references)['bleu']


def test_both_protocols_train_on_batches_of_the_same_tokens():
  """+short's buckets end lower; its batches must not shrink with them."""
  runs = {r.tags['position']: r.config for r in translation_study.study_runs(
      'cpu', 1, ('shaw', 'shaw +short'))}
  full, short = runs['shaw'], runs['shaw +short']
  assert short.task.max_len == translation_study.SHORT_MAX_LEN < full.task.max_len
  assert short.train.batch_tokens == full.train.batch_tokens == 1792
  assert short.eval.lengths == [translation_study.SHORT_MAX_LEN, 64]


@REQUIRES_MULTI30K
def test_the_short_protocol_leaves_about_a_fifth_of_the_test_set_longer():
  from selfattn.tasks.translation import data as translation_data
  tok = translation_data.tokenizer_for(8000)
  sources, _ = multi30k.pairs(translation_study.MAIN_TEST)
  lengths = np.array([len(ids) for ids in tok.encode(sources)])
  longer = float(np.mean(lengths > translation_study.SHORT_MAX_LEN))
  assert 0.17 <= longer <= 0.23, longer


def _fake_result(bleu_main: float, long_bleu: float) -> dict:
  by_length = {translation_study.bin_label(lo, hi): {
      'bleu': bleu_main + i, 'chrf': 50.0, 'sentences': 10}
      for i, (lo, hi) in enumerate(translation_study.LENGTH_BINS)}
  split = {'bleu': bleu_main, 'chrf': 50.0, 'bleu_signature': 'SIG',
           'by_length': by_length,
           'short_sources': {'bleu': bleu_main, 'chrf': 1.0, 'sentences': 80},
           'long_sources': {'bleu': long_bleu, 'chrf': 1.0, 'sentences': 20}}
  return {'splits': {s: split for s in ('val',) + multi30k.TEST_SPLITS},
          'valid_bleu_greedy_by_step': {'500': bleu_main - 10,
                                        '1000': bleu_main}}


def _report_on_made_up_scores(tmp_path, scores: dict) -> str:
  """report() on seed -> label -> (main, long) BLEU, beside a word floor
  of 25 / 20."""
  runs = translation_study.study_runs('quick', len(scores), tuple(scores[0]))
  results = {run.name: {**_fake_result(*scores[run.tags['seed']][run.tags['position']]),
                        'label': run.tags['position'], 'seed': run.tags['seed']}
             for run in runs}
  floors = {'word': _fake_result(25.0, 20.0)['splits']}
  return translation_study.report(str(tmp_path), runs, results, 'quick', floors)


def test_the_report_tables_floors_and_pairs_by_seed(tmp_path):
  """report() on made-up run results: mean ± std cells, the floor named and
  counted against, and a paired line that is the per-seed difference."""
  runs = translation_study.study_runs('quick', 2, ('sinusoidal', 'shaw'))
  results = {}
  for run, (main, long) in zip(runs, [(30, 20), (31, 22), (32, 21), (34, 25)]):
    results[run.name] = {**_fake_result(main, long),
                         'label': run.tags['position'], 'seed': run.tags['seed']}
  floor = _fake_result(25.0, 20.0)['splits']
  text = translation_study.report(str(tmp_path), runs, results, 'quick',
                                  {'word': floor, 'copy': _fake_result(1, 1)['splits']})
  # Seed-major runs: seed 0 sinusoidal 30, shaw 31; seed 1 sinusoidal 32, shaw 34.
  assert '| sinusoidal | 31.00 ± 1.41 |' in text
  assert '| shaw | 32.50 ± 2.12 |' in text
  assert 'The strongest floor on validation is `word`' in text
  assert 'sinusoidal 2/2, shaw 2/2' in text
  assert ('shaw minus sinusoidal (Shaw et al.\'s comparison): +1.50 BLEU over '
          '2 seeds') in text
  assert '| word (floor) | 25.00 | 26.00 | 27.00 |' in text      # by length
  assert (tmp_path / 'bleu_by_length.png').exists()
  assert (tmp_path / 'bleu_by_step.png').exists()


def test_the_later_relative_encodings_are_paired_with_their_peers(tmp_path):
  """xl against shaw and pope against rope, paired by seed on the main
  test set, its long sources, validation and the other test sets."""
  # (main, long) BLEU per label, per seed.
  text = _report_on_made_up_scores(tmp_path, {
      0: {'sinusoidal': (30, 20), 'shaw': (33, 24), 'rope': (34, 23),
          'xl': (32, 25), 'pope': (35, 21)},
      1: {'sinusoidal': (31, 21), 'shaw': (34, 26), 'rope': (33, 24),
          'xl': (34, 25), 'pope': (35, 22)}})
  # xl - shaw: -1, 0; xl - sinusoidal: +2, +3; long: +1, -1.
  assert 'test_2016_flickr BLEU, xl minus shaw: -0.50 BLEU over 2 seeds' in text
  assert 'xl minus sinusoidal: +2.50 BLEU over 2 seeds' in text
  assert ('sources longer than 18 tokens, xl minus shaw: +0.00 BLEU over 2 '
          'seeds') in text
  # pope - rope: +1, +2 (every split holds the main score); long -2, -2.
  assert 'val BLEU, pope minus rope: +1.50 BLEU over 2 seeds' in text
  assert 'test_2017_mscoco BLEU, pope minus rope: +1.50 BLEU' in text
  assert ('sources longer than 18 tokens, pope minus rope: -2.00 BLEU over 2 '
          'seeds') in text
  # Two seeds each: no row is reported as a single run.
  assert 'rows with a single run' not in text


def test_the_relative_lead_is_paired_on_short_and_long_sources(tmp_path):
  """The length lines: relative minus absolute on the short and the long
  sources, and their difference, each paired by seed (made-up scores)."""
  # (short, long) BLEU per label, per seed; _fake_result's main = short.
  text = _report_on_made_up_scores(tmp_path, {
      0: {'sinusoidal': (40, 20), 'learned': (42, 22), 'shaw': (43, 27),
          'rope': (43, 25)},
      1: {'sinusoidal': (41, 21), 'learned': (41, 21), 'shaw': (42, 25),
          'rope': (44, 25)}})
  # Short: seed 0 43 - 41 = +2, seed 1 43 - 41 = +2. Long: seed 0 26 - 21 =
  # +5, seed 1 25 - 21 = +4. Their difference: +3, +2.
  assert ('sources of at most 18 tokens, mean of shaw, rope minus mean of '
          'sinusoidal, learned: +2.00 BLEU over 2 seeds') in text
  assert ('(trained on all), mean of shaw, rope minus mean of sinusoidal, '
          'learned: +4.50 BLEU over 2 seeds') in text
  assert 'per seed +5.00, +4.00)' in text
  assert ('(the line above minus the one before it): +2.50 BLEU over 2 '
          'seeds') in text
  assert 'per seed +3.00, +2.00)' in text
  # _fake_result gives every test set the short sources' score.
  assert ('test_2017_mscoco BLEU, mean of shaw, rope minus mean of '
          'sinusoidal, learned: +2.00 BLEU over 2 seeds') in text
  assert 'test_2017_flickr BLEU, rope minus shaw: +1.00 BLEU' in text


def test_the_plan_trains_tier_by_tier_each_at_its_seeds():
  """Core encodings at 5 seeds come first (seed-major), then +short at 3,
  then single runs, then xl and pope at 3, then the shaw-keys intervention
  at 3; --seeds caps every tier."""
  runs = translation_study.study_runs('cpu', 5, tuple(translation_study.ENCODINGS))
  names = [r.name for r in runs]
  assert len(names) == len(set(names)) == 20 + 9 + 3 + 6 + 3
  assert names[:5] == ['position=sinusoidal,seed=0', 'position=learned,seed=0',
                       'position=shaw,seed=0', 'position=rope,seed=0',
                       'position=sinusoidal,seed=1']
  assert names[20] == 'position=sinusoidal+short,seed=0'
  assert names[29:32] == ['position=none,seed=0', 'position=t5,seed=0',
                          'position=alibi,seed=0']
  assert names[32:38] == [f'position={p},seed={s}' for s in range(3)
                          for p in ('xl', 'pope')]
  # The intervention: Shaw's offsets in the attention weights only.
  keys = runs[38:]
  assert [r.name for r in keys] == [f'position=shawkeys,seed={s}'
                                    for s in range(3)]
  assert all(r.config.model.position == 'shaw'
             and r.config.model.relative_values is False for r in keys)
  assert all(r.config.model.relative_values is None for r in runs[:38])
  short = [r for r in runs if r.tags['position'].endswith('+short')]
  assert {r.config.model.position for r in short} == {'sinusoidal', 'shaw', 'rope'}
  assert all(r.config.task.max_len == translation_study.SHORT_MAX_LEN
             for r in short)
  capped = translation_study.study_runs('cpu', 2, tuple(translation_study.ENCODINGS))
  assert len(capped) == 4 * 2 + 3 * 2 + 3 + 2 * 2 + 2


def test_a_row_with_one_run_gets_a_difference_but_no_interval():
  line = translation_study.single_run_line(
      {'sinusoidal': {0: 30.0, 1: 31.0}, 'none': {0: 12.5},
       'shaw': {0: 31.0, 1: 33.0}})
  assert line is not None and 'none minus sinusoidal at seed 0: -17.50' in line
  assert 'shaw' not in line and 'interval' in line   # 'no interval'
  assert translation_study.single_run_line({'sinusoidal': {0: 1.0}}) is None


def test_the_examples_are_the_first_sentence_of_each_length_bin(tmp_path):
  """example_rows picks by a rule fixed in advance (first of each bin, in
  test order), and the report quotes each run's committed line for it."""
  # Bins (0,10], (10,14], (14,18], (18,22], (22,64]: rows 1, 0, 4, 2, 5.
  lens = np.array([12, 3, 20, 9, 15, 40, 13])
  assert translation_study.example_rows(lens) == [1, 0, 4, 2, 5]
  runs = translation_study.study_runs('quick', 2, ('sinusoidal', 'shaw'))
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    results[run.name] = {**_fake_result(30, 20), 'label': label, 'seed': seed}
    out = tmp_path / run.name / 'translations'
    out.mkdir(parents=True)
    (out / f'{translation_study.MAIN_TEST}.en').write_text(
        ''.join(f'{label} s{seed} line {i}\n' for i in range(len(lens))))
  examples = {'sources': [f'de {i}' for i in range(len(lens))],
              'references': [f'en {i}' for i in range(len(lens))],
              'source_lens': lens}
  text = translation_study.report(str(tmp_path), runs, results, 'quick',
                                  {'word': _fake_result(25, 20)['splits']},
                                  examples)
  assert '## A few translations' in text and 'seed 0' in text
  assert ('**Sentence 2** (3 source tokens)\n\n- German: de 1\n'
          '- reference: en 1\n- sinusoidal: sinusoidal s0 line 1\n'
          '- shaw: shaw s0 line 1') in text
  assert 'Sentence 7' not in text and 's1 line' not in text


def test_the_short_protocol_pairs_extrapolation_by_seed(tmp_path):
  """The +short lines (made-up scores): the relative lead inside and beyond
  the trained lengths, its growth, and each encoding's cost of never
  having seen a long source, all paired by seed."""
  labels = ('sinusoidal', 'shaw', 'rope', 'sinusoidal +short', 'shaw +short',
            'rope +short')
  runs = translation_study.study_runs('quick', 2, labels)
  # (short, long) BLEU per label, per seed.
  scores = {0: {'sinusoidal': (40, 30), 'shaw': (42, 33), 'rope': (42, 31),
                'sinusoidal +short': (39, 20), 'shaw +short': (41, 28),
                'rope +short': (41, 26)},
            1: {'sinusoidal': (41, 31), 'shaw': (43, 34), 'rope': (41, 31),
                'sinusoidal +short': (40, 22), 'shaw +short': (43, 29),
                'rope +short': (42, 25)}}
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    results[run.name] = {**_fake_result(*scores[seed][label]),
                         'label': label, 'seed': seed}
  text = translation_study.report(str(tmp_path), runs, results, 'quick',
                                  {'word': _fake_result(25.0, 20.0)['splits']})
  # Inside: seed 0 41 - 39 = +2, seed 1 42.5 - 40 = +2.5. Beyond: seed 0
  # 27 - 20 = +7, seed 1 27 - 22 = +5. Growth: +5, +2.5.
  assert ('(the trained range): mean of shaw, rope minus sinusoidal: +2.25 '
          'BLEU over 2 seeds') in text
  assert ('(never trained): mean of shaw, rope minus sinusoidal: +6.00 BLEU '
          'over 2 seeds') in text
  assert ('beyond the trained lengths (the line above minus the one before '
          'it): +3.75 BLEU over 2 seeds') in text
  # Trained on all minus on short, long sources: sinusoidal +10, +9; shaw
  # +5, +5; rope +5, +6.
  assert 'sinusoidal on sources longer than 18: trained on all minus trained on short (never seeing a long source, and 24% fewer distinct pairs, as many steps): +9.50 BLEU' in text
  assert 'shaw on sources longer than 18: trained on all minus trained on short (never seeing a long source, and 24% fewer distinct pairs, as many steps): +5.00 BLEU' in text
  assert 'rope on sources longer than 18: trained on all minus trained on short (never seeing a long source, and 24% fewer distinct pairs, as many steps): +5.50 BLEU' in text
  # Each relative encoding beyond the range: shaw 8, 7; rope 6, 3.
  assert '18 tokens: shaw minus sinusoidal: +7.50 BLEU over 2 seeds' in text
  assert '18 tokens: rope minus sinusoidal: +4.50 BLEU over 2 seeds' in text
  # On the short sources: sinusoidal 1, 1; shaw 1, 0; rope 1, -1.
  assert 'sinusoidal on sources of at most 18: trained on all minus trained on short (never seeing a long source, and 24% fewer distinct pairs, as many steps): +1.00 BLEU' in text
  assert 'rope on sources of at most 18: trained on all minus trained on short (never seeing a long source, and 24% fewer distinct pairs, as many steps): +0.00 BLEU' in text
  # Whose cost is larger: sinusoidal's minus shaw's 5, 4; minus rope's 5,
  # 3; rope's minus shaw's 0, 1.
  assert 'longer than 18, sinusoidal minus shaw: +4.50 BLEU' in text
  assert 'longer than 18, sinusoidal minus rope: +4.00 BLEU' in text
  assert 'longer than 18, rope minus shaw: +0.50 BLEU' in text
  # The relative lead's growth with length: +short 5, 2.5 (as above); all
  # pairs: seed 0 -10 - -10 = 0, seed 1 -9.5 - -10 = +0.5; difference 5, 2.
  assert ('whether never seeing a long source widens it more: +3.50 BLEU '
          'over 2 seeds') in text


def test_output_length_is_reported_and_divided_out(tmp_path):
  """With the brevity penalty stored, the report tables the length ratio
  and BP, and pairs BLEU / BP by seed (made-up scores: shaw 33 at BP 1.0,
  sinusoidal 30 at BP 0.95, i.e. 31.58 without it: +1.42 at both seeds)."""
  runs = translation_study.study_runs('quick', 2, ('sinusoidal', 'shaw'))
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    main, bp, sys_len = (33.0, 1.0, 1000) if label == 'shaw' else (30.0, 0.95, 950)
    result = _fake_result(main, main)
    # Every split gets the same lengths (_fake_result has none).
    split = {**result['splits'][translation_study.MAIN_TEST], 'bp': bp,
             'sys_len': sys_len, 'ref_len': 1000}
    result['splits'] = {name: split for name in result['splits']}
    results[run.name] = {**result, 'label': label, 'seed': seed}
    # Shaw loops in 2 of its 5 outputs at seed 0, in 1 at seed 1.
    loops = 2 - seed if label == 'shaw' else 0
    lines = ['a man in a hat in a hat'] * loops + ['a dog runs'] * (5 - loops)
    out = tmp_path / run.name / 'translations'
    out.mkdir(parents=True)
    for split in multi30k.TEST_SPLITS:
      (out / f'{split}.en').write_text(''.join(f'{line}\n' for line in lines))
  text = translation_study.report(str(tmp_path), runs, results, 'quick',
                                  {'word': _fake_result(25.0, 20.0)['splits']})
  assert ('| sinusoidal | 0.950 ± 0.000 | 0.950 ± 0.000 | 31.58 ± 0.00 |'
          in text)
  assert '| shaw | 1.000 ± 0.000 | 1.000 ± 0.000 | 33.00 ± 0.00 |' in text
  assert ('| sinusoidal' + ' | 0.950 ± 0.000 | 0.0 ± 0.0' * 3 + ' |') in text
  assert ('| shaw' + ' | 1.000 ± 0.000 | 1.5 ± 0.7' * 3 + ' |') in text
  assert ('BLEU without its brevity penalty (BLEU / BP: the n-gram precisions, '
          'which shorter outputs tend to raise), shaw minus sinusoidal: +1.42 '
          'BLEU over 2 seeds') in text
  assert 'val BLEU (the split that chooses), shaw minus sinusoidal: +3.00' in text


def test_long_source_precision_divides_out_the_brevity_penalty(tmp_path):
  """BLEU / BP over the long sources only, from the committed translations:
  an output that stops early but whose n-grams all match scores 100 (its
  BLEU is the brevity penalty alone); a wrong short-source line does not
  enter; an output with no matching n-gram scores 0."""
  lens = [5, 30, 30]                  # SHORT_MAX_LEN is 18: rows 1 and 2
  references = ['x y z', 'a b c d e f g h', 'i j k l m n o p']
  outputs = {'position=shaw,seed=0': ['q q q', 'a b c d e f', 'i j k l m n'],
             'position=sinusoidal,seed=0': ['x y z', 'z z z z z z z z',
                                            'y y y y y y y y']}
  results = {}
  for name, lines in outputs.items():
    out = tmp_path / name / 'translations'
    out.mkdir(parents=True)
    (out / f'{translation_study.MAIN_TEST}.en').write_text(
        ''.join(f'{line}\n' for line in lines))
    results[name] = {'label': name.split(',')[0].split('=')[1], 'seed': 0}
  plain = translation_study._long_source_precisions(
      str(tmp_path), results, {'references': references, 'source_lens': lens})
  assert plain['shaw'][0] == pytest.approx(100.0)
  assert plain['sinusoidal'][0] == pytest.approx(0.0)


def test_the_report_pairs_long_source_precision_by_seed(tmp_path):
  """With the data at hand (examples), the +short costs on the long
  sources are also paired with the brevity penalty divided out: all-pairs
  runs that copy the references (100) against +short runs that do (shaw) or
  write nothing that matches (sinusoidal, rope) on the long sources."""
  lens = np.array([5, 30, 30, 5])
  references = ['x y z', 'a b c d e f g h', 'i j k l m n o p', 'u v w']
  labels = ('sinusoidal', 'shaw', 'rope', 'sinusoidal +short', 'shaw +short',
            'rope +short')
  runs = translation_study.study_runs('quick', 2, labels)
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    results[run.name] = {**_fake_result(30, 20), 'label': label, 'seed': seed}
    copies = not label.endswith('+short') or label == 'shaw +short'
    lines = references if copies else ['q q q'] * len(references)
    out = tmp_path / run.name / 'translations'
    out.mkdir(parents=True)
    (out / f'{translation_study.MAIN_TEST}.en').write_text(
        ''.join(f'{line}\n' for line in lines))
  examples = {'sources': [f'de {i}' for i in range(len(lens))],
              'references': references, 'source_lens': lens}
  text = translation_study.report(str(tmp_path), runs, results, 'quick',
                                  {'word': _fake_result(25, 20)['splits']},
                                  examples)
  line = ('BLEU / BP (brevity penalty divided out): {} trained on all '
          'minus trained on short: {} BLEU over 2 seeds')
  assert line.format('sinusoidal', '+100.00') in text
  assert line.format('shaw', '+0.00') in text
  assert line.format('rope', '+100.00') in text
  # Under +short: mean of shaw (100) and rope (0) minus sinusoidal (0).
  assert ('BLEU / BP: mean of shaw, rope minus sinusoidal: +50.00 BLEU over 2 '
          'seeds') in text


def test_a_looping_output_repeats_a_trigram():
  assert translation_study.repeats_a_trigram(
      'A dog runs in front of a fence in front of a fence.')
  assert not translation_study.repeats_a_trigram('A man in a hat, a man.')


def test_the_sentence_bootstrap_is_paired_and_centred_on_the_corpus_difference():
  """Over made-up outputs: the point is the seed-mean of corpus BLEU
  differences (bleu.score's), identical systems differ by exactly 0 in every
  resample, and a real difference gets an interval around it."""
  refs = [f'a man number {i} walks his dog to the park' for i in range(40)]
  good = list(refs)
  bad = [r.replace('walks', 'runs') if i % 2 else r for i, r in enumerate(refs)]
  worse = [r.replace('park', 'beach') for r in bad]
  stats = {'shaw': {0: bleu.sentence_statistics(good, refs),
                    1: bleu.sentence_statistics(bad, refs)},
           'sinusoidal': {0: bleu.sentence_statistics(bad, refs),
                          1: bleu.sentence_statistics(worse, refs)}}
  line = translation_study.sentence_bootstrap(
      stats, ('shaw',), ('sinusoidal',), 'x', resamples=200)
  expected = np.mean([bleu.score(good, refs)['bleu'] - bleu.score(bad, refs)['bleu'],
                      bleu.score(bad, refs)['bleu'] - bleu.score(worse, refs)['bleu']])
  point = float(line.split(': ')[1].split(' BLEU')[0])
  assert point == pytest.approx(expected, abs=0.0051) and point > 0
  lo, hi = (float(x) for x in line.split('seeds fixed: [')[1].rstrip('])').split(', '))
  assert lo < point < hi and lo > 0
  same = {'shaw': stats['shaw'], 'sinusoidal': stats['shaw']}
  assert translation_study.sentence_bootstrap(
      same, ('shaw',), ('sinusoidal',), 'x', resamples=50).endswith(
          '[+0.00, +0.00])')
  assert 'no seed' in translation_study.sentence_bootstrap(
      {'shaw': {0: stats['shaw'][0]}}, ('shaw',), ('sinusoidal',), 'x')

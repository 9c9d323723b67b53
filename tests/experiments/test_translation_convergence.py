"""The translation convergence check (issue 49): its plan and its report,
on made-up scores whose paired differences are known."""

import json
import os

import numpy as np

from convergence_runs import assert_convergence_budget
from convergence_runs import fake_converged_run
from experiments import translation_convergence as convergence


def test_the_plan_is_the_study_protocol_with_an_early_stopped_budget():
  runs = convergence.Convergence().runs('cpu', 3, None)
  # The core pair at every seed first, then rope, then the +short tier
  # (sinusoidal first in each seed: the relative runs compare with it).
  assert [r.name for r in runs[:6]] == [
      f'position={p},seed={s}' for s in range(3) for p in ('shaw', 'sinusoidal')]
  assert {r.tags['position'] for r in runs[6:9]} == {'rope'}
  assert [r.name for r in runs[9:]] == [
      f'position={p}+short,seed={s}' for s in range(3)
      for p in ('sinusoidal', 'shaw', 'rope')]
  from configs import translation as translation_config
  study = translation_config.get_config('cpu')
  for run in runs:
    short = run.tags['position'].endswith('+short')
    # The +short runs train only on sources of at most SHORT_MAX_LEN tokens,
    # like the 3,000-step study's runs of the same label.
    assert run.config.task.max_len == (convergence.SHORT_MAX_LEN if short
                                       else study.task.max_len)
    position = run.tags['position'].split()[0]
    t = run.config.train
    assert_convergence_budget(run.config, convergence, 'bleu')
    # Everything else is the 3,000-step study's.
    assert run.config.model.to_dict() == {**study.model.to_dict(),
                                          'position': position}
    assert run.config.task.to_dict() == {**study.task.to_dict(),
                                         'max_len': run.config.task.max_len}
    for field in ('learning_rate', 'warmup_steps', 'schedule', 'batch_tokens',
                  'label_smoothing', 'final_lr_fraction', 'b2'):
      assert t[field] == study.train[field]
  # Against the 3,000-step study's runs themselves: the same config but the
  # budget and the loop's evaluation. One difference is knowingly kept:
  # the study's +short runs split the loop's evaluation at their training
  # length too ([18, 64]), the convergence runs only at 64 (their early
  # stopping reads BLEU there); only their TensorBoard curves differ.
  from experiments import translation as translation_study
  labels = {r.tags['position'] for r in runs}
  reference = {r.name: r.config for r in
               translation_study.study_runs('cpu', 3, labels)}
  budget = ('num_steps', 'early_stop_patience', 'early_stop_metric',
            'checkpoint_every', 'keep_checkpoints')
  for run in runs:
    a, b = run.config.to_dict(), reference[run.name].to_dict()
    for config in (a, b):
      for field in budget:
        del config['train'][field]
      for field in ('every', 'lengths'):
        del config['eval'][field]
    assert a == b, run.name
    if run.tags['position'].endswith('+short'):
      assert run.config.eval.lengths == [64]
      assert reference[run.name].eval.lengths == [convergence.SHORT_MAX_LEN, 64]
    else:
      assert run.config.eval.lengths == reference[run.name].eval.lengths


def _scores(test, val, long=None):
  """A translation.json's scores; `long`: (BLEU on the sources longer than
  SHORT_MAX_LEN, BLEU on the others) of the main test split."""
  main = {'bleu': test}
  if long is not None:
    main |= {'long_sources': {'bleu': long[0]},
             'short_sources': {'bleu': long[1]}}
  return {'splits': {'val': {'bleu': val}, convergence.MAIN_TEST: main}}


def _fake_run(workdir, name, *, stopped_at, curve):
  fake_converged_run(os.path.join(workdir, name), stopped_at=stopped_at,
                     curve=curve, metric='bleu', patience=2, length=64)


def _report(tmp_path, made_up, labels, *, stopped_at, curve,
            selected_step):
  """(convergence.report's text, its workdir) over made-up runs:
  made_up[seed][label] = (3,000-step test BLEU, converged test BLEU), val
  BLEU the test BLEU + 1 in every run, curve(converged BLEU) the greedy
  validation curve. A made-up entry of four numbers adds the BLEU of the
  long and short sources: (3,000 steps long, short, converged long,
  short), the test BLEU their mean."""
  short_dir, workdir = tmp_path / 'short', tmp_path / 'long'
  runs = convergence.study_runs('quick', len(made_up), labels)
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    parts = made_up[seed][label]
    by_length = (None, None)
    if len(parts) == 4:
      by_length = parts[:2], parts[2:]
      parts = sum(parts[:2]) / 2, sum(parts[2:]) / 2
    short, long = parts
    os.makedirs(short_dir / run.name)
    (short_dir / run.name / 'translation.json').write_text(json.dumps(
        {**_scores(short, short + 1, by_length[0]), 'selected_step': 3000,
         'valid_bleu_greedy_by_step': {'1500': short - 5, '3000': short}}))
    _fake_run(str(workdir), run.name, stopped_at=stopped_at,
              curve=curve(long))
    results[run.name] = {**_scores(long, long + 1, by_length[1]),
                         'selected_step': selected_step,
                         'label': label, 'seed': seed}
  return (convergence.report(str(workdir), runs, results, str(short_dir)),
          workdir)


def test_the_report_pairs_the_lead_at_both_budgets_by_seed(tmp_path):
  # seed -> label -> (3,000-step test BLEU, converged test BLEU)
  made_up = {0: {'shaw': (38.0, 40.0), 'sinusoidal': (36.0, 39.0)},
             1: {'shaw': (37.0, 40.5), 'sinusoidal': (35.0, 39.5)},
             2: {'shaw': (38.5, 41.0), 'sinusoidal': (36.0, 39.0)}}
  text, workdir = _report(
      tmp_path, made_up, convergence.CORE, stopped_at=9000,
      curve=lambda long: {3000: long - 3, 6000: long - 1, 7000: long,
                          8000: long - 0.5, 9000: long - 0.2},
      selected_step=7000)
  # Per seed, shaw minus sinusoidal: 3,000 steps +2, +2, +2.5; converged
  # +1, +1, +2; the change -1, -1, -0.5.
  assert ('test_2016_flickr, 3,000 steps: shaw minus sinusoidal: +2.17 BLEU '
          'over 3 seeds') in text
  assert ('test_2016_flickr, to convergence: shaw minus sinusoidal: +1.33 '
          'BLEU over 3 seeds') in text
  assert ('test_2016_flickr: the lead to convergence minus the lead at 3,000 '
          'steps: -0.83 BLEU over 3 seeds') in text
  assert 'per seed -1.00, -1.00, -0.50' in text
  assert '| shaw | to convergence | 9000, 9000, 9000 | 7000, 7000, 7000 |' in text
  assert '| sinusoidal | 3,000 steps | 3000, 3000, 3000 |' in text
  assert (workdir / 'bleu_by_step.png').exists()
  stored = json.loads((workdir / 'results.json').read_text())
  assert stored['position=shaw,seed=1']['greedy_valid_bleu']['7000'] == 40.5
  assert stored['position=shaw,seed=1']['stopped_at'] == 9000
  assert 'rope minus' not in text        # no rope runs, no rope section
  assert text.startswith(
      '# Translation to convergence: shaw against sinusoidal\n')


def test_rope_is_paired_with_each_core_encoding_where_it_has_runs(tmp_path):
  # seed -> label -> (3,000-step test BLEU, converged test BLEU)
  made_up = {0: {'shaw': (38.0, 40.0), 'sinusoidal': (36.0, 39.0),
                 'rope': (39.0, 41.0)},
             1: {'shaw': (37.0, 40.5), 'sinusoidal': (35.0, 39.5),
                 'rope': (38.0, 40.0)},
             2: {'shaw': (38.5, 41.0), 'sinusoidal': (36.0, 39.0),
                 'rope': (38.5, 41.5)}}
  text, _ = _report(tmp_path, made_up, convergence.ENCODINGS,
                    stopped_at=8000,
                    curve=lambda long: {6000: long, 7000: long - 1,
                                        8000: long - 1},
                    selected_step=6000)
  assert text.startswith('# Translation to convergence: shaw against '
                         'sinusoidal, and rope\n')
  section = text[text.index('## RoPE against each'):]
  # Converged, per seed: rope minus sinusoidal +2, +0.5, +2.5 (mean 1.67);
  # rope minus shaw +1, -0.5, +0.5; at 3,000 steps minus shaw +1, +1, 0.
  assert ('test_2016_flickr, to convergence: rope minus sinusoidal: +1.67 '
          'BLEU over 3 seeds') in section
  assert 'per seed +2.00, +0.50, +2.50' in section
  assert ('test_2016_flickr, to convergence: rope minus shaw: +0.33 BLEU '
          'over 3 seeds') in section
  assert ('test_2016_flickr, 3,000 steps: rope minus shaw: +0.67 BLEU over '
          '3 seeds') in section
  # val is the test score + 1 in every run: the same differences.
  assert ('val, to convergence: rope minus sinusoidal: +1.67 BLEU over 3 '
          'seeds') in section
  assert '| rope | to convergence | 8000, 8000, 8000 |' in text


def test_the_short_tier_pairs_the_lead_beyond_the_trained_lengths(tmp_path):
  # seed -> label -> (3,000 steps: long, short sources; converged: long,
  # short)
  made_up = {
      0: {'sinusoidal +short': (20.0, 40.0, 24.0, 42.0),
          'shaw +short': (24.0, 41.0, 25.0, 42.0),
          'rope +short': (25.0, 40.0, 26.0, 43.0)},
      1: {'sinusoidal +short': (21.0, 40.0, 25.0, 42.0),
          'shaw +short': (24.0, 40.0, 25.0, 41.0),
          'rope +short': (26.0, 41.0, 27.0, 42.0)},
      2: {'sinusoidal +short': (19.0, 39.0, 24.0, 41.0),
          'shaw +short': (23.0, 40.0, 26.0, 42.0),
          'rope +short': (24.0, 40.0, 24.0, 41.0)}}
  text, workdir = _report(tmp_path, made_up, convergence.SHORT_LABELS,
                          stopped_at=9000,
                          curve=lambda long: {8000: long, 9000: long - 1},
                          selected_step=8000)
  assert text.startswith('# Translation to convergence: shaw against '
                         'sinusoidal; and the +short tier\n')
  section = text[text.index('## Beyond the trained lengths'):]
  long = 'test_2016_flickr sources longer than 18 tokens (never trained)'
  # Long sources, mean of shaw and rope minus sinusoidal, per seed: at
  # 3,000 steps +4.5, +4.0, +4.5; converged +1.5, +1.0, +1.0; the change
  # -3.0, -3.0, -3.5.
  assert (f'{long}, 3,000 steps: mean of shaw, rope minus sinusoidal: +4.33 '
          'BLEU over 3 seeds') in section
  assert (f'{long}, to convergence: mean of shaw, rope minus sinusoidal: '
          '+1.17 BLEU over 3 seeds') in section
  assert 'per seed +1.50, +1.00, +1.00' in section
  assert (f"{long}: mean of shaw, rope's lead to convergence minus at 3,000 "
          'steps: -3.17 BLEU over 3 seeds') in section
  # rope alone, converged: +2, +2, 0.
  assert (f'{long}, to convergence: rope minus sinusoidal: +1.33 BLEU over '
          '3 seeds') in section
  # The growth beyond the trained lengths (long minus short sources),
  # shaw minus sinusoidal at 3,000 steps: (24-41)-(20-40) = +3,
  # (24-40)-(21-40) = +3, (23-40)-(19-39) = +3.
  assert ('test_2016_flickr long minus short sources (the lead\'s growth '
          'beyond the trained lengths), 3,000 steps: shaw minus sinusoidal: '
          '+3.00 BLEU over 3 seeds (95% t-interval across seeds [+3.00, '
          '+3.00]; per seed +3.00, +3.00, +3.00)') in section
  assert '| shaw +short | to convergence | 9000, 9000, 9000 |' in text
  assert (workdir / 'bleu_by_step.png').exists()


def test_the_short_tier_pairs_the_lead_beyond_the_trained_lengths_on_other_splits():
  """The long sources of every split but the main test one, each relative
  encoding against sinusoidal at both budgets and the change; a split
  that lacks the long sources in any run is left out."""
  def run(val_long, mscoco_long):
    return {'splits': {
        'val': {'long_sources': {'bleu': val_long}},
        convergence.MAIN_TEST: {'long_sources': {'bleu': 0.0}},
        'test_2017_mscoco': ({'long_sources': {'bleu': mscoco_long}}
                             if mscoco_long is not None else {})}}
  # label -> seed -> val BLEU on long sources; 3,000 steps then converged.
  short = {'sinusoidal +short': {0: 20, 1: 21}, 'shaw +short': {0: 24, 1: 24},
           'rope +short': {0: 23, 1: 22}}
  long = {'sinusoidal +short': {0: 23, 1: 23}, 'shaw +short': {0: 25, 1: 26},
          'rope +short': {0: 23, 1: 24}}
  as_runs = lambda by, mscoco: {label: {s: run(v, mscoco) for s, v in seeds.items()}
                                for label, seeds in by.items()}
  lines = convergence.short_tier_other_splits(as_runs(long, None),
                                              as_runs(short, None))
  # shaw minus sinusoidal on val: +4, +3 at 3,000 steps; +2, +3 converged.
  assert lines[0].startswith('val, 3,000 steps: shaw minus sinusoidal: '
                             '+3.50 BLEU over 2 seeds')
  assert lines[1].startswith('val, to convergence: shaw minus sinusoidal: '
                             '+2.50 BLEU over 2 seeds')
  assert lines[2].startswith("val: shaw's lead to convergence minus at 3,000 "
                             'steps: -1.00 BLEU over 2 seeds')
  assert 'per seed -2.00, +0.00' in lines[2]
  # rope: +3, +1 then 0, +1.
  assert lines[4].startswith('val, to convergence: rope minus sinusoidal: '
                             '+0.50 BLEU over 2 seeds')
  assert len(lines) == 6                       # val only: mscoco lacks them
  assert not any(convergence.MAIN_TEST in line for line in lines)
  both = convergence.short_tier_other_splits(as_runs(long, 30.0),
                                             as_runs(short, 30.0))
  assert len(both) == 12 and both[6].startswith('test_2017_mscoco, 3,000 steps')
  # One seed: no pair, no section.
  one = {label: {0: seeds[0]} for label, seeds in short.items()}
  assert convergence.short_tier_other_splits(as_runs(one, None),
                                             as_runs(one, None)) == []


def test_a_short_tier_without_a_pair_says_so_once(tmp_path):
  """One converged +short run: the section is one line saying why there
  is no comparison yet, not one per comparison."""
  made_up = {0: {'sinusoidal +short': (20.0, 40.0, 24.0, 42.0)}}
  text, _ = _report(tmp_path, made_up, ('sinusoidal +short',),
                    stopped_at=9000,
                    curve=lambda long: {8000: long, 9000: long - 1},
                    selected_step=8000)
  section = text[text.index('## Beyond the trained lengths'):]
  section = section[:section.index('\n## ', 1)]
  lines = [line for line in section.splitlines() if line.startswith('- ')]
  assert lines == ['- No pair yet: each comparison needs two seeds with '
                   'every +short encoding finished at both budgets (1 '
                   'converged +short run so far).']


def test_the_short_tier_by_source_length_pairs_seeds_across_budgets(tmp_path):
  """The +short tier's BLEU by source length: per (label, budget) the
  seeds that have both budgets, their means in the table, and the plot."""
  bins = ['1-10', '11-14', '15-18', '19-22', '23-64']

  def run(*bleu):   # a translation.json's MAIN_TEST BLEU per length bin
    return {'splits': {convergence.MAIN_TEST: {'by_length': {
        b: {'bleu': v} for b, v in zip(bins, bleu)}}}}

  long_by = {'sinusoidal +short': {0: run(47, 42, 37, 28, 17),
                                   1: run(45, 40, 35, 26, 15)},
             'shaw +short': {0: run(48, 42, 38, 33, 21)},
             # No 3,000-step run of this seed: left out.
             'rope +short': {2: run(50, 45, 40, 35, 25)}}
  short_by = {'sinusoidal +short': {0: run(46, 41, 36, 29, 17),
                                    1: run(44, 39, 34, 27, 14),
                                    2: run(1, 1, 1, 1, 1)},
              'shaw +short': {0: run(49, 43, 39, 34, 22)}}
  curves = convergence.short_length_curves(long_by, short_by)
  assert list(curves) == [('sinusoidal +short', '3,000 steps'),
                          ('sinusoidal +short', 'to convergence'),
                          ('shaw +short', '3,000 steps'),
                          ('shaw +short', 'to convergence')]
  np.testing.assert_array_equal(
      curves['sinusoidal +short', '3,000 steps'],
      [[46, 41, 36, 29, 17], [44, 39, 34, 27, 14]])   # seed 2 has no pair
  table = convergence.short_length_table(curves)
  assert ('| sinusoidal +short | 3,000 steps | 2 | 45.00 | 40.00 | 35.00 | '
          '28.00 | 15.50 |') in table
  assert ('| shaw +short | to convergence | 1 | 48.00 | 42.00 | 38.00 | '
          '33.00 | 21.00 |') in table
  assert '19-22 (never trained)' in table and '15-18 (never' not in table
  path = tmp_path / 'by_length.png'
  assert convergence.plot_short_by_length(curves, str(path))
  assert path.stat().st_size > 0
  # Runs scored without length bins (older files): no curve, no plot.
  assert convergence.short_length_curves(
      {'shaw +short': {0: {'splits': {convergence.MAIN_TEST: {}}}}},
      {'shaw +short': {0: run(1, 1, 1, 1, 1)}}) == {}
  assert not convergence.plot_short_by_length({}, str(tmp_path / 'no.png'))
  assert not (tmp_path / 'no.png').exists()

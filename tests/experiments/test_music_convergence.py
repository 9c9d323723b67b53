"""The music convergence check: its plan, its choice of checkpoint and its
report, on made-up scores whose paired differences are known."""

import dataclasses
import json
import os
import pathlib

from convergence_runs import assert_convergence_budget
from convergence_runs import fake_converged_run
from data import REQUIRES_JSB
from experiments import music as music_study
from experiments import music_convergence as convergence
from experiments import music_meter_convergence as meter_convergence
from experiments import study
from selfattn.training.config_checks import validate_config


def test_the_plan_is_the_first_pass_protocol_with_a_held_out_stop():
  runs = convergence.MusicConvergence().runs('cpu', 3, None)
  # The core pair at every seed first, then rope and learned.
  assert [r.name for r in runs[:6]] == [
      f'position={p},seed={s}' for s in range(3) for p in ('shaw', 'sinusoidal')]
  assert {r.tags['position'] for r in runs[6:]} == {'rope', 'learned'}
  short = {r.name: r.config for r in music_study.study_runs(
      'cpu', 3, convergence.ENCODINGS)}
  for run in runs:
    t, e = run.config.train, run.config.eval
    assert_convergence_budget(run.config, convergence, 'loss')
    # The loop evaluates held-out crops, the stop's measure.
    assert run.config.task.eval_split == 'valid'
    assert e.num_examples == convergence.EVAL_EXAMPLES
    # Everything else is the 1,000-step study's run of the same name (its
    # first pass: no meter, crops on any step).
    same = short[run.name]
    assert run.config.model.to_dict() == same.model.to_dict()
    assert run.config.model.meter_period == 0
    assert run.config.task.to_dict() == {**same.task.to_dict(),
                                         'eval_split': 'valid'}
    for field in ('learning_rate', 'warmup_steps', 'schedule', 'batch_size',
                  'final_lr_fraction', 'b2', 'weight_decay'):
      assert t[field] == same.train[field]


@REQUIRES_JSB
def test_every_planned_run_passes_validation():
  """What a run checks before it trains, for each distinct config of the
  plan (the validation crops' option included)."""
  runs = convergence.MusicConvergence().runs('cpu', 1, None)
  for run in study.distinct_but_seed(runs):
    task = validate_config(run.config, num_devices=1)
    assert task.name == 'jsb_chorales' and run.config.task.eval_split == 'valid'


def _record(path, curve, stopped_at):
  fake_converged_run(path, stopped_at=stopped_at, curve=curve,
                     metric='loss', patience=3, length=256)


def test_the_scored_checkpoint_has_the_lowest_held_out_loss(tmp_path):
  _record(tmp_path / 'a', {500: 0.9, 1000: 0.7, 1500: 0.65, 2000: 0.65,
                           2500: 0.66}, 2500)
  assert convergence.chosen_step(str(tmp_path / 'a')) == 1500  # earlier tie


def test_the_meter_plan_is_the_meter_rows_with_the_same_stop():
  """The meter study trains the music study's +bar+meter rows of shaw and
  sinusoidal, seed-major, under the first-pass convergence study's budget."""
  runs = meter_convergence.STUDY.runs('cpu', 3, None)
  assert [r.name for r in runs] == [
      f'position={p}+bar+meter,seed={s}' for s in range(3)
      for p in ('shaw', 'sinusoidal')]
  short = {r.name: r.config for r in music_study.study_runs(
      'cpu', 3, meter_convergence.METER.labels)}
  first_pass = {r.tags['position']: r.config
                for r in convergence.MusicConvergence().runs('cpu', 1, None)}
  for run in runs:
    assert_convergence_budget(run.config, convergence, 'loss')
    same = short[run.name]
    assert run.config.model.to_dict() == same.model.to_dict()
    assert run.config.task.to_dict() == {**same.task.to_dict(),
                                         'eval_split': 'valid'}
    assert (run.config.model.meter_period, run.config.task.crop_align) == (
        16, 16)
    # The same budget as the converged first pass it is paired with.
    before = first_pass[music_study.ENCODINGS[run.tags['position']][0]]
    assert run.config.train.to_dict() == before.train.to_dict()
    assert run.config.eval.to_dict() == before.eval.to_dict()


def _made_up_report(tmp_path, made_up: dict, labels,
                    design=convergence.FIRST_PASS) -> tuple[str, pathlib.Path]:
  """(the report, the workdir) of converged runs of `labels` at the seeds
  of made_up: seed -> label -> (1,000-step test NLL, converged test NLL);
  valid NLL is the test NLL - 0.02 in every run, the best step 20 of 40."""
  short_dir, workdir = tmp_path / 'short', tmp_path / 'long'
  runs = convergence.study_runs('quick', len(made_up), labels)
  results = {}
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    short, long = made_up[seed][label]
    os.makedirs(short_dir / run.name)
    (short_dir / run.name / 'music.json').write_text(json.dumps(
        {'valid_nll': short - 0.02, 'test_nll': short}))
    _record(workdir / run.name, {10: long + 0.1, 20: long, 30: long + 0.01,
                                 40: long + 0.02}, 40)
    results[run.name] = {'valid_nll': long - 0.02, 'test_nll': long,
                         'selected_step': 20, 'label': label, 'seed': seed}
  return (convergence.report(str(workdir), runs, results, str(short_dir),
                             design), workdir)


def test_the_report_pairs_the_lead_at_both_budgets_by_seed(tmp_path):
  made_up = {0: {'shaw': (0.60, 0.55), 'sinusoidal': (0.78, 0.58)},
             1: {'shaw': (0.61, 0.56), 'sinusoidal': (0.77, 0.60)},
             2: {'shaw': (0.59, 0.54), 'sinusoidal': (0.79, 0.55)}}
  text, workdir = _made_up_report(tmp_path, made_up, convergence.CORE)
  # Per seed, shaw minus sinusoidal: at 1,000 steps -0.18, -0.16, -0.20;
  # converged -0.03, -0.04, -0.01; the change +0.15, +0.12, +0.19.
  assert ('test NLL, 1,000 steps: shaw minus sinusoidal: -0.1800 nats over '
          '3 seeds') in text
  assert ('test NLL, to convergence: shaw minus sinusoidal: -0.0267 nats '
          'over 3 seeds') in text
  assert ('test NLL: shaw minus sinusoidal, to convergence minus at 1,000 '
          'steps: +0.1533 nats over 3 seeds') in text
  assert 'per seed +0.1500, +0.1200, +0.1900' in text
  assert 'valid NLL, to convergence: shaw minus sinusoidal: -0.0267' in text
  assert '| shaw | to convergence | 40, 40, 40 | 20, 20, 20 |' in text
  assert 'cosine schedule built for 40 steps' in text       # the runs' own
  assert 'mean of shaw, rope' not in text        # no rope or learned runs
  assert 'rope minus sinusoidal' not in text
  assert (workdir / 'valid_loss_by_step.png').exists()
  stored = json.loads((workdir / 'results.json').read_text())
  assert stored['position=shaw,seed=1']['valid_crop_loss']['20'] == 0.56
  assert stored['position=shaw,seed=1']['stopped_at'] == 40


def test_rope_is_paired_with_sinusoidal_once_it_has_converged_runs(tmp_path):
  """rope's own line against sinusoidal (the group line of relative minus
  absolute waits for learned too, and would average rope with shaw)."""
  made_up = {seed: {'shaw': (0.60, 0.50), 'sinusoidal': (0.90, 0.55),
                    'rope': (0.64, rope)}
             for seed, rope in ((0, 0.57), (1, 0.58), (2, 0.61))}
  text, _ = _made_up_report(tmp_path, made_up,
                            ('shaw', 'sinusoidal', 'rope'))
  # Per seed, rope minus sinusoidal converged: +0.02, +0.03, +0.06; at
  # 1,000 steps -0.26 at every seed.
  assert ('test NLL, to convergence: rope minus sinusoidal: +0.0367 nats over '
          '3 seeds') in text
  assert 'per seed +0.0200, +0.0300, +0.0600' in text
  assert ('test NLL, 1,000 steps: rope minus sinusoidal: -0.2600 nats over '
          '3 seeds') in text
  assert 'learned minus sinusoidal' not in text   # no learned runs
  assert 'mean of shaw, rope' not in text


def test_the_meter_report_pairs_each_row_with_its_first_pass_by_seed(
    tmp_path):
  """What the meter is worth at the early stop: each +bar+meter run minus
  the same position's early-stopped first-pass run of its seed, and shaw's
  change minus sinusoidal's; paired by seed (seed 1 has no first-pass
  sinusoidal run, so shaw's line has three seeds and the others two), the
  validation lines from validation NLL."""
  meter = {seed: {'shaw +bar+meter': (0.49, shaw),
                  'sinusoidal +bar+meter': (0.66, sinusoidal)}
           for seed, shaw, sinusoidal in ((0, 0.47, 0.50), (1, 0.48, 0.52),
                                          (2, 0.46, 0.50))}
  first_pass = {'shaw': {0: 0.51, 1: 0.50, 2: 0.49},
                'sinusoidal': {0: 0.53, 2: 0.52}}
  before_dir = tmp_path / 'first_pass'
  for position, by_seed in first_pass.items():
    for seed, test_nll in by_seed.items():
      path = before_dir / f'position={position},seed={seed}'
      os.makedirs(path)
      # Validation 0.05 below test here, 0.02 in the meter runs: the valid
      # differences are the test ones + 0.03.
      (path / 'music.json').write_text(json.dumps(
          {'valid_nll': test_nll - 0.05, 'test_nll': test_nll}))
  design = dataclasses.replace(meter_convergence.METER,
                               without_dir=str(before_dir))
  text, _ = _made_up_report(tmp_path, meter, design.labels, design)
  assert text.startswith('# Music to convergence with the meter')

  def line(split, name):
    start = f'- {split} NLL, both early-stopped: {name}: '
    found = [l for l in text.split('\n') if l.startswith(start)]
    assert len(found) == 1, start
    return found[0][2:]

  without = f'without bar-aligned crops or the meter ({before_dir})'
  # shaw: test -0.04, -0.02, -0.03 (seeds 0, 1, 2); valid +0.03 on each.
  assert line('test', f'shaw +bar+meter minus shaw {without}').endswith(
      '-0.0300 nats over 3 seeds (95% t-interval across seeds '
      '[-0.0548, -0.0052]; per seed -0.0400, -0.0200, -0.0300)')
  assert line('valid', f'shaw +bar+meter minus shaw {without}').endswith(
      'per seed -0.0100, +0.0100, +0.0000)')
  # sinusoidal: seeds 0 and 2 only, -0.03 and -0.02.
  assert line('test', f'sinusoidal +bar+meter minus sinusoidal {without}'
              ).endswith('per seed -0.0300, -0.0200)')
  # shaw's change minus sinusoidal's at seeds 0 and 2: -0.01, -0.01.
  change = ("shaw +bar+meter's change from its first pass minus sinusoidal "
            "+bar+meter's (negative: the meter and bar-aligned crops help "
            "shaw +bar+meter more)")
  assert ': -0.0100 nats over 2 seeds' in line('test', change)
  assert line('valid', change).endswith('per seed -0.0100, -0.0100)')
  assert ('test NLL, to convergence: shaw +bar+meter minus sinusoidal '
          '+bar+meter: -0.0367 nats') in text
  assert f'early-stopped runs of the same seeds in {before_dir}' in text
  assert 'mean of shaw, rope' not in text

"""The indirect-indexing convergence check: its plan, its choice of
checkpoint, its scoring on strings the loop never evaluated, and its report
on made-up scores whose paired differences are known."""

import json
import os

import numpy as np

from convergence_runs import assert_convergence_budget
from convergence_runs import assert_same_but_budget
from convergence_runs import fake_converged_run
from experiments import indirect_indexing as ii_study
from experiments import indirect_indexing_convergence as convergence
from experiments import study
from selfattn.training import checkpoints
from selfattn.training import workdir as workdir_lib
from selfattn.training.config_checks import validate_config


def test_the_plan_is_section_7s_protocol_with_a_held_out_stop():
  runs = convergence.IndirectIndexingConvergence().runs('cpu', 3, None)
  # The core pair at every seed first, then none.
  assert [r.name for r in runs[:6]] == [
      f'position={p},seed={s}' for s in range(3) for p in ('pope', 'rope')]
  assert [r.name for r in runs[6:]] == [f'position=none,seed={s}'
                                        for s in range(3)]
  short = {r.name: r.config for r in ii_study.study_runs(
      'small', 3, convergence.ENCODINGS)}
  for run in runs:
    assert_convergence_budget(run.config, convergence, 'loss')
    # Everything else is the 4,000-step study's run of the same name.
    same = short[run.name]
    assert same.train.num_steps == convergence.SHORT_STEPS
    assert_same_but_budget(run.config, same)


def test_every_planned_run_passes_validation():
  runs = convergence.IndirectIndexingConvergence().runs('cpu', 1, None)
  for run in study.distinct_but_seed(runs):
    assert validate_config(run.config, num_devices=1).name == 'indirect_indexing'


def test_the_scored_checkpoint_has_the_lowest_held_out_loss(tmp_path):
  fake_converged_run(tmp_path / 'a', stopped_at=5000, metric='loss',
                     patience=3, length=40,
                     curve={1000: 3.9, 2000: 3.7, 3000: 3.6, 4000: 3.6,
                            5000: 3.65})
  assert convergence.chosen_step(str(tmp_path / 'a')) == 3000  # earlier tie


def test_scoring_restores_the_chosen_step_and_reads_fresh_strings(tmp_path):
  """Two checkpoints with different parameters; the record chooses the
  first. The score is that checkpoint's evaluation on the strings of seed
  + SCORE_SEED_OFFSET, which differ from the loop's (the seed's own)."""
  from selfattn.training.steps import Trainer
  run = convergence.study_runs('quick', 1, ('rope',))[0]
  # One length, few strings: each Trainer compiles its own evaluation.
  run.config.eval.lengths, run.config.eval.num_examples = [40], 16
  path = tmp_path / run.name
  trainer = Trainer(run.config)
  chosen = trainer.init_state()
  other = {**chosen, 'params': jax_scaled(chosen['params'], 3.0)}
  mngr = checkpoints.manager(str(path), keep=2)
  checkpoints.save(mngr, 10, chosen)
  checkpoints.save(mngr, 20, other)
  checkpoints.wait(mngr)
  mngr.close()
  workdir_lib.write_json(os.path.join(path, 'early_stop.json'), {
      'evaluations': [{'step': 10, 'length': 40, 'value': 3.0},
                      {'step': 20, 'length': 40, 'value': 3.5}]})
  loop = trainer.evaluate(chosen['params'])          # the loop's strings
  workdir_lib.write_json(os.path.join(path, workdir_lib.EVALUATED_FILE), {
      'step': 20, 'history': [
          {'step': 10, 'eval': {str(n): m for n, m in loop.items()}},
          {'step': 20, 'eval': {}}]})

  scored = convergence.score_run(run, str(path))
  assert scored['selected_step'] == 10
  assert scored['eval_seed'] == run.config.seed + convergence.SCORE_SEED_OFFSET
  fresh_config = run.config.copy_and_resolve_references()
  fresh_config.seed = scored['eval_seed']
  fresh = Trainer(fresh_config).evaluate(chosen['params'])
  assert set(scored['eval']) == {str(n) for n in run.config.eval.lengths}
  for n, metrics in fresh.items():
    np.testing.assert_allclose(scored['eval'][str(n)]['loss'],
                               metrics['loss'], rtol=1e-6)
  # Other strings than the loop's: the same parameters score other losses.
  assert all(abs(scored['eval'][str(n)]['loss'] - loop[n]['loss']) > 1e-4
             for n in loop)
  assert scored['loop_eval']['40']['loss'] == loop[40]['loss']
  # Computed once: the file is the score from then on.
  assert json.loads((path / convergence.SCORE_FILE).read_text()) == scored


def jax_scaled(tree, factor):
  import jax
  return jax.tree.map(lambda x: x * factor, tree)


def _made_up_report(tmp_path, made_up: dict, labels) -> str:
  """The report of converged runs of `labels` at the seeds of made_up:
  seed -> label -> (4,000-step accuracy, converged accuracy), the same at
  every length; the best step 20 of 40."""
  short_dir, workdir = tmp_path / 'short', tmp_path / 'long'
  runs = convergence.study_runs('quick', len(made_up), labels)
  results = {}
  lengths = ii_study.IN_DISTRIBUTION + ii_study.BEYOND
  for run in runs:
    label, seed = run.tags['position'], run.tags['seed']
    short, long = made_up[seed][label]
    os.makedirs(short_dir / run.name)
    (short_dir / run.name / 'summary.json').write_text(json.dumps(
        {'step': 4000,
         'eval': {str(n): {'token_accuracy': short} for n in lengths}}))
    fake_converged_run(workdir / run.name, stopped_at=40, metric='loss',
                       patience=3, length=40,
                       curve={10: 3.9, 20: 3.5, 30: 3.6, 40: 3.7})
    evaluations = {str(n): {'token_accuracy': long + 0.01} for n in lengths}
    workdir_lib.write_json(
        os.path.join(workdir / run.name, workdir_lib.EVALUATED_FILE),
        {'step': 40, 'history': [{'step': s, 'eval': evaluations}
                                 for s in (10, 20, 30, 40)]})
    results[run.name] = {
        'selected_step': 20, 'eval_seed': seed + 1000, 'label': label,
        'seed': seed, 'loop_eval': evaluations,
        'eval': {str(n): {'token_accuracy': long} for n in lengths}}
  return convergence.report(str(workdir), runs, results, str(short_dir))


def test_the_report_pairs_the_lead_at_both_budgets_by_seed(tmp_path):
  made_up = {0: {'pope': (0.070, 0.090), 'rope': (0.040, 0.080)},
             1: {'pope': (0.065, 0.085), 'rope': (0.035, 0.085)},
             2: {'pope': (0.060, 0.100), 'rope': (0.040, 0.070)}}
  text = _made_up_report(tmp_path, made_up, convergence.CORE)
  # Per seed, pope minus rope in points: at 4,000 steps +3, +3, +2;
  # converged +1, 0, +3; the change -2, -3, +1.
  assert ('lengths 20-40, 4,000 steps: pope minus rope: +2.67 points over '
          '3 seeds') in text
  assert ('lengths 44-52, to convergence: pope minus rope: +1.33 points '
          'over 3 seeds') in text
  assert ('lengths 20-40: pope minus rope, to convergence minus at 4,000 '
          'steps: -1.33 points over 3 seeds') in text
  assert 'per seed -2.00, -3.00, +1.00' in text
  assert '| pope | to convergence | 40, 40, 40 | 20, 20, 20 | 9.167 ± 0.764' in text
  assert 'rope minus none' not in text               # no none runs
  # The loop's strings read 1 point higher than the fresh ones.
  assert 'minus on fresh ones: +1.00 points, mean over 6 runs' in text
  assert (tmp_path / 'long' / 'loss_and_accuracy_by_step.png').exists()
  stored = json.loads((tmp_path / 'long' / 'results.json').read_text())
  assert stored['position=rope,seed=1']['held_out_loss']['20'] == 3.5
  assert stored['position=rope,seed=1']['accuracy']['52'] == 0.085
  assert stored['position=rope,seed=1']['stopped_at'] == 40


def test_none_is_paired_with_rope_once_it_has_converged_runs(tmp_path):
  made_up = {seed: {'pope': (0.07, 0.09), 'rope': (0.04, rope),
                    'none': (0.04, 0.05)}
             for seed, rope in ((0, 0.06), (1, 0.07), (2, 0.05))}
  text = _made_up_report(tmp_path, made_up, convergence.ENCODINGS)
  assert ('lengths 20-40, to convergence: rope minus none: +1.00 points over '
          '3 seeds') in text
  assert text.startswith('# Indirect indexing to convergence: pope against '
                         'rope, and none')

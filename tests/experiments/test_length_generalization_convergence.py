"""The length-generalization convergence check: its plan (section 5's
protocol with a stop on the fit of length 16), the evaluation it reads a
run at, and its report on made-up readings whose paired differences are
known."""

import json
import os

import pytest

from convergence_runs import assert_convergence_budget
from convergence_runs import assert_same_but_budget
from convergence_runs import fake_converged_run
from experiments import length_generalization as lengthgen
from experiments import length_generalization_convergence as convergence
from experiments import skeleton
from experiments import study
from selfattn.training import workdir as workdir_lib
from tiers import EXTENDED
from selfattn.training.config_checks import validate_config


def test_the_plan_is_section_5s_protocol_with_a_stop_on_the_fit():
  runs = convergence.LengthGeneralizationConvergence().runs('cpu', 3, None)
  assert len(runs) == 3 * 2 * 2 * 2
  # Seed-major: every cell of seed 0 before any of seed 1.
  assert [r.tags['seed'] for r in runs] == sorted(r.tags['seed'] for r in runs)
  assert {(r.tags['task'], r.tags['position'], r.tags['random'])
          for r in runs} == {(t, p, x) for t in convergence.TASKS
                             for p in convergence.POSITIONS
                             for x in (False, True)}
  short = {r.name: r.config for r in lengthgen.study_runs(
      'small', 3, convergence.TASKS, convergence.POSITIONS)}
  for run in runs:
    t, e = run.config.train, run.config.eval
    assert_convergence_budget(run.config, convergence, 'token_accuracy')
    assert convergence.SHORT_STEPS % e.every == 0     # evaluated at 2,000
    # What makes step 2,000 the 2,000-step protocol: a rate that does not
    # depend on the number of steps.
    assert (t.schedule, t.warmup_steps) == ('constant', 0)
    same = short[run.name]
    assert same.train.num_steps == convergence.SHORT_STEPS
    assert_same_but_budget(run.config, same)


def test_every_planned_run_passes_validation():
  runs = convergence.LengthGeneralizationConvergence().runs('cpu', 1, None)
  for run in study.distinct_but_seed(runs):
    assert validate_config(run.config, num_devices=1).name in convergence.TASKS


def _fake_run(path, curve: dict, accuracy: dict, stopped_at: int) -> None:
  """A finished run whose early-stopping record at 16 is `curve` (step ->
  accuracy) and whose token accuracy at every evaluated step is
  accuracy[step]: a pair (at 16, at every length above 16)."""
  fake_converged_run(path, stopped_at=stopped_at, metric='token_accuracy',
                     patience=3, length=16, curve=curve)
  history = []
  for step, (trained, longer) in accuracy.items():
    evaluation = {'8': {'token_accuracy': 1.0},
                  '16': {'token_accuracy': trained}}
    evaluation |= {str(n): {'token_accuracy': longer} for n in range(17, 49)}
    history.append({'step': step, 'eval': evaluation})
  workdir_lib.write_json(os.path.join(path, workdir_lib.EVALUATED_FILE),
                         {'step': stopped_at, 'history': history})


def test_a_run_is_read_at_its_best_fit_and_at_2000_steps(tmp_path):
  run = convergence.study_runs('cpu', 1)[0]
  _fake_run(tmp_path / run.name,
            curve={1000: 0.5, 2000: 0.7, 3000: 0.9, 4000: 0.9, 5000: 0.85,
                   6000: 0.89},
            accuracy={s: (0.5 + s / 20_000, 0.4 + s / 40_000)
                      for s in range(1000, 6001, 1000)},
            stopped_at=6000)
  r = convergence.read_run(run, str(tmp_path))
  assert r['stopped_at'] == 6000
  assert r['chosen'] == {'step': 3000, 'trained': 0.65,   # the earlier tie
                         'score': pytest.approx(0.475)}
  assert r['short'] == {'step': 2000, 'trained': 0.6,
                        'score': pytest.approx(0.45)}
  assert (r['task'], r['position'], r['random'], r['seed']) == (
      'reverse_string', 'rope', False, 0)


def test_a_run_without_the_evaluation_it_is_read_at_is_a_clear_error(
    tmp_path):
  """The early-stopping record and the history disagree (a history reset
  on a resume): one line naming the run and the step, not a KeyError."""
  run = convergence.study_runs('cpu', 1)[0]
  _fake_run(tmp_path / run.name,
            curve={1000: 0.5, 2000: 0.7, 3000: 0.9, 4000: 0.9, 5000: 0.85,
                   6000: 0.89},
            accuracy={s: (0.9, 0.5) for s in (1000, 3000, 4000, 5000, 6000)},
            stopped_at=6000)
  with pytest.raises(skeleton.StudyError, match='no evaluation at step 2000'):
    convergence.read_run(run, str(tmp_path))


def test_the_report_pairs_each_comparison_at_both_budgets_by_seed(tmp_path):
  """Scores made up so that, per seed, randomized minus fixed rope is
  +10, +20, +30 points at 2,000 steps and +4, +5, +6 at the read step,
  the same on both tasks; pope equals rope but 2 points lower."""
  runs = convergence.study_runs('cpu', 3)
  workdir, short_dir = tmp_path / 'long', tmp_path / 'short'
  results = {}
  for run in runs:
    t = run.tags
    seed, randomized = t['seed'], t['random']
    short = 0.5 + (0.1 * (seed + 1) if randomized else 0)
    long = 0.7 + (0.01 * (seed + 4) if randomized else 0)
    if t['position'] == 'pope':
      short, long = short - 0.02, long - 0.02
    _fake_run(workdir / run.name, curve={1000: 0.5, 2000: 0.6, 3000: 0.9,
                                         4000: 0.8, 5000: 0.9, 6000: 0.9},
              accuracy={s: (0.9, short if s <= 2000 else long)
                        for s in range(1000, 6001, 1000)},
              stopped_at=6000)
    # The committed runs: seed 0 on a GPU, 3 points off; the others 1.
    gpu = seed == 0
    os.makedirs(short_dir / run.name)
    (short_dir / run.name / 'summary.json').write_text(json.dumps(
        {'score': short - (0.03 if gpu else 0.01),
         'versions': {'jax': '0.11.2' if gpu else '0.10.2',
                      'backend': 'gpu' if gpu else 'cpu'}}))
    results[run.name] = convergence.read_run(run, str(workdir))
  # One more seed's run, diverged: named, in no table.
  diverged = convergence.study_runs('cpu', 4)[-1]
  os.makedirs(workdir / diverged.name)
  (workdir / diverged.name / study.DIVERGED_FILE).write_text(
      json.dumps({'diverged': 'loss nan at step 300'}))
  text = convergence.report(str(workdir), runs + [diverged], results,
                            str(short_dir))
  # Rows: comparison | tasks | 2,000 steps | to convergence | change.
  assert ('| rope: randomized minus fixed | both tasks | +20.00 [-4.84, '
          '+44.84] (3 seeds: +10.0, +20.0, +30.0) | +5.00 [+2.52, +7.48] '
          '(3 seeds: +4.0, +5.0, +6.0) | -15.00 [-37.36, +7.36] (3 seeds: '
          '-6.0, -15.0, -24.0) |') in text
  # Each task alone: the same differences (both tasks were made alike).
  assert ('| rope: randomized minus fixed | reverse_string | +20.00 [-4.84, '
          '+44.84]') in text
  assert ('| pope minus rope, fixed | both tasks | -2.00 [-2.00, -2.00] (3 '
          'seeds: -2.0, -2.0, -2.0) | -2.00 [-2.00, -2.00]') in text
  # The fit at 16 was made the same everywhere: no difference.
  assert ('| pope: randomized minus fixed | duplicate_string | +0.00 [+0.00, '
          '+0.00] (3 seeds: +0.0, +0.0, +0.0) |') in text
  assert ('JAX 0.10.2 on cpu: mean +1.00 points, largest +1.00, over 16 '
          'runs; JAX 0.11.2 on gpu: mean +3.00 points, largest +3.00, over 8 '
          'runs.') in text
  assert ('1 finished run(s) diverged and are in no table or comparison: '
          f'{diverged.name}.') in text
  assert '| reverse_string rope rand. | to convergence | 6000, 6000, 6000 ' \
         '| 3000, 3000, 3000 | 0.900 ± 0.000 | 0.750 ± 0.010 | 3 |' in text
  saved = json.loads((workdir / 'results.json').read_text())
  assert len(saved) == 24
  assert (workdir / 'score_by_step.png').stat().st_size > 0


@EXTENDED
def test_a_capped_run_at_the_short_step_is_the_short_run(tmp_path):
  """The premise of the 2,000-step rows: under the constant rate, a run
  capped higher, evaluated and checkpointed more often and stopped early
  evaluates at the short step exactly as a run that ends there (quick
  scale: the cap 40 against a 20-step run)."""
  from selfattn.training import train
  run = convergence.study_runs('quick', 1, ('reverse_string',), ('rope',))[0]
  short = lengthgen.study_runs('quick', 1, ('reverse_string',), ('rope',))[0]
  short.config.train.num_steps = convergence.QUICK_SHORT_STEPS
  short.config.eval.every = convergence.QUICK_SHORT_STEPS
  train.train_and_evaluate(run.config, str(tmp_path / 'capped'))
  ended = train.train_and_evaluate(short.config, str(tmp_path / 'short'))
  capped = convergence.evaluations(str(tmp_path / 'capped'))
  assert max(capped) > convergence.QUICK_SHORT_STEPS       # trained past it
  assert capped[convergence.QUICK_SHORT_STEPS] == {
      str(n): m for n, m in ended['eval'].items()}

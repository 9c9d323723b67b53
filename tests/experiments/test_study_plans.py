"""Every synthetic-task study's plan, without training: the runs its quick
mode and its default scale would train have unique names, the tags its filters
read, and configs that pass validate_config, the check a run makes before
it trains (and study.execute makes for every run before the first trains,
test_study.py). The studies' trained quick runs are in the extended tier
(test_experiments.py); this is the commit tier's check of the same plans,
at both scales, without running a study.
"""

import importlib
import json

import pytest
from absl import flags

from experiments import common
from experiments import exercise1_depth
from experiments import study
from selfattn.training.config_checks import validate_config

STUDIES = ('compare_positions', 'exercise2_learned', 'exercise3_relative',
           'indirect_indexing', 'length_generalization')


@pytest.fixture
def default_flags():
  """The studies read their absl flags (--task, --positions) when they plan;
  here at their defaults, as a run without them would."""
  parsed = flags.FLAGS.is_parsed()
  if not parsed:
    flags.FLAGS.mark_as_parsed()
  yield
  if not parsed:
    flags.FLAGS.unparse_flags()


@pytest.mark.usefixtures('default_flags')
@pytest.mark.parametrize('module', STUDIES)
@pytest.mark.parametrize('scale', ['quick', 'default'])
def test_every_run_a_study_would_train_has_a_valid_config(module, scale):
  """The quick plan and the plan a run without --scale trains (the
  study's default scale)."""
  spec = importlib.import_module(f'experiments.{module}').STUDY
  scale = spec.default_scale if scale == 'default' else 'quick'
  runs = spec.runs(scale, 2, spec.prepare(scale))
  assert runs
  names = [run.name for run in runs]
  assert len(set(names)) == len(names)
  valid = spec.filter_values()
  for run in runs:
    for tag in spec.filters:
      assert run.tags[tag] in valid[tag], (run.name, tag)
  for run in study.distinct_but_seed(runs):
    validate_config(run.config, num_devices=1)


@pytest.mark.usefixtures('default_flags')
def test_compare_positions_lays_out_a_task_its_default_layout_cannot():
  """--task=duplicate_string failed validation: its output is not aligned
  with its input, and the study kept the default in_place layout."""
  from experiments import compare_positions
  for task in ('duplicate_string', 'reverse'):
    config = compare_positions.task_config(task, quick=True)
    assert validate_config(config, num_devices=1).name == task
  assert config.task.layout == 'in_place'      # reverse's, as committed
  assert compare_positions.task_config('duplicate_string', False
                                       ).task.layout == 'placeholders'


@pytest.mark.usefixtures('default_flags')
def test_compare_positions_steps_stretches_the_schedule_with_ten_evaluations():
  """--steps=10000 (the 5x study, experiments/results/compare_long) trains
  and evaluates 10,000 steps; without it the committed study's 2,000 steps
  and evaluations every 200 stay (a changed config would refuse to resume
  or re-collect its runs)."""
  from absl.testing import flagsaver
  from experiments import compare_positions
  config = compare_positions.task_config('reverse', quick=False)
  assert (config.train.num_steps, config.eval.every) == (2000, 200)
  with flagsaver.flagsaver(steps=10000):
    config = compare_positions.task_config('reverse', quick=False)
  assert (config.train.num_steps, config.eval.every) == (10000, 1000)
  validate_config(config, num_devices=1)


@pytest.mark.usefixtures('default_flags')
def test_compare_positions_reports_the_change_over_the_last_interval(tmp_path):
  """Runs evaluated more than once get a table of their last change, per
  encoding in the ranking's order: made-up histories whose differences are
  known."""
  from experiments import compare_positions
  spec = compare_positions.STUDY
  runs = [run for run in spec.runs('quick', 2, None)
          if run.tags['position'] in ('none', 'rope')]
  summaries = {}
  for run in runs:
    first = 0.3 if run.tags['position'] == 'none' else 0.5
    rise = 0.0 if run.tags['position'] == 'none' else 0.1 * (
        1 + run.tags['seed'])
    history = [{'step': step, 'eval': {str(n): {'token_accuracy': a}
                                       for n in (8, 16)}}
               for step, a in ((150, first), (300, first + rise))]
    summaries[run.name] = dict(_made_up_summary(run, first + rise),
                               history=history)
  text = spec.report(str(tmp_path), runs, summaries, 'quick', None)
  changes = text.split('## Change over the last evaluation interval')[1]
  rows = [line for line in changes.splitlines() if line.startswith('| ')]
  # rope ranks first (0.65 at 8, the longest trained in quick mode); it rose 0.1 and 0.2, none by nothing.
  assert rows[1:] == ['| rope | +0.150 (2 of 2 up) | +0.150 (2 of 2 up) |',
                      '| none | +0.000 (0 of 2 up) | +0.000 (0 of 2 up) |']
  # The same histories drawn as training curves; a single evaluation
  # draws none (the quick plan's runs evaluate once).
  assert '![accuracy at length 8 by step](accuracy_vs_step_reverse.png)' in text
  assert (tmp_path / 'accuracy_vs_step_reverse.png').stat().st_size > 0
  once = {name: dict(s, history=s['history'][-1:])
          for name, s in summaries.items()}
  assert not common.plot_accuracy_vs_step(
      {'rope': list(once.values())}, 8, 'title', str(tmp_path / 'none.png'))
  assert not (tmp_path / 'none.png').exists()


@pytest.mark.parametrize('quick', [True, False])
def test_every_exercise1_training_cell_has_a_valid_config(quick):
  """Exercise 1 is one function, not a Study: its trainability cells are
  built by trainability_settings from training_plan (the trained quick
  run is in the extended tier)."""
  settings = exercise1_depth.trainability_settings(
      *exercise1_depth.training_plan(quick))
  names = [name for name, _ in settings]
  assert len(set(names)) == len(names)
  for _, config in settings:
    validate_config(config, num_devices=1)


def test_rank_collapse_separates_attention_alone_from_attention_with_a_skip():
  """The exercise's first table at a small depth: pure attention collapses
  towards rank one; the skip connection keeps the tokens apart (the quick
  run asserts the same at depth 4, in the extended tier)."""
  curves = exercise1_depth.rank_collapse(depth=4, seeds=1, width=16,
                                         heads=2, length=8)
  assert curves['attention only'][0][4] < 1e-3
  assert curves['attention + skip'][0][4] > 1e-2
  assert set(curves) == set(exercise1_depth.VARIANTS)


def _made_up_summary(run, accuracy):
  """A finished run's summary.json as train_and_evaluate writes it, with
  `accuracy` at every evaluated length."""
  lengths = list(run.config.eval.lengths)
  # Loss and sequence accuracy off the accuracies' range: a number found in
  # the report is an accuracy.
  metrics = {str(n): {'loss': 3.0, 'token_accuracy': accuracy,
                      'sequence_accuracy': 0.0} for n in lengths}
  steps = run.config.train.num_steps
  return {'task': run.config.task.name, 'position': run.config.model.position,
          'chance': 0.25, 'step': steps,
          'train_lengths': [run.config.task.min_len, run.config.task.max_len],
          'eval': metrics, 'score': accuracy,
          'history': [{'step': steps, 'eval': metrics}],
          'train_seconds': 1.0}


@pytest.mark.usefixtures('default_flags')
@pytest.mark.parametrize('module', ('compare_positions', 'exercise3_relative',
                                    'indirect_indexing'))
def test_a_study_report_from_made_up_summaries(module, tmp_path):
  """The report of a study whose tables read only the runs' summaries, on
  made-up ones whose numbers are known: each encoding's made-up accuracy
  reaches results.json and its row of results.md, and the plot is written
  (the drivers' trained quick runs do this end to end, in the extended
  tier)."""
  spec = importlib.import_module(f'experiments.{module}').STUDY
  runs = spec.runs('quick', 1, spec.prepare('quick'))
  # Values no protocol text or default holds, one per run.
  accuracy = {run.name: round(0.4137 + 0.1 * i, 4)
              for i, run in enumerate(runs)}
  summaries = {run.name: _made_up_summary(run, accuracy[run.name])
               for run in runs}
  text = spec.report(str(tmp_path), runs, summaries, 'quick', None)
  assert text == (tmp_path / 'results.md').read_text()
  data = json.loads((tmp_path / 'results.json').read_text())
  shown = json.dumps(data)
  for run in runs:
    # Every run's accuracy in the data, and in the table to three decimals
    # or as a percentage (one seed: the mean is the run's own number).
    value = accuracy[run.name]
    assert str(value) in shown, run.name
    assert f'{value:.3f}' in text or f'{100 * value:.2f}' in text, run.name
  assert list(tmp_path.glob('*.png'))

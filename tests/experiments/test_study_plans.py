"""Every synthetic-task study's plan, without training: the runs its quick
mode and its full scale would train have unique names, the tags its filters
read, and configs that pass validate_config, the check a run makes before
it trains (and study.execute makes for every run before the first trains,
test_study.py). The studies' trained quick runs are in the extended tier
(test_experiments.py); this is the commit tier's check of the same plans,
at both scales, without running a study.
"""

import importlib

import pytest
from absl import flags

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
@pytest.mark.parametrize('scale', ['quick', 'full'])
def test_every_run_a_study_would_train_has_a_valid_config(module, scale):
  spec = importlib.import_module(f'experiments.{module}').STUDY
  scale = spec.default_scale if scale == 'full' else 'quick'
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

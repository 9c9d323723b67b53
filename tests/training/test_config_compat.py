"""A workdir made before a config field existed still resumes: the stored
config.json lacks the field, and the field's default is the old behaviour."""

import json

import pytest

from data import REQUIRES_JSB
from configs import tiny
from selfattn.training import workdir as workdir_lib
from selfattn.errors import ConfigError


def test_a_config_json_from_before_the_newer_fields_still_matches(tmp_path):
  config = tiny.get_config()
  stored = json.loads(config.to_json_best_effort())
  for section, field in (('task', 'max_shift'), ('task', 'transpose'),
                         ('train', 'final_lr_fraction'), ('train', 'b2'),
                         ('model', 'scan_layers'), ('train', 'init_from'),
                         ('model', 'norm_type')):
    del stored[section][field]
  (tmp_path / 'config.json').write_text(json.dumps(stored))
  workdir_lib.check_or_store_config(str(tmp_path), config, write=False)
  # A real difference in one of them is still refused.
  config.train.b2 = 0.99
  try:
    workdir_lib.check_or_store_config(str(tmp_path), config, write=False)
  except ConfigError as e:
    assert 'config.train.b2' in str(e) or 'train.b2' in str(e)
  else:
    raise AssertionError('a changed beta2 resumed silently')


def _dotted_fields(config: dict, prefix: str = '') -> set[str]:
  return set().union(*(
      _dotted_fields(v, f'{prefix}{k}.') if isinstance(v, dict)
      else {prefix + k} for k, v in config.items()))


def test_every_committed_config_json_gets_every_field_of_today():
  """with_added_fields gives each committed run's stored config every field
  of the default config (eval.free_running, eval.figures and the encodings'
  options were missing from its list), so code reading a stored config
  reads no missing field, whichever the run's age."""
  import glob
  import os
  from selfattn.training import default_config
  today = _dotted_fields(json.loads(
      default_config.get_config().to_json_best_effort()))
  paths = glob.glob(os.path.join(os.path.dirname(__file__), '..', '..',
                                 'experiments', 'results', '**',
                                 workdir_lib.CONFIG_FILE), recursive=True)
  assert len(paths) > 100
  for path in paths:
    stored = workdir_lib.with_added_fields(json.loads(open(path).read()))
    assert today <= _dotted_fields(stored), path


# The fields the library once read with `.get(field, default)`: a config
# without one now fails at validation, naming it, instead of running with a
# default repeated far from configs/default.py.
@pytest.mark.parametrize('dotted', [
    'task.layout', 'task.per_batch_length', 'task.shift', 'train.schedule',
    'train.final_lr_fraction', 'train.b2', 'train.init_from',
    'model.attention_impl', 'model.remat', 'model.randomize_positions'])
def test_a_config_without_a_field_is_refused_naming_it(tiny_config, dotted):
  from selfattn.training import config_checks

  section, field = dotted.split('.')
  del tiny_config[section][field]
  with pytest.raises(config_checks.ConfigError,
                     match=f"lacks the field '{field}'"):
    config_checks.validate_config(tiny_config)


def test_validation_builds_the_model_abstractly(monkeypatch, tiny_config):
  """Whatever a model constructor refuses is a ConfigError at validation,
  before any work: the model is built with nnx.eval_shape (a constructor
  made to refuse stands in for a check that only it makes). A message that
  starts with a model field's name names it as config.model.<field>."""
  from selfattn.training import config_checks
  from selfattn.nn import encoder

  config_checks.validate_config(tiny_config)
  for message, expected in (
      ('num_heads=2 is not allowed with this stand-in check',
       'config.model.num_heads=2 is not allowed with this stand-in check'),
      ('heads=2 is not allowed',     # no such field: the generic prefix
       'config.model: the model cannot be built: heads=2 is not allowed'),
      ('something is off', 'config.model: the model cannot be built: '
       'something is off')):
    def refuse(*args, message=message, **kwargs):
      raise ValueError(message)
    monkeypatch.setattr(encoder.TransformerEncoder, '__init__', refuse)
    try:
      config_checks.validate_config(tiny_config)
    except config_checks.ConfigError as e:
      assert str(e) == expected
    else:
      raise AssertionError('the constructor was not consulted')


def test_a_full_disk_at_start_is_one_clear_error_and_leaves_nothing(
    monkeypatch, tmp_path, tiny_config):
  """No space for config.json when a run starts: a ConfigError naming the
  file and the reason (the CLI prints it in one line, exit 2), and the new
  workdir is removed again."""
  import errno
  from selfattn.training import train

  def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, 'No space left on device')

  monkeypatch.setattr(workdir_lib, 'write_json', full)
  workdir = tmp_path / 'new' / 'run'
  try:
    train.train_and_evaluate(tiny_config, str(workdir))
  except ConfigError as e:
    assert str(e) == (f'cannot write {workdir}/config.json: No space left on '
                      f'device; free space or use another --workdir')
  else:
    raise AssertionError('a full disk went unnoticed')
  assert not (tmp_path / 'new').exists()


@pytest.mark.parametrize('module', [pytest.param('music', marks=REQUIRES_JSB),
                                    'indirect_indexing'])
def test_the_published_recipes_validate_and_use_rmsnorm(module):
  """The papers' scales (PoPE's JSB and indirect-indexing recipes) pass
  validation and build RMSNorm blocks, as the paper's models have."""
  import importlib

  from flax import nnx

  from selfattn.training import config_checks
  from selfattn.training import build as build_lib

  config = importlib.import_module(f'configs.{module}').get_config('paper')
  assert config.model.norm_type == 'rmsnorm'
  config_checks.validate_config(config)
  task = build_lib.task_from_config(config)
  abstract = nnx.eval_shape(
      lambda: build_lib.build_model(config, task, nnx.Rngs(0)))
  assert isinstance(abstract.stack.final_ln, nnx.RMSNorm)


def test_every_committed_music_run_still_matches_its_study_config():
  """The CPU music default gained the meter; each committed run of the
  study (first pass and meter rows) must still be the config the study
  would train it with, or resuming and re-collecting would mix configs."""
  import pathlib
  from experiments import music as music_study
  committed = pathlib.Path(__file__).parents[2] / 'experiments/results/music'
  runs = music_study.study_runs('cpu', 5)
  checked = 0
  for run in runs:
    path = committed / run.name
    if (path / 'config.json').exists():
      workdir_lib.check_or_store_config(str(path), run.config, write=False)
      checked += 1
  assert checked >= 80, checked      # 55 first pass + 5 pope_uniform + meter rows
  # And the check would catch the meter left on in a first-pass row.
  shaw = next(r for r in runs if r.name == 'position=shaw,seed=0')
  shaw.config.model.meter_period = 16
  with pytest.raises(ConfigError, match='meter_period'):
    workdir_lib.check_or_store_config(str(committed / shaw.name), shaw.config,
                                      write=False)


def test_the_cpu_music_default_is_the_study_row_it_was_chosen_as():
  """configs/music.py:cpu claims the numbers of the study's 'shaw
  +bar+meter' row (EXPERIMENTS.md section 6): it must be that config."""
  from configs import music as music_config
  from experiments import music as music_study
  row = music_study.study_runs('cpu', 1, ('shaw +bar+meter',))[0].config
  default = music_config.get_config('cpu')
  row.seed = default.seed
  assert row.to_dict() == default.to_dict()

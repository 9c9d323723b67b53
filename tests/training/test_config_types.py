"""A config file can set any value: every field of default_config holds its
type before anything is built, said in one line naming the field (a config
fuzzing probe found wrong types surfacing as tracebacks deep in a task or a
module, and fractions silently truncated where an integer belongs)."""

import math

import ml_collections
import pytest

from configs import tiny
from selfattn.training import cli_checks
from selfattn.training.config_checks import ConfigError
from selfattn.training.config_checks import validate_config


def _written_as_a_dict(section, name, value):
  """tiny's config as a config file may build it: from a dict, where no
  field has a type yet."""
  fields = tiny.get_config().to_dict()
  fields[section][name] = value
  return ml_collections.ConfigDict(fields)


@pytest.mark.parametrize('section, name, value, message', [
    ('model', 'meter_period', 'x', 'config.model.meter_period must be an integer'),
    ('task', 'shift', 1.5, 'config.task.shift must be an integer; got 1.5'),
    ('task', 'crop_align', None, 'config.task.crop_align must be an integer; got None'),
    ('task', 'max_shift', True, 'config.task.max_shift must be an integer; got True'),
    ('eval', 'lengths', 8, 'config.eval.lengths must be a list; got 8'),
    ('task', 'name', ['reverse'], 'config.task.name must be a string'),
    ('model', 'position', None, 'config.model.position must be a string; got None'),
    ('model', 'relative_values', 'no',
     "config.model.relative_values must be True or False; got 'no'"),
    ('train', 'learning_rate', math.nan,
     'config.train.learning_rate must be a finite number; got nan'),
    ('train', 'grad_clip', math.inf, 'config.train.grad_clip must be a finite number'),
])
def test_a_value_of_another_type_names_its_field(section, name, value, message):
  config = _written_as_a_dict(section, name, value)
  with pytest.raises(ConfigError, match='^' + message.replace('.', r'\.')
                     .replace('(', r'\(').replace('[', r'\[')):
    validate_config(config, num_devices=1)


def test_the_types_a_field_allows():
  config = tiny.get_config()
  config.train.learning_rate = 1                # an int where a float goes
  config.eval.lengths = (4, 8)                  # a tuple where a list goes
  config.model.rope_base = None                 # unset: the encoding's default
  config.task.vocab_size = 12
  assert validate_config(config, num_devices=1).vocab_size == 12
  config = _written_as_a_dict('task', 'vocab_size', 12.0)
  with pytest.raises(ConfigError, match='task.vocab_size must be an integer'):
    validate_config(config, num_devices=1)


@pytest.mark.parametrize('override, message', [
    ('--config.eval.lengths=abc', "'abc' is not a list such as [8,16,32]"),
    ('--config.eval.lengths=8,,16', "'8,,16' is not a list"),
    ('--config.task.vocab_size=abc',
     "config.task.vocab_size is an integer; got 'abc'"),
    ('--config.model.rope_base=abc', "config.model.rope_base is a number"),
    ('--config.model.alibi_symmetric=yes',
     "config.model.alibi_symmetric is True or False; got 'yes'"),
    ('--config.model.max_random_len=1.5',
     "config.model.max_random_len is an integer; got '1.5'"),
])
def test_the_command_line_checks_lists_and_unset_fields_too(override, message):
  """Unset fields (placeholders) and lists had no check before absl, whose
  parse error was a FATAL flags message and exit 1."""
  config, _, problem = cli_checks.config_from_argv(
      ['--config=configs/tiny.py', override])
  assert config is None and message in problem and '\n' not in problem
  config, _, problem = cli_checks.config_from_argv(
      ['--config=configs/tiny.py', '--config.eval.lengths=4,8',
       '--config.task.vocab_size=12', '--config.model.alibi_symmetric=false'])
  assert problem is None


def test_a_model_that_cannot_fit_in_memory_is_refused_before_it_is_built(
    monkeypatch):
  """Sizes whose parameters, gradients and AdamW moments alone exceed the
  device's memory failed with out-of-memory tracebacks at the first step
  (after the workdir was written), or took every byte of the host while
  validation built 10**12 layers. The estimate builds one or two layers
  abstractly and scales by depth."""
  from selfattn.training import config_checks
  monkeypatch.setattr(config_checks, '_memory_bytes', lambda: 2**30)  # 1 GiB
  config = tiny.get_config()
  assert validate_config(config, num_devices=1)
  config.model.num_layers = 10**12
  with pytest.raises(ConfigError, match=r'^config\.model: the parameters, '
                     r'gradients and optimiser state alone take [\d,.]+ GiB '
                     r'\(num_layers=1000000000000, .*more than the 1\.0 GiB'):
    validate_config(config, num_devices=1)
  # 16 bytes a parameter: the input embedding and the output layer hold
  # 2 x 2**23 x 16 of them, 4.0 GiB, and three small layers a little more.
  config.model.num_layers = 3
  config.task.vocab_size = 2**23
  with pytest.raises(ConfigError, match=r'take 4\.[01] GiB \(num_layers=3'):
    validate_config(config, num_devices=1)

"""tasks.register_task: a task added from outside the package is valid in a
config, built by name with its own options, and bad registrations are
refused with the reason (configs/own_encoding_and_task.py uses it)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from selfattn import tasks
from selfattn.errors import ConfigError
from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec
from selfattn.training.config_checks import validate_config


@pytest.fixture
def registries():
  """TASKS and DEFAULT_OPTIONS as they were, after the test."""
  from selfattn.tasks import registry
  saved_tasks, saved_options = dict(tasks.TASKS), dict(tasks.DEFAULT_OPTIONS)
  saved_added = dict(registry._ADDED_OPTIONS)
  yield
  registry._ADDED_OPTIONS.clear()
  registry._ADDED_OPTIONS.update(saved_added)
  tasks.TASKS.clear()
  tasks.TASKS.update(saved_tasks)
  tasks.DEFAULT_OPTIONS.clear()
  tasks.DEFAULT_OPTIONS.update(saved_options)


def _offset_sampler(V, options):
  """Output i = (input i + offset) mod V."""
  def sample(key, length, max_length):
    x = jax.random.randint(key, (max_length,), 0, V, dtype=jnp.int32)
    return Example(x, length, (x + options['offset']) % V, length,
                   jnp.ones(max_length, bool))
  return sample


def _spec(**kwargs):
  return TaskSpec(description='output i = input i + offset',
                  make_sampler=_offset_sampler, level='selfattn', aligned=True,
                  order_sensitive=False, **kwargs)


def test_a_registered_task_is_built_by_name_with_its_option(registries):
  tasks.register_task('offset', _spec(options=('offset',)), options={'offset': 3})
  from configs import tiny
  config = tiny.get_config()        # built after registering: the field
  assert config.task.offset == 3     # its default
  config.task.name = 'offset'
  config.task.offset = 2
  task = validate_config(config)
  inputs, targets, weights, valid_len = task.sample(jax.random.key(0), 5, 8)
  inputs, targets = np.asarray(inputs), np.asarray(targets)
  # The in_place layout: targets at the inputs' positions, over V = 8.
  np.testing.assert_array_equal(targets[:5], (inputs[:5] + 2) % 8)
  assert int(valid_len) == 5
  # Another task's option away from its default is refused for it, by name.
  config.task.shift = 2
  with pytest.raises(ConfigError, match='config.task.shift'):
    validate_config(config)
  # Registering again replaces the researcher's own entry and its options
  # (a config file loaded twice, or edited: another default, another name).
  again = _spec(options=('offset',))
  tasks.register_task('offset', again, options={'offset': 5})
  assert tasks.TASKS['offset'] is again and tasks.DEFAULT_OPTIONS['offset'] == 5
  renamed = _spec(options=('step',))
  tasks.register_task('offset', renamed, options={'step': 1})
  assert 'offset' not in tasks.DEFAULT_OPTIONS
  assert tasks.DEFAULT_OPTIONS['step'] == 1


def test_a_run_stored_before_a_task_was_registered_still_resumes(registries,
                                                                 tmp_path):
  """Its config.json lacks the new option; it reads as the default, which
  every other task ignores (workdir.with_added_fields)."""
  import json
  from configs import tiny
  from selfattn.training import workdir as workdir_lib
  before = tiny.get_config()
  (tmp_path / 'config.json').write_text(before.to_json_best_effort())
  tasks.register_task('offset', _spec(options=('offset',)), options={'offset': 3})
  after = tiny.get_config()
  assert 'offset' in after.task and 'offset' not in json.loads(
      (tmp_path / 'config.json').read_text())['task']
  workdir_lib.check_or_store_config(str(tmp_path), after, write=False)
  after.task.offset = 4          # a real difference is still one
  with pytest.raises(ConfigError, match='config.task.offset: stored 3, now 4'):
    workdir_lib.check_or_store_config(str(tmp_path), after, write=False)


def test_an_option_named_like_a_task_field_is_refused_when_the_config_is_built(
    registries):
  tasks.register_task('offset', _spec(options=('max_len',)),
                      options={'max_len': 3})
  from configs import tiny
  with pytest.raises(ValueError, match="option 'max_len' of a registered task "
                     'is named like the field config.task.max_len'):
    tiny.get_config()


@pytest.mark.parametrize('name,options,spec_options,message', [
    ('reverse', {}, (), "'reverse' is one of selfattn's own"),
    ('my-task', {}, (), "task name 'my-task' must be a Python identifier"),
    ('mine', {'vocab_size': 4}, ('vocab_size',),
     "option 'vocab_size' of task 'mine' is taken"),
    ('mine', {'offset': 1.5}, ('offset',), 'its default must be an int'),
    ('mine', {'shift': 4}, ('shift',), "'shift' .* already an option with default 1"),
    ('mine', {}, ('offset',), r'reads option\(s\) offset, which are neither'),
])
def test_bad_registrations_are_refused_with_the_reason(registries, name, options,
                                                       spec_options, message):
  before = dict(tasks.TASKS), dict(tasks.DEFAULT_OPTIONS)
  with pytest.raises(ValueError, match=message):
    tasks.register_task(name, _spec(options=spec_options), options=options)
  assert (dict(tasks.TASKS), dict(tasks.DEFAULT_OPTIONS)) == before

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
  saved_tasks, saved_options = dict(tasks.TASKS), dict(tasks.DEFAULT_OPTIONS)
  yield
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
  # Registering again replaces the researcher's own entry (a config file
  # loaded twice).
  again = _spec(options=('offset',))
  tasks.register_task('offset', again, options={'offset': 3})
  assert tasks.TASKS['offset'] is again


@pytest.mark.parametrize('name,options,spec_options,message', [
    ('reverse', {}, (), "'reverse' is one of selfattn's own"),
    ('my-task', {}, (), "'my-task' cannot be a config field name"),
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

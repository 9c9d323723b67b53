"""Your own encoding and task, without editing selfattn: a config file that
registers them, then builds an ordinary config that names them.

Run:
  python -m selfattn.main --config=configs/own_encoding_and_task.py --workdir=runs/own

Everything else works as for selfattn's own: `--config.model.decay=0.5`,
`--config.task.rotation=3`, validation naming the field, checkpoints,
resuming (rerun this command: the file registers them again), TensorBoard.
To extend selfattn this way, copy this file anywhere (it needs only the installed
package: it builds on selfattn.training.default_config, not on configs/) and import
your own modules here instead of defining them inline.
"""

import jax
import jax.numpy as jnp
import ml_collections

from selfattn import tasks
from selfattn.nn import positions
from selfattn.training import default_config
from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec


class DecayingBias(positions.RelativePosition):
  """A logit bias of -decay * |i - j| on every head: ALiBi with one slope."""

  def __init__(self, *, decay: float):
    # Option errors start with the option's name: validation prefixes
    # 'config.model.' and reports them before any work.
    if not decay > 0:
      raise ValueError(f'decay must be > 0; got {decay}')
    self.decay = decay

  def logits(self, q, k, q_pos=None, k_pos=None):
    """(1, 1, Lq, Lk) float32, added to every head's scaled logits."""
    offsets = positions.position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
    return -self.decay * jnp.abs(offsets).astype(jnp.float32)[None, None]


def _rotate_sampler(V, options):
  """Output i = input (i + rotation) mod L: an aligned task that needs
  order, with its own option."""
  r = options['rotation']

  def sample(key, length, max_length):
    x = jax.random.randint(key, (max_length,), 0, V, dtype=jnp.int32)
    source = (jnp.arange(max_length) + r) % length
    return Example(x, length, x[source], length, jnp.ones(max_length, bool))
  return sample


def _rotation_problem(options, max_len):
  if options['rotation'] < 1:
    return f'config.task.rotation must be >= 1; got {options["rotation"]}'
  return None


positions.register_position(positions.PositionKind(
    'decaying_bias', relative=True, options={'decay': 0.25},
    build=lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
    DecayingBias(**o)))
tasks.register_task('rotate', TaskSpec(
    description='output i = input (i + rotation) mod L',
    make_sampler=_rotate_sampler, level='selfattn', aligned=True,
    options=('rotation',), options_problem=_rotation_problem),
    options={'rotation': 1})


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  # Built after registering, so its fields include the new options.
  config = default_config.get_config(arg)
  config.model.position = 'decaying_bias'
  config.task.name = 'rotate'
  config.train.num_steps = 1000
  return config

"""One source of truth: an encoding's registry entry in nn/positions/registry.py is all
the library and the configs need (docs/library.md: "Adding an encoding")."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from selfattn.nn import positions
from selfattn.training.config_checks import task_from_config
from selfattn.training.config_checks import validate_config
from selfattn.errors import ConfigError
from selfattn.training.build import build_model


class _Toy(positions.RelativePosition):
  """A bias of -toy_slope * |offset| on every head."""

  def __init__(self, *, toy_slope: float = 1.0):
    if not toy_slope > 0:
      raise ValueError(f'toy_slope must be > 0; got {toy_slope}')
    self.toy_slope = toy_slope

  def logits(self, q, k, q_pos=None, k_pos=None):
    offsets = positions.position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
    return -self.toy_slope * jnp.abs(offsets).astype(jnp.float32)[None, None]


@pytest.fixture
def toy(monkeypatch):
  monkeypatch.setitem(positions.POSITIONS, 'toy', positions.PositionKind(
      'toy', True, {'toy_slope': 1.0},
      lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
      _Toy(**o)))


def test_a_new_encoding_needs_only_its_registry_entry(toy):
  from configs import tiny
  config = tiny.get_config()              # configs/default.py reads the registry
  assert 'toy_slope' in config.model and config.model.toy_slope is None
  config.model.position = 'toy'
  config.model.toy_slope = 0.5
  validate_config(config)
  task = task_from_config(config)
  model = build_model(config, task, nnx.Rngs(0))
  relative = model.encoder.blks[0].attention.relative
  assert isinstance(relative, _Toy) and relative.toy_slope == 0.5
  logits = model(jnp.zeros((2, 5), jnp.int32), jnp.array([5, 3]))
  assert logits.shape == (2, 5, task.num_classes)
  assert np.all(np.isfinite(np.asarray(logits)))
  # Its constructor's check is the config check, naming the field.
  config.model.toy_slope = -1.0
  with pytest.raises(ConfigError, match=r'^config.model.toy_slope must be > 0'):
    validate_config(config)
  # Another encoding's option is still refused by name.
  config.model.toy_slope = None
  config.model.position = 'rope'
  config.model.toy_slope = 0.5
  with pytest.raises(ConfigError, match='toy_slope is an option of toy'):
    validate_config(config)

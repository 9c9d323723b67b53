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


@pytest.fixture
def restored_positions():
  saved = dict(positions.POSITIONS)
  yield
  positions.POSITIONS.clear()
  positions.POSITIONS.update(saved)


def test_register_position_adds_an_encoding_and_refuses_a_bad_entry(
    restored_positions):
  """register_position is the toy fixture's entry made from outside the
  package (configs/own_encoding_and_task.py): by name in a config, and a
  bad entry refused with the reason, the registry unchanged."""
  build = lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o: _Toy(**o)
  kind = positions.register_position(
      positions.PositionKind('toy', True, {'toy_slope': 1.0}, build))
  assert positions.POSITIONS['toy'] is kind
  from configs import tiny
  config = tiny.get_config()
  config.model.position, config.model.toy_slope = 'toy', 0.5
  validate_config(config)
  before = dict(positions.POSITIONS)
  for entry, message in (
      (positions.PositionKind('alibi', True, {}, build),
       "'alibi' is one of selfattn's own"),
      (positions.PositionKind('toy', True, {'toy-slope': 1.0}, build),
       "option 'toy-slope' of position encoding 'toy' must be a Python "
       "identifier"),
      (positions.PositionKind('toy-2', True, {}, build),
       "name 'toy-2' must be a Python identifier"),
      # Passed beside build's and the stacks' own keywords.
      (positions.PositionKind('toy', True, {'dropout': 0.5}, build),
       "option 'dropout' of position encoding 'toy' is taken"),
      # rope_base is rope's float option: one config field, one type.
      (positions.PositionKind('toy', True, {'rope_base': 10000}, build),
       "option 'rope_base' of 'toy' has a default of type int, but 'rope' "
       "declares it as float")):
    with pytest.raises(ValueError, match=message):
      positions.register_position(entry)
  assert positions.POSITIONS == before


def test_reserved_option_names_cover_what_the_options_are_passed_beside():
  """An option goes to build beside its keywords and to the encoder and
  decoder beside their own arguments: every one of those is reserved."""
  import inspect
  from selfattn.nn.decoder import TransformerDecoder
  from selfattn.nn.encoder import TransformerEncoder
  for cls in (TransformerEncoder, TransformerDecoder):
    names = {n for n, p in inspect.signature(cls.__init__).parameters.items()
             if n != 'self' and p.kind != p.VAR_KEYWORD}   # the options
    assert names <= positions.registry.RESERVED_OPTION_NAMES, cls


def test_an_option_named_like_a_model_field_is_refused_when_the_config_is_built(
    restored_positions):
  """randomize_positions is a config field, not an argument: the config
  would overwrite it with the option's placeholder."""
  build = lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o: _Toy()
  positions.register_position(positions.PositionKind(
      'toy', True, {'randomize_positions': False}, build))
  from configs import tiny
  with pytest.raises(ValueError, match="option 'randomize_positions' of a "
                     'registered encoding is named like the field '
                     'config.model.randomize_positions'):
    tiny.get_config()

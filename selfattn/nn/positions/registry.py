"""Every encoding by name: how it is built and which options it takes."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax.numpy as jnp
from flax import nnx

from selfattn.nn import registration
from selfattn.nn.masks import check_flag
from selfattn.nn.positions.absolute import LearnedEncoding
from selfattn.nn.positions.absolute import NoEncoding
from selfattn.nn.positions.absolute import SinusoidalEncoding
from selfattn.nn.positions.alibi import ALiBi
from selfattn.nn.positions.huang import HuangRelative
from selfattn.nn.positions.rotary import PolarEncoding
from selfattn.nn.positions.rotary import RotaryEncoding
from selfattn.nn.positions.shaw import ShawRelative
from selfattn.nn.positions.t5 import T5RelativeBias
from selfattn.nn.positions.xl import TransformerXLRelative


@dataclasses.dataclass(frozen=True)
class PositionKind:
  """How one encoding is built: absolute (added once) or relative (per layer)."""
  name: str
  relative: bool
  options: dict[str, Any]   # option name -> default
  build: Callable[..., nnx.Module]
  # Whether build takes causal= (set by decoders): an encoding whose
  # computation differs under a causal mask (Huang et al.'s skew).
  takes_causal: bool = False


POSITIONS: dict[str, PositionKind] = {
    kind.name: kind for kind in [
        PositionKind(
            'none', False, {},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs:
            NoEncoding(num_hiddens, dropout, rngs=rngs)),
        PositionKind(
            'sinusoidal', False, {},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs:
            SinusoidalEncoding(num_hiddens, dropout, max_len, rngs=rngs)),
        PositionKind(
            'learned', False, {'init': 'normal'},
            lambda *, num_hiddens, dropout, max_len, param_dtype, rngs, **o:
            LearnedEncoding(num_hiddens, dropout, max_len,
                            param_dtype=param_dtype, rngs=rngs, **o)),
        PositionKind(
            'shaw', True,
            {'clip_distance': 16, 'relative_values': True,
             'shared_heads': True},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            ShawRelative(num_heads, head_dim, param_dtype=param_dtype,
                         rngs=rngs, **o)),
        PositionKind(
            'huang', True, {'shared_heads': False},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            HuangRelative(num_heads, head_dim, max_len=max_len,
                          param_dtype=param_dtype, rngs=rngs, **o),
            takes_causal=True),
        PositionKind(
            'rope', True, {'rope_base': 10000.0},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            RotaryEncoding(head_dim, **o)),
        PositionKind(
            'pope', True, {'rope_base': 10000.0, 'pope_delta_init': 'zero'},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs,
            rope_base, pope_delta_init:
            PolarEncoding(num_heads, head_dim, rope_base=rope_base,
                          delta_init=pope_delta_init,
                          param_dtype=param_dtype, rngs=rngs)),
        PositionKind(
            'alibi', True, {'alibi_symmetric': False},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs,
            alibi_symmetric:
            ALiBi(num_heads, symmetric=alibi_symmetric)),
        PositionKind(
            'xl', True, {},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs:
            TransformerXLRelative(num_heads, head_dim, max_len=max_len,
                                  param_dtype=param_dtype, rngs=rngs)),
        PositionKind(
            't5', True, {'num_buckets': 32, 'max_distance': 128},
            lambda *, num_heads, head_dim, max_len, param_dtype, rngs, **o:
            T5RelativeBias(num_heads, param_dtype=param_dtype, rngs=rngs,
                           **o)),
    ]
}
# selfattn's own encodings, which register_position never replaces.
_BUILT_IN: frozenset[str] = frozenset(POSITIONS)
POSITION_NAMES: tuple[str, ...] = tuple(POSITIONS)
RELATIVE_NAMES: tuple[str, ...] = tuple(n for n, k in POSITIONS.items()
                                        if k.relative)


# What an encoding's options are passed beside, which an option must not be
# named: build's keywords, and the keyword arguments of the encoder and
# decoder that take the options with their own (tests/nn/test_registry.py
# holds this to their signatures).
RESERVED_OPTION_NAMES = frozenset({
    'num_hiddens', 'num_heads', 'head_dim', 'max_len', 'dropout',
    'param_dtype', 'rngs', 'causal',
    'vocab_size', 'ffn_num_hiddens', 'num_layers', 'position', 'norm',
    'norm_type', 'residual', 'attention_impl', 'remat', 'scan_layers', 'dtype',
    'meter_period', 'meter_step_tokens', 'cross_attention', 'tie_output',
    'use_bias', 'deterministic'})


def register_position(kind: PositionKind) -> PositionKind:
  """Adds an encoding to POSITIONS from outside this package, so configs
  (`--config.model.position=<name>`, its options as `config.model.<option>`),
  their validation and every stack build it by name. Call it before a
  config is built, e.g. at the top of your own config file: configs/
  default.py makes a placeholder per option when get_config runs (and
  refuses an option named like one of its fields).

  Registering a name again replaces your earlier entry (a config file
  loaded twice). Raises ValueError for one of selfattn's own names, a name
  or option that is not a Python identifier, an option in
  RESERVED_OPTION_NAMES, or an option another encoding declares with
  another type (a config field has one type). POSITION_NAMES and
  RELATIVE_NAMES list selfattn's own encodings; POSITIONS is the live
  registry.
  """
  registration.check_entry('position encoding', kind.name, kind.options,
                           _BUILT_IN, RESERVED_OPTION_NAMES)
  others = [k for n, k in POSITIONS.items() if n != kind.name]
  for option, default in kind.options.items():
    for other in others:
      if option in other.options and (type(other.options[option])
                                      is not type(default)):
        raise ValueError(
            f'option {option!r} of {kind.name!r} has a default of type '
            f'{type(default).__name__}, but {other.name!r} declares it as '
            f'{type(other.options[option]).__name__}; use the same type or '
            f'another name')
  POSITIONS[kind.name] = kind
  return kind


def option_types() -> dict[str, type]:
  """Every encoding option and its type, from the registry above: the one
  list that selfattn.training.default_config (placeholders) and config validation read."""
  types: dict[str, type] = {}
  for kind in POSITIONS.values():
    for name, default in kind.options.items():
      types.setdefault(name, type(default))
  return types


def build_encoding(name: str, options: dict[str, Any] | None = None, *,
                   num_hiddens: int, num_heads: int, max_len: int,
                   param_dtype=jnp.float32, rngs: nnx.Rngs) -> nnx.Module:
  """The encoding `name` with `options` (None: its defaults) for a model of
  these sizes, as the stacks build it: a relative one's hooks (per head of
  width num_hiddens // num_heads), to pass as
  `MultiHeadAttention(..., relative=)`, or an absolute one (without
  dropout). Raises get_position's and the constructor's errors."""
  kind, options = get_position(name, options)
  shared = dict(max_len=max_len, param_dtype=param_dtype, rngs=rngs)
  if kind.relative:
    return kind.build(num_heads=num_heads, head_dim=num_hiddens // num_heads,
                      **shared, **options)
  return kind.build(num_hiddens=num_hiddens, dropout=0.0, **shared, **options)


def build_abstract(name: str, options: dict[str, Any], *, num_hiddens: int,
                   num_heads: int, max_len: int) -> None:
  """Builds the encoding without allocating anything (nnx.eval_shape), so
  its constructor's checks of its options run: the one place options are
  validated. Raises the constructor's ValueError."""
  nnx.eval_shape(lambda: build_encoding(
      name, options, num_hiddens=num_hiddens, num_heads=num_heads,
      max_len=max_len, rngs=nnx.Rngs(0)))


def get_position(name: str, options: dict[str, Any] | None = None
                 ) -> tuple[PositionKind, dict[str, Any]]:
  """Looks up an encoding by name and checks its options.

  Returns the kind and its options with defaults filled in. Raises ValueError
  naming the valid encodings, or the valid options of this encoding, and
  TypeError for a switch option (a bool default) given anything but a bool.
  """
  if name not in POSITIONS:
    raise ValueError(f'unknown position encoding {name!r}; valid: '
                     f'{", ".join(POSITIONS)}')
  kind = POSITIONS[name]
  options = dict(options or {})
  unknown = sorted(set(options) - set(kind.options))
  if unknown:
    valid = ', '.join(kind.options) or 'none'
    raise ValueError(f'position encoding {name!r} takes no option(s) '
                     f'{", ".join(unknown)}; its options: {valid}')
  for option, value in options.items():
    if isinstance(kind.options[option], bool):
      check_flag(value, option)        # 'False' is truthy
  return kind, {**kind.options, **options}

"""What the encoder and decoder stacks share: the constructor checks, the
embedding with the absolute encoding, per-layer relative modules, block
construction (a list, or one stacked block for nnx.scan), the loop / scan /
remat runner and the final norm of pre-norm stacks. The stacks keep only
their blocks and their call signatures."""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from selfattn.nn import masks
from selfattn.nn.attention import capturing
from selfattn.nn.attention import check_cache_fit
from selfattn.nn.layers import NORMS
from selfattn.nn.layers import check_norm_type
from selfattn.nn.layers import make_norm
from selfattn.nn.positions import NoEncoding, POSITIONS, get_position


def check_position_options(owner: str, position: str,
                           options: dict) -> None:
  """A keyword that is no encoding's option is a typo: TypeError naming it, as
  Python does. (An option of another encoding is get_position's ValueError.)"""
  known = {name for kind in POSITIONS.values() for name in kind.options}
  unknown = sorted(set(options) - known)
  if unknown:
    raise TypeError(f'{owner}() got an unexpected keyword argument '
                    f'{unknown[0]!r} (position={position!r}; encoding options '
                    f'are passed as keywords: {", ".join(sorted(known))})')


def check_stack(owner: str, position: str, position_options: dict, *,
                norm: str, vocab_size: int | None, num_hiddens: int,
                ffn_num_hiddens: int, num_heads: int, num_layers: int,
                max_len: int, norm_type: str = 'layernorm',
                flags: dict[str, object] | None = None):
  """The checks every stack's constructor makes; returns (kind, options).
  flags: the constructor's switches by name, each True or False.

  Every size is checked here, before anything is built: a float then fails
  alike whatever the encoding (most ignore max_len) and the depth (no layer,
  no FFN to refuse ffn_num_hiddens)."""
  check_position_options(owner, position, position_options)
  for name, value in (flags or {}).items():
    masks.check_flag(value, name)
  if norm not in NORMS:
    raise ValueError(f'norm={norm!r}; valid: {", ".join(NORMS)}')
  check_norm_type(norm_type)
  if vocab_size is not None:         # None: a features-only stack
    masks.check_size(vocab_size, 'vocab_size')
  for name, size in (('num_hiddens', num_hiddens),
                     ('ffn_num_hiddens', ffn_num_hiddens),
                     ('num_heads', num_heads), ('max_len', max_len)):
    masks.check_size(size, name)
  masks.check_size(num_layers, 'num_layers', 0)
  if num_hiddens % num_heads:
    raise ValueError(f'num_hiddens={num_hiddens} is not divisible by '
                     f'num_heads={num_heads}')
  return get_position(position, position_options)


def check_tokens(tokens: jax.Array, name: str = 'tokens', *,
                 takes_ids: bool = True) -> jax.Array:
  """tokens as an array; ValueError naming `name` unless they are (B, L) int
  ids or (B, L, F) float features (a rank-1 array would fail later with an
  IndexError; float ids were read as features and refused for their width).
  Nested Python lists are taken, as jnp.asarray reads them ([[1, 2, 3]]:
  int32 ids); TypeError for any other dtype (bool, complex). takes_ids:
  False for a features-only module (vocab_size=None), whose errors then
  speak of features only."""
  if isinstance(tokens, (list, tuple)):
    tokens = jnp.asarray(tokens)       # jnp.result_type cannot read a list
  shape, dtype = tuple(jnp.shape(tokens)), jnp.result_type(tokens)
  either = '(B, L) int token ids or (B, L, num_hiddens) float features'
  batch_axis = f'a single sequence needs a batch axis: {name}[None]'
  if jnp.issubdtype(dtype, jnp.integer):
    if len(shape) != 2:
      raise ValueError(f'{name} must be (B, L) int token ids; got shape '
                       f'{shape} ({batch_axis})')
  elif not jnp.issubdtype(dtype, jnp.floating):
    raise TypeError(f'{name} must be {either}; got dtype {dtype}')
  elif len(shape) == 2 and takes_ids:
    # Float ids (jnp.array([[1., 2.]]) or a float batch) or one sequence of
    # features: the shape cannot tell which.
    raise ValueError(f'{name} must be {either}; got {dtype} of shape '
                     f'{shape}: cast token ids to integers '
                     f'({name}.astype(jnp.int32)), or {batch_axis}')
  elif len(shape) != 3:
    raise ValueError(f'{name} must be (B, L, num_hiddens) features; got '
                     f'shape {shape} ({batch_axis})')
  return tokens


class EmbeddingMixin:
  """Tokens or features to the first layer's input, with the absolute
  encoding; shared by TransformerEncoder and TransformerDecoder (the modules
  keep `embedding` and `pos_encoding` as their own attributes, so parameter
  paths, and checkpoints, stay those of the chapter's encoder).

  tokens (B, L) int -> Embed * sqrt(num_hiddens); features (B, L, num_hiddens)
  float pass as they are (the caller embedded them). Then the absolute
  encoding at `positions` (None: 0..L-1) and dropout; relative encodings add
  nothing here (dropout only). vocab_size=None: features only.

  With a meter (`_init_meter`, meter_period P > 0), a learned (P,
  num_hiddens) table is added to every input first, at row (position //
  step_tokens) % P: the phase of the position's time step in a cycle of P
  steps (for JSB with bar-aligned crops, P = 16 and 4 tokens a step give
  target i's sixteenth within the bar). It starts at zero, so a model with
  a meter starts as the one without.
  """

  meter: nnx.Embed | None = None
  meter_step_tokens: int = 1

  def _init_meter(self, period: int, step_tokens: int, *, dtype, param_dtype,
                  rngs: nnx.Rngs) -> None:
    """Called last in the stack's constructor, so every other parameter
    draws the values it draws without a meter."""
    period = masks.check_size(period, 'meter_period', 0)      # 0: no meter
    step_tokens = masks.check_size(step_tokens, 'meter_step_tokens')
    if period:
      self.meter = nnx.Embed(period, self.num_hiddens, dtype=dtype,
                             param_dtype=param_dtype,
                             embedding_init=nnx.initializers.zeros,
                             rngs=rngs)
      self.meter_step_tokens = step_tokens

  def _init_layers(self, make_block: Callable[[object, nnx.Rngs], nnx.Module],
                   *, vocab_size: int | None, num_hiddens: int,
                   num_heads: int, num_layers: int, dropout: float, kind,
                   options: dict, max_len: int, norm: str, norm_type: str,
                   causal: bool, remat: bool, scan_layers: bool, dtype,
                   param_dtype, rngs: nnx.Rngs) -> None:
    """What every stack's constructor builds, in this order (the order of
    the parameters' random draws, so checkpoints and golden numbers hold):
    the embedding and absolute encoding, the blocks (each
    make_block(relative, rngs) with its own relative module), the final
    norm."""
    self.num_heads = num_heads
    self.dtype = dtype
    self.remat = remat
    self.scan_layers = scan_layers
    self._init_embedding(vocab_size, num_hiddens, dropout, kind=kind,
                         options=options, max_len=max_len, dtype=dtype,
                         param_dtype=param_dtype, rngs=rngs)
    self.blks = build_blocks(
        make_block, num_layers, scan_layers=scan_layers, kind=kind,
        options=options, num_heads=num_heads,
        head_dim=num_hiddens // num_heads, max_len=max_len, causal=causal,
        param_dtype=param_dtype, rngs=rngs)
    self.final_ln = final_norm(norm, num_hiddens, norm_type=norm_type,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def _init_embedding(self, vocab_size: int | None, num_hiddens: int,
                      dropout: float, *, kind, options: dict, max_len: int,
                      dtype, param_dtype, rngs: nnx.Rngs) -> None:
    self.num_hiddens = num_hiddens
    self.embedding = (None if vocab_size is None else
                      nnx.Embed(vocab_size, num_hiddens, dtype=dtype,
                                param_dtype=param_dtype, rngs=rngs))
    if kind.relative:
      self.pos_encoding = NoEncoding(num_hiddens, dropout, rngs=rngs)
    else:
      self.pos_encoding = kind.build(num_hiddens=num_hiddens, dropout=dropout,
                                     max_len=max_len, param_dtype=param_dtype,
                                     rngs=rngs, **options)

  def embed(self, inputs: jax.Array, *, positions: jax.Array | None = None,
            deterministic: bool | None = None) -> jax.Array:
    """(B, L) tokens or (B, L, num_hiddens) features -> (B, L, num_hiddens)."""
    # Before the meter reads them (its phase is positions mod the period).
    if inputs.ndim >= 2:
      masks.check_positions(positions, *inputs.shape[:2])
    if jnp.issubdtype(inputs.dtype, jnp.integer):
      if self.embedding is None:
        raise ValueError('this module was built with vocab_size=None: pass '
                         '(B, L, num_hiddens) float features, not token ids')
      check_token_ids(inputs, self.embedding.num_embeddings)
      X = self.embedding(inputs) * math.sqrt(self.num_hiddens)
    else:
      if inputs.ndim != 3 or inputs.shape[-1] != self.num_hiddens:
        raise ValueError(f'features must be (B, L, num_hiddens='
                         f'{self.num_hiddens}); got shape {inputs.shape}')
      X = inputs
    if self.meter is not None:
      at = (jnp.arange(X.shape[1], dtype=jnp.int32)[None] if positions is None
            else positions)
      phase = (at // self.meter_step_tokens) % self.meter.num_embeddings
      X = X + self.meter(phase).astype(X.dtype)
    if positions is None:
      return self.pos_encoding(X, deterministic=deterministic)
    return self.pos_encoding(X, positions=positions,
                             deterministic=deterministic)


def check_token_ids(ids: jax.Array, vocab_size: int) -> None:
  """Refuses token ids outside [0, vocab_size) where they are concrete
  (eager calls, and the host before a jitted step): the embedding lookup
  would read NaN for an id >= vocab_size and wrap a negative one around to
  a row from the end, silently. Under jit the ids are traced and cannot be
  checked; call this on the batch first."""
  if isinstance(ids, jax.core.Tracer):
    return
  concrete = np.asarray(ids)
  if concrete.size and (concrete.min() < 0 or concrete.max() >= vocab_size):
    raise ValueError(f'token ids must lie in [0, vocab_size={vocab_size}); '
                     f'got values from {concrete.min()} to {concrete.max()}')


class CacheMixin:
  """Cached decoding for a causal stack (TransformerDecoder, and a
  TransformerEncoder built causal): `init_cache` makes every layer's
  key/value cache and the next position; `_start_decode` checks one step
  against them. The stack names its blocks' self-attention attribute in
  `_self_attention`."""

  _self_attention: str

  def _init_cache_fields(self) -> None:
    self.next_position: nnx.Cache | None = nnx.data(None)
    self.cache_shape: nnx.Cache | None = nnx.data(None)

  def init_cache(self, batch_size: int, max_length: int, dtype=None) -> None:
    """Empty caches for decode=True calls: every layer's keys and values
    (batch_size, heads, max_length, head_dim), and the next position.
    Refuses a max_length past what the position encoding can address the
    way the full pass does (its `position_limit`: a learned table's max_len,
    whose later positions would all read its last row under jit; XL's
    max_len, past which the cached steps clip offsets that the full pass
    does not), silently otherwise. Sizes are integers >= 1 (TypeError,
    ValueError)."""
    batch_size = masks.check_size(batch_size, 'batch_size')
    max_length = masks.check_size(max_length, 'max_length')
    first = self.blks if self.scan_layers else self.blks[0]
    for encoding in (getattr(self, 'pos_encoding', None),
                     getattr(getattr(first, self._self_attention), 'relative',
                             None)):
      limit = getattr(encoding, 'position_limit', None)
      if limit is not None and max_length > limit:
        raise ValueError(
            f'a decoding cache of {max_length} positions exceeds the '
            f'{type(encoding).__name__}\'s max_len={limit}: generate at most '
            f'{limit} tokens in all (prompt included), or build the model '
            f'with a larger max_len')
    def init(blk):
      getattr(blk, self._self_attention).init_cache(batch_size, max_length,
                                                    dtype)
    if self.scan_layers:
      nnx.vmap(init, in_axes=0, out_axes=0)(self.blks)   # one per layer
    else:
      for blk in self.blks:
        init(blk)
    self.next_position = nnx.Cache(jnp.zeros((), jnp.int32))
    # (batch_size, max_length) as the shape of a placeholder: shapes, unlike
    # plain int attributes, travel through nnx.jit as state.
    self.cache_shape = nnx.Cache(jnp.zeros((batch_size, max_length), bool))

  def drop_cache(self) -> None:
    """Removes what init_cache made, every layer's cache included: the
    stack's state is then what it was before decoding (the decode loops
    of decoding.py call it when they finish)."""
    if self.scan_layers:
      getattr(self.blks, self._self_attention).drop_cache()   # stacked
    else:
      for blk in self.blks:
        getattr(blk, self._self_attention).drop_cache()
    self.next_position = None
    self.cache_shape = None

  def reorder_cache(self, rows: jax.Array) -> None:
    """Row i of every cache becomes row rows[i] (beam search: each
    surviving hypothesis continues its parent's keys and values)."""
    axis = 1 if self.scan_layers else 0        # scanned caches: (layers, B, ...)

    def reorder(blk):
      cache = getattr(blk, self._self_attention).cache
      for name in ('key', 'value', 'positions'):
        cache[name][...] = jnp.take(cache[name][...], rows, axis=axis)

    if self.scan_layers:
      reorder(self.blks)
    else:
      for blk in self.blks:
        reorder(blk)

  def _start_decode(self, batch: int, length: int,
                    positions: jax.Array | None,
                    mask: jax.Array | None = None
                    ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One decode step of `length` new tokens: (their positions, where they
    go in the caches, overflow). The stack owns its layers' caches: this is
    the one fill counter and the one fit check, and the stack poisons its
    output once (the layers write at the start given, see
    MultiHeadAttention's cache_start). Positions continue from the cache
    unless given; overflow (a bool scalar) says the step runs past the
    caches (attention.poison). A step's mask is checked here, against the
    whole cache, before the counter moves: a refused call changes nothing."""
    if self.next_position is None:
      raise ValueError('decode=True needs caches: call init_cache first')
    if mask is not None:
      masks.check_mask(mask, (batch, self.num_heads, length,
                              self.cache_shape.shape[1]))
    start = self.next_position[...]
    overflow = check_cache_fit(batch, length, start, *self.cache_shape.shape)
    if positions is None:
      positions = jnp.broadcast_to(
          start + jnp.arange(length, dtype=jnp.int32), (batch, length))
    self.next_position[...] = start + length
    return positions, start, overflow


def relative_layers(kind, options: dict, num_layers: int, *, num_heads: int,
                    head_dim: int, max_len: int, causal: bool, param_dtype,
                    rngs: nnx.Rngs) -> list:
  """One relative-position module per layer (None for absolute encodings)."""
  if not kind.relative:
    return [None] * num_layers
  if kind.takes_causal:
    options = {**options, 'causal': causal}
  return [kind.build(num_heads=num_heads, head_dim=head_dim, max_len=max_len,
                     param_dtype=param_dtype, rngs=rngs, **options)
          for _ in range(num_layers)]


def build_blocks(make_block: Callable[[object, nnx.Rngs], nnx.Module],
                 num_layers: int, *, scan_layers: bool, kind, options: dict,
                 num_heads: int, head_dim: int, max_len: int, causal: bool,
                 param_dtype, rngs: nnx.Rngs) -> nnx.Module:
  """num_layers blocks, each make_block(relative, rngs) with its own relative
  module (None for absolute encodings).

  Without scan_layers: an nnx.List, every relative module drawn before the
  blocks (the order, hence the initial values, of every earlier run). With
  it: one block whose variables carry a leading layer axis, for nnx.scan (one
  compiled block instead of num_layers); each layer still has its own values
  of everything.
  """
  def relatives(count, rngs):
    return relative_layers(kind, options, count, num_heads=num_heads,
                           head_dim=head_dim, max_len=max_len, causal=causal,
                           param_dtype=param_dtype, rngs=rngs)

  if scan_layers:
    @nnx.split_rngs(splits=num_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def stacked(rngs):
      return make_block(relatives(1, rngs)[0], rngs)
    return stacked(rngs)
  return nnx.List([make_block(relative, rngs)
                   for relative in relatives(num_layers, rngs)])


def final_norm(norm: str, num_hiddens: int, *, norm_type: str = 'layernorm',
               dtype, param_dtype,
               rngs: nnx.Rngs) -> nnx.LayerNorm | nnx.RMSNorm | None:
  """The norm (of norm_type) that closes a pre-norm stack (None for 'post' /
  'none': post-norm blocks end normalised, and 'none' means none)."""
  if norm != 'pre':
    return None
  return make_norm(norm_type, num_hiddens, dtype=dtype,
                   param_dtype=param_dtype, rngs=rngs)


def run_blocks(stack: nnx.Module, run: Callable[..., jax.Array], X: jax.Array,
               *args, remat: bool, keep_hidden: bool = False
               ) -> tuple[jax.Array, list[jax.Array]]:
  """X (B, L, D) through stack.blks, then stack.final_ln (if any).

  run(blk, X, *args) -> X applies one block; args are the same for every
  layer. remat recomputes each block in the backward pass (never while
  capturing attention weights, which remat would drop). With
  stack.scan_layers the blocks are one stacked block run by nnx.scan.

  Returns (output, hidden): hidden is [X, after block 1, ..., after the last
  block] (before the final norm) when keep_hidden, else just [X].
  """
  if remat and not capturing(stack):
    run = nnx.remat(run)
  hidden = [X]
  if stack.scan_layers:
    def step(blk, X, *args):
      X = run(blk, X, *args)
      return X, (X if keep_hidden else None)
    scanned = nnx.scan(step, in_axes=(0, nnx.Carry) + (None,) * len(args),
                       out_axes=(nnx.Carry, 0))
    X, per_layer = scanned(stack.blks, X, *args)
    if keep_hidden:
      hidden += list(per_layer)
  else:
    for blk in stack.blks:
      X = run(blk, X, *args)
      if keep_hidden:
        hidden.append(X)
  if stack.final_ln is not None:
    X = stack.final_ln(X)
  return X, hidden

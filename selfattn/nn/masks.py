"""One mask convention for every module (attention, blocks, encoder, decoder).

  mask        boolean, True = attend, with four axes broadcastable to
              (B, H, Lq, Lk): Flax's and `jax.nn.dot_product_attention`'s
              convention. Build the common ones with `make_padding_mask`,
              `make_causal_mask` and `make_length_mask`.
  bias        float, four axes broadcastable to (B, H, Lq, Lk), added to the
              scaled logits (after any relative-position term).
  valid_lens  d2l's lengths: (B,) keys j < valid_lens[b] attend; (B, Lq) one
              length per query (respected per query everywhere).
  causal      key j attends to query i iff j <= i + (Lk - Lq): the queries are
              the last Lq of the Lk positions (Lq == Lk: the usual triangle).

Everything that is given is combined with `and`. Masks of fewer than four axes
are refused rather than guessed: a (B, Lk) key-padding mask and an (Lq, Lk)
causal mask have the same shape whenever B == Lq, and reading one as the other
gives wrong results without an error. Float masks are refused too: an
additive mask of 0 / -inf read as booleans would keep every key.
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp
import numpy as np

AXES = ('batch', 'heads', 'queries', 'keys')


def make_padding_mask(valid_BxL: jax.Array) -> jax.Array:
  """(B, Lk) bool, True = real token -> (B, 1, 1, Lk): every query sees the
  real keys only (left or right padding alike)."""
  valid = jnp.asarray(valid_BxL)
  if valid.ndim != 2:
    raise ValueError(f'make_padding_mask takes a (B, L) boolean array; got '
                     f'shape {valid.shape}')
  if jnp.issubdtype(valid.dtype, jnp.floating):
    # An additive float mask (0 keep, -inf drop) would be read as truth
    # values: -inf as True, the opposite of what it meant.
    raise TypeError(f'make_padding_mask takes a (B, L) boolean array (True = '
                    f'real token; 0/1 integers too); got {valid.dtype}')
  return valid.astype(bool)[:, None, None, :]


def make_causal_mask(num_queries: int, num_keys: int | None = None
                     ) -> jax.Array:
  """(1, 1, Lq, Lk) bool: query i sees keys j <= i + (Lk - Lq)."""
  # jnp.arange would take -1 (an empty mask) or 2.5 (3 rows) silently.
  num_queries = check_size(num_queries, 'num_queries', 0)
  num_keys = (num_queries if num_keys is None
              else check_size(num_keys, 'num_keys', 0))
  query = jnp.arange(num_queries)[:, None] + (num_keys - num_queries)
  return (jnp.arange(num_keys)[None, :] <= query)[None, None]


def make_length_mask(valid_lens: jax.Array, num_queries: int, num_keys: int,
                     what: str = 'valid_lens') -> jax.Array:
  """d2l's `valid_lens` as a mask: (B,) -> (B, 1, 1, Lk); (B, Lq) ->
  (B, 1, Lq, Lk) (one length per query).

  Lengths are data, so they are not range-checked (that cannot run under
  jit): a length <= 0 keeps no key (the query's output is zeros) and a
  length >= Lk keeps every key, as d2l's sequence_mask does. Their dtype
  is static, so it is checked: a float length (2.5 would keep 3 keys) is
  refused. `what` names the lengths in errors (the decoder's cross-attention
  takes them as enc_valid_lens).
  """
  valid_lens = integer_lengths(valid_lens, what)
  key_idx = jnp.arange(num_keys)
  if valid_lens.ndim == 1:
    return (key_idx[None, :] < valid_lens[:, None])[:, None, None, :]
  if valid_lens.ndim == 2:
    if valid_lens.shape[1] != num_queries:
      raise ValueError(f'{what} of shape {valid_lens.shape} does not match '
                       f'{num_queries} queries; use (B,) or (B, Lq)')
    return (key_idx[None, None, :] < valid_lens[:, :, None])[:, None]
  raise ValueError(f'{what} must be (B,) or (B, Lq); got shape '
                   f'{valid_lens.shape}')


def _check_broadcast(x: jax.Array, what: str, target: tuple[int, ...]) -> None:
  if x.ndim != 4:
    raise ValueError(
        f'{what} must have 4 axes broadcastable to (B, H, Lq, Lk) = {target}; '
        f'got shape {tuple(x.shape)}. A 2-D mask is ambiguous ((B, Lk) key '
        f'padding or (Lq, Lk)?): use make_padding_mask(valid) for (B, Lk) or '
        f'x[None, None] for (Lq, Lk).')
  for axis, size, want in zip(AXES, x.shape, target):
    if size not in (1, want):
      raise ValueError(f'{what} of shape {tuple(x.shape)} does not broadcast '
                       f'to (B, H, Lq, Lk) = {target}: its {axis} axis is '
                       f'{size}, expected 1 or {want}')


def check_mask(mask: jax.Array, target: tuple[int, int, int, int]) -> jax.Array:
  """The mask as bool after checking it against the convention above."""
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    hint = ('A 0/1 mask: mask.astype(bool); lengths go in valid_lens= '
            '(enc_lens= for a decoder block\'s encoder outputs), not in '
            'mask (an encoder block\'s second positional argument).'
            if jnp.issubdtype(mask.dtype, jnp.integer)
            else 'Pass additive float terms as bias=.')
    raise TypeError(f'mask must be boolean (True = attend); got {mask.dtype}. '
                    f'{hint}')
  _check_broadcast(mask, 'mask', target)
  return mask


def check_bias(bias: jax.Array, target: tuple[int, int, int, int]) -> jax.Array:
  bias = jnp.asarray(bias)
  if not jnp.issubdtype(bias.dtype, jnp.floating):
    raise TypeError(f'bias must be a float array added to the logits; got '
                    f'{bias.dtype} (a boolean mask goes in mask=)')
  _check_broadcast(bias, 'bias', target)
  return bias


def integer_lengths(valid_lens, what: str = 'valid_lens') -> jax.Array:
  """valid_lens as an array of an integer dtype; a float one is refused
  (static, so checked even under jit): 2.5 would keep 3 keys, silently."""
  valid_lens = jnp.asarray(valid_lens)
  if not jnp.issubdtype(valid_lens.dtype, jnp.integer):
    raise TypeError(f'{what} must be integer token counts; got dtype '
                    f'{valid_lens.dtype} (a fractional length would keep '
                    f'the keys below it, silently): cast with .astype(int)')
  return valid_lens


def check_valid_lens(valid_lens: jax.Array, batch: int,
                     what: str = 'valid_lens') -> jax.Array:
  """valid_lens as an array, refused unless it has one row per example.

  d2l's lengths are per example: one length for a whole batch is a mistake
  more often than a broadcast, so (1,) for B = 2 is refused, not spread."""
  valid_lens = jnp.asarray(valid_lens)
  if valid_lens.ndim not in (1, 2) or valid_lens.shape[0] != batch:
    raise ValueError(f'{what} must have one row per example, (B,) or '
                     f'(B, Lq) with B = {batch}; got shape '
                     f'{tuple(valid_lens.shape)}')
  return valid_lens


def check_positions(positions: jax.Array | None, batch: int, length: int,
                    what: str = 'positions') -> None:
  """Refuses positions that are not (B, L), or (1, L) for every example."""
  if positions is None:
    return
  positions = jnp.asarray(positions)     # a list of lists too
  shape = positions.shape
  if len(shape) != 2 or shape[1] != length or shape[0] not in (1, batch):
    raise ValueError(f'{what} must be (B, L) = {(batch, length)} (or (1, L) '
                     f'for every example); got shape {tuple(shape)}')
  integer_positions(positions, what)


def integer_positions(positions, what: str = 'positions') -> jax.Array:
  """positions as an array, refused unless integer: tables index by them and
  offset encodings truncate them (0.5 would silently read as 0)."""
  positions = jnp.asarray(positions)
  if not jnp.issubdtype(positions.dtype, jnp.integer):
    raise TypeError(f'{what} must be integers; got {positions.dtype}')
  return positions


def check_flag(value, name: str) -> bool:
  """A switch argument as a Python bool; TypeError for anything else: the
  string 'False' is truthy and built the other variant silently, and an
  int 0 / 1 is no switch anyone meant where a size check refuses bools."""
  if not isinstance(value, (bool, np.bool_)):
    raise TypeError(f'{name}={value!r} must be True or False (a Python or '
                    f'NumPy bool: not 0 / 1, a string or a JAX array)')
  return bool(value)


def check_size(value, name: str, minimum: int | None = 1) -> int:
  """A size argument (a width, a count, a table's rows) as a Python int.

  TypeError unless it is an integer: a Python or NumPy one (anything
  operator.index takes), not a bool (True is no size anyone meant) and not
  32.0; ValueError below `minimum` (None: the caller checks a range of its
  own). Sizes become shapes: a float failed deep inside JAX, or
  (jnp.arange(4.5) has 5 rows) gave an odd shape silently. The message
  starts `name=value`, as the constructors' others do (config checks read
  the field's name from it)."""
  valid = 'an integer' if minimum is None else f'an integer >= {minimum}'
  if isinstance(value, jax.core.Tracer):
    # Perhaps an integer, but traced (a jit argument): sizes are shapes.
    raise TypeError(f'{name} must be {valid} known when tracing; got a '
                    f'traced value (pass it as a static argument)')
  try:
    size = operator.index(value)
  except TypeError:
    size = None
  if size is None or isinstance(value, bool):
    raise TypeError(f'{name}={value!r} must be {valid}')
  if minimum is not None and size < minimum:
    raise ValueError(f'{name}={size} must be {valid}')
  return size


RELATIVE_HOOKS = ('rotate', 'logits', 'values')


def check_built_for(relative, num_heads: int, head_dim: int) -> None:
  """Refuses what is no relative encoding (a name, an absolute encoding:
  TypeError, where the first call failed with an AttributeError) and a
  relative encoding whose tables were made for other heads or another head
  width (its `built_for()`; it would fail later inside an einsum, or,
  padded into a kernel's layout, give a number)."""
  if relative is None:
    return
  missing = [hook for hook in RELATIVE_HOOKS
             if not callable(getattr(relative, hook, None))]
  if missing:
    by_name = (f' (by name: the encoder and decoder take position='
               f'{relative!r}; selfattn.nn.positions.build_encoding builds '
               f'one)' if isinstance(relative, str) else '')
    raise TypeError(
        f'relative must be a relative encoding module with the hooks '
        f'{", ".join(RELATIVE_HOOKS)} (ShawRelative, HuangRelative, '
        f'RotaryEncoding, PolarEncoding, ALiBi, T5RelativeBias, '
        f'TransformerXLRelative, or a RelativePosition subclass); got '
        f'{type(relative).__name__}, without {", ".join(missing)}{by_name}')
  built_for = getattr(relative, 'built_for', None)
  if built_for is None:
    return
  heads, width = built_for()
  if any(isinstance(n, jax.core.Tracer) for n in (heads, width)):
    # Every method traced (nnx.tabulate jits each one): not sizes to
    # compare here; the module's construction compared them.
    return
  if heads not in (None, num_heads) or width not in (None, head_dim):
    raise ValueError(
        f'relative={type(relative).__name__} was built for '
        f'{heads or "any number of"} heads of width {width or "any"}; this '
        f'attention has {num_heads} heads of width {head_dim}')


def check_heads(q: jax.Array, k: jax.Array, v: jax.Array, *,
                broadcast: bool = False) -> None:
  """Refuses per-head q (B, H, Lq, D), k (B, H, Lk, D) and v (B, H, Lk, Dv)
  that do not fit together, naming the axis (before an einsum would).
  broadcast: k and v may have 1 for B or H (one key set for every example,
  or multi-query attention's one head), as dot_product_attention's einsum
  takes them."""
  for name, x in (('q', q), ('k', k), ('v', v)):
    if x.ndim != 4:
      raise ValueError(f'{name} must be per-head (B, H, L, D); got shape '
                       f'{tuple(x.shape)}')
  allowed = [(1, n) if broadcast else (n,) for n in q.shape[:2]]
  if any(n not in ok for x in (k, v) for n, ok in zip(x.shape[:2], allowed)):
    raise ValueError(f'q, k and v must share (B, H)'
                     f'{" (k and v may have 1)" if broadcast else ""}; got q '
                     f'{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}')
  if k.shape[3] != q.shape[3]:
    raise ValueError(f'q and k must have the same head width D (the logits '
                     f'are q . k); got {q.shape[3]} and {k.shape[3]}')
  if v.shape[2] != k.shape[2]:
    raise ValueError(f'v must have one row per key: k has Lk = {k.shape[2]}, '
                     f'v has {v.shape[2]}')


def attention_mask(target: tuple[int, int, int, int], *,
                   valid_lens: jax.Array | None = None,
                   mask: jax.Array | None = None,
                   causal: bool = False) -> jax.Array | None:
  """valid_lens, mask and causal combined into one boolean mask with four
  axes broadcastable to target = (B, H, Lq, Lk); None when nothing masks."""
  _, _, num_queries, num_keys = target
  result = None
  if valid_lens is not None:
    valid_lens = check_valid_lens(valid_lens, target[0])
    result = make_length_mask(valid_lens, num_queries, num_keys)
  if mask is not None:
    mask = check_mask(mask, target)
    result = mask if result is None else result & mask
  if causal:
    tri = make_causal_mask(num_queries, num_keys)
    result = tri if result is None else result & tri
  return result


def keys_in_use(mask: jax.Array | None) -> jax.Array | None:
  """(B|1, H|1, Lk|1, 1) bool: True where some query may attend to the key,
  from a four-axis mask (None: every key)."""
  if mask is None:
    return None
  return jnp.any(mask, axis=2)[..., None]


def clear_unused_keys(k: jax.Array, v: jax.Array, mask: jax.Array | None
                      ) -> tuple[jax.Array, jax.Array]:
  """Keys and values that no query may attend to, set to zero.

  A masked key gets weight exactly 0, but 0 * NaN = NaN: a NaN or inf in a
  padded key or value would otherwise reach the valid outputs (through the
  weighted sum of values) and the gradients (through the logits' gradient,
  0 * k). Padding must never change valid outputs, whatever it holds.
  `jnp.where` selects, so the gradients stay finite too. k, v: (B, H, Lk, D).
  """
  if mask is None:
    return k, v
  # The barrier keeps XLA from constant-folding the reduction when the mask
  # is a constant (seconds of compile time at L = 2048).
  used = keys_in_use(jax.lax.optimization_barrier(mask))
  return (jnp.where(used, k, jnp.zeros((), k.dtype)),
          jnp.where(used, v, jnp.zeros((), v.dtype)))

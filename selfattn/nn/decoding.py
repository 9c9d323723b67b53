"""The decode loops that run a causal model one token at a time through its
key/value caches: greedy_search and sample (one loop, one row per example,
with teacher forcing: a token given at some or every step, as free-running
evaluation and cached scoring need) and beam_search (beam_size rows per
example); `generate(method=...)` picks one. They share how they start
(the caches, the prompt) and their end-of-sentence handling.

    out = generate(model, prompt, num_steps, method='beam', beam_size=4,
                   eos=EOS, call_args=(enc_outputs, enc_valid_lens))

`model(tokens, *call_args, decode=True, deterministic=True)` must return
logits (B, L, V) for the L new tokens and advance the caches that its
stack's `init_cache(B, max_length)` made: a TransformerDecoder, a causal
TransformerEncoder, or a wrapper with a `stack` (nn/models.py's). When a
loop returns or raises, the stack's `drop_cache()` (where it has one)
removes them. The loop is an nnx.while_loop: one traced step, however many
steps, and it stops early once every sequence has produced `eos`.

Beam search keeps, per example, `beam_size` live hypotheses ranked by
their summed log-probabilities and, apart from them, the `beam_size` best
finished ones (they produced eos), each scored with GNMT's length penalty,
score / ((5 + length) / 6) ** alpha (Wu et al. 2016), the length counting
the generated tokens up to and including eos. Each step ranks 2 x
beam_size continuations of the live hypotheses: those ending in eos join
the finished set, the best beam_size others stay live. A finished
hypothesis therefore never takes a live one's place, which would favour
short outputs (the Tensor2Tensor / Flax WMT search). An example stops once
no live hypothesis can still beat its worst finished one (log-probabilities
only fall; the bound uses the largest penalty ahead); at num_steps the
live hypotheses compete with the finished ones under the same penalty. The
caches follow the live hypotheses (CacheMixin.reorder_cache).
"""

from __future__ import annotations

import functools
import math

from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn import masks

METHODS = ('greedy', 'sample', 'beam')


class Generated(NamedTuple):
  """tokens (B, P + num_steps): the prompt and what followed (pad after
  eos); scores (B,): the summed log-probability of the generated tokens
  (beam: divided by the length penalty); logits (B, num_steps + 1, V)
  after the prompt and after each token, only with return_logits."""
  tokens: jax.Array
  scores: jax.Array
  logits: jax.Array | None = None


def draw(logits: jax.Array, key: jax.Array | None, temperature: float,
         top_k: int | None) -> jax.Array:
  """(B, V) logits -> (B,) int32: argmax at temperature 0 (or without a
  key), else a draw at `temperature` among the top_k (None: all)."""
  if temperature == 0 or key is None:
    return jnp.argmax(logits, axis=-1).astype(jnp.int32)
  logits = logits / temperature
  if top_k is not None:
    if not 1 <= top_k <= logits.shape[-1]:
      raise ValueError(f'top_k must be between 1 and the {logits.shape[-1]} '
                       f'logits of a step, or None; got {top_k}')
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT's ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _repeat(x, k: int):
  """Each example's row k times in a row (B, ...) -> (B k, ...)."""
  return None if x is None else jnp.repeat(x, k, axis=0)


class _Start(NamedTuple):
  """What every decode loop begins with: the caches made, the prompt read.
  b examples of k rows each (beam search: k hypotheses; else k = 1);
  tokens (b k, P + num_steps) is the prompt then pad; logits (b k, V) after
  the prompt; call(model, tokens, start, length) -> the last new token's
  float32 logits."""
  b: int
  k: int
  p: int
  total: int
  tokens: jax.Array
  logits: jax.Array
  call: Callable


def _start(model: nnx.Module, prompt: jax.Array, num_steps: int, k: int, *,
           pad: int, positions: jax.Array | None, call_args: tuple
           ) -> _Start:
  num_steps = masks.check_size(num_steps, 'num_steps')    # any int, not 2.5
  prompt = jnp.asarray(prompt)
  if not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise TypeError(f'prompt must be integer token ids; got dtype '
                    f'{prompt.dtype}')
  prompt = prompt.astype(jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'prompt must be (B, P) token ids with P >= 1; got '
                     f'shape {tuple(prompt.shape)}')
  b, p = prompt.shape
  total = p + num_steps
  shape = None if positions is None else jnp.shape(positions)
  if shape is not None and (len(shape) != 2 or shape[0] not in (1, b)
                            or shape[1] < total):
    # One position per token the run will hold, the prompt's and each
    # step's; a shorter array would be read past its end (clamped).
    raise ValueError(f'positions must be (B, P + num_steps) = {(b, total)} '
                     f'(or (1, ...) for every example, or longer); got shape '
                     f'{tuple(shape)}')
  # The prompt, then one token a step: the last step's call writes position
  # P + num_steps - 1, the caches' last slot.
  _stack_of(model).init_cache(b * k, total)
  call_args = tuple(_repeat(a, k) for a in call_args)
  if positions is not None:
    # (1, ...) is every example's: spread to (B, ...) before the beams, so
    # each row's cache records its own positions.
    # Checked before the cast, which would truncate floats first.
    positions = masks.integer_positions(positions).astype(jnp.int32)
    positions = _repeat(jnp.broadcast_to(positions, (b, positions.shape[1])), k)

  def call(model, tokens, start, length):
    at = (None if positions is None else
          jax.lax.dynamic_slice_in_dim(positions, start, length, axis=1))
    out = model(tokens, *call_args, positions=at, deterministic=True,
                decode=True)
    return out[:, -1].astype(jnp.float32)

  logits = call(model, _repeat(prompt, k), 0, p)            # (B k, V)
  tokens = jnp.concatenate(
      [_repeat(prompt, k), jnp.full((b * k, num_steps), pad, jnp.int32)], 1)
  return _Start(b, k, p, total, tokens, logits, call)


def _stack_of(model: nnx.Module) -> nnx.Module:
  return getattr(model, 'stack', model)   # a wrapper's, or the stack


def _dropping_caches(loop: Callable[..., Generated]) -> Callable[..., Generated]:
  """`loop(model, ...)`, after which, returned or raised, the model's state
  is as it was before: its stack's drop_cache, where the stack has one
  (selfattn's do), removes the caches the loop made."""
  @functools.wraps(loop)
  def run(model: nnx.Module, *args, **kwargs) -> Generated:
    try:
      return loop(model, *args, **kwargs)
    finally:
      drop = getattr(_stack_of(model), 'drop_cache', None)
      if drop is not None:
        drop()
  return run


def greedy_search(model: nnx.Module, prompt: jax.Array, num_steps: int, *,
                  eos: int | None = None, pad: int = 0,
                  forced: jax.Array | None = None,
                  forced_mask: jax.Array | None = None,
                  positions: jax.Array | None = None, call_args: tuple = (),
                  return_logits: bool = False,
                  choice_offset: int = 0) -> Generated:
  """Continues prompt (B, P) by up to num_steps tokens, each the argmax
  (see `generate` for the arguments)."""
  return _one_token_a_step(
      model, prompt, num_steps,
      lambda i, logits: jnp.argmax(logits, axis=-1).astype(jnp.int32),
      eos=eos, pad=pad, forced=forced, forced_mask=forced_mask,
      positions=positions, call_args=call_args, return_logits=return_logits,
      choice_offset=choice_offset)


def sample(model: nnx.Module, prompt: jax.Array, num_steps: int, *,
           key: jax.Array, temperature: float = 1.0, top_k: int | None = None,
           eos: int | None = None, pad: int = 0,
           forced: jax.Array | None = None,
           forced_mask: jax.Array | None = None,
           positions: jax.Array | None = None, call_args: tuple = (),
           return_logits: bool = False, choice_offset: int = 0) -> Generated:
  """Continues prompt (B, P) by up to num_steps tokens, step i drawn with
  fold_in(key, i) at `temperature` among the top_k (see `generate`)."""
  if key is None:
    raise ValueError("method='sample' needs a key")
  if not math.isfinite(temperature) or not temperature > 0:
    raise ValueError(f'temperature must be > 0 and finite; got {temperature}')
  return _one_token_a_step(
      model, prompt, num_steps,
      lambda i, logits: draw(logits, jax.random.fold_in(key, i), temperature,
                             top_k),
      eos=eos, pad=pad, forced=forced, forced_mask=forced_mask,
      positions=positions, call_args=call_args, return_logits=return_logits,
      choice_offset=choice_offset)


@_dropping_caches
def _one_token_a_step(model, prompt, num_steps: int, choose, *, eos, pad,
                      forced, forced_mask, positions, call_args,
                      return_logits: bool, choice_offset: int) -> Generated:
  """Greedy search and sampling: one row per example, choose(i, logits)
  -> (B,) picks step i's token (forced ones override it)."""
  start = _start(model, prompt, num_steps, 1, pad=pad, positions=positions,
                 call_args=call_args)
  b, p, call = start.b, start.p, start.call
  vocab = start.logits.shape[-1]
  kept = (jnp.zeros((b, num_steps, vocab), jnp.float32)
          if return_logits else jnp.zeros((), jnp.float32))

  def step(carry):
    model, i, logits, tokens, scores, finished, kept = carry
    if return_logits:
      kept = kept.at[:, i].set(logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
    token = choose(i, logits) + choice_offset
    if forced is not None:
      token = jnp.where(forced_mask[:, i], jnp.asarray(forced)[:, i], token)
    live = ~finished
    token = jnp.where(live, token, pad).astype(jnp.int32)
    gained = jnp.where(live, jnp.take_along_axis(
        logp, jnp.clip(token - choice_offset, 0, vocab - 1)[:, None],
        axis=1)[:, 0], 0.0)
    if eos is not None:
      finished = finished | (token == eos)
    tokens = jax.lax.dynamic_update_slice(tokens, token[:, None], (0, p + i))
    logits = call(model, token[:, None], p + i, 1)
    return model, i + 1, logits, tokens, scores + gained, finished, kept

  def more(carry):
    return (carry[1] < num_steps) & ~jnp.all(carry[5])

  carry = (model, jnp.zeros((), jnp.int32), start.logits, start.tokens,
           jnp.zeros((b,), jnp.float32), jnp.zeros((b,), bool), kept)
  _, _, logits, tokens, scores, _, kept = nnx.while_loop(more, step, carry)
  return Generated(tokens, scores,
                   jnp.concatenate([kept, logits[:, None]], axis=1)
                   if return_logits else None)


@_dropping_caches
def beam_search(model: nnx.Module, prompt: jax.Array, num_steps: int, *,
                beam_size: int = 4, alpha: float = 0.6,
                eos: int | None = None, pad: int = 0,
                positions: jax.Array | None = None,
                call_args: tuple = ()) -> Generated:
  """Continues prompt (B, P) by up to num_steps tokens: the best hypothesis
  of a beam of beam_size under GNMT's length penalty with exponent alpha
  (the module doc says how; `generate` the other arguments)."""
  beam_size = masks.check_size(beam_size, 'beam_size')
  if not math.isfinite(alpha):
    raise ValueError(f'alpha must be a finite number; got {alpha}')
  k = beam_size
  start = _start(model, prompt, num_steps, k, pad=pad, positions=positions,
                 call_args=call_args)
  b, p, total, call = start.b, start.p, start.total, start.call
  rows, vocab = b * k, start.logits.shape[-1]
  # Beam i > 0 starts dead, so the first step expands beam 0 only.
  scores = jnp.where(jnp.arange(k)[None, :] == 0, 0.0, -jnp.inf)
  scores = jnp.broadcast_to(scores, (b, k)).astype(jnp.float32)
  # The finished set: (B, k, P + num_steps) tokens and their
  # length-penalised scores, -inf where empty.
  done_tokens = jnp.full((b, k, total), pad, jnp.int32)
  done_scores = jnp.full((b, k), -jnp.inf, jnp.float32)
  penalty = lambda n: length_penalty(jnp.asarray(n, jnp.float32), alpha)

  def choose(i, logp, scores, tokens, done_tokens, done_scores):
    # 2k continuations of the k live hypotheses: at most k end in eos, so
    # at least k stay live.
    width = min(2 * k, k * vocab)
    candidates = (scores.reshape(rows)[:, None] + logp).reshape(b, k * vocab)
    top, flat = jax.lax.top_k(candidates, width)              # (B, 2k)
    token = (flat % vocab).astype(jnp.int32)
    rows_from = jnp.arange(b)[:, None] * k + flat // vocab     # (B, 2k)
    grown = tokens[rows_from.reshape(-1)].reshape(b, width, total)
    grown = jax.lax.dynamic_update_slice(
        grown, token[:, :, None], (0, 0, p + i))
    ends = (token == eos) if eos is not None else jnp.zeros_like(token, bool)
    # Finished: the old set and the new eos continuations, best k kept.
    pool = jnp.concatenate(
        [done_scores, jnp.where(ends, top / penalty(i + 1), -jnp.inf)], 1)
    done_scores, keep = jax.lax.top_k(pool, k)
    done_tokens = jnp.take_along_axis(
        jnp.concatenate([done_tokens, grown], 1), keep[:, :, None], 1)
    # Live: the best k continuations that did not end.
    scores, keep = jax.lax.top_k(jnp.where(ends, -jnp.inf, top), k)
    token = jnp.take_along_axis(token, keep, 1).reshape(rows)
    rows_from = jnp.take_along_axis(rows_from, keep, 1).reshape(rows)
    tokens = jnp.take_along_axis(grown, keep[:, :, None], 1).reshape(
        rows, total)
    return token, scores, tokens, done_tokens, done_scores, rows_from

  def settled(i, scores, done_scores):
    # (B,): no live hypothesis can beat the worst finished one. Scores are
    # <= 0 and only fall, so the best a live one can reach is its score
    # over the largest penalty of any length still ahead.
    best_live = scores[:, 0] / jnp.maximum(penalty(i + 1), penalty(num_steps))
    return done_scores[:, -1] >= best_live

  def step(carry):
    model, i, logits, tokens, scores, finished, done_tokens, done_scores = carry
    logp = jax.nn.log_softmax(logits, axis=-1)
    token, scores, tokens, done_tokens, done_scores, rows_from = choose(
        i, logp, scores, tokens, done_tokens, done_scores)
    finished = settled(i + 1, scores, done_scores)
    _stack_of(model).reorder_cache(rows_from)
    logits = call(model, token[:, None], p + i, 1)
    return (model, i + 1, logits, tokens, scores, finished, done_tokens,
            done_scores)

  def more(carry):
    return (carry[1] < num_steps) & ~jnp.all(carry[5])

  carry = (model, jnp.zeros((), jnp.int32), start.logits, start.tokens,
           scores, jnp.zeros((b,), bool), done_tokens, done_scores)
  (_, steps, _, tokens, scores, finished, done_tokens,
   done_scores) = nnx.while_loop(more, step, carry)
  # The live hypotheses, at the length reached, against the finished set;
  # a settled example's live ones are out (with alpha < 0 a prefix cut
  # short could otherwise beat every finished hypothesis).
  live = jnp.where(finished[:, None], -jnp.inf, scores / penalty(steps))
  pool = jnp.concatenate([done_scores, live], 1)
  best = jnp.argmax(pool, axis=1)
  tokens = jnp.concatenate(
      [done_tokens, tokens.reshape(b, k, total)], 1)[jnp.arange(b), best]
  return Generated(tokens, pool[jnp.arange(b), best])


def generate(model: nnx.Module, prompt: jax.Array, num_steps: int, *,
             method: str = 'greedy', key: jax.Array | None = None,
             temperature: float = 1.0, top_k: int | None = None,
             beam_size: int = 4, alpha: float = 0.6,
             **common) -> Generated:
  """Continues prompt (B, P) by up to num_steps tokens with `method`:
  greedy_search, sample or beam_search, whose own arguments follow.

  Args:
    model: a causal model with `stack.init_cache` (see the module doc); its
      caches are replaced by fresh ones.
    prompt: (B, P) int, P >= 1; fills the caches in one call.
    num_steps: tokens after the prompt (>= 1).
    method: 'greedy', 'sample' (step i draws with fold_in(key, i)) or
      'beam'.
    key, temperature, top_k: sampling's.
    beam_size, alpha: beam search's width and length-penalty exponent.
    common, for every method: eos (the end-of-sentence id, or None: every
      sequence runs num_steps), pad (what follows eos), positions
      ((B, P + num_steps) int positions for randomized encodings, or None:
      0, 1, ...), call_args (more positional arguments of every model
      call: a translation decoder's enc_outputs, enc_valid_lens; beam
      search repeats their rows per hypothesis). Greedy and sampling only:
      forced, forced_mask ((B, num_steps): where the mask is True, step i's
      token is forced[:, i], teacher forcing), return_logits (also the
      logits after the prompt and after each step's token, (B, num_steps +
      1, V)), choice_offset (added to the index a step picks from the
      logits, for a model whose logits are over classes that are tokens
      from an offset on; forced tokens and pad are token ids already).

  Returns:
    Generated(tokens, scores, logits).
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}; valid: {", ".join(METHODS)}')
  if method == 'beam':
    given = {name: common.pop(name, None) for name in
             ('forced', 'forced_mask', 'return_logits', 'choice_offset')}
    if given['forced'] is not None or given['return_logits'] or (
        given['choice_offset']):
      raise ValueError('beam search takes no forced tokens, returns no '
                       'per-step logits and picks no offset')
    return beam_search(model, prompt, num_steps, beam_size=beam_size,
                       alpha=alpha, **common)
  if method == 'sample':
    return sample(model, prompt, num_steps, key=key, temperature=temperature,
                  top_k=top_k, **common)
  return greedy_search(model, prompt, num_steps, **common)


def teacher_forced_logits(model: nnx.Module, tokens: jax.Array, *,
                          positions: jax.Array | None = None,
                          call_args: tuple = ()) -> jax.Array:
  """(B, T) tokens -> (B, T, V): position t's logits given tokens[:, :t+1],
  one token at a time through the caches (tokens[:, 0] is the prompt, every
  later token is forced). Equal to one full causal pass (tested)."""
  b, t = tokens.shape
  if t < 2:
    raise ValueError('teacher forcing through the cache needs T >= 2')
  return generate(model, tokens[:, :1], t - 1, method='greedy',
                  forced=tokens[:, 1:], forced_mask=jnp.ones((b, t - 1), bool),
                  positions=positions, call_args=call_args,
                  return_logits=True).logits


__all__ = ['Generated', 'METHODS', 'beam_search', 'draw', 'generate',
           'greedy_search', 'length_penalty', 'sample', 'teacher_forced_logits']

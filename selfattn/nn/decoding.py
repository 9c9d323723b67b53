"""One decode loop for every way selfattn runs a causal model one token at
a time through its key/value caches: greedy, sampling, beam search, and
teacher forcing (a token given at some or every step, as free-running
evaluation and cached scoring need). They differ only in how a step picks
its token; the loop, the caches and end-of-sentence handling are shared.

    out = generate(model, prompt, num_steps, method='beam', beam_size=4,
                   eos=EOS, call_args=(enc_outputs, enc_valid_lens))

`model(tokens, *call_args, decode=True, deterministic=True)` must return
logits (B, L, V) for the L new tokens and advance the caches that its
stack's `init_cache(B, max_length)` made: a TransformerDecoder, a causal
TransformerEncoder, or a wrapper with a `stack` (nn/models.py's). The loop is an
nnx.while_loop: one traced step, however many steps, and it stops early
once every sequence has produced `eos`.

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

from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

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
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits >= kth, logits, -jnp.inf)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def length_penalty(length: jax.Array, alpha: float) -> jax.Array:
  """GNMT's ((5 + length) / 6) ** alpha."""
  return ((5.0 + length) / 6.0) ** alpha


def _repeat(x, k: int):
  """Each example's row k times in a row (B, ...) -> (B k, ...)."""
  return None if x is None else jnp.repeat(x, k, axis=0)


def generate(model: nnx.Module, prompt: jax.Array, num_steps: int, *,
             method: str = 'greedy', key: jax.Array | None = None,
             temperature: float = 1.0, top_k: int | None = None,
             beam_size: int = 4, alpha: float = 0.6,
             eos: int | None = None, pad: int = 0,
             forced: jax.Array | None = None,
             forced_mask: jax.Array | None = None,
             positions: jax.Array | None = None,
             call_args: tuple = (), return_logits: bool = False,
             choice_offset: int = 0) -> Generated:
  """Continues prompt (B, P) by up to num_steps tokens.

  Args:
    model: a causal model with `stack.init_cache` (see the module doc); its
      caches are replaced by fresh ones.
    prompt: (B, P) int, P >= 1; fills the caches in one call.
    num_steps: tokens after the prompt (>= 1).
    method: 'greedy', 'sample' (step i draws with fold_in(key, i)) or
      'beam'.
    temperature, top_k: sampling's.
    beam_size, alpha: beam search's width and length-penalty exponent.
    eos: the end-of-sentence id, or None (every sequence runs num_steps).
    pad: what follows eos.
    forced, forced_mask: (B, num_steps): where the mask is True, step i's
      token is forced[:, i] instead of the method's choice (teacher
      forcing; greedy and sampling only).
    positions: (B, P + num_steps) int positions for randomized encodings,
      or None (0, 1, ...).
    call_args: more positional arguments of every model call (a
      translation decoder's enc_outputs, enc_valid_lens); beam search
      repeats their rows per hypothesis.
    return_logits: also return the logits after the prompt and after each
      step's token, (B, num_steps + 1, V) (greedy, sampling).
    choice_offset: added to the index a step picks from the logits (a
      model whose logits are over classes that are tokens from an offset
      on); forced tokens and pad are token ids already.

  Returns:
    Generated(tokens, scores, logits).
  """
  if method not in METHODS:
    raise ValueError(f'method={method!r}; valid: {", ".join(METHODS)}')
  if num_steps < 1:
    raise ValueError(f'num_steps must be >= 1; got {num_steps}')
  prompt = jnp.asarray(prompt, jnp.int32)
  if prompt.ndim != 2 or prompt.shape[1] < 1:
    raise ValueError(f'prompt must be (B, P) token ids with P >= 1; got '
                     f'shape {tuple(prompt.shape)}')
  if method == 'beam' and (forced is not None or return_logits):
    raise ValueError('beam search takes no forced tokens and returns no '
                     'per-step logits')
  if method == 'sample' and key is None:
    raise ValueError("method='sample' needs a key")
  k = beam_size if method == 'beam' else 1
  if k < 1:
    raise ValueError(f'beam_size must be >= 1; got {beam_size}')
  b, p = prompt.shape
  rows, total = b * k, p + num_steps
  # The prompt, then one token a step: the last step's call writes position
  # P + num_steps - 1, the caches' last slot.
  stack_of = lambda m: getattr(m, 'stack', m)   # a wrapper's, or the stack
  stack_of(model).init_cache(rows, total)
  call_args = tuple(_repeat(a, k) for a in call_args)
  positions = _repeat(None if positions is None else
                      jnp.asarray(positions, jnp.int32), k)

  def call(model, tokens, start, length):
    at = (None if positions is None else
          jax.lax.dynamic_slice_in_dim(positions, start, length, axis=1))
    out = model(tokens, *call_args, positions=at, deterministic=True,
                decode=True)
    return out[:, -1].astype(jnp.float32)

  logits = call(model, _repeat(prompt, k), 0, p)            # (B k, V)
  vocab = logits.shape[-1]
  tokens = jnp.concatenate(
      [_repeat(prompt, k), jnp.full((rows, num_steps), pad, jnp.int32)], 1)
  # Beam i > 0 starts dead, so the first step expands beam 0 only.
  scores = jnp.where(jnp.arange(k)[None, :] == 0, 0.0, -jnp.inf)
  scores = jnp.broadcast_to(scores, (b, k)).astype(jnp.float32)
  finished = jnp.zeros((b, k), bool)
  lengths = jnp.zeros((b, k), jnp.int32)
  # Beam search's finished set: (B, k, P + num_steps) tokens and their
  # length-penalised scores, -inf where empty.
  done_tokens = (jnp.full((b, k, total), pad, jnp.int32) if method == 'beam'
                 else jnp.zeros((), jnp.int32))
  done_scores = jnp.full((b, k), -jnp.inf, jnp.float32)
  penalty = lambda n: length_penalty(jnp.asarray(n, jnp.float32), alpha)
  kept = (jnp.zeros((rows, num_steps, vocab), jnp.float32)
          if return_logits else jnp.zeros((), jnp.float32))

  def beam_choice(i, logp, scores, tokens, done_tokens, done_scores):
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

  def beam_settled(i, scores, done_scores):
    # (B,): no live hypothesis can beat the worst finished one. Scores are
    # <= 0 and only fall, so the best a live one can reach is its score
    # over the largest penalty of any length still ahead.
    best_live = scores[:, 0] / jnp.maximum(penalty(i + 1), penalty(num_steps))
    return done_scores[:, -1] >= best_live

  def single_choice(i, logits, logp, scores, finished, lengths):
    if method == 'sample':
      token = draw(logits, jax.random.fold_in(key, i), temperature, top_k)
    else:
      token = jnp.argmax(logits, axis=-1).astype(jnp.int32)
    token = token + choice_offset
    if forced is not None:
      token = jnp.where(forced_mask[:, i], jnp.asarray(forced)[:, i], token)
    live = ~finished.reshape(rows)
    token = jnp.where(live, token, pad).astype(jnp.int32)
    gained = jnp.where(live, jnp.take_along_axis(
        logp, jnp.clip(token - choice_offset, 0, vocab - 1)[:, None],
        axis=1)[:, 0], 0.0)
    finished = finished | (
        (token == eos).reshape(b, k) if eos is not None else False)
    lengths = lengths + live.reshape(b, k).astype(jnp.int32)
    return token, scores + gained.reshape(b, k), finished, lengths

  def step(carry):
    (model, i, logits, tokens, scores, finished, lengths, kept, done_tokens,
     done_scores) = carry
    if return_logits:
      kept = kept.at[:, i].set(logits)
    logp = jax.nn.log_softmax(logits, axis=-1)
    if method == 'beam':
      token, scores, tokens, done_tokens, done_scores, rows_from = (
          beam_choice(i, logp, scores, tokens, done_tokens, done_scores))
      finished = jnp.broadcast_to(
          beam_settled(i + 1, scores, done_scores)[:, None], (b, k))
      stack_of(model).reorder_cache(rows_from)
    else:
      token, scores, finished, lengths = single_choice(
          i, logits, logp, scores, finished, lengths)
      tokens = jax.lax.dynamic_update_slice(tokens, token[:, None],
                                            (0, p + i))
    logits = call(model, token[:, None], p + i, 1)
    return (model, i + 1, logits, tokens, scores, finished, lengths, kept,
            done_tokens, done_scores)

  def more(carry):
    finished = carry[5]
    return (carry[1] < num_steps) & ~jnp.all(finished)

  carry = (model, jnp.zeros((), jnp.int32), logits, tokens, scores, finished,
           lengths, kept, done_tokens, done_scores)
  (_, steps, logits, tokens, scores, finished, lengths, kept, done_tokens,
   done_scores) = nnx.while_loop(more, step, carry)
  if method == 'beam':
    # The live hypotheses, at the length reached, against the finished set;
    # a settled example's live ones are out (with alpha < 0 a prefix cut
    # short could otherwise beat every finished hypothesis).
    live = jnp.where(finished, -jnp.inf, scores / penalty(steps))
    pool = jnp.concatenate([done_scores, live], 1)
    best = jnp.argmax(pool, axis=1)
    tokens = jnp.concatenate(
        [done_tokens, tokens.reshape(b, k, total)], 1)[jnp.arange(b), best]
    return Generated(tokens, pool[jnp.arange(b), best])
  return Generated(tokens, scores[:, 0],
                   jnp.concatenate([kept, logits[:, None]], axis=1)
                   if return_logits else None)


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


__all__ = ['Generated', 'METHODS', 'draw', 'generate', 'length_penalty',
           'teacher_forced_logits']

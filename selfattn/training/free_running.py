"""Free-running evaluation of the autoregressive layout.

Teacher-forced accuracy feeds every output position the *true* previous
symbol, so one early mistake costs one token. A decoder in use feeds back its
own predictions, so a mistake can derail everything after it. This module
scores that: the fed-back tokens are replaced by the model's greedy
predictions until they stop changing.

The fixed point needs no decoding loop or cache: attention is causal, so the
prediction at position t depends only on tokens 0..t. Starting from the
teacher-forced sequence, one round (a full forward pass, then writing each
position's argmax into the next fed-back slot) makes the first fed-back slot
final; round r makes the first r slots final. After at most M - 1 rounds (M
output slots) the sequence is a fixed point and equals greedy decoding. The
teacher-forced pass is round 0's input, and the loop stops as soon as a round
would change nothing, so a model that is already right everywhere costs no
forward pass beyond the teacher-forced one.

`cached_free_running_logits` computes the same logits the way a decoder in
use would: one token at a time through the key/value caches, T steps of one
token each. Which is cheaper depends on how many rounds the fixed point
needs (none beyond the teacher-forced pass for a model that is right
everywhere, up to M - 1 for one whose every prediction changes the next);
scripts/bench_free_running.py measures both, and `config.eval.free_running`
chooses.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn import decoding
from selfattn.tasks import Batch

FREE_RUNNING_IMPLEMENTATIONS = ('fixed_point', 'cache')


def free_running_logits(logits_fn: Callable[[Batch], jax.Array], batch: Batch,
                        *, first_output_token: int, max_rounds: int,
                        teacher_forced_logits: jax.Array | None = None,
                        return_rounds: bool = False
                        ) -> jax.Array | tuple[jax.Array, jax.Array]:
  """Logits (B, T, C) with every fed-back output replaced by the model's own.

  Args:
    logits_fn: Batch -> (B, T, C) logits of a causal model.
    batch: an autoregressive-layout batch (teacher-forced inputs).
    first_output_token: the input id of output class 0 (tasks/spec.py: S + 2);
      input ids at or above it are fed-back outputs, `id - first_output_token`
      the class.
    max_rounds: an upper bound on the rounds, the output slots minus one (the
      loop usually ends earlier, when nothing changes).
    teacher_forced_logits: logits_fn(batch), when the caller has them already
      (evaluation does): they are where the rounds start.
    return_rounds: also return the number of forward passes the rounds took
      (an int32 scalar; 0 when the teacher-forced pass was already the fixed
      point).

  Returns:
    The logits of the greedy-decoded sequence: position t's logits given the
    model's own predictions at every fed-back position before t (and the
    rounds, with return_rounds).
  """
  fed_back = batch.inputs >= first_output_token

  def feed_back(logits):
    predicted = jnp.argmax(logits, -1).astype(batch.inputs.dtype)
    previous = jnp.concatenate([predicted[:, :1], predicted[:, :-1]], axis=1)
    return jnp.where(fed_back, first_output_token + previous, batch.inputs)

  # Carry: (rounds, inputs, their logits, the inputs those logits feed back).
  def more(carry):
    rounds, inputs, _, following = carry
    return jnp.any(following != inputs) & (rounds < max_rounds)

  def round_(carry):
    rounds, _, _, inputs = carry
    logits = logits_fn(batch._replace(inputs=inputs))
    return rounds + 1, inputs, logits, feed_back(logits)

  if teacher_forced_logits is None:
    teacher_forced_logits = logits_fn(batch)
  start = (jnp.zeros((), jnp.int32), batch.inputs, teacher_forced_logits,
           feed_back(teacher_forced_logits))
  rounds, _, logits, _ = jax.lax.while_loop(more, round_, start)
  return (logits, rounds) if return_rounds else logits


def cached_free_running_logits(model: nnx.Module, batch: Batch, *,
                               first_output_token: int) -> jax.Array:
  """free_running_logits through the key/value caches: (B, T, C) logits.

  Steps through all T positions one token at a time (examples may start
  their outputs at different positions): at a fed-back position the token is
  the model's greedy prediction at the position before, elsewhere the
  batch's own token. Positions follow batch.positions (randomized
  encodings). Right padding needs no mask under causal attention.

  Args:
    model: a causal models.SequenceModel (its stack takes decode=True); its
      caches are replaced by fresh ones of (B, T).
    batch: an autoregressive-layout batch.
    first_output_token: as in free_running_logits.
  """
  inputs = batch.inputs
  b, t = inputs.shape
  if t < 2:
    raise ValueError('free-running evaluation needs sequences of length >= 2')
  fed_back = inputs >= first_output_token
  # The one decode loop: the first token is the prompt; after it a fed-back
  # position takes first_output_token + the greedy class at the position
  # before, every other position its own token.
  return decoding.generate(
      model, inputs[:, :1], t - 1, method='greedy', forced=inputs[:, 1:],
      forced_mask=~fed_back[:, 1:], positions=batch.positions,
      return_logits=True, choice_offset=first_output_token).logits

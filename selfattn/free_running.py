"""Free-running evaluation of the autoregressive layout.

Teacher-forced accuracy feeds every output position the *true* previous
symbol, so one early mistake costs one token. A decoder in use feeds back its
own predictions, so a mistake can derail everything after it. This module
scores that: the fed-back tokens are replaced by the model's greedy
predictions until they stop changing.

Why no decoding loop or cache is needed: attention is causal, so the
prediction at position t depends only on tokens 0..t. Starting from the
teacher-forced sequence, one round (a full forward pass, then writing each
position's argmax into the next fed-back slot) makes the first fed-back slot
final; round r makes the first r slots final. After at most M - 1 rounds (M
output slots) the sequence is a fixed point and equals greedy decoding. The
teacher-forced pass is round 0's input, and the loop stops as soon as a round
would change nothing, so a model that is already right everywhere costs no
forward pass beyond the teacher-forced one.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from selfattn.tasks import Batch


def free_running_logits(logits_fn: Callable[[Batch], jax.Array], batch: Batch,
                        *, first_output_token: int, max_rounds: int,
                        teacher_forced_logits: jax.Array | None = None
                        ) -> jax.Array:
  """Logits (B, T, C) with every fed-back output replaced by the model's own.

  Args:
    logits_fn: Batch -> (B, T, C) logits of a causal model.
    batch: an autoregressive-layout batch (teacher-forced inputs).
    first_output_token: the input id of output class 0 (task_spec.py: S + 2);
      input ids at or above it are fed-back outputs, `id - first_output_token`
      the class.
    max_rounds: an upper bound on the rounds, the output slots minus one (the
      loop usually ends earlier, when nothing changes).
    teacher_forced_logits: logits_fn(batch), when the caller has them already
      (evaluation does): they are where the rounds start.

  Returns:
    The logits of the greedy-decoded sequence: position t's logits given the
    model's own predictions at every fed-back position before t.
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
  return jax.lax.while_loop(more, round_, start)[2]

"""Indirect indexing (Gopalakrishnan et al. 2025, the PoPE paper's sec. 4 and
appendix A.1): find a character, move by a shift, name the character there.

An example reads `<source string> , <source character> , <sign> <digits>`
and its answer is the character `shift` places from the source character:

    TzbkWoKDyscBepYvfwxEVQtgPa , c , - 8   ->  b

The string's letters are distinct (drawn without replacement from the
alphabet, [A-Za-z] by default: task.vocab_size = 52), so "the source
character" names one position; the model must find it by content (what) and
then read the key `shift` positions away (where), which is why the task
separates encodings that entangle the two (RoPE) from PoPE. Tokens are
characters: the letters, the delimiter, the signs and the digits (the shift
is written in decimal, 1 or 2 digit tokens). Loss and accuracy count the
target token only (a classification task; the paper's decoder reads it after
the last input token: layout `autoregressive`).

The paper's setting: strings of 20-40 letters (task.min_len / task.max_len,
as configs/indirect_indexing.py sets them), shifts in [-15, +15]
(task.max_shift, the default). Shifts are drawn
uniformly among those that land inside the string (|shift| < length, and
|shift| <= max_shift), then the source uniformly among the positions whose
target is inside; the paper does not say how it handles shifts that leave
the string, and its examples all land inside. A shift of 0 is allowed and
written `+0`. Extrapolation: longer strings, up to the alphabet's size
(distinct letters), at evaluation.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from selfattn.tasks.spec import Example
from selfattn.tasks.spec import TaskSpec

DEFAULT_ALPHABET = 52          # [A-Za-z]
DEFAULT_MAX_SHIFT = 15
# Input symbols after the V letters: delimiter, plus, minus, digits 0-9.
COMMA, PLUS, MINUS, DIGIT0 = 0, 1, 2, 3       # offsets from V
EXTRA_SYMBOLS = 13


def _input_length(length: int) -> int:
  # string, ',', source character, ',', sign, at most two digits
  return length + 6


def _make_sampler(V: int, options: dict):
  max_shift = options['max_shift']

  def sample(key, length, max_length):
    key_letters, key_shift, key_source = jax.random.split(key, 3)
    n_max = _input_length(max_length)
    letters = jax.random.permutation(key_letters, V)[:max_length]
    letters = jnp.pad(letters, (0, max(0, max_length - V))).astype(jnp.int32)
    # The shift first (uniform over the shifts that fit), then the source.
    reach = jnp.minimum(max_shift, length - 1)
    shift = jax.random.randint(key_shift, (), -reach, reach + 1)
    low = jnp.maximum(0, -shift)                  # source + shift >= 0
    high = jnp.minimum(length, length - shift)    # source + shift < length
    source = jax.random.randint(key_source, (), low, high)
    target = letters[source + shift]
    magnitude = jnp.abs(shift)
    two_digits = magnitude >= 10
    t = jnp.arange(n_max)
    tail = jnp.stack([
        V + COMMA, letters[source], V + COMMA,
        jnp.where(shift < 0, V + MINUS, V + PLUS),
        V + DIGIT0 + jnp.where(two_digits, magnitude // 10, magnitude),
        V + DIGIT0 + magnitude % 10]).astype(jnp.int32)
    x = jnp.where(t < length, letters[jnp.clip(t, 0, max_length - 1)],
                  tail[jnp.clip(t - length, 0, 5)])
    num_inputs = length + 5 + two_digits.astype(jnp.int32)
    x = jnp.where(t < num_inputs, x, 0)
    return Example(x, num_inputs, target[None].astype(jnp.int32),
                   jnp.int32(1), jnp.ones((1,), bool))
  return sample


def _options_problem(options: dict, max_len: int) -> str | None:
  del max_len
  if not 1 <= options['max_shift'] <= 99:
    return (f'config.task.max_shift must be between 1 and 99 (one or two '
            f'digit tokens); got {options["max_shift"]}')
  return None


INDIRECT_TASKS: dict[str, TaskSpec] = {
    'indirect_indexing': TaskSpec(
        description='the letter task.max_shift-bounded shift away from a '
                    'given letter of a string of distinct letters (PoPE '
                    'paper)',
        make_sampler=_make_sampler, level='selfattn', classification=True,
        input_symbols=lambda V: V + EXTRA_SYMBOLS, num_classes=lambda V: V,
        input_length=_input_length, default_vocab=DEFAULT_ALPHABET,
        min_length=2, max_length=lambda V: V,
        options_problem=_options_problem, options=('max_shift',)),
}

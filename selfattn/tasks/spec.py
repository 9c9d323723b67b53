"""What a task is, before a layout turns it into the model's sequence.

A task samples one `Example`: an input sequence and an output sequence, each
padded to a static size with its true length alongside. A *layout*
(tasks/registry.py) then places them in one token sequence the encoder reads:

  in_place      the output of position i is read at input position i (tasks
                whose output is aligned with their input), or one label read
                at a CLS token in front (classification);
  placeholders  the reference layout of Deletang et al. and Ruoss et al.: the
                input, then one placeholder token per output symbol; outputs
                are read at the placeholders (one placeholder, a query token
                at the end, for classification).
  autoregressive  a decoder's layout: the input, a separator, then the
                outputs shifted right (teacher forcing); the separator and
                each output symbol predict the next output symbol, and the
                model attends causally (nn/models.py). Scored like placeholders,
                at the same positions. token/sequence_accuracy are
                teacher-forced; evaluation adds free_running_* accuracies,
                with the model's own greedy outputs fed back
                (free_running.py).
  encoder_decoder  translation: the source goes to an encoder, BOS + target
                to a decoder with cross-attention that predicts target +
                EOS (translation/batches.py builds these batches).

Token ids of the model input: the task's input symbols 0..S-1 (its alphabet,
including any operator or separator symbols it uses), then PAD = S, then the
layout's token (CLS, placeholder or separator) = S + 1; the autoregressive
layout embeds output symbol o as S + 2 + o.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import jax


class Example(NamedTuple):
  """One sampled example, before layout.

  inputs: (N,) int32 input symbols; positions >= num_inputs are ignored.
  num_inputs: () int32, the true input length.
  outputs: (M,) int32 output classes; positions >= num_outputs are ignored.
  num_outputs: () int32, the true output length.
  output_mask: (M,) bool, the output positions that count for the loss and
    the accuracy (the reference's accuracy mask; all True on most tasks).
  """
  inputs: jax.Array
  num_inputs: jax.Array
  outputs: jax.Array
  num_outputs: jax.Array
  output_mask: jax.Array


# sample(key, length, max_length) -> Example, arrays sized for max_length.
RawSampler = Callable[[jax.Array, jax.Array, int], Example]


def _same(length: int) -> int:
  return length


def _one(length: int) -> int:
  del length
  return 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class TaskSpec:
  """A task family, before its alphabet size and options are chosen.

  make_sampler(V, options) -> RawSampler. V is the number of data symbols: the
  configurable `task.vocab_size` for selfattn's own tasks; reference tasks have
  a fixed alphabet (`fixed_vocab`). None for a task whose examples are not
  drawn one at a time (translation: pairs of a corpus, batched by length
  in selfattn.tasks.translation.batches.TrainingBatches).

  input_length / output_length: the static number of input and output tokens
  of an example of `length` (the task's length argument, as in the reference
  code), used to size padded arrays; they must not decrease with length.
  """
  description: str
  make_sampler: Callable[[int, dict[str, Any]], RawSampler] | None
  # The examples the training loop evaluates on, where they are not drawn
  # like training's (a held-out split); None: make_sampler's.
  make_eval_sampler: Callable[[int, dict[str, Any]], RawSampler] | None = None
  level: str     # 'selfattn', 'regular', 'dcf', 'cs', 'music' or 'translation'
  classification: bool = False    # one output symbol per example
  aligned: bool = False           # output i belongs to input i (in_place OK)
  order_sensitive: bool = True    # unsolvable without position information
  # A causal language model: next-token targets in place (layout in_place).
  language_model: bool = False
  # Translation: a source for an encoder, a target for a decoder with
  # cross-attention (layout encoder_decoder); batches come from
  # selfattn.tasks.translation.batches, not from examples (make_sampler None).
  seq2seq: bool = False
  input_symbols: Callable[[int], int] = _same   # S from V
  num_classes: Callable[[int], int] = _same     # output alphabet from V
  input_length: Callable[[int], int] = _same
  output_length: Callable[[int], int] = _same
  fixed_vocab: int | None = None  # reference tasks: V is not configurable
  # What is wrong with the task's own options (config.task's shift, window,
  # max_shift, transpose, crop_align) for training up to max_len, as one
  # line naming the field; None when nothing. Config validation calls it.
  options_problem: Callable[[dict[str, Any], int], str | None] | None = None
  # The options of DEFAULT_OPTIONS the task reads; config validation
  # refuses another's set away from its default (it would be ignored).
  options: tuple[str, ...] = ()
  default_vocab: int = 8
  min_length: int = 1
  # The longest task length the alphabet allows (None: any), e.g. strings of
  # distinct letters; config validation checks training and eval lengths.
  max_length: Callable[[int], int] | None = None
  chance: Callable[[int], float] | None = None   # None: 1 / num_classes

  def __post_init__(self):
    if self.classification:
      object.__setattr__(self, 'output_length', _one)

  @property
  def layouts(self) -> tuple[str, ...]:
    """The layouts this task can use."""
    if self.language_model:
      return ('in_place',)
    if self.seq2seq:
      return ('encoder_decoder',)
    if self.aligned or self.classification:
      return ('in_place', 'placeholders', 'autoregressive')
    return ('placeholders', 'autoregressive')

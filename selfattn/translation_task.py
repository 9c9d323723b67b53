"""Translation as a task of the training system: Multi30k German-English.

The task `multi30k` (layout encoder_decoder) trains an encoder-decoder on
the training pairs, as translation_data.py tokenizes and buckets them. Its
`task.vocab_size` is the SentencePiece vocabulary (joint, unigram, trained on
the training split only), its `task.max_len` the longest source (in tokens)
a training pair may have: pairs with longer sources are left out (the
length-generalization protocol sets it low; 64 keeps all of them, the
longest is 55).

Its batches come from translation_batches.py (pairs of two sequences in
length buckets), not from per-example samples; this module only registers
the task, below tasks.py, which lists it.
"""

from __future__ import annotations

from selfattn.task_spec import TaskSpec

def _make_sampler(V: int, options: dict):
  del options
  # Trains (or reads from its cache) the tokenizer now, so missing data or
  # an impossible vocabulary is reported by config validation.
  from selfattn import translation_data
  translation_data.tokenizer_for(V)

  def sample(key, length, max_length):
    raise NotImplementedError(
        'translation batches come from selfattn.translation_task.'
        'TrainingBatches (pairs of two sequences), not from per-example '
        'samples')
  return sample


TRANSLATION_TASKS: dict[str, TaskSpec] = {
    'multi30k': TaskSpec(
        description='German to English image descriptions (Multi30k task 1), '
                    'SentencePiece tokens',
        make_sampler=_make_sampler, level='translation', seq2seq=True,
        default_vocab=8000, min_length=1),
}

"""Translation as a task of the training system: Multi30k, either way.

The task `multi30k` (German to English, the study's direction) or
`multi30k_en_de` (English to German; layout encoder_decoder for both)
trains an encoder-decoder on the training pairs, as data.py
tokenizes and buckets them. Both share one joint tokenizer. Each task's
`task.vocab_size` is the SentencePiece vocabulary (joint, unigram, trained on
the training split only), its `task.max_len` the longest source (in tokens)
a training pair may have: pairs with longer sources are left out (the
length-generalization protocol sets it low; 64 keeps all of them either
way: the longest German source has 55 tokens, the longest English 52).

Its batches come from translation_batches.py (pairs of two sequences in
length buckets), not from per-example samples; this module only registers
the task, below tasks/registry.py, which lists it.
"""

from __future__ import annotations

from selfattn.tasks.spec import TaskSpec

def _make_sampler(V: int, options: dict):
  del options
  # Trains (or reads from its cache) the tokenizer now, so missing data or
  # an impossible vocabulary is reported by config validation.
  from selfattn.tasks.translation import data as translation_data
  translation_data.tokenizer_for(V)

  def sample(key, length, max_length):
    raise NotImplementedError(
        'translation batches come from selfattn.tasks.translation.task.'
        'TrainingBatches (pairs of two sequences), not from per-example '
        'samples')
  return sample


# Each task's (source, target) language, as multi30k.pairs names them.
LANGUAGES: dict[str, tuple[str, str]] = {
    'multi30k': ('de', 'en'),
    'multi30k_en_de': ('en', 'de'),
}
_LANGUAGE_NAMES = {'de': 'German', 'en': 'English'}

TRANSLATION_TASKS: dict[str, TaskSpec] = {
    name: TaskSpec(
        description=f'{_LANGUAGE_NAMES[source]} to {_LANGUAGE_NAMES[target]} '
                    f'image descriptions (Multi30k task 1), SentencePiece '
                    f'tokens',
        make_sampler=_make_sampler, level='translation', seq2seq=True,
        default_vocab=8000, min_length=1)
    for name, (source, target) in LANGUAGES.items()
}

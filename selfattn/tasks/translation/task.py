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

Its batches come from batches.py (pairs of two sequences in length
buckets), not from per-example samples (the spec's make_sampler is None);
this module registers the task, below tasks/registry.py, which lists it,
and checks a config against its corpus (config_problem: the config
validation calls it before anything is written).
"""

from __future__ import annotations

from selfattn.tasks.spec import TaskSpec

def config_problem(name: str, *, vocab_size: int, max_source_len: int,
                   batch_tokens: int, model_max_len: int,
                   devices: int = 1, eval_lengths=None,
                   eval_examples: int | None = None) -> str | None:
  """What makes a translation config unable to train or decode, in one
  line naming the field; None when it can. Builds (or reads from the
  cache) the corpus the trainer will use, so it runs before anything is
  written to a workdir."""
  from selfattn.tasks.translation import data as translation_data
  try:       # trains the joint tokenizer, or reads it from its cache
    translation_data.tokenizer_for(vocab_size)
  except ValueError as e:
    return f'config.task.{e}'
  try:
    corpus = translation_data.prepare(vocab_size, max_source_len,
                                      *LANGUAGES[name])
  except ValueError as e:        # 'task.max_len=...: no training source ...'
    return f'config.{e}'
  # The validation split that every evaluation reads: a damaged or missing
  # file is a DataError now, before anything is written to a workdir.
  val = corpus.eval_set('val')
  if eval_lengths:
    # The evaluation scores the first eval_examples sentences in source-
    # length ranges (previous, L]; with none in any range it measured
    # nothing (no score; early stopping failed on an empty record).
    lens = val.source_lens()[:eval_examples]
    bounds = sorted(int(n) for n in eval_lengths)
    if not ((lens > 0) & (lens <= bounds[-1])).any():
      return (f'config.eval.lengths={list(eval_lengths)}: none of the '
              f'{len(lens)} validation sentences evaluated has a source of at '
              f'most {bounds[-1]} tokens (the shortest has {int(lens.min())}), '
              f'so the evaluation would measure nothing')
  longest = corpus.buckets[-1].bound      # padded tokens of the longest pair
  if batch_tokens and batch_tokens < longest * devices:
    return (f'config.train.batch_tokens={batch_tokens} is smaller than one '
            f'sentence of the longest bucket ({longest} padded tokens) per '
            f'device ({devices}): use 0 (batch_size sentences of it) or at '
            f'least {longest * devices}')
  if model_max_len < longest:
    return (f'config.model.max_len={model_max_len} is below the longest '
            f'training pair ({longest} padded tokens, BOS included): the '
            f'encoder and decoder need a position for each; raise it')
  return None


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
        make_sampler=None, level='translation', seq2seq=True,
        default_vocab=8000, min_length=1)
    for name, (source, target) in LANGUAGES.items()
}

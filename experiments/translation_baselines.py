"""Simple floors for Multi30k German-English: what a trained model must beat.

  python -m experiments.translation_baselines [--data_dir=...]

Each floor is fitted on the training split only and scored with sacreBLEU
(detokenized, cased) and chrF on the validation and every test set:

  copy       the German source as the English output: what names, numbers
             and shared words alone score.
  word       word-by-word: each source word replaced by its most likely
             English word under IBM Model 1 (Brown et al. 1993; EM from
             uniform, NULL word on the source side, ITERATIONS rounds), in
             source order, the first letter capitalised; a word never seen
             in training is copied.
  retrieval  the English side of the most similar training source: cosine of
             TF-IDF vectors of lower-cased word unigrams and bigrams. Multi30k
             is image captions with a small vocabulary, so a near-duplicate
             training caption is often a close translation.

Words are sacreBLEU's 13a tokens of the text (its own tokenizer, so the
floors' units are the metric's); outputs are joined with spaces and the
spaces before punctuation removed.
"""

from __future__ import annotations

import collections
import math
import re
from typing import Any, Sequence

import numpy as np

ITERATIONS = 5
NULL = '<null>'


def words(text: str) -> list[str]:
  """sacreBLEU's 13a tokens of `text`."""
  from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
  return Tokenizer13a()(text).split()


def detokenize(tokens: Sequence[str]) -> str:
  """Tokens joined with spaces, none before . , ! ? ; :"""
  return re.sub(r' ([.,!?;:])', r'\1', ' '.join(tokens))


def copy_source(sources: Sequence[str]) -> list[str]:
  return list(sources)


class WordByWord:
  """IBM Model 1 t(e | f) from the training pairs; translate() replaces
  each source word by its argmax English word."""

  def __init__(self, sources: Sequence[str], targets: Sequence[str],
               iterations: int = ITERATIONS):
    src = [[NULL] + [w.lower() for w in words(s)] for s in sources]
    tgt = [[w for w in words(t)] for t in targets]
    f_vocab = {w: i for i, w in enumerate(sorted({w for s in src for w in s}))}
    e_vocab = {w: i for i, w in enumerate(sorted({w for t in tgt for w in t}))}
    # Every co-occurring (f, e) in a sentence pair, one row per target token
    # occurrence and source token: the E-step's terms.
    keys, occurrences, f_ids = [], [], []
    occurrence = 0
    for s, t in zip(src, tgt):
      fs = np.array([f_vocab[w] for w in s])
      for e in t:
        keys.append(fs * len(e_vocab) + e_vocab[e])
        occurrences.append(np.full(len(fs), occurrence))
        f_ids.append(fs)
        occurrence += 1
    flat = np.concatenate(keys)
    pair_types, pair_of = np.unique(flat, return_inverse=True)
    occ = np.concatenate(occurrences)
    f_of_type = pair_types // len(e_vocab)
    t = np.ones(len(pair_types))          # uniform start: any constant
    for _ in range(iterations):
      p = t[pair_of]
      z = np.bincount(occ, weights=p, minlength=occurrence)
      delta = p / z[occ]
      counts = np.bincount(pair_of, weights=delta, minlength=len(pair_types))
      totals = np.bincount(f_of_type, weights=counts, minlength=len(f_vocab))
      t = counts / totals[f_of_type]
    e_words = sorted(e_vocab, key=e_vocab.get)
    f_words = sorted(f_vocab, key=f_vocab.get)
    # argmax_e t(e | f) for every source word f.
    best = collections.defaultdict(lambda: (-1.0, ''))
    for kind, prob in zip(pair_types, t):
      f, e = divmod(int(kind), len(e_vocab))
      if prob > best[f][0]:
        best[f] = (prob, e_words[e])
    self.table = {f_words[f]: e for f, (_, e) in best.items()}

  def translate(self, sources: Sequence[str]) -> list[str]:
    out = []
    for s in sources:
      text = detokenize([self.table.get(w.lower(), w) for w in words(s)])
      out.append(text[:1].upper() + text[1:])    # sentence case, as the source
    return out


class Retrieval:
  """The target of the nearest training source (TF-IDF cosine over
  lower-cased word unigrams and bigrams); ties go to the earliest pair."""

  def __init__(self, sources: Sequence[str], targets: Sequence[str]):
    self.targets = list(targets)
    grams = [self._grams(s) for s in sources]
    df = collections.Counter(g for gs in grams for g in set(gs))
    self.index = {g: i for i, g in enumerate(sorted(df))}
    self.idf = np.array([math.log(len(grams) / df[g]) + 1.0
                         for g in sorted(df)])
    self.matrix = self._vectors(grams)

  @staticmethod
  def _grams(text: str) -> list[str]:
    w = [x.lower() for x in words(text)]
    return w + [a + ' ' + b for a, b in zip(w, w[1:])]

  def _vectors(self, grams_list):
    from scipy import sparse
    rows, cols, vals = [], [], []
    for r, grams in enumerate(grams_list):
      counts = collections.Counter(g for g in grams if g in self.index)
      for g, c in counts.items():
        rows.append(r)
        cols.append(self.index[g])
        vals.append(c * self.idf[self.index[g]])
    m = sparse.csr_matrix((vals, (rows, cols)),
                          shape=(len(grams_list), len(self.index)))
    norms = np.sqrt(np.asarray(m.multiply(m).sum(axis=1))).ravel()
    return sparse.diags(1.0 / np.maximum(norms, 1e-12)) @ m

  def translate(self, sources: Sequence[str]) -> list[str]:
    queries = self._vectors([self._grams(s) for s in sources])
    out = []
    for start in range(0, queries.shape[0], 256):
      sims = (queries[start:start + 256] @ self.matrix.T).toarray()
      out += [self.targets[i] for i in np.argmax(sims, axis=1)]
    return out


FLOORS = ('copy', 'word', 'retrieval')


def floors(data_dir: str | None = None, splits: Sequence[str] | None = None,
           scorer=None) -> dict[str, dict[str, dict[str, Any]]]:
  """{floor: {split: scores}} on the validation and test splits; scores
  are scorer(split, hypotheses, references), bleu.score by default (the
  study adds BLEU by source length)."""
  from selfattn.tasks.translation import bleu
  from selfattn.tasks.translation import multi30k
  splits = list(splits or ('val',) + multi30k.TEST_SPLITS)
  scorer = scorer or (lambda split, hyps, refs: bleu.score(hyps, refs))
  train_src, train_tgt = multi30k.pairs('train', data_dir=data_dir)
  systems = {'copy': copy_source,
             'word': WordByWord(train_src, train_tgt).translate,
             'retrieval': Retrieval(train_src, train_tgt).translate}
  out: dict[str, dict[str, dict[str, Any]]] = {}
  for name, system in systems.items():
    out[name] = {}
    for split in splits:
      src, ref = multi30k.pairs(split, data_dir=data_dir)
      out[name][split] = scorer(split, system(src), ref)
  return out


def main(argv):
  del argv
  from absl import flags
  results = floors(flags.FLAGS.data_dir)
  for name, by_split in results.items():
    print(name + ': ' + ', '.join(f'{split} BLEU {s["bleu"]:.2f} chrF '
                                  f'{s["chrf"]:.2f}'
                                  for split, s in by_split.items()))
  print(next(iter(next(iter(results.values())).values()))['bleu_signature'])


if __name__ == '__main__':
  from absl import app
  from absl import flags
  from selfattn.training.cli_checks import parse_flags
  flags.DEFINE_string('data_dir', None, 'Multi30k folder (default: '
                      '$SELFATTN_DATA_DIR/multi30k or the user cache).')
  app.run(main, flags_parser=parse_flags)

"""Translation scores with the field's tool, sacreBLEU (Post 2018): BLEU on
detokenized, cased text with its standard 13a tokenization, and chrF,
each with the signature that says exactly how it was computed (print it
beside every number, so anyone can recompute the score with `sacrebleu`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def score(hypotheses: Sequence[str], references: Sequence[str]
          ) -> dict[str, float | str]:
  """{'bleu', 'chrf', 'bleu_signature', 'chrf_signature'} of one reference
  per hypothesis, corpus-level, and BLEU's brevity penalty with the lengths
  it comes from ('bp', 'sys_len', 'ref_len': 13a tokens), since part of a
  BLEU difference can be output length alone."""
  from sacrebleu.metrics import BLEU, CHRF
  _check_lists(hypotheses, references)
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} '
                     f'references')
  if not references:
    raise ValueError('no sentences to score')
  bleu, chrf = BLEU(), CHRF()
  bleu_score = bleu.corpus_score(hypotheses, [references])
  return {'bleu': float(bleu_score.score),
          'bp': float(bleu_score.bp),
          'sys_len': int(bleu_score.sys_len),
          'ref_len': int(bleu_score.ref_len),
          'chrf': float(chrf.corpus_score(hypotheses, [references]).score),
          'bleu_signature': str(bleu.get_signature()),
          'chrf_signature': str(chrf.get_signature())}


def _check_lists(hypotheses, references) -> None:
  """Two strings would be scored as lists of one-character sentences."""
  for name, value in (('hypotheses', hypotheses), ('references', references)):
    if isinstance(value, str):
      raise TypeError(f'{name} is one string; pass a list of sentences '
                      f'(e.g. [{value[:20]!r}])')


def sentence_statistics(hypotheses: Sequence[str], references: Sequence[str]
                        ) -> np.ndarray:
  """(N, 10) float64: sacreBLEU's sufficient statistics of each sentence
  (output length, reference length, matches of 1- to 4-grams, 1- to 4-grams
  in the output). Summed over any subset of rows, they give that subset's
  corpus BLEU (bleu_of_statistics): what a bootstrap over sentences needs
  (sacrebleu.significance computes its paired bootstrap the same way)."""
  from sacrebleu.metrics import BLEU
  _check_lists(hypotheses, references)
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} '
                     f'references')
  if not references:
    raise ValueError('no sentences to score')
  return np.asarray(BLEU()._extract_corpus_statistics(
      list(hypotheses), [list(references)]), np.float64).reshape(-1, 10)


def bleu_of_statistics(summed: np.ndarray) -> np.ndarray:
  """(..., 10) summed sentence_statistics -> (...) corpus BLEU, with
  sacreBLEU's default smoothing."""
  from sacrebleu.metrics import BLEU
  metric = BLEU()
  flat = np.asarray(summed).reshape(-1, 10)
  out = [metric._compute_score_from_stats(row.tolist()).score for row in flat]
  return np.asarray(out, np.float64).reshape(np.shape(summed)[:-1])

"""Translation scores with the field's tool, sacreBLEU (Post 2018): BLEU on
detokenized, cased text with its standard 13a tokenization, and chrF,
each with the signature that says exactly how it was computed (print it
beside every number, so anyone can recompute the score with `sacrebleu`).
"""

from __future__ import annotations

from typing import Sequence


def score(hypotheses: Sequence[str], references: Sequence[str]
          ) -> dict[str, float | str]:
  """{'bleu', 'chrf', 'bleu_signature', 'chrf_signature'} of one reference
  per hypothesis, corpus-level."""
  from sacrebleu.metrics import BLEU, CHRF
  hypotheses, references = list(hypotheses), list(references)
  if len(hypotheses) != len(references):
    raise ValueError(f'{len(hypotheses)} hypotheses for {len(references)} '
                     f'references')
  if not references:
    raise ValueError('no sentences to score')
  bleu, chrf = BLEU(), CHRF()
  return {'bleu': float(bleu.corpus_score(hypotheses, [references]).score),
          'chrf': float(chrf.corpus_score(hypotheses, [references]).score),
          'bleu_signature': str(bleu.get_signature()),
          'chrf_signature': str(chrf.get_signature())}

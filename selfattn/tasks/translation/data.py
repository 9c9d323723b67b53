"""Multi30k as token arrays for training and evaluation: the tokenizer,
the training pairs in length buckets, and padded evaluation chunks.

Everything here is host-side NumPy, computed once per process
(`prepare` is cached): the training system turns the buckets into JAX
batches (translation/batches.py), so a batch stays a pure function of (seed,
step).

Length buckets. A pair's length is max(source tokens, target tokens + 1)
(the decoder reads BOS + target and predicts target + EOS). The training
pairs are split at the length quantiles BUCKET_QUANTILES, each bound
rounded up to a multiple of 8, so a batch is padded to its bucket's bound
rather than to the longest pair of the corpus (Multi30k's mean source is
15 tokens, its longest 55: one padded size would spend about 3x the
compute). Every bucket's batch holds about the same number of tokens.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np

from selfattn.tasks import data_files
from selfattn.tasks.translation import multi30k
from selfattn.tasks.translation import tokenizer as tokenizer_lib

BUCKET_QUANTILES = (0.5, 0.8, 0.95, 1.0)
PAD, BOS, EOS = tokenizer_lib.PAD, tokenizer_lib.BOS, tokenizer_lib.EOS


def _round_up(n: int, multiple: int = 8) -> int:
  return -(-n // multiple) * multiple


@dataclasses.dataclass(frozen=True)
class Bucket:
  """Training pairs of one padded length.

  sources (n, bound) int32 (PAD after each source), source_lens (n,),
  targets (n, bound) int32 = target + EOS then PAD, target_lens (n,)
  counting EOS. decoder inputs are BOS + target (`decoder_inputs`).
  """
  bound: int
  sources: np.ndarray
  source_lens: np.ndarray
  targets: np.ndarray
  target_lens: np.ndarray

  def __len__(self) -> int:
    return len(self.source_lens)


def decoder_inputs(targets: np.ndarray) -> np.ndarray:
  """(n, T) targets (target + EOS, PAD) -> (n, T) BOS + target (the EOS
  position's input is the last target token; padding stays PAD)."""
  shifted = np.concatenate([np.full((len(targets), 1), BOS, targets.dtype),
                            targets[:, :-1]], axis=1)
  return np.where(shifted == EOS, PAD, shifted).astype(np.int32)


def padded(rows: list[list[int]], width: int) -> np.ndarray:
  """Ragged rows -> (n, width) int32, PAD on the right."""
  out = np.full((len(rows), width), PAD, np.int32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """A split's pairs for evaluation, in file order.

  sources/references: the raw text; source_ids/target_ids: token ids
  (target without EOS)."""
  split: str
  sources: list[str]
  references: list[str]
  source_ids: list[list[int]]
  target_ids: list[list[int]]

  def __len__(self) -> int:
    return len(self.sources)

  def source_lens(self) -> np.ndarray:
    return np.array([len(s) for s in self.source_ids], np.int32)


@dataclasses.dataclass(frozen=True)
class Corpus:
  """The tokenizer, the training buckets and the evaluation splits."""
  tokenizer: tokenizer_lib.Tokenizer
  buckets: tuple[Bucket, ...]
  max_source_len: int          # training sources are at most this long
  dropped: int                 # training pairs left out by max_source_len
  source: str = 'de'           # languages, as multi30k.pairs names them
  target: str = 'en'

  @property
  def vocab_size(self) -> int:
    return self.tokenizer.vocab_size

  def eval_set(self, split: str, data_dir: str | None = None) -> EvalSet:
    return _eval_set(self.tokenizer, split, self.source, self.target,
                     data_dir)


def make_buckets(source_ids: list[list[int]], target_ids: list[list[int]],
                 quantiles=BUCKET_QUANTILES) -> tuple[Bucket, ...]:
  """Pairs -> buckets at the length quantiles (bounds multiples of 8,
  distinct, the last holding the longest pair)."""
  if not source_ids:
    raise ValueError('no training pairs')
  lengths = np.array([max(len(s), len(t) + 1)
                      for s, t in zip(source_ids, target_ids)])
  bounds = sorted({_round_up(int(np.ceil(np.quantile(lengths, q))))
                   for q in quantiles} | {_round_up(int(lengths.max()))})
  buckets, lower = [], 0
  for bound in bounds:
    chosen = np.flatnonzero((lengths > lower) & (lengths <= bound))
    lower = bound
    if not len(chosen):
      continue
    src = [source_ids[i] for i in chosen]
    tgt = [target_ids[i] + [EOS] for i in chosen]
    buckets.append(Bucket(
        bound=bound, sources=padded(src, bound),
        source_lens=np.array([len(s) for s in src], np.int32),
        targets=padded(tgt, bound),
        target_lens=np.array([len(t) for t in tgt], np.int32)))
  return tuple(buckets)


def tokenizer_cache() -> str:
  """Where trained tokenizers are kept: beside the user's data cache."""
  return os.path.join(data_files.cache_dir(), multi30k.SUBDIR, 'sentencepiece')


@functools.lru_cache(maxsize=2)
def tokenizer_for(vocab_size: int, data_dir: str | None = None
                  ) -> tokenizer_lib.Tokenizer:
  """A joint German-English SentencePiece model (unigram) of the training
  split only, cached under a hash of its inputs."""
  de, en = multi30k.pairs('train', 'de', 'en', data_dir)
  return tokenizer_lib.train(de + en, vocab_size=vocab_size,
                             cache_dir=tokenizer_cache())


@functools.lru_cache(maxsize=2)
def prepare(vocab_size: int, max_source_len: int, source: str = 'de',
            target: str = 'en', data_dir: str | None = None) -> Corpus:
  """The corpus for training: training pairs whose source has at most
  max_source_len tokens, bucketed."""
  tok = tokenizer_for(vocab_size, data_dir)
  src, tgt = multi30k.pairs('train', source, target, data_dir)
  src_ids, tgt_ids = tok.encode(src), tok.encode(tgt)
  kept = [i for i, s in enumerate(src_ids) if 0 < len(s) <= max_source_len]
  if not kept:
    raise ValueError(f'task.max_len={max_source_len}: no training source is '
                     f'that short')
  buckets = make_buckets([src_ids[i] for i in kept], [tgt_ids[i] for i in kept])
  return Corpus(tokenizer=tok, buckets=buckets, max_source_len=max_source_len,
                dropped=len(src_ids) - len(kept), source=source,
                target=target)


@functools.lru_cache(maxsize=8)
def _eval_set(tok: tokenizer_lib.Tokenizer, split: str, source: str = 'de',
              target: str = 'en', data_dir: str | None = None) -> EvalSet:
  src, ref = multi30k.pairs(split, source, target, data_dir)
  return EvalSet(split=split, sources=src, references=ref,
                 source_ids=tok.encode(src), target_ids=tok.encode(ref))


def eval_chunks(source_ids: list[list[int]], target_ids: list[list[int]] | None,
                token_budget: int, multiple: int = 1):
  """Yields (indices, sources (n, S), source_lens (n,), targets (n, T) or
  None) over the pairs sorted by source length, each chunk padded to a
  multiple of 8 and holding about token_budget source tokens; n is a
  multiple of `multiple` (rows past the pairs repeat the last pair and are
  marked by index -1)."""
  order = np.argsort([len(s) for s in source_ids], kind='stable')
  start = 0
  while start < len(order):
    width = _round_up(max(len(source_ids[order[start]]), 1))
    count = max(multiple, token_budget // width // multiple * multiple)
    chosen = order[start:start + count]
    width = _round_up(max(len(source_ids[i]) for i in chosen))
    indices = np.full(_round_up(len(chosen), multiple), -1, np.int64)
    indices[:len(chosen)] = chosen
    rows = [source_ids[i] for i in chosen]
    rows += [rows[-1]] * (len(indices) - len(chosen))
    targets = None
    if target_ids is not None:
      tgt = [target_ids[i] + [EOS] for i in chosen]
      tgt += [tgt[-1]] * (len(indices) - len(chosen))
      targets = padded(tgt, _round_up(max(len(t) for t in tgt)))
    yield (indices, padded(rows, width),
           np.array([len(r) for r in rows], np.int32), targets)
    start += len(chosen)

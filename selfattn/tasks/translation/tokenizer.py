"""Subword tokenization for translation, with SentencePiece (Kudo &
Richardson 2018): trained on the training split only, deterministic, cached
under a hash of everything that shapes it, and exactly reversible.

Exact round trip (decode(encode(s)) == s for every string): no
normalization (`identity` rule), whitespace kept as it is, and byte
fallback, so a character never seen in training is spelled in UTF-8 bytes
instead of becoming <unk>. Ids: 0 pad, 1 unk, 2 bos, 3 eos.

Training is deterministic: one thread, every sentence used, none shuffled
(the same inputs give the same model bytes, tested), and the model is
cached as <cache>/<sha256 of inputs and options>.model, so a study trains it
once.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
from typing import Iterable, Sequence

PAD, UNK, BOS, EOS = 0, 1, 2, 3
MODEL_TYPES = ('unigram', 'bpe')

# Every trainer option besides the two a caller picks. The cache key hashes
# this table, so editing any entry trains a new model instead of silently
# reusing one trained under other options.
_TRAINER_OPTIONS = dict(
    character_coverage=1.0, byte_fallback=True,
    normalization_rule_name='identity', remove_extra_whitespaces=False,
    split_digits=True, pad_id=PAD, unk_id=UNK, bos_id=BOS, eos_id=EOS,
    num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
    max_sentence_length=100000)


class Tokenizer:
  """A trained SentencePiece model: text <-> ids (lists of ints)."""

  def __init__(self, model_proto: bytes):
    import sentencepiece as spm
    self.proto = model_proto
    self._sp = spm.SentencePieceProcessor(model_proto=model_proto)

  @property
  def vocab_size(self) -> int:
    return self._sp.get_piece_size()

  def encode(self, text: str | Sequence[str]) -> list[int] | list[list[int]]:
    """Ids of a string (no bos/eos), or of each string of a list."""
    return self._sp.encode(text if isinstance(text, str) else list(text))

  def decode(self, ids: Sequence[int] | Sequence[Sequence[int]]
             ) -> str | list[str]:
    """The text of ids (pad, bos, eos and anything after eos dropped), or of
    each list of ids."""
    if ids and not isinstance(ids[0], (int,)) and hasattr(ids[0], '__len__'):
      return [self.decode(row) for row in ids]
    kept = []
    for i in ids:
      i = int(i)
      if i == EOS:
        break
      if i not in (PAD, BOS):
        kept.append(i)
    return self._sp.decode(kept)

  def pieces(self, text: str) -> list[str]:
    return self._sp.encode(text, out_type=str)

  def id_pieces(self, ids: Sequence[int]) -> list[str]:
    """The piece of each id (for labels: '▁' marks a word start)."""
    return [self._sp.id_to_piece(int(i)) for i in ids]


def _key(texts: Sequence[str], options: dict) -> str:
  import sentencepiece as spm
  digest = hashlib.sha256()
  digest.update(json.dumps({**options, **_TRAINER_OPTIONS,
                            'sentencepiece': spm.__version__},
                           sort_keys=True).encode())
  for text in texts:
    digest.update(text.encode('utf-8'))
    digest.update(b'\n')
  return digest.hexdigest()


def train(texts: Sequence[str], *, vocab_size: int = 8000,
          model_type: str = 'unigram',
          cache_dir: str | os.PathLike | None = None) -> Tokenizer:
  """A SentencePiece model of `texts` (the training split's sentences, of
  one language or both), from the cache when these inputs trained one
  before. cache_dir None: train without caching."""
  if model_type not in MODEL_TYPES:
    raise ValueError(f'model_type={model_type!r}; valid: '
                     f'{", ".join(MODEL_TYPES)}')
  if vocab_size < 260:
    raise ValueError(f'vocab_size={vocab_size} must be >= 260 (256 bytes '
                     f'for the fallback and the 4 special ids)')
  texts = list(texts)
  if not texts:
    raise ValueError('no training text')
  options = dict(vocab_size=vocab_size, model_type=model_type)
  path = None
  if cache_dir is not None:
    path = pathlib.Path(cache_dir) / f'{_key(texts, options)}.model'
    if path.is_file():
      return Tokenizer(path.read_bytes())
  proto = _train(texts, **options)
  if path is not None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_suffix(f'.tmp-{os.getpid()}')
    temp.write_bytes(proto)
    os.replace(temp, path)             # atomic: a reader sees all or none
  return Tokenizer(proto)


def _train(texts: Iterable[str], *, vocab_size: int, model_type: str) -> bytes:
  import io

  import sentencepiece as spm
  model = io.BytesIO()
  try:
    _run_trainer(spm, model, texts, vocab_size, model_type)
  except RuntimeError as e:     # sentencepiece reports bad sizes this way
    reason = ' '.join(str(e).split())
    raise ValueError(f'vocab_size={vocab_size}: SentencePiece cannot train '
                     f'this vocabulary on this text ({reason})') from None
  return model.getvalue()


def _run_trainer(spm, model, texts, vocab_size: int, model_type: str) -> None:
  spm.SentencePieceTrainer.train(
      sentence_iterator=iter(texts), model_writer=model,
      vocab_size=vocab_size, model_type=model_type, **_TRAINER_OPTIONS,
      minloglevel=2)


__all__ = ['BOS', 'EOS', 'MODEL_TYPES', 'PAD', 'Tokenizer', 'UNK', 'train']

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
once. Beside it a .json record (the model's checksum, vocabulary size, type
and trainer options) is checked on every load: a cached model that does not
match it (truncated, replaced, or planted under the key) is rebuilt.
"""

from __future__ import annotations

import hashlib
import json
import numbers
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
    """Ids of a string (no bos/eos), or of each string of a list. A string
    that is not valid Unicode (a lone surrogate) is refused: it has no
    UTF-8 spelling to tokenize."""
    texts = [text] if isinstance(text, str) else list(text)
    for i, t in enumerate(texts):
      if not isinstance(t, str):
        raise TypeError(f'encode takes strings; item {i} is {type(t).__name__}')
      try:
        t.encode('utf-8')
      except UnicodeEncodeError as e:
        where = '' if isinstance(text, str) else f'string {i}: '
        raise ValueError(f'{where}not valid Unicode ({e.reason} at character '
                         f'{e.start}: {t[e.start]!r})') from None
    return self._sp.encode(text if isinstance(text, str) else texts)

  def decode(self, ids: Sequence[int] | Sequence[Sequence[int]]
             ) -> str | list[str]:
    """The text of ids (pad, bos, eos and anything after eos dropped), or of
    each row of ids; lists, NumPy and JAX arrays alike (the decoder returns
    arrays)."""
    if hasattr(ids, 'tolist'):           # np.ndarray, jax.Array
      ids = ids.tolist()
    if isinstance(ids, numbers.Integral):
      raise TypeError('decode takes a sequence of ids, not one id')
    if len(ids) and not isinstance(ids[0], numbers.Integral):
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
    cached = _read_cached(path, options)
    if cached is not None:
      return cached
  proto = _train(texts, **options)
  if path is not None:
    _write_cached(path, proto, options)
  return Tokenizer(proto)


def _record_path(model_path: pathlib.Path) -> pathlib.Path:
  return model_path.with_suffix('.json')


def _read_cached(path: pathlib.Path, options: dict) -> Tokenizer | None:
  """The cached model at `path` if it is the one its record describes
  (checksum, vocabulary size, model type) and loads with that vocabulary;
  None (with a warning naming why) when it must be rebuilt: missing,
  truncated, replaced, or written without its record."""
  if not path.is_file():
    return None
  problem = None
  try:
    record = json.loads(_record_path(path).read_text())
    proto = path.read_bytes()
    if not isinstance(record, dict):
      problem = 'its record is not a JSON object'
    elif record.get('sha256') != hashlib.sha256(proto).hexdigest():
      problem = 'its checksum does not match its record'
    elif any(record.get(k) != v for k, v in options.items()):
      problem = (f'its record says {record.get("vocab_size")} '
                 f'{record.get("model_type")}, not {options["vocab_size"]} '
                 f'{options["model_type"]}')
    else:
      tokenizer = Tokenizer(proto)
      if tokenizer.vocab_size != options['vocab_size']:
        problem = (f'it holds {tokenizer.vocab_size} pieces, not '
                   f'{options["vocab_size"]}')
      else:
        return tokenizer
  except FileNotFoundError:
    problem = 'it has no record (checksum, size) beside it'
  except (OSError, ValueError, RuntimeError) as e:  # JSON, SentencePiece
    problem = f'it cannot be read ({type(e).__name__})'
  from absl import logging
  logging.warning('Tokenizer cache %s is rebuilt: %s', path, problem)
  return None


def _write_cached(path: pathlib.Path, proto: bytes, options: dict) -> None:
  """The model, then its record, each replaced atomically. Training is
  deterministic, so two processes that build the same key at once write
  the same bytes, and a reader that meets a half-finished pair rebuilds."""
  import sentencepiece as spm
  path.parent.mkdir(parents=True, exist_ok=True)
  record = {**options, 'sha256': hashlib.sha256(proto).hexdigest(),
            'sentencepiece': spm.__version__, 'trainer': _TRAINER_OPTIONS}
  for target, data in ((path, proto),
                       (_record_path(path), json.dumps(record, indent=1,
                                                       sort_keys=True).encode())):
    temp = target.with_name(f'{target.name}.tmp-{os.getpid()}')
    temp.write_bytes(data)
    os.replace(temp, target)           # atomic: a reader sees all or none


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

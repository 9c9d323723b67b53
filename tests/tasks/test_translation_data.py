"""Translation's data, tokens and scores: the Multi30k loader (checksums,
refusals, the shared copy), the SentencePiece tokenizer (exact round trip,
determinism, the cache) and the sacreBLEU call."""

import gzip
import json
import math
import hashlib
import urllib.error
import urllib.request

import pytest

from data import REQUIRES_MULTI30K
from selfattn.tasks.translation import bleu
from selfattn.tasks import data_files
from selfattn.tasks.translation import multi30k
from selfattn.tasks.translation import tokenizer

# A small made-up parallel corpus (the tests' own; the real data is
# Multi30k's, read only by the tests marked REQUIRES_MULTI30K).
GERMAN = ['Ein Hund läuft über die Wiese.', 'Zwei Kinder spielen im Park.',
          'Eine Frau liest ein Buch.', 'Der Mann fährt  Fahrrad.',
          'Ein kleines Mädchen isst ein Eis.', 'Drei Hunde schlafen.'] * 20
ENGLISH = ['A dog runs across the meadow.', 'Two children play in the park.',
           'A woman reads a book.', 'The man rides a  bike.',
           'A little girl eats an ice cream.', 'Three dogs sleep.'] * 20


def _offline(monkeypatch):
  def refuse(*args, **kwargs):
    raise urllib.error.URLError('network disabled in tests')
  monkeypatch.setattr(urllib.request, 'urlopen', refuse)


def _gz(path, lines):
  path.parent.mkdir(parents=True, exist_ok=True)
  with gzip.open(path, 'wt', encoding='utf-8') as f:
    f.write(''.join(line + '\n' for line in lines))
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_loader_refuses_a_bad_checksum_and_says_where_it_looked(
    tmp_path, monkeypatch):
  _offline(monkeypatch)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  monkeypatch.setenv('SELFATTN_DATA_DIR', str(tmp_path / 'data'))
  with pytest.raises(multi30k.DataError, match=r'val\.de\.gz not found '
                     r'\(looked in .*data/multi30k/val\.de\.gz, .*cache/'
                     r'selfattn/multi30k/val\.de\.gz\) and the download .* '
                     r'failed'):
    multi30k.sentences('val', 'de')
  _gz(tmp_path / 'data' / 'multi30k' / 'val.de.gz', ['not the data'])
  with pytest.raises(multi30k.DataError, match='checksum mismatch'):
    multi30k.sentences('val', 'de')
  with pytest.raises(ValueError, match="split='dev'; valid: train, val"):
    multi30k.sentences('dev', 'de')


def test_lines_are_read_exactly_and_counted(tmp_path, monkeypatch):
  """No stripping: spaces inside and around a sentence stay; a file with
  the wrong number of lines is refused."""
  lines = [' two  spaces ', 'ü and ß'] + ['x'] * 459
  digest = _gz(tmp_path / 'multi30k' / 'test_2017_mscoco.en.gz', lines)
  monkeypatch.setitem(multi30k.SHA256, 'test_2017_mscoco.en.gz', digest)
  assert multi30k.sentences('test_2017_mscoco', 'en',
                            data_dir=tmp_path) == lines
  digest = _gz(tmp_path / 'multi30k' / 'test_2017_mscoco.en.gz', lines[:-1])
  monkeypatch.setitem(multi30k.SHA256, 'test_2017_mscoco.en.gz', digest)
  with pytest.raises(multi30k.DataError, match='460 lines, expected 461'):
    multi30k.sentences('test_2017_mscoco', 'en', data_dir=tmp_path)


@REQUIRES_MULTI30K
def test_the_shared_copy_is_aligned_and_complete():
  for split, size in multi30k.SIZES.items():
    de, en = multi30k.pairs(split)
    assert len(de) == len(en) == size
  de, en = multi30k.pairs('test_2016_flickr')
  assert de[0].startswith('Ein Mann mit einem orangefarbenen Hut')
  assert en[0].startswith('A man in an orange hat')


def test_the_tokenizer_round_trips_exactly_and_is_deterministic(tmp_path):
  texts = GERMAN + ENGLISH
  a = tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path)
  b = tokenizer.train(texts, vocab_size=300)            # no cache: retrained
  assert a.proto == b.proto and a.vocab_size == 300
  for text in texts + ['Ünbekannte Zeichen: 😀 ñ €', '  leading', 'two  in']:
    ids = a.encode(text)
    assert a.decode(ids) == text                        # exact, bytes too
    assert a.decode([tokenizer.BOS] + ids + [tokenizer.EOS, 7, 8]) == text
  assert a.decode([a.encode('ein'), a.encode('zwei')]) == ['ein', 'zwei']
  cached = list(tmp_path.glob('*.model'))
  assert len(cached) == 1
  assert tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path).proto == \
      cached[0].read_bytes()
  other = tokenizer.train(texts[:50], vocab_size=300, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('*.model'))) == 2 and other.proto != a.proto
  with pytest.raises(ValueError, match="model_type='wordpiece'; valid"):
    tokenizer.train(texts, model_type='wordpiece')


def test_a_changed_trainer_option_trains_a_new_model(tmp_path, monkeypatch):
  texts = GERMAN + ENGLISH
  kept = tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path)
  monkeypatch.setitem(tokenizer._TRAINER_OPTIONS, 'remove_extra_whitespaces',
                      True)
  changed = tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path)
  assert len(list(tmp_path.glob('*.model'))) == 2  # not the cached model
  assert changed.proto != kept.proto
  text = 'two  spaces'                              # the option took effect
  assert kept.decode(kept.encode(text)) == text
  assert changed.decode(changed.encode(text)) == 'two spaces'


def test_bleu_and_chrf_with_their_signatures():
  refs = ENGLISH[:6]
  perfect = bleu.score(refs, refs)
  assert perfect['bleu'] == pytest.approx(100.0)
  assert perfect['chrf'] == pytest.approx(100.0)
  assert 'tok:13a' in perfect['bleu_signature']
  assert 'case:mixed' in perfect['bleu_signature']
  # Lower-casing costs cased BLEU; an empty output scores 0.
  assert bleu.score([r.lower() for r in refs], refs)['bleu'] < 100
  assert bleu.score([''] * 6, refs)['bleu'] == 0
  # The brevity penalty: 1 at the reference's length, exp(1 - ref/sys)
  # below it (sacreBLEU's 13a token counts).
  assert perfect['bp'] == 1.0 and perfect['sys_len'] == perfect['ref_len']
  shorter = [' '.join(r.split()[:-1]) for r in refs]
  short = bleu.score(shorter, refs)
  assert short['ref_len'] == perfect['ref_len']
  assert short['sys_len'] < short['ref_len']
  assert short['bp'] == pytest.approx(
      math.exp(1 - short['ref_len'] / short['sys_len']))
  with pytest.raises(ValueError, match='5 hypotheses for 6 references'):
    bleu.score(refs[:5], refs)


def test_the_jsb_and_multi30k_loaders_share_one_locator():
  """One place finds, checks and downloads data files (data_files)."""
  from selfattn.tasks.music import jsb
  from selfattn import errors
  assert (jsb.DataError is multi30k.DataError is data_files.DataError
          is errors.DataError)


def _cached(tmp_path):
  (model,) = tmp_path.glob('*.model')
  return model, model.with_suffix('.json')


@pytest.mark.parametrize('damage', ['truncated', 'random bytes', 'no record',
                                    'record not an object',
                                    'another vocabulary'])
def test_a_damaged_or_planted_cached_model_is_rebuilt(tmp_path, damage):
  texts = GERMAN + ENGLISH
  good = tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path)
  model, record = _cached(tmp_path)
  if damage == 'truncated':
    model.write_bytes(good.proto[:len(good.proto) // 2])
  elif damage == 'random bytes':
    model.write_bytes(bytes(range(256)) * 20)
  elif damage == 'no record':
    record.unlink()
  elif damage == 'record not an object':
    record.write_text('[]')
  else:
    # A valid model of 320 pieces, with its own valid record, planted under
    # the key of the 300-piece request.
    other = tmp_path / 'other'
    tokenizer.train(texts, vocab_size=320, cache_dir=other)
    other_model, other_record = _cached(other)
    model.write_bytes(other_model.read_bytes())
    record.write_bytes(other_record.read_bytes())
  again = tokenizer.train(texts, vocab_size=300, cache_dir=tmp_path)
  assert again.vocab_size == 300 and again.proto == good.proto
  # The rebuilt cache is whole again, and is read without a rebuild.
  model, record = _cached(tmp_path)
  assert model.read_bytes() == good.proto
  assert json.loads(record.read_text())['sha256'] == hashlib.sha256(
      good.proto).hexdigest()


def test_decode_takes_arrays_and_encode_refuses_what_is_not_unicode(tmp_path):
  import jax.numpy as jnp
  import numpy as np
  tok = tokenizer.train(GERMAN + ENGLISH, vocab_size=300, cache_dir=tmp_path)
  ids = tok.encode(GERMAN[:2])
  width = max(map(len, ids)) + 3
  padded = [row + [tokenizer.EOS] + [tokenizer.PAD] * (width - len(row))
            for row in ids]
  for rows in (np.asarray(padded), jnp.asarray(padded, jnp.int32)):
    assert tok.decode(rows) == GERMAN[:2]                # one row a sentence
    assert tok.decode(rows[0]) == GERMAN[0]
  assert tok.decode([np.int32(i) for i in ids[0]]) == GERMAN[0]
  with pytest.raises(ValueError, match=r"string 1: not valid Unicode .* at "
                     r"character 2: '\\ud800'"):
    tok.encode(['fine', 'ab\ud800c'])
  with pytest.raises(ValueError, match='not valid Unicode'):
    tok.encode('\udfff')


def test_bleu_refuses_two_strings_where_lists_of_sentences_belong():
  with pytest.raises(TypeError, match='hypotheses is one string; pass a list'):
    bleu.score('A dog runs.', 'A dog runs.')
  with pytest.raises(TypeError, match='references is one string'):
    bleu.sentence_statistics(['A dog runs.'], 'A dog runs.')
  assert bleu.score(['A dog runs.'], ['A dog runs.'])['bleu'] == pytest.approx(100)


def test_a_missing_corpus_is_one_error_naming_every_missing_file(
    tmp_path, monkeypatch):
  _offline(monkeypatch)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  monkeypatch.setenv('SELFATTN_DATA_DIR', str(tmp_path / 'data'))
  with pytest.raises(multi30k.DataError) as error:
    multi30k.sentences('train', 'de')
  message = str(error.value)
  assert '\n' not in message
  assert "10 of the corpus's 10 files are missing" in message
  for name in multi30k.SHA256:
    assert name in message
  # With all but one present, the message names the one.
  _gz(tmp_path / 'data' / 'multi30k' / 'val.de.gz', ['x'])
  assert multi30k.missing_files() == [n for n in multi30k.SHA256
                                      if n != 'val.de.gz']

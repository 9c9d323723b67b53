"""A small made-up parallel corpus standing in for Multi30k in the
translation tests: every Multi30k file replaced by it, with its checksum."""

import gzip
import hashlib

import pytest

from configs import translation as translation_config
from selfattn.tasks.translation import multi30k
from selfattn.tasks.translation import data as translation_data

GERMAN = ['Ein Hund läuft über die Wiese.', 'Zwei Kinder spielen im Park.',
          'Eine Frau liest ein Buch.', 'Der Mann fährt Fahrrad.',
          'Ein kleines Mädchen isst ein Eis.', 'Drei Hunde schlafen.',
          'Ein Mann in einem blauen Hemd steht vor einem großen Gebäude und '
          'schaut auf sein Telefon.']
ENGLISH = ['A dog runs across the meadow.', 'Two children play in the park.',
           'A woman reads a book.', 'The man rides a bike.',
           'A little girl eats an ice cream.', 'Three dogs sleep.',
           'A man in a blue shirt stands in front of a large building and '
           'looks at his phone.']


@pytest.fixture
def tiny_multi30k(tmp_path, monkeypatch):
  """Every Multi30k file replaced by the made-up corpus (train: 20 copies;
  other splits: one), with its checksum; caches emptied."""
  sizes = {}
  for split in multi30k.SPLITS:
    copies = 20 if split == 'train' else 1
    sizes[split] = len(GERMAN) * copies
    for lang, lines in (('de', GERMAN), ('en', ENGLISH)):
      name = multi30k.filename(split, lang)
      path = tmp_path / 'data' / 'multi30k' / name
      path.parent.mkdir(parents=True, exist_ok=True)
      with gzip.open(path, 'wt', encoding='utf-8') as f:
        f.write(''.join(line + '\n' for line in lines * copies))
      monkeypatch.setitem(multi30k.SHA256, name,
                          hashlib.sha256(path.read_bytes()).hexdigest())
  monkeypatch.setattr(multi30k, 'SIZES', sizes)
  monkeypatch.setenv('SELFATTN_DATA_DIR', str(tmp_path / 'data'))
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  for cached in (translation_data.prepare, translation_data.tokenizer_for,
                 translation_data._eval_set):
    cached.cache_clear()
  yield
  for cached in (translation_data.prepare, translation_data.tokenizer_for,
                 translation_data._eval_set):
    cached.cache_clear()


def tiny_translation_config(**changes):
  config = translation_config.get_config('quick')
  config.task.vocab_size = 300
  config.eval.num_examples = 8      # more than the 7 validation pairs
  config.eval.lengths = [8, 256]
  for dotted, value in changes.items():
    section, name = dotted.split('.')
    config[section][name] = value
  return config

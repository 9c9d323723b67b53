"""Multi30k task 1 (Elliott et al. 2016; the WMT16-18 multimodal translation
data): German-English image descriptions, raw (untokenized, cased) text.

  train 29,000 pairs; val 1,014; test_2016_flickr 1,000 (the standard test
  set); test_2017_flickr 1,000; test_2017_mscoco 461 (out of domain).

The files come from the repository multi30k/dataset at a pinned commit,
folder data/task1/raw/, gzipped, one sentence a line, the two languages
aligned by line. They carry no licence file, so they are never part of this
repository: data_files finds them under $SELFATTN_DATA_DIR/multi30k/ or the
user cache, or downloads them once, checking each file's SHA-256 every time.
"""

from __future__ import annotations

import gzip
import os

from selfattn.tasks import data_files
from selfattn.errors import DataError

SUBDIR = 'multi30k'
COMMIT = 'a3d2e0d26b56f3846f66a952536ffed4e401d05a'
URL = ('https://github.com/multi30k/dataset/raw/' + COMMIT
       + '/data/task1/raw/{name}')
LANGUAGES = ('de', 'en')
SPLITS = ('train', 'val', 'test_2016_flickr', 'test_2017_flickr',
          'test_2017_mscoco')
TEST_SPLITS = SPLITS[2:]
SIZES = {'train': 29000, 'val': 1014, 'test_2016_flickr': 1000,
         'test_2017_flickr': 1000, 'test_2017_mscoco': 461}
SHA256 = {
    'test_2016_flickr.de.gz': '9204244e408ccb38d2a55cfcd344df15005fc42a07a6e55ca6c52b6ababb8cc8',
    'test_2016_flickr.en.gz': '611d361c6334bc7246101d48097c13cf5c4413c5befc793cc629934359d532d9',
    'test_2017_flickr.de.gz': 'a2c89666db00c495cd8513b9d708d5a3acc205d7de312ef2bf5fb7ebc1540aee',
    'test_2017_flickr.en.gz': '76a444ee25172e72695cddb13ae4a3bda59430617be88e0bb46b60504f054074',
    'test_2017_mscoco.de.gz': '799e4854c25d601cb6cb6be29eabe5667734c61ace2f495e03e429031a0bc338',
    'test_2017_mscoco.en.gz': 'aab300bfb4427697987e02cd0aacd44bfe8aa50456231b6474c08038bbed2b58',
    'train.de.gz': '726e39b2fa9eb9ffb6dc763fb35a179f80fae06ffc5d28b6ace5faa883de28a6',
    'train.en.gz': 'd79cfa999dd4c51d2cb42499b6796d5a882c3a8a961923c25a898c90f8bbd56f',
    'val.de.gz': 'f0cba2f995189cf5770f29a8a9a537a3ad3f51657ad873405082ff6863a5e75a',
    'val.en.gz': '14f7d25ddd868909a9213e361768460edcacdd6ab9d1e77b92560dc10c10dc28',
}


def filename(split: str, language: str) -> str:
  if split not in SPLITS:
    raise ValueError(f'split={split!r}; valid: {", ".join(SPLITS)}')
  if language not in LANGUAGES:
    raise ValueError(f'language={language!r}; valid: {", ".join(LANGUAGES)}')
  return f'{split}.{language}.gz'


def sentences(split: str, language: str,
              data_dir: str | os.PathLike | None = None) -> list[str]:
  """The split's sentences in one language, in file order, each without
  its line end (nothing else is changed: no stripping, no normalization)."""
  name = filename(split, language)
  try:
    path = data_files.locate(SUBDIR, name, SHA256[name],
                             URL.format(name=name), data_dir)
  except DataError as e:
    absent = missing_files(data_dir)
    if len(absent) > 1:       # one line that names everything to fetch
      raise DataError(f'{e}; {len(absent)} of the corpus\'s {len(SHA256)} '
                      f'files are missing: {", ".join(absent)}') from None
    raise
  try:
    with gzip.open(path, 'rt', encoding='utf-8', newline='') as f:
      lines = f.read().split('\n')
  except (OSError, UnicodeDecodeError, EOFError) as e:
    raise DataError(f'{path}: cannot be read as gzipped UTF-8 text ({e})') from None
  if lines and lines[-1] == '':
    lines.pop()                       # the final line end
  if len(lines) != SIZES[split]:
    raise DataError(f'{path}: {len(lines)} lines, expected {SIZES[split]}')
  return lines


def missing_files(data_dir: str | os.PathLike | None = None) -> list[str]:
  """The corpus files found in none of data_files.candidates' places."""
  return [name for name in SHA256
          if not any(p.is_file() for p in data_files.candidates(
              SUBDIR, name, data_dir))]


def pairs(split: str, source: str = 'de', target: str = 'en',
          data_dir: str | os.PathLike | None = None
          ) -> tuple[list[str], list[str]]:
  """(source sentences, target sentences) of a split, aligned by index."""
  if source == target:
    raise ValueError(f'source and target are both {source!r}')
  return (sentences(split, source, data_dir),
          sentences(split, target, data_dir))


__all__ = ['DataError', 'LANGUAGES', 'SPLITS', 'TEST_SPLITS', 'pairs',
           'sentences']

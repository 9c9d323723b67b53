"""Data files that are never part of this repository: found under
$SELFATTN_DATA_DIR/<subdir>/ or the user cache, or downloaded once from a
pinned URL, and checked against their SHA-256 every time (as tfds and
torchvision do). A missing, corrupt or undownloadable file raises DataError
with a one-line message; command-line callers print `error: <message>` and
exit with status 2. Shared by jsb.py (JSB Chorales) and multi30k.py.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile
import urllib.request

# Defined with every other exception; data_files.DataError still names it.
from selfattn.errors import DataError  # noqa: F401


def cache_dir() -> pathlib.Path:
  """The user cache: $XDG_CACHE_HOME/selfattn, else ~/.cache/selfattn."""
  base = os.environ.get('XDG_CACHE_HOME') or os.path.expanduser('~/.cache')
  return pathlib.Path(base) / 'selfattn'


def sha256(path: pathlib.Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def verify(path: pathlib.Path, expected: str, url: str) -> pathlib.Path:
  got = sha256(path)
  if got != expected:
    raise DataError(f'{path}: checksum mismatch (expected sha256 {expected}, '
                    f'got {got}); delete the file and run again to download '
                    f'it, or copy a good one from {url}')
  return path


def download(url: str, dest: pathlib.Path, expected: str) -> None:
  """Fetches url into dest atomically: a partial download never lies at
  dest. The checksum is verified before the rename."""
  dest.parent.mkdir(parents=True, exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + '.')
  try:
    with os.fdopen(fd, 'wb') as out, urllib.request.urlopen(url, timeout=60) as r:
      out.write(r.read())
    got = sha256(pathlib.Path(tmp))
    if got != expected:
      raise DataError(f'{url}: downloaded file has sha256 {got}, expected '
                      f'{expected}; not saved to {dest}')
    os.replace(tmp, dest)
  finally:
    if os.path.exists(tmp):
      os.unlink(tmp)


def candidates(subdir: str, filename: str,
               data_dir: str | os.PathLike | None = None) -> list[pathlib.Path]:
  """Where a file is looked for, in order: <data_dir>/<subdir>/ (data_dir
  defaults to $SELFATTN_DATA_DIR), then <cache_dir()>/<subdir>/."""
  data_dir = data_dir if data_dir is not None else os.environ.get(
      'SELFATTN_DATA_DIR')
  out = [pathlib.Path(data_dir) / subdir / filename] if data_dir else []
  out.append(cache_dir() / subdir / filename)
  return out


def locate(subdir: str, filename: str, expected: str, url: str,
           data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Path of a verified file: the first of `candidates` that exists (a
  checksum mismatch there is an error, not a silent re-download: the user
  should know a file they put there is bad), else downloaded into the
  cache."""
  paths = candidates(subdir, filename, data_dir)
  for path in paths:
    if path.is_file():
      return verify(path, expected, url)
  cached = paths[-1]
  try:
    download(url, cached, expected)
  except DataError:
    raise
  except Exception as e:  # URLError, timeouts, HTTP errors, OSError
    looked = ', '.join(str(p) for p in paths)
    raise DataError(f'{filename} not found (looked in {looked}) and the '
                    f'download from {url} failed ({type(e).__name__}: {e}); '
                    f'put the file in $SELFATTN_DATA_DIR/{subdir}/ or the '
                    f'cache dir') from e
  return verify(cached, expected, url)

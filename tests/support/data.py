"""The data sets the tests read, and the one skip-with-reason for each.

A test that needs a data set is marked `@REQUIRES_JSB` or
`@REQUIRES_MULTI30K` (or takes the mark in a parametrization), never
hand-checked: on a machine without the data
(an offline fork's CI, a fresh clone with no ../shared) those tests skip,
each saying what to set, and the rest of the suite stays green. The data is
found the way selfattn finds it ($SELFATTN_DATA_DIR, then the user cache),
without the download: a test must not depend on the network.
"""

from __future__ import annotations

import pathlib

import pytest

from selfattn.tasks import data_files
from selfattn.tasks.music import jsb


def jsb_file() -> pathlib.Path | None:
  """Jsb16thSeparated.json where jsb.locate would find it, or None."""
  return next((p for p in data_files.candidates(jsb.SUBDIR, jsb.FILENAME)
               if p.is_file()), None)


REQUIRES_JSB = pytest.mark.skipif(
    jsb_file() is None,
    reason=f'JSB Chorales data not found: set SELFATTN_DATA_DIR to a folder '
           f'holding {jsb.SUBDIR}/{jsb.FILENAME} (selfattn/tasks/music/jsb.py '
           f'says where it comes from)')


def multi30k_files() -> list[pathlib.Path] | None:
  """Every Multi30k file where selfattn would find it, or None if one is
  missing."""
  from selfattn.tasks.translation import multi30k
  found = []
  for name in multi30k.SHA256:
    path = next((p for p in data_files.candidates(multi30k.SUBDIR, name)
                 if p.is_file()), None)
    if path is None:
      return None
    found.append(path)
  return found


REQUIRES_MULTI30K = pytest.mark.skipif(
    multi30k_files() is None,
    reason='Multi30k data not found: set SELFATTN_DATA_DIR to a folder '
           'holding multi30k/{train,val,test_*}.{de,en}.gz (selfattn/tasks/'
           'translation/multi30k.py says where they come from)')

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Tests import their helpers (reference.py) and the configs package by name.
for path in (HERE, ROOT):
  if path not in sys.path:
    sys.path.insert(0, path)


@pytest.fixture
def tiny_config():
  from configs import tiny
  return tiny.get_config()


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """One real run of configs/tiny.py on this process's one device, shared by
  the tests that only read it: (workdir, summary, printed table)."""
  import contextlib
  import io
  from configs import tiny
  from selfattn import train
  workdir = tmp_path_factory.mktemp('tiny')
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = train.train_and_evaluate(tiny.get_config(), str(workdir))
  return workdir, summary, out.getvalue()

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

"""Every Python block of README.md runs as written, each on its own (a user
pastes one at a time), so the examples cannot drift from the library."""

import os
import re

import pytest

from runs import ROOT

README = os.path.join(ROOT, 'README.md')


def _blocks():
  with open(README) as f:
    text = f.read()
  return [(text[:m.start()].count('\n') + 1, m.group(1))
          for m in re.finditer(r'```python\n(.*?)```', text, re.S)]


def test_the_readme_has_python_examples():
  assert len(_blocks()) >= 3


@pytest.mark.parametrize('line,code', _blocks(), ids=lambda v: (
    f'line{v}' if isinstance(v, int) else ''))
def test_readme_block_runs_on_its_own(line, code):
  namespace = {'__name__': f'readme_block_line_{line}'}
  exec(compile(code, f'README.md:{line}', 'exec'), namespace)

"""Every Python block of README.md and the docs/ pages it links runs as
written, each on its own (a user pastes one at a time), so the examples
cannot drift from the library; and every relative link of those pages
points at a file that exists."""

import glob
import os
import re

import pytest

from runs import ROOT

PAGES = [os.path.join(ROOT, 'README.md')] + sorted(
    glob.glob(os.path.join(ROOT, 'docs', '*.md')))


def _blocks():
  out = []
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    name = os.path.relpath(page, ROOT)
    out += [(f'{name}:{text[:m.start()].count(chr(10)) + 1}', m.group(1))
            for m in re.finditer(r'```python\n(.*?)```', text, re.S)]
  return out


def test_the_pages_have_python_examples():
  assert len(_blocks()) >= 3
  assert any(where.startswith('README.md') for where, _ in _blocks())


@pytest.mark.parametrize('where,code', _blocks(), ids=lambda v: (
    v if ':' in str(v) and '\n' not in str(v) else ''))
def test_block_runs_on_its_own(where, code):
  namespace = {'__name__': 'readme_block_' + re.sub(r'\W', '_', where)}
  exec(compile(code, where, 'exec'), namespace)


def test_relative_links_point_at_files():
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    for target in re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', text):
      path = os.path.normpath(os.path.join(os.path.dirname(page), target))
      assert os.path.exists(path), f'{page}: broken link {target}'


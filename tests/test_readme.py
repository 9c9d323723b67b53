"""Every Python block of README.md and the docs/ pages it links runs as
written, each on its own (a user pastes one at a time), so the examples
cannot drift from the library, and the shapes their comments promise
(`x = ...  # (2, 12, 64)`) are the shapes they make; and every relative
link of those pages points at a file that exists."""

import ast
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
  """Statement by statement, so that a shape comment is checked against the
  name its line assigns when that line has run (a later line may reuse it)."""
  namespace = {'__name__': 'readme_block_' + re.sub(r'\W', '_', where)}
  checks = _shape_checks(code)
  for statement in ast.parse(code).body:
    exec(compile(ast.Module([statement], []), where, 'exec'), namespace)
    if statement.lineno in checks:
      name, shape = checks[statement.lineno]
      assert namespace[name].shape == shape, (where, statement.lineno, name)


# A comment that opens with a shape of numbers: `# (2, 12, 64)`.
SHAPE_COMMENT = re.compile(r'#\s*\((\d+(?:,\s*\d+)*)\)')


def _shape_checks(code: str) -> dict[int, tuple[str, tuple[int, ...]]]:
  """{line: (name, shape)} for each one-line `name = ...  # (shape)`."""
  lines = code.split('\n')
  out = {}
  for statement in ast.parse(code).body:
    promised = SHAPE_COMMENT.search(lines[statement.lineno - 1])
    if (promised and isinstance(statement, ast.Assign)
        and isinstance(statement.targets[0], ast.Name)):
      out[statement.lineno] = (statement.targets[0].id, tuple(
          int(n) for n in promised.group(1).split(',')))
  return out


def test_every_shape_comment_is_checked():
  """The check above has something to check, and skips none: every shape
  comment of the pages sits on a one-line assignment to a name."""
  promised = sum(bool(SHAPE_COMMENT.search(line)) for _, code in _blocks()
                 for line in code.split('\n'))
  checked = sum(len(_shape_checks(code)) for _, code in _blocks())
  assert checked == promised >= 4


def test_relative_links_point_at_files():
  for page in PAGES:
    with open(page) as f:
      text = f.read()
    for target in re.findall(r'\]\(([^)#:]+)(?:#[^)]*)?\)', text):
      path = os.path.normpath(os.path.join(os.path.dirname(page), target))
      assert os.path.exists(path), f'{page}: broken link {target}'



def _pins() -> dict[str, str]:
  with open(os.path.join(ROOT, 'requirements.txt')) as f:
    return dict(re.findall(r'^([\w.-]+)==(\S+)$', f.read(), re.M))


def test_accelerator_install_lines_name_the_pinned_jax_and_its_extras():
  """Every `jax[EXTRA]==V` the README and docs tell a GPU/TPU user to
  install names requirements.txt's JAX and an extra that JAX release has
  (jax 0.10.2's `cuda12` line outlived the pin once)."""
  import importlib.metadata
  pinned = _pins()['jax']
  if importlib.metadata.version('jax') != pinned:
    pytest.skip(f'reads the extras of the pinned jax {pinned}; '
                f'{importlib.metadata.version("jax")} is installed')
  extras = set(importlib.metadata.metadata('jax').get_all('Provides-Extra'))
  lines = []
  for page in PAGES + [os.path.join(ROOT, 'scripts', 'gpu_session.sh')]:
    with open(page) as f:
      lines += re.findall(r'jax\[(\w+)\]==([\w.]+)', f.read())
  assert len(lines) >= 4
  for extra, version in lines:
    assert version == pinned, (extra, version)
    assert extra in extras, f'jax {pinned} has no extra {extra!r}: {extras}'


def test_one_python_floor():
  """.python-version, pyproject's requires-python and the README agree."""
  with open(os.path.join(ROOT, '.python-version')) as f:
    selected = f.read().strip()
  with open(os.path.join(ROOT, 'pyproject.toml')) as f:
    floor = re.search(r'requires-python = ">=([\d.]+)"', f.read()).group(1)
  with open(os.path.join(ROOT, 'README.md')) as f:
    assert f'only Python {floor}+' in f.read()
  assert selected == floor

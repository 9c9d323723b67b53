"""The package's import graph has no circle: every selfattn module imports
only modules below it, in function bodies too, so any of them can be
imported first and the layers stay readable."""

import ast
import glob
import os
import subprocess
import sys

from runs import ROOT
from runs import subprocess_env

PACKAGE = os.path.join(ROOT, 'selfattn')


def _imports(path: str) -> set[str]:
  """The selfattn modules a file imports, anywhere in it."""
  found = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == 'selfattn':
        found |= {f'selfattn.{a.name}' for a in node.names}
      elif node.module.startswith('selfattn.'):
        found.add(node.module)
    elif isinstance(node, ast.Import):
      found |= {a.name for a in node.names if a.name.startswith('selfattn.')}
  return found


def _module_name(path: str) -> str:
  """selfattn/x.py -> selfattn.x; selfattn/pkg/__init__.py -> selfattn.pkg."""
  relative = os.path.relpath(path, ROOT)[:-3].replace(os.sep, '.')
  return relative.removesuffix('.__init__')


def _graph() -> dict[str, set[str]]:
  paths = {_module_name(p): p for p in glob.glob(
      os.path.join(PACKAGE, '**', '*.py'), recursive=True)}
  paths.pop('selfattn')                  # the package's own re-exports
  graph = {}
  for module, path in paths.items():
    found = {m if m in paths else m.rsplit('.', 1)[0]
             for m in _imports(path)}   # `from pkg import name` -> pkg
    graph[module] = {m for m in found if m in paths} - {module}
  return graph


def _layer_order(graph):
  """Modules such that each imports only earlier ones (Kahn's algorithm);
  raises naming the modules left on a circle."""
  order, done = [], set()
  while len(order) < len(graph):
    ready = sorted(m for m in graph if m not in done and graph[m] <= done)
    if not ready:
      raise AssertionError(f'import circle among '
                           f'{sorted(set(graph) - done)}')
    order += ready
    done |= set(ready)
  return order


def test_no_import_circle_and_every_module_imports_in_layer_order():
  order = _layer_order(_graph())
  assert order.index('selfattn.masks') < order.index('selfattn.attention')
  assert order.index('selfattn.model') < order.index('selfattn.config_checks')
  # In a fresh interpreter: selfattn.main defines absl flags that other
  # tests' imports (experiments.common) may already have defined here.
  code = ('import importlib\n'
          f'for name in {order!r}:\n  importlib.import_module(name)\n')
  result = subprocess.run([sys.executable, '-c', code], cwd=ROOT,
                          capture_output=True, text=True, timeout=300,
                          env=subprocess_env())
  assert result.returncode == 0, result.stderr[-2000:]


def test_a_circle_is_caught():
  graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': set()}
  try:
    _layer_order(graph)
  except AssertionError as e:
    assert "['a', 'b', 'c']" in str(e)
  else:
    raise AssertionError('the circle went unnoticed')

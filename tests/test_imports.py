"""The package's import graph has no circle: every selfattn module imports
only modules below it, in function bodies too, so any of them can be
imported first and the layers stay readable. And it points one way by role:
selfattn.nn (the reusable library) imports nothing from selfattn.tasks or
selfattn.training, and selfattn.tasks nothing from selfattn.training."""

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
  with open(path) as f:
    tree = ast.parse(f.read())
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      if node.module == 'selfattn' or node.module.startswith('selfattn.'):
        # `from pkg import name`: the module pkg.name where name is one
        # (resolved against the modules in _graph), else pkg itself.
        found |= {f'{node.module}.{a.name}' for a in node.names}
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
    if module.count('.') > 1 and module.rsplit('.', 1)[0] in found:
      raise AssertionError(f'{module} imports its own package\'s __init__; '
                           'import the module that defines the name')
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
  assert order.index('selfattn.nn.masks') < order.index('selfattn.nn.attention')
  assert (order.index('selfattn.nn.models')
          < order.index('selfattn.training.config_checks'))
  # In a fresh interpreter: selfattn.main defines absl flags that other
  # tests' imports (experiments.common) may already have defined here.
  # Matplotlib is imported where a figure is drawn (training/figures.py): it
  # was a quarter of the command line's start-up, before any config error.
  code = ('import importlib, sys\n'
          f'for name in {order!r}:\n  importlib.import_module(name)\n'
          "assert 'matplotlib' not in sys.modules, 'matplotlib imported'\n")
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


def _role(module: str) -> str:
  """selfattn.nn.positions.shaw -> 'nn'; selfattn.errors -> 'errors'."""
  return module.split('.')[1]


# Which roles each role may import (besides itself): the library is
# reusable without the tasks or the training system, and tasks are
# usable without the training system.
ALLOWED = {'errors': set(), 'nn': {'errors'}, 'tasks': {'errors', 'nn'},
           'training': {'errors', 'nn', 'tasks'},
           'main': {'errors', 'nn', 'tasks', 'training'}}


def test_imports_point_one_way_by_role():
  graph = _graph()
  assert set(map(_role, graph)) == set(ALLOWED)
  upward = sorted((module, dep) for module, deps in graph.items()
                  for dep in deps
                  if _role(dep) != _role(module)
                  and _role(dep) not in ALLOWED[_role(module)])
  assert not upward, upward
  # Taken as units, the roles stack in at most 6 layers (errors, nn, tasks,
  # training, main).
  units = {}
  for module, deps in graph.items():
    units.setdefault(_role(module), set()).update(
        _role(d) for d in deps if _role(d) != _role(module))
  assert len(_layer_order(units)) == len(units) <= 6


def test_an_upward_import_is_caught(tmp_path, monkeypatch):
  """The direction check reads real files: an nn module that imports the
  training system fails it."""
  import shutil
  import sys
  fake = tmp_path / 'selfattn'
  shutil.copytree(PACKAGE, fake)
  with open(fake / 'nn' / 'masks.py', 'a') as f:
    f.write('\nfrom selfattn.training import timing  # noqa\n')
  this = sys.modules[__name__]
  monkeypatch.setattr(this, 'PACKAGE', str(fake))
  monkeypatch.setattr(this, 'ROOT', str(tmp_path))
  try:
    test_imports_point_one_way_by_role()
  except AssertionError as e:
    assert ('selfattn.nn.masks' in str(e)
            and 'selfattn.training.timing' in str(e)), str(e)
  else:
    raise AssertionError('the upward import went unnoticed')

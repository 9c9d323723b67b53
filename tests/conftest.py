import gc
import os
import shutil
import sys
import tempfile

import pytest

# The suite compiles hundreds of small programs whose run time is negligible:
# LLVM's optimisation passes are most of XLA's CPU compile time, and skipping
# them cuts a tiny training run from 15 s to 10 s with the same numbers (the
# golden steps hold). Set before any test imports JAX; inherited by the
# subprocesses the tests start (`bench.py --smoke` too: runs.smoke_env).
FAST_COMPILE = '--xla_backend_optimization_level=0'
if FAST_COMPILE not in os.environ.get('XLA_FLAGS', ''):
  os.environ['XLA_FLAGS'] = ' '.join(
      filter(None, [os.environ.get('XLA_FLAGS'), FAST_COMPILE]))

# Real-data tests (JSB Chorales) read SELFATTN_DATA_DIR; default to the
# checkout's sibling shared/data when it exists. Tests without it skip.
_SHARED_DATA = os.path.join(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))), '..', 'shared', 'data')
if 'SELFATTN_DATA_DIR' not in os.environ and os.path.isdir(_SHARED_DATA):
  os.environ['SELFATTN_DATA_DIR'] = os.path.normpath(_SHARED_DATA)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# Tests import their helpers (support/: reference.py, runs.py, ...) and the
# configs package by name; tests/ mirrors selfattn/ (nn/, tasks/, training/)
# plus experiments/ and the whole-project checks at the top.
for path in (os.path.join(HERE, 'support'), ROOT):
  if path not in sys.path:
    sys.path.insert(0, path)


# One on-disk XLA cache for the session (the xdist controller creates it and
# its workers inherit the variable):
#  * the subprocesses the tests start (the CLI, the experiment drivers)
#    compile the same small programs again and again, and keep every one
#    there (runs.subprocess_env);
#  * the test processes themselves keep the programs that take a second or
#    more to compile: a resumed run, a run's second trainer, the next test's
#    run of the same config compile the same training step again. On
#    tests/training (two workers, beside a training run, 2026-11-28): 397 s
#    without, 309 s with; keeping every program instead, in JAX's
#    size-limited cache (which lists the directory at each write), 697 s.
# The cache stores executables keyed by program and options: no number
# changes. A subprocess a test kills gets a cache of its own
# (runs.subprocess_env), so a kill never leaves a truncated entry here.
CACHE_VARIABLE = 'SELFATTN_TEST_XLA_CACHE'
IN_PROCESS_MIN_COMPILE_SECONDS = 1.0

# Python's cyclic garbage collector, tuned for a process that imports JAX
# once and then traces thousands of small programs: once the tests are
# collected, everything imported so far (JAX, Flax, the test modules)
# moves to the permanent generation (gc.freeze), so a full collection no
# longer walks them, and the young generation collects every 10,000
# allocations instead of 700. On tests/nn/test_encoder.py and
# test_chunked.py in one process (beside a training run, 2026-11-28): 3,814
# collections took 9.0 s of 318 s with the defaults, 360 took 1.8 s tuned.
# Nothing a test checks depends on when cycles are freed.
GC_THRESHOLDS = (10_000, 20, 50)


def pytest_configure(config):
  if CACHE_VARIABLE not in os.environ:
    os.environ[CACHE_VARIABLE] = tempfile.mkdtemp(prefix='selfattn-xla-cache-')
    config._selfattn_owns_cache = True
  import jax
  jax.config.update('jax_compilation_cache_dir', os.environ[CACHE_VARIABLE])
  jax.config.update('jax_persistent_cache_min_compile_time_secs',
                    IN_PROCESS_MIN_COMPILE_SECONDS)


def pytest_collection_finish(session):
  gc.collect()
  gc.freeze()
  gc.set_threshold(*GC_THRESHOLDS)


def pytest_unconfigure(config):
  if getattr(config, '_selfattn_owns_cache', False):
    shutil.rmtree(os.environ.pop(CACHE_VARIABLE), ignore_errors=True)


@pytest.fixture
def tiny_config():
  """configs/tiny.py without TensorBoard figures: the attention probe's
  compile and two Matplotlib drawings at each evaluation, in every
  in-process run, checked only where a test reads images (tiny_run keeps
  them, and the tests that read them set eval.figures back)."""
  from configs import tiny
  config = tiny.get_config()
  config.eval.figures = False
  return config


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
  """One real run of configs/tiny.py on this process's one device, shared by
  the tests that only read it: (workdir, summary, printed table)."""
  import contextlib
  import io
  from configs import tiny
  from selfattn.training import train
  workdir = tmp_path_factory.mktemp('tiny')
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    summary = train.train_and_evaluate(tiny.get_config(), str(workdir))
  return workdir, summary, out.getvalue()


def pytest_addoption(parser):
  parser.addoption(
      '--extended', action='store_true',
      help='run the extended tier too (tests marked extended: the '
           'experiment drivers\' quick runs, the benchmark smoke run, the '
           'cases of parametrized grids beyond a covering subset; '
           'tests/README.md). Without it, they are deselected.')


def pytest_collection_modifyitems(config, items):
  """Without --extended, the extended tier is deselected (in each xdist
  worker, which collects for itself; pytest_terminal_summary says so),
  except a test the command line names by its node id.
  Then the end-to-end (slow) tests first, in their collected order: with
  two xdist workers, a minute-long test that starts near the end keeps one
  worker busy while the other idles; started first, the short tests
  fill around it."""
  if not config.getoption('--extended'):
    named = _named_tests(config)
    extended = [item for item in items if item.get_closest_marker('extended')
                and not _is_named(item.nodeid, named)]
    if extended:
      config.hook.pytest_deselected(items=extended)
      dropped = set(map(id, extended))
      items[:] = [item for item in items if id(item) not in dropped]
  items.sort(key=lambda item: item.get_closest_marker('slow') is None)


def _named_tests(config) -> list[str]:
  """The node ids the command line names (path::test, with or without a
  case): a test named so runs in either tier."""
  named = []
  for arg in config.args:
    if '::' not in arg:
      continue
    path, rest = arg.split('::', 1)
    path = os.path.relpath(os.path.abspath(path), str(config.rootpath))
    named.append(f'{path.replace(os.sep, "/")}::{rest}')
  return named


def _is_named(nodeid: str, named: list[str]) -> bool:
  return any(nodeid == n or nodeid.startswith((n + '[', n + '::'))
             for n in named)


COMMIT_TIER_NOTE = ('commit tier: tests marked extended run only where named '
                    'by node id (python -m pytest --extended runs every test; '
                    'tests/README.md)')


def pytest_terminal_summary(terminalreporter, exitstatus, config):
  # Under xdist the controller does not collect, so pytest's own
  # "N deselected" is missing: say which tier ran (the header, which says it
  # too, is hidden by -q).
  if not config.getoption('--extended'):
    terminalreporter.write_line(COMMIT_TIER_NOTE)


def pytest_report_header(config):
  if not config.getoption('--extended'):
    return COMMIT_TIER_NOTE
  return 'commit and extended tiers: every test'


# A worker ignores SIGINT once its session is over (execnet's shutdown
# signal would otherwise print a stray KeyboardInterrupt after 100%).
from quiet_worker_exit import pytest_sessionfinish  # noqa: E402,F401

# The made-up parallel corpus of the translation tests, as a fixture; imported
# last, after XLA_FLAGS is set, since it imports JAX.
from tiny_corpus import tiny_multi30k  # noqa: E402,F401

"""The suite's own plumbing: a slow worker teardown ends quietly."""

import os
import subprocess
import sys

import pytest

SUPPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'support')

# A project whose workers, like a worker freeing JAX's programs, are still
# busy more than 5 s after their last result (execnet's patience), with a gc
# callback like JAX's for the signal to land in.
SLOW_TEARDOWN = '''
import gc, time
from quiet_worker_exit import pytest_sessionfinish

def pytest_unconfigure(config):
  if hasattr(config, 'workerinput'):
    gc.callbacks.append(lambda *args: time.sleep(0.01))
    until = time.time() + 6
    while time.time() < until:
      [object() for _ in range(1000)]
      gc.collect(0)
'''


@pytest.mark.slow
def test_a_slow_worker_teardown_prints_no_keyboard_interrupt(tmp_path):
  """Without quiet_worker_exit (the import above removed) the run ends with
  `Exception ignored in: <function <lambda> ...> KeyboardInterrupt`."""
  (tmp_path / 'conftest.py').write_text(SLOW_TEARDOWN)
  (tmp_path / 'test_two.py').write_text(
      'def test_one():\n  assert True\n\n\ndef test_two():\n  assert True\n')
  (tmp_path / 'pytest.ini').write_text('[pytest]\n')
  env = {**os.environ, 'PYTHONPATH': SUPPORT}
  result = subprocess.run(
      [sys.executable, '-m', 'pytest', '-q', '-n', '2', '-p',
       'no:cacheprovider', str(tmp_path)], cwd=tmp_path, env=env,
      capture_output=True, text=True, timeout=120)
  assert result.returncode == 0, result.stdout + result.stderr
  assert '2 passed' in result.stdout
  assert 'KeyboardInterrupt' not in result.stdout + result.stderr

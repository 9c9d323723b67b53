"""docs/training.md's picture of TensorBoard's HParams tab, taken in a real browser,
and a check of what a fresh browser shows there by default.

  apt-get install chromium-headless-shell && pip install playwright
  python scripts/screenshot_tensorboard.py [--out=PNG] [--logdir=DIR]

Trains configs/tiny.py four times into a temporary logdir (or reuses
--logdir), runs differing in encoding, task, layout and randomized positions;
starts `tensorboard` on it (127.0.0.1, a free port), opens the HParams tab in
headless Chromium, reads the table's column headers, screenshots the tab, and
fails unless the encoding, the task and the score are among the columns shown
by default. Playwright is not in requirements.txt: only this script and the
test that reuses it (tests/test_tensorboard.py, skipped without it) need it;
`playwright install` is not needed: --browser names the Debian binary.
"""

import os
import socket
import subprocess
import sys
import tempfile
import time

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROWSER = '/usr/bin/chromium-headless-shell'
# name -> command-line overrides of configs/tiny.py: a mixed logdir.
RUNS = {
    'sinusoidal_reverse': ['--config.model.position=sinusoidal'],
    'rope_sort_autoregressive': ['--config.model.position=rope',
                                 '--config.task.name=sort',
                                 '--config.task.layout=autoregressive'],
    'shaw_reverse_randomized': ['--config.model.position=shaw',
                                '--config.model.randomize_positions=True',
                                '--config.model.max_random_len=64'],
    'alibi_sort': ['--config.model.position=alibi', '--config.task.name=sort'],
}
# What must be among the columns a fresh browser shows.
EXPECTED_HEADERS = ('Encoding', 'Task', 'Score')

# The HParams table's header texts, in order: tf-hparams-table-view's
# vaadin-grid, through the shadow roots (its header cells slot in their text).
_HEADERS_JS = """() => {
  const find = (root, selector) => {
    const hit = root.querySelector(selector);
    if (hit) return hit;
    for (const el of root.querySelectorAll('*')) {
      if (el.shadowRoot) {
        const inner = find(el.shadowRoot, selector);
        if (inner) return inner;
      }
    }
    return null;
  };
  const view = find(document, 'tf-hparams-table-view');
  const grid = view && (view.shadowRoot || view).querySelector('vaadin-grid');
  if (!grid) return [];
  return [...grid.shadowRoot.querySelectorAll('thead th')].map(cell => {
    const slot = cell.querySelector('slot');
    const nodes = slot ? slot.assignedNodes({flatten: true}) : [];
    return nodes.map(n => n.textContent).join('').replace(/\\s+/g, ' ').trim();
  }).filter(text => text);
}"""


def free_port() -> int:
  with socket.socket() as s:
    s.bind(('127.0.0.1', 0))
    return s.getsockname()[1]


def train_runs(logdir: str) -> None:
  env = {**os.environ, 'PYTHONPATH': ROOT}
  for name, overrides in RUNS.items():
    print(f'training configs/tiny.py: {name}', flush=True)
    subprocess.run([sys.executable, '-m', 'selfattn.main',
                    '--config=configs/tiny.py', f'--workdir={logdir}/{name}',
                    *overrides],
                   cwd=ROOT, env=env, check=True, capture_output=True)


def start_tensorboard(logdir: str) -> tuple[subprocess.Popen, int]:
  """`tensorboard` on 127.0.0.1 and a free port; the caller terminates it."""
  port = free_port()
  server = subprocess.Popen(
      [sys.executable, '-m', 'tensorboard.main', '--logdir', logdir,
       '--host', '127.0.0.1', '--port', str(port), '--load_fast=false',
       '--reload_interval=1'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return server, port


def browser_headers(port: int, out: str | None = None,
                    browser: str = BROWSER, timeout_s: float = 60,
                    width: int = 1900) -> list[str]:
  """Opens the HParams tab in a fresh headless Chromium, waits until the
  table has metric columns (TensorBoard reads the logdir in the background),
  and returns its column headers; screenshots the tab to `out` if given."""
  from playwright.sync_api import Error as PlaywrightError
  from playwright.sync_api import sync_playwright
  with sync_playwright() as p:
    chromium = p.chromium.launch(executable_path=browser)
    try:
      page = chromium.new_page(viewport={'width': width, 'height': 560})
      headers: list[str] = []
      deadline = time.monotonic() + timeout_s
      while time.monotonic() < deadline:
        # A fresh page each try: the dashboard reads the experiment once.
        try:
          page.goto(f'http://127.0.0.1:{port}/#hparams',
                    wait_until='networkidle')
        except PlaywrightError:           # the server is still starting
          time.sleep(1)
          continue
        page.wait_for_timeout(1500)
        headers = page.evaluate(_HEADERS_JS)
        if any(h in headers for h in EXPECTED_HEADERS[-1:]):
          break
        page.wait_for_timeout(1000)
      if out:
        page.screenshot(path=out)
      return headers
    finally:
      chromium.close()


_OUT = flags.DEFINE_string(
    'out', os.path.join(ROOT, 'experiments/results/tensorboard_hparams.png'),
    'Where to write the PNG.')
_BROWSER = flags.DEFINE_string('browser', BROWSER, 'Chromium executable.')
_LOGDIR = flags.DEFINE_string(
    'logdir', None, 'An existing logdir to show instead of training RUNS.')


def main(argv):
  del argv
  with tempfile.TemporaryDirectory() as tmp:
    logdir = _LOGDIR.value or tmp
    if not _LOGDIR.value:
      train_runs(logdir)
    server, port = start_tensorboard(logdir)
    try:
      headers = browser_headers(port, _OUT.value, _BROWSER.value)
    finally:
      server.terminate()
      server.wait(timeout=30)
  print(f'wrote {_OUT.value}\ncolumns shown: {headers}')
  missing = [h for h in EXPECTED_HEADERS if h not in headers]
  if missing:
    sys.exit(f'error: the HParams table does not show {missing} by default')


if __name__ == '__main__':
  app.run(main)

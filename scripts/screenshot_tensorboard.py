"""docs/training.md's pictures of TensorBoard, taken in a
real browser, and a check of what a fresh browser shows by default.

  apt-get install chromium-headless-shell && pip install playwright==1.65.2   # the version it was checked with
  python scripts/screenshot_tensorboard.py [--outdir=DIR] [--logdir=DIR]
  python scripts/screenshot_tensorboard.py --outdir=experiments/results   # replace the committed pictures

Before training anything it checks what it needs (playwright, the browser,
the JSB Chorales data the music runs read) and names what is missing in one
line. The pictures go to --outdir (default runs/tensorboard_screenshots, so
the committed ones in experiments/results change only when asked). A
training run that fails stops the script with its own last error line.

Trains a mixed logdir into a temporary directory (or reuses --logdir): six
configs/tiny.py runs differing in encoding, task, layout and randomized
positions, each evaluated every 5 of its 20 steps, and the music study's
--quick runs (JSB Chorales, with piano rolls and audio). Starts
`tensorboard` on it (127.0.0.1, a free port), opens the Scalars, HParams
(table and parallel coordinates) and Images tabs in headless Chromium,
screenshots each to DIR/tensorboard_{scalars,hparams,parallel,images}.png,
and fails unless the HParams table shows the encoding, the task and every
Score column by default, and every run has a point inside each Score
chart's default y range (TensorBoard clips outliers by default; see
`clipped_range`). Playwright is not in requirements.txt: only this script
and the test that reuses it (tests/training/test_tensorboard.py, skipped without it)
need it; `playwright install` is not needed: --browser names the Debian
binary.
"""

import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request

from absl import app
from absl import flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BROWSER = '/usr/bin/chromium-headless-shell'
# name -> command-line overrides of configs/tiny.py: a mixed logdir. Every
# run evaluates 4 times, so each Score is a curve, as in a real run.
EVERY = ['--config.eval.every=5']
RUNS = {
    'sinusoidal_reverse': ['--config.model.position=sinusoidal'],
    'learned_reverse': ['--config.model.position=learned'],
    'shaw_reverse_randomized': ['--config.model.position=shaw',
                                '--config.model.randomize_positions=True',
                                '--config.model.max_random_len=64'],
    'pope_reverse': ['--config.model.position=pope'],
    'rope_sort_autoregressive': ['--config.model.position=rope',
                                 '--config.task.name=sort',
                                 '--config.task.layout=autoregressive'],
    'alibi_sort': ['--config.model.position=alibi', '--config.task.name=sort'],
}
# The music study's quick scale, one seed: two runs with test NLL, piano
# rolls and audio.
MUSIC = ['-m', 'experiments.music', '--quick', '--seeds=1']
# What must be among the columns a fresh browser shows.
EXPECTED_HEADERS = ('Encoding', 'Task', 'Score', 'Score/above_chance')

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


def missing_prerequisites(browser: str, need_music_data: bool) -> list[str]:
  """What this script needs and does not find, each with how to get it."""
  missing = []
  try:
    import playwright.sync_api  # noqa: F401
  except ImportError:
    missing.append('playwright (pip install playwright==1.65.2)')
  if not os.path.isfile(browser):
    missing.append(f'the browser {browser} (apt-get install '
                   f'chromium-headless-shell, or --browser=PATH)')
  if need_music_data:
    sys.path.insert(0, ROOT)
    from selfattn.errors import DataError
    from selfattn.tasks.music import jsb
    try:
      jsb.locate()
    except DataError as e:
      missing.append(f'the JSB Chorales data for the music runs ({e})')
  return missing


def _run_or_exit(what: str, command: list[str], env: dict) -> None:
  """Runs a training command; a failure ends the script with the
  command's own last error line, not a CalledProcessError."""
  result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                          text=True)
  if result.returncode:
    lines = [l for l in result.stderr.splitlines() if l.strip()]
    cause = lines[-1] if lines else '(no output)'
    sys.exit(f'error: {what} failed (exit {result.returncode}): {cause}')


def train_runs(logdir: str) -> None:
  env = {**os.environ, 'PYTHONPATH': ROOT}
  for name, overrides in RUNS.items():
    print(f'training configs/tiny.py: {name}', flush=True)
    _run_or_exit(f'training {name}',
                 [sys.executable, '-m', 'selfattn.main',
                  '--config=configs/tiny.py', f'--workdir={logdir}/{name}',
                  *EVERY, *overrides], env)
  print('training and scoring the music study\'s --quick runs', flush=True)
  _run_or_exit('the music study\'s --quick runs',
               [sys.executable, *MUSIC, f'--workdir={logdir}/music'], env)


def start_tensorboard(logdir: str) -> tuple[subprocess.Popen, int]:
  """`tensorboard` on 127.0.0.1 and a free port; the caller terminates it."""
  port = free_port()
  server = subprocess.Popen(
      [sys.executable, '-m', 'tensorboard.main', '--logdir', logdir,
       '--host', '127.0.0.1', '--port', str(port), '--load_fast=false',
       '--reload_interval=1'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return server, port


def _get(port: int, path: str):
  with urllib.request.urlopen(f'http://127.0.0.1:{port}{path}',
                              timeout=10) as response:
    return json.loads(response.read())


def clipped_range(values: list[float]) -> tuple[float, float]:
  """The y range TensorBoard 2.21's scalar charts keep with their default
  "Ignore outliers in chart scaling" (the line chart's data extent in
  webfiles.zip): over every visible point, sorted, the values at indices
  ceil(0.05 (n-1)) and floor(0.95 (n-1)) when n > 2. The chart then pads it
  by 5% and rounds it outwards, so a point inside is always drawn."""
  a = sorted(values)
  if len(a) > 2:
    return a[math.ceil(0.05 * (len(a) - 1))], a[math.floor(0.95 * (len(a) - 1))]
  return a[0], a[-1]


def runs_off_chart(port: int, prefix: str = 'Score') -> dict[str, list[str]]:
  """Per scalar tag starting with `prefix`, the runs with no point inside
  the chart's default range (clipped_range), read through TensorBoard's
  HTTP API: {} when every run is on every such chart."""
  by_tag: dict[str, dict[str, list[float]]] = {}
  for run, tags in _get(port, '/data/plugin/scalars/tags').items():
    for tag in tags:
      if tag.startswith(prefix):
        query = urllib.parse.urlencode({'run': run, 'tag': tag})
        points = _get(port, f'/data/plugin/scalars/scalars?{query}')
        by_tag.setdefault(tag, {})[run] = [value for _, _, value in points]
  off = {}
  for tag, runs in by_tag.items():
    low, high = clipped_range([v for values in runs.values() for v in values])
    hidden = sorted(run for run, values in runs.items()
                    if not any(low <= v <= high for v in values))
    if hidden:
      off[tag] = hidden
  return off


def _open(page, port: int, route: str, ready) -> None:
  """Opens #route, retrying until ready(page) (TensorBoard reads the logdir
  in the background, and the server may still be starting)."""
  from playwright.sync_api import Error as PlaywrightError
  deadline = time.monotonic() + 60
  while time.monotonic() < deadline:
    try:
      page.goto(f'http://127.0.0.1:{port}/#{route}', wait_until='networkidle')
    except PlaywrightError:
      time.sleep(1)
      continue
    page.wait_for_timeout(1500)
    if ready(page):
      return
    page.wait_for_timeout(1000)


def browser_headers(port: int, out: str | None = None,
                    browser: str = BROWSER, width: int = 1900) -> list[str]:
  """Opens the HParams tab in a fresh headless Chromium, waits until the
  table has metric columns, and returns its column headers; screenshots the
  tab to `out` if given."""
  from playwright.sync_api import sync_playwright
  with sync_playwright() as p:
    chromium = p.chromium.launch(executable_path=browser)
    try:
      page = chromium.new_page(viewport={'width': width, 'height': 560})
      _open(page, port, 'hparams',
            lambda page: 'Score' in page.evaluate(_HEADERS_JS))
      headers = page.evaluate(_HEADERS_JS)
      if out:
        page.screenshot(path=out)
      return headers
    finally:
      chromium.close()


def screenshot_views(port: int, outdir: str, browser: str = BROWSER
                     ) -> list[str]:
  """The Scalars (Score charts), HParams parallel coordinates and Images
  tabs, each in a fresh page; returns the PNG paths written."""
  from playwright.sync_api import sync_playwright
  paths = []
  with sync_playwright() as p:
    chromium = p.chromium.launch(executable_path=browser)
    try:
      def shoot(name, query, ready, height=900, click=None, wait=2000):
        page = chromium.new_page(viewport={'width': 1600, 'height': height})
        _open(page, port, query, ready)
        if click:
          page.get_by_text(click).click()
        page.wait_for_timeout(wait)
        paths.append(os.path.join(outdir, f'tensorboard_{name}.png'))
        page.screenshot(path=paths[-1])

      shoot('scalars', 'scalars&tagFilter=Score',
            lambda page: page.locator('canvas, svg.line-chart').count() > 0)
      shoot('parallel', 'hparams',
            lambda page: 'Score' in page.evaluate(_HEADERS_JS),
            click='Parallel Coordinates View', wait=2500)
      shoot('images', 'images', lambda page: page.locator('img').count() > 2,
            height=1400)
    finally:
      chromium.close()
  return paths


_OUTDIR = flags.DEFINE_string(
    'outdir', 'runs/tensorboard_screenshots',
    'Where to write tensorboard_{scalars,hparams,parallel,images}.png '
    '(experiments/results replaces the committed ones).')
_BROWSER = flags.DEFINE_string('browser', BROWSER, 'Chromium executable.')
_LOGDIR = flags.DEFINE_string(
    'logdir', None, 'An existing logdir to show instead of training RUNS.')


def main(argv):
  del argv
  missing = missing_prerequisites(_BROWSER.value, not _LOGDIR.value)
  if missing:
    sys.exit('error: this script needs ' + '; '.join(missing))
  os.makedirs(_OUTDIR.value, exist_ok=True)
  with tempfile.TemporaryDirectory() as tmp:
    logdir = _LOGDIR.value or tmp
    if not _LOGDIR.value:
      train_runs(logdir)
    server, port = start_tensorboard(logdir)
    try:
      hparams_png = os.path.join(_OUTDIR.value, 'tensorboard_hparams.png')
      headers = browser_headers(port, hparams_png, _BROWSER.value)
      written = [hparams_png, *screenshot_views(port, _OUTDIR.value,
                                                _BROWSER.value)]
      off_chart = runs_off_chart(port)
    finally:
      server.terminate()
      server.wait(timeout=30)
  print('wrote ' + ', '.join(written) + f'\ncolumns shown: {headers}')
  missing = [h for h in EXPECTED_HEADERS if h not in headers]
  if missing:
    sys.exit(f'error: the HParams table does not show {missing} by default')
  if off_chart:
    sys.exit(f'error: runs outside the default y range: {off_chart}')


if __name__ == '__main__':
  app.run(main)

"""TensorBoard output through tensorboardX (no TensorFlow needed).

Tags: train/* and eval/* scalars, eval/<metric>/len_NNNN per evaluation length
(one chart group per metric), the run's generalisation score as `Score` (and
`Score/training_lengths`), attention/layer_N images (heads side by side),
positions/table, the config as text, and the HParams plugin's session so runs
with different encodings can be filtered and compared (tests/test_tensorboard.py
checks it against a real TensorBoard server and in headless Chromium).

What TensorBoard 2.21's HParams tab shows in a fresh browser, and why the
headline names below are capitalised:
- The server (plugins/hparams/backend_context.py,
  `_sort_and_reduce_to_hparams_limit`) orders the hparams by (not differs,
  name): those whose values differ across the runs first, then by name, as
  Python compares strings (upper case before lower case).
- The dashboard (tf-hparams-query-pane's `_computeHParams`, in webfiles.zip)
  keeps that order, sorts differing ones first again, and ticks only the
  first 5; `_computeMetrics` ticks the first 5 metrics in the server's order,
  which `_compute_metric_names` sorts by (tag, group): every scalar tag of a
  run is a metric, so eval/loss/* came before every accuracy.
- A `display_name` is only read from an experiment summary
  (`_hparams_/experiment`), which selfattn must not write (see
  Writer.hparams): the names are the column headers.
So the fields a researcher compares are logged under capitalised names
(HEADLINE_HPARAMS), which sort before every lower-case `model.*`, `task.*`,
`train.*` name, and the score under `Score`, which sorts before `eval/*` and
`train/*`. Unset (None) fields are left out rather than logged as a string, so
a numeric hparam stays numeric across runs.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summary

# Config fields that never distinguish one experiment from another: where and
# how often a run logs, and the device mesh. Everything else is an hparam.
# Fields that change how a run is executed, not what it computes (the
# attention implementations and layer scanning give the same numbers).
NOT_HPARAMS = ('mesh.', 'eval.', 'train.log_every', 'train.checkpoint_every',
               'train.keep_checkpoints', 'model.attention_impl', 'model.remat',
               'model.scan_layers')


def eval_tag(metric: str, length: int) -> str:
  return f'eval/{metric}/len_{length:04d}'


ATTENTION_IMAGE_HELP = (
    'attention/layer_N: one fixed evaluation example; heads side by side '
    '(white gaps). Rows are queries, columns keys, both in sequence order '
    'from the top left. Colour (viridis): weight divided by the head\'s '
    'largest weight, so each head uses the full range; padding is white.')
TABLE_IMAGE_HELP = (
    'positions/table: the encoding\'s own picture (positions.py, picture()): '
    'rows are positions (absolute) or offsets/buckets (relative), columns '
    'features or heads; viridis, min-max normalised per image. Logged once '
    'for encodings whose table cannot change (sinusoidal).')


def _colour(values: np.ndarray, scale: int) -> np.ndarray:
  """(H, W) in [0, 1], NaN = gap -> (H*scale, W*scale, 3) uint8, viridis;
  gaps white."""
  import matplotlib
  rgb = matplotlib.colormaps['viridis'](np.nan_to_num(values))[..., :3]
  rgb[np.isnan(values)] = 1.0
  rgb = (255 * rgb).astype(np.uint8)
  return np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)


def heatmap(matrix: np.ndarray, scale: int = 4) -> np.ndarray:
  """2-D array -> (H, W, 3) uint8 image, min-max normalised, viridis, each
  cell scale x scale."""
  m = np.asarray(matrix, np.float64)
  span = m.max() - m.min()
  m = (m - m.min()) / span if span > 0 else np.zeros_like(m)
  return _colour(m, scale)


def tile_heads(weights_HxLxL: np.ndarray, scale: int = 4) -> np.ndarray:
  """Heads side by side with a white 1-cell gap -> (H, W, 3) uint8; each
  head divided by its own largest weight (a layer that attends broadly is
  not drawn black)."""
  h, lq, lk = weights_HxLxL.shape
  canvas = np.full((lq, h * (lk + 1) - 1), np.nan)
  for i in range(h):
    head = np.asarray(weights_HxLxL[i], np.float64)
    top = head.max()
    canvas[:, i * (lk + 1): i * (lk + 1) + lk] = head / top if top > 0 else head
  return _colour(np.clip(canvas, 0, 1), scale)


# Config field -> the name (the column header) it is logged under in the
# HParams tab; capitalised so that these columns come first (see above).
HEADLINE_HPARAMS = {
    'model.position': 'Encoding',
    'model.randomize_positions': 'Encoding randomized',
    'task.name': 'Task',
    'task.layout': 'Task layout',
}
# The generalisation score (report.generalization_score: token accuracy
# averaged over the evaluated lengths above the training range), and the same
# average over the evaluated lengths inside the training range. Tags allow no
# spaces; upper case sorts them before eval/* and train/* in the HParams tab.
SCORE_TAG = 'Score'
TRAINING_LENGTHS_SCORE_TAG = 'Score/training_lengths'


def flatten_config(config: Mapping[str, Any], prefix: str = '') -> dict:
  """Nested config -> {'model.position': 'shaw', ...} with TensorBoard-safe
  values: bools, ints, floats and strings as they are, lists as JSON. Unset
  fields (None, or '' as in train.init_from) are left out: logged as a string
  they would turn a numeric hparam into a string one in the HParams tab."""
  flat = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(flatten_config(value, name + '.'))
    elif value is None or value == '':
      continue
    elif isinstance(value, (bool, int, float, str)):
      flat[name] = value
    else:
      flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
  return flat


def researcher_hparams(config: Mapping[str, Any]) -> dict:
  """The config fields a researcher varies, flattened for the HParams tab:
  the headline fields first under their HEADLINE_HPARAMS names, then the rest
  under their dotted config names."""
  flat = {name: value for name, value in flatten_config(config).items()
          if not name.startswith(NOT_HPARAMS)}
  headline = {HEADLINE_HPARAMS[name]: flat.pop(name)
              for name in HEADLINE_HPARAMS if name in flat}
  return {**headline, **flat}


def score_scalars(summary: Mapping[str, Any]) -> dict[str, float]:
  """The scalars a run's HParams row is sorted by, from train's summary
  (its 'score', 'eval' and 'train_lengths'); a score that cannot be computed
  (no evaluated length beyond, or inside, the training range) is left out."""
  values = {}
  if summary.get('score') is not None:
    values[SCORE_TAG] = float(summary['score'])
  lo, hi = summary['train_lengths']
  inside = [m['token_accuracy'] for n, m in summary['eval'].items()
            if lo <= int(n) <= hi]
  if inside:
    values[TRAINING_LENGTHS_SCORE_TAG] = float(sum(inside) / len(inside))
  return values


class Writer:
  """Writes only when enabled (process 0 in multi-process runs)."""

  def __init__(self, logdir: str, enabled: bool = True):
    self._writer = SummaryWriter(logdir=logdir) if enabled else None

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer:
      for tag, value in values.items():
        self._writer.add_scalar(tag, float(value), step)

  def image(self, tag: str, step: int, image: np.ndarray) -> None:
    """(H, W) grey or (H, W, 3) colour uint8."""
    if self._writer:
      self._writer.add_image(tag, image, step,
                             dataformats='HW' if image.ndim == 2 else 'HWC')

  def text(self, tag: str, step: int, text: str) -> None:
    if self._writer:
      self._writer.add_text(tag, text, step)

  def hparams(self, hparams: Mapping[str, Any]) -> None:
    """Registers this run as an HParams *session* (its hparams), and writes no
    experiment summary: TensorBoard then builds one experiment from every
    session under the logdir, with each hparam's values across runs (strings
    as discrete domains, `differs` where runs differ) and every run's scalar
    tags as metrics. A per-run experiment summary would make TensorBoard pick
    one run's arbitrarily and hide the others' metrics and encodings."""
    if self._writer:
      _, session_start, session_end = hparams_summary(dict(hparams), {})
      file_writer = self._writer._get_file_writer()
      for summary in (session_start, session_end):
        file_writer.add_summary(summary)

  def flush(self) -> None:
    if self._writer:
      self._writer.flush()

  def close(self) -> None:
    if self._writer:
      self._writer.close()

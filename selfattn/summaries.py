"""TensorBoard output through tensorboardX (no TensorFlow needed).

Tags: train/* and eval/* scalars, eval/<metric>/len_NNNN per evaluation length
(one chart group per metric), attention/layer_N images (heads side by side),
positions/table, the config as text, and the HParams plugin's session so runs
with different encodings can be filtered and compared.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summary


def eval_tag(metric: str, length: int) -> str:
  return f'eval/{metric}/len_{length:04d}'


def heatmap(matrix: np.ndarray, scale: int = 4) -> np.ndarray:
  """2-D array -> (H, W) uint8 image, min-max normalised, each cell scale x scale."""
  m = np.asarray(matrix, np.float64)
  span = m.max() - m.min()
  m = (m - m.min()) / span if span > 0 else np.zeros_like(m)
  return np.kron((255 * m).astype(np.uint8), np.ones((scale, scale), np.uint8))


def tile_heads(weights_HxLxL: np.ndarray, scale: int = 4) -> np.ndarray:
  """Heads side by side with a 1-cell gap; weights in [0, 1] map to 0..255."""
  h, lq, lk = weights_HxLxL.shape
  canvas = np.full((lq, h * (lk + 1) - 1), 0.5)
  for i in range(h):
    canvas[:, i * (lk + 1): i * (lk + 1) + lk] = weights_HxLxL[i]
  canvas = np.clip(canvas, 0, 1)
  return np.kron((255 * canvas).astype(np.uint8), np.ones((scale, scale), np.uint8))


def flatten_config(config: Mapping[str, Any], prefix: str = '') -> dict:
  """Nested config -> {'model.position': 'shaw', ...} with TensorBoard-safe values."""
  flat = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(flatten_config(value, name + '.'))
    elif value is None:
      flat[name] = 'default'
    elif isinstance(value, (bool, int, float, str)):
      flat[name] = value
    else:
      flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
  return flat


class Writer:
  """Writes only when enabled (process 0 in multi-process runs)."""

  def __init__(self, logdir: str, enabled: bool = True):
    self._writer = SummaryWriter(logdir=logdir) if enabled else None

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer:
      for tag, value in values.items():
        self._writer.add_scalar(tag, float(value), step)

  def image(self, tag: str, step: int, image_HxW: np.ndarray) -> None:
    if self._writer:
      self._writer.add_image(tag, image_HxW, step, dataformats='HW')

  def text(self, tag: str, step: int, text: str) -> None:
    if self._writer:
      self._writer.add_text(tag, text, step)

  def hparams(self, hparams: Mapping[str, Any], metric_tags: list[str]) -> None:
    """Registers this run in the HParams plugin; metrics are read from the
    run's own scalars with these tags (no separate sub-run is created)."""
    if self._writer:
      exp, ssi, sei = hparams_summary(dict(hparams),
                                      {tag: 0.0 for tag in metric_tags})
      file_writer = self._writer._get_file_writer()
      for summary in (exp, ssi, sei):
        file_writer.add_summary(summary)

  def flush(self) -> None:
    if self._writer:
      self._writer.flush()

  def close(self) -> None:
    if self._writer:
      self._writer.close()

"""Training time, measured the way the progress line and summary.json need it.

Time is measured in segments between boundaries (log, checkpoint, eval) and
excludes the boundaries' own work (checkpointing, evaluation). The first
segment includes compilation, so the warm rate (and the time left) leave it
out.
"""

from __future__ import annotations

import time


class StepTimer:
  """Call `start()` before a segment of steps and `stop(steps)` after it."""

  def __init__(self):
    self.train_seconds = 0.0
    self._segment_start = time.perf_counter()
    self._window = [0, 0.0]          # steps, seconds since the last report
    self._warm = [0, 0.0]            # steps, seconds after the first segment
    self._first = True

  def start(self) -> None:
    self._segment_start = time.perf_counter()

  def stop(self, steps: int) -> None:
    seconds = time.perf_counter() - self._segment_start
    self.train_seconds += seconds
    self._window = [self._window[0] + steps, self._window[1] + seconds]
    if not self._first:
      self._warm = [self._warm[0] + steps, self._warm[1] + seconds]
    self._first = False

  def report_rate(self) -> float:
    """Steps per second since the previous report (compilation included if
    it fell in this window); starts the next window."""
    steps, seconds = self._window
    self._window = [0, 0.0]
    return steps / max(seconds, 1e-9)

  @property
  def warm_rate(self) -> float | None:
    """Steps per second after the first (compiling) segment; None before."""
    steps, seconds = self._warm
    return steps / seconds if seconds > 0 else None

  def seconds_left(self, steps_left: int) -> float | None:
    rate = self.warm_rate
    return None if rate is None else steps_left / rate


def duration(seconds: float) -> str:
  """'4m07s', or '1h02m' from an hour on: progress lines and ETAs."""
  seconds = int(round(seconds))
  hours, rest = divmod(seconds, 3600)
  return f'{hours}h{rest // 60:02d}m' if hours else f'{rest // 60}m{rest % 60:02d}s'

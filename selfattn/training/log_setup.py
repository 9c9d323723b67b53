"""Logging for the entry points (selfattn.main, experiments)."""

import logging as std_logging
import os
import pathlib
import sys

from absl import logging

# The project's own source directories. Matched as path prefixes, not
# substrings: a virtualenv inside a checkout named `selfattn` (what `git clone`
# gives) must not let every library's INFO lines through.
# This file is selfattn/training/log_setup.py: the checkout is three up.
_ROOT = str(pathlib.Path(os.path.abspath(__file__)).parents[2])
OWN_DIRS = tuple(os.path.join(_ROOT, name) + os.sep
                 for name in ('selfattn', 'experiments', 'scripts'))


class _OwnInfoOnly(std_logging.Filter):
  """INFO lines from this project's modules only; warnings and errors from
  everyone, one line each (absl logs every library under one logger name, so
  the filter reads the emitting file).

  A library's tracebacks are dropped: orbax logs one per background thread
  when a checkpoint write fails (a full disk: hundreds of lines), and the
  training loop reports the same failure itself in one line.
  """

  def filter(self, record: std_logging.LogRecord) -> bool:
    own = os.path.abspath(record.pathname).startswith(OWN_DIRS)
    if not own and record.exc_info:
      record.exc_info, record.exc_text = None, None
    return record.levelno >= std_logging.WARNING or own


def configure_logging() -> None:
  """Progress lines at INFO on stderr, without the libraries' INFO chatter."""
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_OwnInfoOnly())
  sys.unraisablehook = _drop_closed_loop_callbacks


def _drop_closed_loop_callbacks(unraisable) -> None:
  """Drops tensorstore's late callbacks into orbax's closed event loop.

  When a checkpoint write fails (a full disk), orbax closes its asyncio loop
  while tensorstore still has writes in flight; each one's completion calls
  `loop.call_soon_threadsafe` from C++, fails with 'Event loop is closed' and
  is reported as unraisable: dozens of tracebacks around the one line in which
  the training loop reports the failure. Anything else keeps the default
  report.
  """
  error = unraisable.exc_value
  if isinstance(error, RuntimeError) and str(error) == 'Event loop is closed':
    logging.debug('dropped a callback into a closed event loop')
    return
  sys.__unraisablehook__(unraisable)

"""Logging for the entry points (selfattn.main, experiments)."""

import logging as std_logging
import os

from absl import logging

# The project's own source directories. Matched as path prefixes, not
# substrings: a virtualenv inside a checkout named `selfattn` (what `git clone`
# gives) must not let every library's INFO lines through.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OWN_DIRS = tuple(os.path.join(_ROOT, name) + os.sep
                 for name in ('selfattn', 'experiments', 'scripts'))


class _OwnInfoOnly(std_logging.Filter):
  """INFO lines from this project's modules only; warnings and errors from
  everyone (absl logs every library under one logger name, so the filter
  reads the emitting file)."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    return (record.levelno >= std_logging.WARNING
            or os.path.abspath(record.pathname).startswith(OWN_DIRS))


def configure_logging() -> None:
  """Progress lines at INFO on stderr, without the libraries' INFO chatter."""
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_OwnInfoOnly())

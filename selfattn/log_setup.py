"""Logging for the entry points (selfattn.main, experiments)."""

import logging as std_logging

from absl import logging


class _OwnInfoOnly(std_logging.Filter):
  """INFO lines from this project only; warnings and errors from everyone."""

  def filter(self, record: std_logging.LogRecord) -> bool:
    path = record.pathname.replace('\\', '/')
    return (record.levelno >= std_logging.WARNING
            or '/selfattn/' in path or '/experiments/' in path)


def configure_logging() -> None:
  """Progress lines at INFO on stderr, without the libraries' INFO chatter."""
  logging.set_verbosity(logging.INFO)
  logging.get_absl_handler().addFilter(_OwnInfoOnly())

"""How a training run ends for the command line: each error a user can act
on is one line on stderr and an exit status, never a traceback."""

from __future__ import annotations

import logging as std_logging
import os
import sys

import ml_collections

from selfattn.errors import CheckpointError
from selfattn.errors import ConfigError
from selfattn.errors import DataError
from selfattn.errors import NonFiniteError
from selfattn.errors import TrainingInterrupted


def train_reporting_errors(config: ml_collections.ConfigDict,
                           workdir: str) -> int:
  """train_and_evaluate, with each error a user can act on printed as one
  line on stderr; returns the exit status (0: trained). Bad input (config,
  data files, caches) is 2, a diverged run 1, a stop request 128 + signal;
  a checkpoint that cannot be written ends the process at once, status 1
  (os._exit: orbax's threads could otherwise hold it for minutes)."""
  # Imported here, after the caller's distributed init.
  from selfattn.training.train import train_and_evaluate
  try:
    train_and_evaluate(config, workdir)
  except (ConfigError, DataError) as e:
    print(f'error: {e}', file=sys.stderr)
    return 2
  except NonFiniteError as e:
    print(f'error: {e}', file=sys.stderr)
    return 1
  except CheckpointError as e:
    # Orbax's threads may still be logging the same failure; the one-line
    # report must be the last thing printed.
    std_logging.disable(std_logging.CRITICAL)
    print(f'error: {e}', file=sys.stderr)
    # A failed save can leave orbax threads waiting on a barrier that never
    # completes; a normal exit would wait for them (minutes). Every finished
    # checkpoint is already complete on disk, so nothing is lost.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)
  except TrainingInterrupted as e:
    print(f'stopped: {e}', file=sys.stderr)
    return 128 + e.signum
  return 0

"""selfattn's exceptions, in one place that imports nothing of selfattn:
the run-management modules (config checks, workdir, checkpoints, training,
studies) and the tasks' data loaders raise and catch them without importing
each other or the model."""


class ConfigError(ValueError):
  """An invalid config or a workdir that cannot hold this run: the command
  line prints the message as one line (exit status 2)."""


class DataError(Exception):
  """A data file (JSB Chorales, Multi30k) is missing, corrupt or malformed;
  the message is one line naming the path and what to do."""


class CheckpointError(RuntimeError):
  """Every checkpoint of a workdir is damaged."""


class NonFiniteError(FloatingPointError):
  """Training produced a non-finite loss, gradient norm or parameter (a study
  records the run as diverged)."""


class TrainingInterrupted(Exception):
  """SIGINT or SIGTERM arrived; the run saved a checkpoint and stopped."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.signum = signum

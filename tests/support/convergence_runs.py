"""A made-up finished run of a convergence study (its summary and its
early-stopping record), for the convergence drivers' report tests."""

import os

from selfattn.training import early_stopping
from selfattn.training import workdir as workdir_lib


def fake_converged_run(path, *, stopped_at: int, curve: dict, metric: str,
                       patience: int, length: int) -> None:
  """`path`/summary.json stopped at `stopped_at`, and the record of the
  metric at each evaluated step (curve: step -> value) at `length`."""
  os.makedirs(path)
  workdir_lib.write_json(os.path.join(path, 'summary.json'),
                         {'step': stopped_at})
  workdir_lib.write_json(
      os.path.join(path, early_stopping.EARLY_STOP_FILE),
      {'metric': metric, 'patience': patience, 'evaluations': [
          {'step': s, 'length': length, 'value': v} for s, v in curve.items()]})

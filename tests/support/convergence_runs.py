"""What the convergence drivers' tests share: a made-up finished run (its
summary and its early-stopping record) for their report tests, and the
check that a planned run carries its driver's budget."""

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


def assert_convergence_budget(config, driver, metric: str) -> None:
  """`config` trains up to driver.CAP_STEPS, evaluates and keeps a
  checkpoint every driver.EVAL_EVERY steps (every one kept), and stops
  after driver.PATIENCE evaluations without a new best `metric`."""
  t, e = config.train, config.eval
  assert t.num_steps == driver.CAP_STEPS
  assert (t.early_stop_patience, t.early_stop_metric) == (driver.PATIENCE,
                                                          metric)
  assert t.checkpoint_every == e.every == driver.EVAL_EVERY
  assert t.keep_checkpoints * e.every == t.num_steps      # every one kept

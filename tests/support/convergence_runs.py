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


# What convergence.with_budget sets; everything else is the study's.
BUDGET_FIELDS = ('num_steps', 'checkpoint_every', 'keep_checkpoints',
                 'early_stop_patience', 'early_stop_metric')


def assert_same_but_budget(config, same) -> None:
  """`config` is the fixed-budget study's `same` but for the budget: the
  model, task, training and evaluation settings all equal."""
  assert config.model.to_dict() == same.model.to_dict()
  assert config.task.to_dict() == same.task.to_dict()
  assert ({k: v for k, v in config.train.to_dict().items()
           if k not in BUDGET_FIELDS}
          == {k: v for k, v in same.train.to_dict().items()
              if k not in BUDGET_FIELDS})
  assert ({k: v for k, v in config.eval.to_dict().items() if k != 'every'}
          == {k: v for k, v in same.eval.to_dict().items() if k != 'every'})

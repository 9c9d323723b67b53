"""Early stopping: end a run when its validation metric stops improving.

config.train.early_stop_patience = N > 0 stops training after the first
evaluation that is the N-th in a row without a new best of
config.train.early_stop_metric (loss: lower is better; the accuracies,
BLEU and chrF: higher), read at the longest evaluated length within the
trained range (translation: the source-length range ending there, over the
first eval.num_examples validation pairs; configs/translation.py's single
length 64 makes that every pair evaluated). num_steps stays the
cap, and the schedule is still built for it.

The record of every evaluation lives in the workdir (EARLY_STOP_FILE), so a
resumed run counts the evaluations before its kill: a run stopped and resumed
any number of times stops at the same step as one that never was. Entries
past the checkpoint a run resumes from are dropped (they are recomputed).
So that the record compares like with like, a resume refuses another
config.eval.lengths, every or num_examples (workdir.check_or_store_config).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import ml_collections

from selfattn.errors import ConfigError
from selfattn.training import workdir as workdir_lib

EARLY_STOP_FILE = 'early_stop.json'
LOWER_IS_BETTER = ('loss',)
METRICS = ('loss', 'token_accuracy', 'sequence_accuracy')
# Only the encoder-decoder evaluation decodes and scores text.
TEXT_METRICS = ('bleu', 'chrf')


def check_config(config: ml_collections.ConfigDict) -> None:
  """ConfigError for an unusable early-stopping setting."""
  patience = config.train.early_stop_patience
  if not isinstance(patience, int) or isinstance(patience, bool) or patience < 0:
    raise ConfigError(f'config.train.early_stop_patience must be an integer '
                      f'>= 0 (0: off); got {patience!r}')
  valid = METRICS + (TEXT_METRICS if config.task.layout == 'encoder_decoder'
                     else ())
  metric = config.train.early_stop_metric
  if metric not in valid:
    raise ConfigError(f'config.train.early_stop_metric={metric!r} is not '
                      f'evaluated for layout {config.task.layout!r}; valid: '
                      f'{", ".join(valid)}')


def monitored_length(results: dict[int, dict[str, float]], max_len: int) -> int:
  """The longest evaluated length within the trained range (the shortest
  evaluated one where none is)."""
  inside = [n for n in results if n <= max_len]
  return max(inside) if inside else min(results)


@dataclasses.dataclass
class EarlyStopping:
  """The evaluations so far ({'step', 'value'} in order) and the rule."""
  metric: str
  patience: int
  max_len: int
  path: str
  record: list[dict[str, Any]]

  @classmethod
  def for_run(cls, config: ml_collections.ConfigDict, workdir: str,
              start_step: int) -> EarlyStopping | None:
    """The run's early stopping, resumed at start_step; None when off."""
    patience = config.train.early_stop_patience
    if not patience:
      return None
    path = os.path.join(workdir, EARLY_STOP_FILE)
    record = []
    if os.path.exists(path):
      stored = workdir_lib.read_json_object(
          path, 'the early-stopping record; delete it and the checkpoints to '
          'retrain')
      record = [e for e in stored.get('evaluations', [])
                if e['step'] <= start_step]
    return cls(config.train.early_stop_metric, patience,
               config.task.max_len, path, record)

  def _better(self, a: float, b: float) -> bool:
    return a < b if self.metric in LOWER_IS_BETTER else a > b

  def best(self) -> dict[str, Any] | None:
    """The first evaluation with the best value (None before any)."""
    best = None
    for entry in self.record:
      if best is None or self._better(entry['value'], best['value']):
        best = entry
    return best

  def has(self, step: int) -> bool:
    """Whether the evaluation at `step` is in the record."""
    return any(e['step'] == step for e in self.record)

  def should_stop(self) -> bool:
    """Whether the record already says stop (a run killed after the
    decision, before its summary)."""
    return self.since_best() >= self.patience

  def since_best(self) -> int:
    """Evaluations after the best one."""
    best = self.best()
    return 0 if best is None else sum(
        e['step'] > best['step'] for e in self.record)

  def observe(self, step: int, results: dict[int, dict[str, float]],
              write: bool = True) -> bool:
    """Records the evaluation at `step`; True when training should stop."""
    length = monitored_length(results, self.max_len)
    self.record = [e for e in self.record if e['step'] < step]
    self.record.append({'step': step, 'length': length,
                        'value': float(results[length][self.metric])})
    if write:
      workdir_lib.write_json(self.path, {
          'metric': self.metric, 'patience': self.patience,
          'evaluations': self.record})
    return self.should_stop()

  def outcome(self) -> dict[str, Any]:
    """What the summary records about a run that stopped early."""
    best = self.best()
    assert best is not None
    return {'metric': self.metric, 'patience': self.patience,
            'length': best['length'], 'best_step': best['step'],
            'best': best['value'], 'evaluations': len(self.record)}


def read_record(workdir: str) -> list[dict[str, Any]]:
  """A workdir's evaluations as early stopping saw them ([] without one)."""
  path = os.path.join(workdir, EARLY_STOP_FILE)
  if not os.path.exists(path):
    return []
  return workdir_lib.read_json_object(
      path, 'the early-stopping record').get('evaluations', [])

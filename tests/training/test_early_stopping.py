"""Early stopping (config.train.early_stop_patience): the rule, its config
checks, and a real run that stops, resumes and reruns at the same step."""

import json
import os
import shutil

import numpy as np
import pytest

from selfattn.errors import ConfigError
from selfattn.training import early_stopping
from selfattn.training import train
from selfattn.training import workdir as workdir_lib
from selfattn.training.config_checks import validate_config
from runs import crashed_copy, saved_params
from tiers import EXTENDED


def _rule(tmp_path, metric, patience=2, max_len=8):
  return early_stopping.EarlyStopping(metric, patience, max_len,
                                      str(tmp_path / 'early.json'), [])


def _results(value, metric, lengths=(4, 8, 12)):
  # Lengths past the trained max_len (12) carry a decoy that must be ignored.
  return {n: {metric: value if n <= 8 else -value} for n in lengths}


@pytest.mark.parametrize('metric,values,stop_at', [
    # loss: lower is better; 2.0 at the 2nd evaluation, then two worse.
    ('loss', [3.0, 2.0, 2.5, 2.1], 4),
    # a tie is not an improvement
    ('loss', [3.0, 3.0, 3.0], 3),
    # accuracy: higher is better; a new best resets the count.
    ('token_accuracy', [0.1, 0.2, 0.15, 0.3, 0.3, 0.29], 6),
])
def test_stops_after_patience_evaluations_without_a_new_best(
    tmp_path, metric, values, stop_at):
  rule = _rule(tmp_path, metric)
  stops = [rule.observe(100 * (i + 1), _results(v, metric))
           for i, v in enumerate(values)]
  assert stops == [i + 1 >= stop_at for i in range(len(values))]
  assert stops.index(True) + 1 == stop_at
  best = min(values) if metric == 'loss' else max(values)
  outcome = rule.outcome()
  assert outcome['best'] == best and outcome['length'] == 8
  assert outcome['best_step'] == 100 * (values.index(best) + 1)
  stored = json.loads((tmp_path / 'early.json').read_text())
  assert [e['value'] for e in stored['evaluations']] == values


def test_monitored_length_is_the_longest_trained_one_or_the_shortest():
  assert early_stopping.monitored_length({4: {}, 8: {}, 12: {}}, 8) == 8
  assert early_stopping.monitored_length({4: {}, 6: {}, 12: {}}, 8) == 6
  assert early_stopping.monitored_length({12: {}, 16: {}}, 8) == 12


def test_config_checks_name_the_field_and_the_valid_choices(tiny_config):
  tiny_config.train.early_stop_patience = 2
  tiny_config.train.early_stop_metric = 'bleu'      # a translation metric
  with pytest.raises(ConfigError, match=r"early_stop_metric='bleu'.*valid: "
                     r'loss, token_accuracy, sequence_accuracy$'):
    validate_config(tiny_config)
  tiny_config.train.early_stop_metric = 'loss'
  tiny_config.train.early_stop_patience = -1
  with pytest.raises(ConfigError, match='early_stop_patience must be an '
                     'integer >= 0'):
    validate_config(tiny_config)
  tiny_config.train.early_stop_patience = 0
  validate_config(tiny_config)


def _flat_run_config(c, num_steps):
  """tiny config evaluated (and checkpointed) every 10 steps with a learning
  rate too small to change a prediction: sequence accuracy is the same at
  every evaluation, so the first stays the best and patience 2 stops the
  run at the third (step 30)."""
  c.train.num_steps = num_steps
  c.train.checkpoint_every = c.eval.every = 10
  c.train.keep_checkpoints = 10
  c.train.learning_rate = 1e-9
  c.train.early_stop_patience = 2
  c.train.early_stop_metric = 'sequence_accuracy'
  return c


# Extended: test_resumes_that_missed_or_already_made_the_decision_stop_at_the_same_step
# makes the same claim (a run stops early, resumed copies stop at the same
# step with the same outcome) and takes both of the resume's own branches;
# the outcome's fields are test_stops_after_patience_evaluations_without_a_new_best's,
# and its rerun of an early-stopped run trains nothing there too
# (tests/README.md).
@EXTENDED
def test_run_stops_early_and_a_resumed_copy_stops_at_the_same_step(
    tiny_config, tmp_path):
  c = _flat_run_config(tiny_config, 60)    # the cap, never reached
  straight = tmp_path / 'straight'
  summary = train.train_and_evaluate(c, str(straight))
  assert summary['step'] == 30
  assert summary['stopped_early'] == {
      'metric': 'sequence_accuracy', 'patience': 2, 'length': 8,
      'best_step': 10, 'best': summary['history'][0]['eval']['8'][
          'sequence_accuracy'], 'evaluations': 3}
  assert sorted(map(int, os.listdir(straight / 'checkpoints'))) == [10, 20, 30]

  # A crash after the step-20 checkpoint (its early-stopping record already
  # holds step 30's evaluation, which the resumed run recomputes).
  resumed = crashed_copy(straight, tmp_path / 'resumed', 20)
  shutil.copy(straight / early_stopping.EARLY_STOP_FILE, resumed)
  again = train.train_and_evaluate(c, str(resumed))
  assert again['step'] == 30 and again['stopped_early'] == summary['stopped_early']
  for a, b in zip(saved_params(straight), saved_params(resumed), strict=True):
    np.testing.assert_array_equal(a, b)

  # A stopped run is finished: rerunning it trains nothing.
  rerun = train.train_and_evaluate(c, str(straight))
  assert rerun == json.loads((straight / 'summary.json').read_text())
  assert sorted(map(int, os.listdir(straight / 'checkpoints'))) == [10, 20, 30]


def _record_only(path, steps):
  """Keeps the early-stopping record's evaluations at `steps`."""
  record = json.loads((path / early_stopping.EARLY_STOP_FILE).read_text())
  record['evaluations'] = [e for e in record['evaluations']
                           if e['step'] in steps]
  (path / early_stopping.EARLY_STOP_FILE).write_text(json.dumps(record))


def test_resumes_that_missed_or_already_made_the_decision_stop_at_the_same_step(
    tiny_config, tmp_path):
  """A stop request (or a kill) between the step-20 checkpoint and its
  evaluation leaves the record without step 20: the resumed run evaluates
  it first. A kill after the step-30 decision, before the summary: the
  resumed run stops at once, training nothing."""
  c = _flat_run_config(tiny_config, 60)
  straight = tmp_path / 'straight'
  summary = train.train_and_evaluate(c, str(straight))
  assert summary['step'] == 30

  missed = crashed_copy(straight, tmp_path / 'missed', 20)
  shutil.copy(straight / early_stopping.EARLY_STOP_FILE, missed)
  _record_only(missed, {10})
  # The evaluation record (written before early stopping's) holds step 20:
  # remade, it is still one entry of summary.json's history.
  shutil.copy(straight / workdir_lib.EVALUATED_FILE, missed)
  # The record is compared across the resume, so what it measured must not
  # change: other lengths (here the monitored 8 gone), cadence or sample
  # is refused before any work, in one line naming the field.
  before = sorted(os.listdir(missed / 'checkpoints'))
  for field, value in (('lengths', [4, 12]), ('every', 5),
                       ('num_examples', 8)):
    changed = c.copy_and_resolve_references()
    changed.eval[field] = value
    with pytest.raises(ConfigError, match=rf'config.eval.{field}: stored .*'
                       r'With early stopping on'):
      train.train_and_evaluate(changed, str(missed))
  assert sorted(os.listdir(missed / 'checkpoints')) == before
  again = train.train_and_evaluate(c, str(missed))
  assert again['step'] == 30 and again['stopped_early'] == summary['stopped_early']
  assert [h['step'] for h in again['history']] == [10, 20, 30]

  decided = crashed_copy(straight, tmp_path / 'decided', 30)
  shutil.copy(straight / early_stopping.EARLY_STOP_FILE, decided)
  again = train.train_and_evaluate(c, str(decided))
  assert again['step'] == 30 and again['stopped_early'] == summary['stopped_early']
  assert again['history'] == []                 # nothing trained or evaluated
  assert sorted(map(int, os.listdir(decided / 'checkpoints'))) == [30]

  # A stopped run is finished: rerunning it trains nothing, also with
  # other evaluation settings (nothing is evaluated, so no record to keep).
  rerun = train.train_and_evaluate(c, str(straight))
  assert rerun == json.loads((straight / 'summary.json').read_text())
  c.eval.lengths = [4, 12]
  assert train.train_and_evaluate(c, str(straight)) == rerun
  assert sorted(map(int, os.listdir(straight / 'checkpoints'))) == [10, 20, 30]


def test_patience_running_out_at_the_cap_is_not_an_early_stop(tiny_config,
                                                               tmp_path):
  c = _flat_run_config(tiny_config, 30)    # patience runs out at the cap
  summary = train.train_and_evaluate(c, str(tmp_path / 'run'))
  assert summary['step'] == 30 and 'stopped_early' not in summary

"""The command line's one-line endings (selfattn/training/exits.py), each
error class against the status and the single line it promises."""

import signal

import pytest

from selfattn.errors import ConfigError
from selfattn.errors import DataError
from selfattn.errors import NonFiniteError
from selfattn.errors import TrainingInterrupted
from selfattn.training import exits
from selfattn.training import train


@pytest.mark.parametrize('error,status,line', [
    (DataError('val.de.gz: checksum mismatch'), 2,
     'error: val.de.gz: checksum mismatch'),
    (ConfigError('config.task.max_len must be >= 2'), 2,
     'error: config.task.max_len must be >= 2'),
    (NonFiniteError('non-finite loss at step 3'), 1,
     'error: non-finite loss at step 3'),
    (TrainingInterrupted('SIGTERM received', signal.SIGTERM), 143,
     'stopped: SIGTERM received'),
])
def test_each_error_a_user_can_act_on_is_one_line_and_a_status(
    monkeypatch, capsys, error, status, line):
  def fail(config, workdir):
    raise error
  monkeypatch.setattr(train, 'train_and_evaluate', fail)
  assert exits.train_reporting_errors(None, 'unused') == status
  captured = capsys.readouterr()
  assert captured.err.splitlines() == [line] and captured.out == ''


def test_a_run_that_trains_exits_zero(monkeypatch, capsys):
  monkeypatch.setattr(train, 'train_and_evaluate', lambda c, w: {})
  assert exits.train_reporting_errors(None, 'unused') == 0
  assert capsys.readouterr().err == ''


def test_an_unexpected_error_is_not_hidden(monkeypatch):
  def fail(config, workdir):
    raise KeyError('a bug')
  monkeypatch.setattr(train, 'train_and_evaluate', fail)
  with pytest.raises(KeyError):
    exits.train_reporting_errors(None, 'unused')

"""Extending selfattn without editing it: configs/own_encoding_and_task.py
registers an encoding and a task (positions.register_position,
tasks.register_task) and the command line trains them, with their options
as config fields checked like selfattn's own (docs/library.md)."""

import ast
import json
import pathlib

import pytest

from runs import cli
from runs import ROOT

pytestmark = pytest.mark.slow

CONFIG = 'configs/own_encoding_and_task.py'
# The example's model and run, shrunk to configs/tiny.py's seconds.
TINY = ('--config.task.max_len=8', '--config.model.num_layers=1',
        '--config.model.num_hiddens=16', '--config.model.num_heads=2',
        '--config.model.ffn_num_hiddens=32', '--config.train.num_steps=20',
        '--config.train.batch_size=8', '--config.train.warmup_steps=2',
        '--config.eval.lengths=4,8,12', '--config.eval.num_examples=16',
        '--config.train.checkpoint_every=10')


def test_the_example_needs_only_the_installed_package():
  """It can be copied out of the checkout: it imports selfattn (whose
  default_config has every field) and nothing from configs/, which is not
  installed."""
  tree = ast.parse(pathlib.Path(ROOT, CONFIG).read_text())
  imported = {alias.name.split('.')[0] for node in ast.walk(tree)
              if isinstance(node, ast.Import) for alias in node.names}
  imported |= {node.module.split('.')[0] for node in ast.walk(tree)
               if isinstance(node, ast.ImportFrom)}
  assert 'configs' not in imported and 'selfattn' in imported


def test_a_registered_encoding_and_task_train_from_the_command_line(tmp_path):
  workdir = tmp_path / 'run'
  done = cli(workdir, '--config.task.rotation=3', '--config.model.decay=0.5',
             '--config.eval.figures=False', *TINY, config=CONFIG)
  assert done.returncode == 0, done.stderr[-2000:]
  summary = json.loads((workdir / 'summary.json').read_text())
  assert summary['step'] == 20
  config = summary['config']
  assert (config['model']['position'], config['model']['decay']) == (
      'decaying_bias', 0.5)
  assert (config['task']['name'], config['task']['rotation']) == ('rotate', 3)
  assert 'decaying_bias on rotate' in done.stdout

  # Its options are checked by its own code, reported like selfattn's own:
  # one line naming the field, exit 2, nothing written. (Another task's
  # option set away from its default is refused for a registered task in
  # process: test_register_task.py.)
  refused = tmp_path / 'refused'
  for override, message in (
      ('--config.model.decay=-1', 'error: config.model.decay must be > 0'),
      ('--config.task.rotation=0', 'error: config.task.rotation must be >= 1')):
    result = cli(refused, override, *TINY, config=CONFIG)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert not refused.exists()

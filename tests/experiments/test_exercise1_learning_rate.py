"""The learning-rate check of exercise 1's deep post-LN stacks: its plan is
the warmup sweep's cell with only the peak rate changed."""

import json
import os
import re
import statistics

from experiments import exercise1_depth
from experiments import exercise1_learning_rate as lr_check
from runs import ROOT
from selfattn.training.config_checks import validate_config


def test_each_cell_is_the_warmup_sweep_cell_with_another_peak_rate():
  cells = lr_check.settings(quick=False)
  assert [name for name, _ in cells] == [
      f'norm={n},depth={d},warmup=100,lr={lr},steps=2000'
      for n, d in (('post', 12), ('post', 24), ('pre', 12))
      for lr in ('0.001', '0.0003')]
  for name, config in cells:
    sweep = exercise1_depth.depth_config(
        config.model.norm, config.model.num_layers, 100, 2000)
    assert sweep.train.learning_rate == 3e-3     # the rate that failed
    assert config.train.learning_rate in (1e-3, 3e-4)
    config_dict, sweep_dict = config.to_dict(), sweep.to_dict()
    config_dict['train'].pop('learning_rate')
    sweep_dict['train'].pop('learning_rate')
    assert config_dict == sweep_dict, name


def test_every_planned_run_passes_validation():
  for quick in (False, True):
    for _, config in lr_check.settings(quick):
      assert validate_config(config, num_devices=1).name == 'precedes'


def test_section_1_quotes_the_committed_runs():
  """EXPERIMENTS.md's reading of the check against its results.json: the
  seeds trained (accuracy >= 0.6) per cell, and the two depth-24 cells'
  mean ± std."""
  with open(os.path.join(ROOT, 'experiments/results/exercise1_lr/'
                         'results.json')) as f:
    cells = json.load(f)['trainability']
  trained = {name: sum(a >= 0.6 for a in c['accuracy'])
             for name, c in cells.items()}
  at = lambda norm, depth, lr: trained[
      f'norm={norm},depth={depth},warmup=100,lr={lr},steps=2000']
  assert [at('post', 12, '0.001'), at('post', 12, '0.0003'),
          at('post', 24, '0.001'), at('post', 24, '0.0003'),
          at('pre', 12, '0.001') + at('pre', 12, '0.0003')] == [5, 5, 1, 5, 10]
  with open(os.path.join(ROOT, 'EXPERIMENTS.md'), encoding='utf-8') as f:
    text = re.sub(r'\s+', ' ', f.read())
  for lr in ('0.001', '0.0003'):
    accs = cells[f'norm=post,depth=24,warmup=100,lr={lr},steps=2000'][
        'accuracy']
    assert (f'{statistics.mean(accs):.3f} ± {statistics.stdev(accs):.3f}'
            in text)
  assert '1 of 5 trained, 0.72' in text and '(10 of 10, 0.996-1.000' in text

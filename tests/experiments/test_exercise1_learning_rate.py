"""The learning-rate check of exercise 1's deep post-LN stacks: its plan is
the warmup sweep's cell with only the peak rate changed."""

from experiments import exercise1_depth
from experiments import exercise1_learning_rate as lr_check
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

"""experiments/stack_check.py: a committed run's config as it was trained,
and the paired comparison of two stacks on made-up summaries."""

import json
import os

import pytest
import scipy.stats

from experiments import stack_check
from runs import ROOT
from selfattn.training import config_checks

COMMITTED = os.path.join(ROOT, 'experiments', 'results', 'compare',
                         'position=shaw,seed=3')


def test_a_committed_config_is_restored_as_stored_and_validates():
  """Every stored field keeps its value; fields added since the run come
  from configs/default.py, and the whole config passes validation (the
  committed file alone lacks fields the training system now needs)."""
  config = stack_check.stored_config(COMMITTED)
  with open(os.path.join(COMMITTED, 'config.json')) as f:
    stored = json.load(f)

  def leaves(tree, prefix=''):
    for key, value in tree.items():
      if isinstance(value, dict):
        yield from leaves(value, f'{prefix}{key}.')
      else:
        yield f'{prefix}{key}', value

  restored = config.to_dict()
  for dotted, value in leaves(stored):
    node = restored
    for part in dotted.split('.'):
      node = node[part]
    assert node == value, dotted
  assert config.seed == 3 and config.model.position == 'shaw'
  config_checks.validate_config(config, num_devices=1)


def _summary(accuracies, jax_version):
  return {'eval': {n: {'token_accuracy': a} for n, a in accuracies.items()},
          'versions': {'jax': jax_version, 'flax': 'f', 'python': 'p'}}


def test_report_pairs_the_stacks_by_seed_with_a_t_interval():
  old = {f'position=x,seed={s}': _summary({'8': 0.5, '16': 0.2 + s / 100},
                                          '0.10.2') for s in range(3)}
  new = {f'position=x,seed={s}': _summary({'8': 0.5, '16': 0.2 + 2 * s / 100},
                                          '0.12.0.1') for s in range(3)}
  text = stack_check.report(old, new)
  assert 'committed: jax 0.10.2' in text and 'retrained: jax 0.12.0.1' in text
  # Length 16: differences 0, 0.01, 0.02 across the three seeds.
  half = scipy.stats.t.ppf(0.975, 2) * 0.01 / 3 ** 0.5
  row = next(line for line in text.splitlines() if line.startswith('| 16 '))
  assert '+0.010' in row and f'[{0.01 - half:+.3f}, {0.01 + half:+.3f}]' in row
  assert '+0.000, +0.010, +0.020' in row
  # Identical numbers: no interval to draw.
  row8 = next(line for line in text.splitlines() if line.startswith('| 8 '))
  assert '+0.000' in row8 and '–' in row8


def _main_with(argv):
  """stack_check.main under `argv`, the process's flags restored after."""
  from absl import flags
  from absl.testing import flagsaver
  with flagsaver.flagsaver():
    flags.FLAGS.unparse_flags()
    flags.FLAGS(argv)
    stack_check.main(argv)


def _refused(argv, capsys, message):
  """One line naming the problem, exit 2 (a usage error, as in studies)."""
  with pytest.raises(SystemExit) as stop:
    _main_with(argv)
  assert stop.value.code == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(f'error: {message}') and '\n' not in err, err


def test_a_cell_that_matches_no_run_is_refused(tmp_path, capsys):
  _refused(['stack_check', f'--study={ROOT}/experiments/results/compare',
            '--runs=position=nosuch,seed=*', f'--workdir={tmp_path}'],
           capsys, 'no run directory matches')


def test_a_missing_flag_is_refused_by_name(tmp_path, capsys):
  _refused(['stack_check', f'--study={ROOT}/experiments/results/compare',
            f'--workdir={tmp_path}'], capsys, '--runs is required')


def test_importing_the_driver_leaves_other_flag_parsing_alone():
  """Its flags are not absl-required: a required flag is validated on every
  parse in the process, so other drivers' tests in the same worker failed
  (seen under xdist) once this module was imported."""
  from absl import flags
  from absl.testing import flagsaver
  with flagsaver.flagsaver():
    flags.FLAGS.unparse_flags()
    flags.FLAGS(['another_driver', '--workdir=/tmp/x'])   # no --study, --runs
    assert flags.FLAGS['study'].value is None

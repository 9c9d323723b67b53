"""A committed study cell, retrained on the installed stack and compared.

  python -m experiments.stack_check \
      --study=experiments/results/compare --runs='position=shaw,seed=*' \
      --workdir=experiments/results/stack_check/compare_shaw

Each run directory of the cell holds the config.json it was trained with and
the summary.json it ended with (whose `versions` names the stack). Every run
is trained again from that config, as it is, into `--workdir/<run name>`
(resumable: a finished run is not retrained), and results.md compares the two
stacks per evaluation length: each stack's mean ± std over seeds, and the new
minus the committed token accuracy paired by seed, with its 95% t-interval
across seeds (the seed is the unit of replication).

A new JAX release changes XLA's fusions and reduction orders, so the same
seed need not give the same bits; what should hold is that the cell's
numbers stay inside its seed-to-seed spread.
"""

from __future__ import annotations

import glob
import os
import statistics

import ml_collections
from absl import app
from absl import flags

from experiments import common
from selfattn.training import train
from selfattn.errors import ConfigError
from selfattn.training import workdir as workdir_lib
from selfattn.training.log_setup import configure_logging
from selfattn.training.cli_checks import parse_flags
from selfattn.training.cli_checks import workdir_problem

# Checked in main, not with required=True: absl validates required flags on
# every parse in the process, so importing this module (as its test does)
# would break other drivers' flag parsing beside it.
_STUDY = flags.DEFINE_string('study', None, 'A committed study directory.')
_RUNS = flags.DEFINE_string('runs', None, 'Glob of the cell\'s run directory '
                            "names inside --study, e.g. 'position=shaw,seed=*'.")


def _stack(summary: dict) -> str:
  v = summary.get('versions') or {}
  return f"jax {v.get('jax')}, flax {v.get('flax')}, python {v.get('python')}"


def _token_accuracy(summary: dict) -> dict[str, float]:
  return {n: m['token_accuracy'] for n, m in summary['eval'].items()}


def _overlay(config: ml_collections.ConfigDict, stored: dict) -> None:
  for key, value in stored.items():
    if isinstance(value, dict) and key in config:
      _overlay(config[key], value)
    else:
      config[key] = value


def stored_config(path: str) -> ml_collections.ConfigDict:
  """The config a committed run was trained with: its config.json over
  configs/default.py, so that fields added since it ran take the values
  that reproduce it (workdir's added fields) or their defaults."""
  from configs import default
  stored = workdir_lib.with_added_fields(workdir_lib.read_json_object(
      os.path.join(path, workdir_lib.CONFIG_FILE), "a committed run's config"))
  config = default.get_config()
  with config.unlocked():
    _overlay(config, stored)
  return config


def _retrain(path: str, out: str) -> dict:
  """The finished summary of `path`'s config trained into `out`."""
  config = stored_config(path)
  done = workdir_lib.finished_summary(out, config.train.num_steps)
  return done if done is not None else train.train_and_evaluate(config, out)


def _seed(name: str) -> int:
  return int(name.rsplit('seed=', 1)[1])


def report(old: dict[str, dict], new: dict[str, dict]) -> str:
  """The markdown comparing two stacks' summaries of the same runs
  (run name -> summary)."""
  names = sorted(old, key=_seed)
  lengths = list(old[names[0]]['eval'])
  first_old, first_new = old[names[0]], new[names[0]]
  rows = []
  for n in lengths:
    before = [_token_accuracy(old[r])[n] for r in names]
    after = [_token_accuracy(new[r])[n] for r in names]
    diffs = [a - b for a, b in zip(after, before)]
    if len(diffs) > 1 and statistics.stdev(diffs) > 0:
      lo, hi = common.seed_interval(diffs)
      interval = f'[{lo:+.3f}, {hi:+.3f}]'
    else:
      interval = '–'
    rows.append([n, common.mean_std(before), common.mean_std(after),
                 f'{statistics.mean(diffs):+.3f}', interval,
                 ', '.join(f'{d:+.3f}' for d in diffs)])
  table = common.markdown_table(
      ['length', 'committed', 'retrained', 'new minus committed',
       '95% t-interval across seeds', 'per seed'], rows)
  return (f'Runs: {", ".join(names)} ({len(names)} seeds).\n\n'
          f'- committed: {_stack(first_old)}\n'
          f'- retrained: {_stack(first_new)}\n\n'
          'Token accuracy, mean ± std over seeds:\n\n' + table)


def main(argv) -> None:
  del argv
  configure_logging()
  for name in ('study', 'runs', 'workdir'):
    if not flags.FLAGS[name].value:
      common.fail(f'--{name} is required')
  problem = workdir_problem(flags.FLAGS.workdir)
  if problem:
    common.fail(problem)
  paths = sorted(p for p in glob.glob(os.path.join(_STUDY.value, _RUNS.value))
                 if os.path.isdir(p))
  if not paths:
    common.fail(f'no run directory matches --runs={_RUNS.value!r} in '
                f'--study={_STUDY.value!r}')
  old, new = {}, {}
  for i, path in enumerate(paths, 1):
    name = os.path.basename(path)
    print(f'[{i}/{len(paths)}] {name}', flush=True)
    old[name] = workdir_lib.read_json_object(
        os.path.join(path, workdir_lib.SUMMARY_FILE), "a committed run's summary")
    new[name] = _retrain(path, os.path.join(common.WORKDIR.value, name))
  # The study as one spelling (a trailing slash, ./ or an absolute path
  # name the same runs): the title is the report's owner mark.
  title = f'{os.path.relpath(_STUDY.value)}/{_RUNS.value} on the installed stack'
  try:
    text = common.write_results(
        common.WORKDIR.value, title,
        [('Committed against retrained', report(old, new))])
  except ConfigError as e:
    common.fail(str(e))
  print(text)


if __name__ == '__main__':
  app.run(main, flags_parser=parse_flags)

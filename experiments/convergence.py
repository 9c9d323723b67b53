"""What the convergence studies share (translation_convergence.py,
music_convergence.py, indirect_indexing_convergence.py,
length_generalization_convergence.py): a study's protocol with its budget
replaced by early stopping, and the same seeds' runs of the fixed-budget
study beside them."""

from __future__ import annotations

import os

import ml_collections
from absl import flags

from experiments import common
from experiments import skeleton
from selfattn.training import early_stopping
from selfattn.training import workdir as workdir_lib

# --scale=quick: a smoke test of the whole path.
QUICK = {'cap': 40, 'every': 10, 'patience': 1}
# One flag for both drivers (absl refuses a flag defined twice in a process).
SHORT_DIR = flags.DEFINE_string(
    'short_dir', None,
    "The fixed-budget study's workdir, whose runs of the same seeds are the "
    "short budget (default: that study's committed results folder).")


def short_dir(default: str) -> str:
  """--short_dir, or the driver's default."""
  return SHORT_DIR.value or default


def with_budget(config: ml_collections.ConfigDict, scale: str, *, cap: int,
                every: int, patience: int, metric: str
                ) -> ml_collections.ConfigDict:
  """`config` (in place) with the schedule built for `cap` steps, an
  evaluation and a kept checkpoint every `every` steps, and training
  stopped after `patience` evaluations in a row without a new best
  `metric`; QUICK's numbers under --scale=quick."""
  if scale == 'quick':
    cap, every, patience = QUICK['cap'], QUICK['every'], QUICK['patience']
  t = config.train
  t.num_steps = cap
  t.checkpoint_every = config.eval.every = every
  t.keep_checkpoints = cap // every          # every evaluated step
  t.early_stop_patience = patience
  t.early_stop_metric = metric
  return config


def record_curve(path: str) -> dict[int, float]:
  """step -> the early-stopping metric of a run in `path` (its record,
  written at every evaluation)."""
  return {e['step']: e['value'] for e in early_stopping.read_record(path)}


def _best_step(path: str, sign: int) -> int:
  """The evaluated step whose early-stopping value times `sign` is lowest
  (the earlier of a tie)."""
  curve = record_curve(path)
  if not curve:
    raise FileNotFoundError(f'no early-stopping record in {path}')
  return min(curve, key=lambda s: (sign * curve[s], s))


def lowest_step(path: str) -> int:
  """The evaluated step with the lowest early-stopping value of a run in
  `path` (the earlier of a tie): the checkpoint a study that stops on a
  held-out loss scores."""
  return _best_step(path, 1)


def highest_step(path: str) -> int:
  """lowest_step for a metric where higher is better (an accuracy)."""
  return _best_step(path, -1)


def loop_evaluations(path: str) -> dict[int, dict]:
  """step -> the loop's evaluation ({length: metrics}) of a run in `path`
  (its evaluated.json history)."""
  record = workdir_lib.read_json_object(
      os.path.join(path, workdir_lib.EVALUATED_FILE), "the run's evaluations")
  return {h['step']: h['eval'] for h in record.get('history', [])}


def change_with_budget(short: dict, long: dict) -> dict:
  """label -> seed -> the long budget's value minus the short one's, for
  the seeds a label has at both (short, long: label -> seed -> value)."""
  return {label: {s: v - short[label][s] for s, v in by_seed.items()
                  if s in short.get(label, {})}
          for label, by_seed in long.items()}


def lines_at_budgets(values: dict, comparisons, at_budget, change_name,
                     **paired) -> list[str]:
  """Report lines for each comparison (a, b, name): a minus b paired by
  seed at each budget, then the same difference's change from the first
  budget to the second (the seeds paired at both).

  values: budget name -> label -> seed -> value, the short budget first;
  at_budget(budget, name) and change_name(name) phrase the lines; `paired`
  goes to common.paired_by_seed (unit, scale, digits).
  """
  short, long = values
  change = change_with_budget(values[short], values[long])
  lines = []
  for a, b, name in comparisons:
    for budget in (short, long):
      lines.append(common.paired_by_seed(values[budget], a, b,
                                         at_budget(budget, name), **paired))
    lines.append(common.paired_by_seed(change, a, b, change_name(name),
                                       **paired))
  return lines


def same_seed_result(short_dir: str, label: str, seed: int, result_file: str,
                     what: str) -> dict | None:
  """The fixed-budget study's `result_file` for (label, seed), or None."""
  path = os.path.join(short_dir,
                      f'position={label.replace(" ", "")},seed={seed}',
                      result_file)
  if not os.path.exists(path):
    return None
  return workdir_lib.read_json_object(path, what)


def stopped_at(workdir: str, name: str) -> int:
  """The step run `name` under workdir ended at (its summary)."""
  return workdir_lib.read_json_object(
      os.path.join(workdir, name, workdir_lib.SUMMARY_FILE),
      'a run summary')['step']


def by_budget(workdir: str, runs, results: dict, order, short_result
              ) -> tuple[list[str], dict, dict]:
  """(The labels of `order` that have runs, label -> seed -> converged
  result with its 'stopped_at', label -> seed -> short_result(label,
  seed): the fixed-budget run of each converged one's seed, where it
  exists.)"""
  labels = [l for l in order if any(r.tags['position'] == l for r in runs)]
  long_by: dict[str, dict[int, dict]] = {}
  for name, r in results.items():
    r = {**r, 'stopped_at': stopped_at(workdir, name)}
    long_by.setdefault(r['label'], {})[r['seed']] = r
  short_by = {label: {seed: s for seed in long_by.get(label, {})
                      if (s := short_result(label, seed))}
              for label in labels}
  return labels, long_by, short_by


def step_cells(runs: list[dict], converged: bool, fixed_steps: int
               ) -> list[str]:
  """A report table's 'stopped at (per seed)' and 'scored step' cells:
  each early-stopped run's stop and chosen step (its 'stopped_at' and
  'selected_step'), or the fixed budget's step count for every seed."""
  return [', '.join(str(r[key]) if converged else str(fixed_steps)
                    for r in runs)
          for key in ('stopped_at', 'selected_step')]


class Study(skeleton.Study):
  """A convergence study: --scale cpu (the CPU study) or quick, 3 seeds."""
  scales = ('cpu', 'quick')
  default_scale = 'cpu'
  default_seeds = 3

"""What a study's training budget says about its claims: every results.md
whose workdir holds finished runs ends with a "Budget" section built here
from their summaries.

A comparison of models still improving when their budget ends holds at
that budget, not necessarily at convergence (EXPERIMENTS.md's rule). So the
section names each group of runs' budget and says how many were still
improving at their last evaluation: their mean evaluation loss over the
trained lengths lower than at the evaluation before, by more than
IMPROVING. The evaluation
examples are the same at every evaluation of a run (drawn from its seed), so
the change is the model's, not the sample's.
"""

from __future__ import annotations

import math
import os
import statistics

from experiments import study
from selfattn.training import early_stopping
from selfattn.training import workdir as workdir_lib

# A fall of the loss over the last evaluation interval larger than this
# (nats per token) counts as still improving: smaller ones are what a
# converged model's rounding and a decayed learning rate leave.
IMPROVING = 1e-3
# Tasks whose in-loop evaluation is not on fresh examples (with their
# default task.eval_split='train'): what it measures.
LOOP_EVALUATES = {
    'jsb_chorales': 'the loop evaluates crops of the training pieces, so this '
                    'is the fit still improving (the study scores held-out '
                    'pieces itself)',
}


def run_summaries(workdir: str) -> dict[str, dict]:
  """name (relative to workdir) -> summary.json of every finished run under
  workdir (a run's own subfolders, checkpoints among them, not searched)."""
  return {name: workdir_lib.read_json_object(
              os.path.join(workdir, name, workdir_lib.SUMMARY_FILE),
              'a run summary')
          for name in study.finished_run_names(workdir)}


def trained_range_loss(evaluation: dict[str, dict], train_lengths) -> float | None:
  """Mean loss over the evaluated lengths inside the trained range (every
  evaluated length where none is inside it); None without a loss."""
  lo, hi = train_lengths if train_lengths else (None, None)
  inside = [m['loss'] for n, m in evaluation.items()
            if 'loss' in m and lo is not None and lo <= int(n) <= hi]
  losses = inside or [m['loss'] for m in evaluation.values() if 'loss' in m]
  return statistics.mean(losses) if losses else None


def last_change(summary: dict) -> float | None:
  """The trained-range loss at the last evaluation minus at the one before
  (None with fewer than two evaluations); nan when either is not finite."""
  losses = [trained_range_loss(h['eval'], summary.get('train_lengths'))
            for h in summary.get('history', []) if h.get('eval')]
  losses = [x for x in losses if x is not None]
  if len(losses) < 2:
    return None
  before, last = losses[-2], losses[-1]
  if not (math.isfinite(before) and math.isfinite(last)):
    return math.nan
  return last - before


def last_new_best(summary: dict) -> tuple[int, int, float] | None:
  """For an early-stopped run: (the step of the last new best of its
  early-stopping metric, the step of the best before it, how much better),
  read from its history at the length early stopping reads; None with fewer
  than two bests or without the metric in the history (translation's BLEU
  lives in the run's early_stop.json, not always here)."""
  train = summary['config']['train']
  metric = train.get('early_stop_metric', 'loss')
  lower = metric in early_stopping.LOWER_IS_BETTER
  max_len = (summary.get('train_lengths') or [0, 0])[1]
  bests: list[tuple[int, float]] = []
  for entry in summary.get('history', []):
    results = {int(n): m for n, m in entry.get('eval', {}).items()}
    if not results:
      continue
    value = results[early_stopping.monitored_length(results, max_len)].get(
        metric)
    if value is None or not math.isfinite(value):
      continue
    if not bests or (value < bests[-1][1] if lower else value > bests[-1][1]):
      bests.append((entry['step'], value))
  if len(bests) < 2:
    return None
  (before, old), (last, new) = bests[-2:]
  return last, before, abs(new - old)


def _capped_trend(summaries: list[dict], metric: str) -> str:
  """' (...)': how far the last new best of each run that ran to the cap
  moved past the one before it; '' when none says."""
  direction = 'lower' if metric in early_stopping.LOWER_IS_BETTER else 'higher'
  parts = []
  for summary in summaries:
    found = last_new_best(summary)
    if found is not None:
      last, before, gain = found
      parts.append(f'step {last:,}, {gain:.2g} {direction} than step '
                   f'{before:,}\'s')
  if not parts:
    return ''
  return f' (last new best of {metric}: {"; ".join(parts)})'


def _group_key(summary: dict) -> tuple[int, int, str, int, str]:
  train = summary['config']['train']
  patience = int(train.get('early_stop_patience', 0) or 0)
  return (int(train['num_steps']), patience,
          train.get('early_stop_metric', 'loss') if patience else '',
          int(summary['config']['eval']['every']),
          train.get('schedule', 'cosine'))


def _group_line(key: tuple[int, int, str, int, str], summaries: list[dict]
                ) -> tuple[str, int, int]:
  """(The line for one budget, how many of its runs were still improving,
  how many early-stopped ones ran to the cap unstopped.)"""
  num_steps, patience, metric, every, schedule = key
  n = len(summaries)
  runs = f'{n} run{"s" if n != 1 else ""}'
  if patience:
    stops = sorted(s['step'] for s in summaries)
    early = [x for x in stops if x < num_steps]
    line = (f'{runs} with early stopping on {metric} (patience {patience} '
            f'evaluation{"s" if patience != 1 else ""}, every {every:,} '
            f'steps, cap {num_steps:,}): ')
    if early:
      stopped = (f'{early[0]:,}' if early[0] == early[-1]
                 else f'{early[0]:,}-{early[-1]:,}')
      line += (f'{len(early)} stopped at step {stopped}, after their metric '
               f'stopped improving')
    capped = len(stops) - len(early)
    if capped:
      # Reaching the cap says only that patience was not used up there.
      line += ('; ' if early else '') + (
          f'{capped} ran to the cap without stopping, so not shown '
          f'converged') + _capped_trend(
              [run for run in summaries if run['step'] >= num_steps], metric)
    return line + '.', 0, capped
  length = ("the learning-rate schedule's length" if schedule != 'constant'
            else 'at a constant learning rate')
  head = f'{runs} of {num_steps:,} steps ({length}), evaluated every {every:,} steps'
  changes = [last_change(s) for s in summaries]
  known = [c for c in changes if c is not None and not math.isnan(c)]
  diverged = sum(1 for c in changes if c is not None and math.isnan(c))
  once = n - len(known) - diverged
  others = ([f'{once} with one evaluation recorded' if once < n
              else 'evaluated once each'] if once else []) + (
      [f'{diverged} with a loss that is not finite (diverged)']
      if diverged else [])
  if not known:
    return (f'{head}: {", ".join(others)}, so their summaries do not say '
            f'whether they were still improving at the end.', 0, 0)
  falling = sum(1 for c in known if c < -IMPROVING)
  line = (f'{head}: over the last evaluation interval the loss on the '
          f'trained lengths fell by more than {IMPROVING} nats in {falling} '
          f'of {len(known)} (change: median {statistics.median(known):+.2g} '
          f'nats, from {min(known):+.2g} to {max(known):+.2g})')
  if others:
    line += '; ' + '; '.join(others)
  notes = {LOOP_EVALUATES.get(s.get('task'))
           if s['config']['task'].get('eval_split', 'train') == 'train'
           else None for s in summaries}
  if len(notes) == 1 and None not in notes:
    line += f'; {notes.pop()}'
  return line + '.', falling, 0


def budget_section(workdir: str) -> tuple[str, str] | None:
  """("Budget", markdown) for the finished runs under workdir, one line per
  budget; None when there are none."""
  groups: dict[tuple, list[dict]] = {}
  for summary in run_summaries(workdir).values():
    if 'config' in summary:    # what a run's summary always holds
      groups.setdefault(_group_key(summary), []).append(summary)
  if not groups:
    return None
  lines, improving, capped = [], 0, 0
  for key in sorted(groups):
    line, falling, unstopped = _group_line(key, groups[key])
    lines.append(f'- {line}')
    improving += falling
    capped += unstopped
  fixed = [key for key in groups if not key[1]]
  known = any(last_change(s) is not None for key in fixed for s in groups[key])
  decayed = all(key[4] != 'constant' for key in fixed)
  closings = []
  if improving:
    bound = (' (a lower bound: the schedule had brought the learning rate '
             'down over the last interval)' if decayed else '')
    closings.append(
        f'At least {improving} of these runs '
        f'{"was" if improving == 1 else "were"} still improving when their '
        f'budget ended{bound}, so the comparisons above hold at these '
        f'budgets and may differ at convergence (EXPERIMENTS.md says where '
        f'convergence was checked).')
  elif known:
    closings.append(
        'The comparisons above hold at these budgets: a loss that had '
        'stopped falling may still fall with a longer schedule.')
  elif fixed:
    closings.append('The comparisons above hold at these budgets.')
  if capped:
    closings.append(f'{capped} early-stopped run{"s" if capped != 1 else ""} '
                    f'ran to the cap unstopped: at that cap, not shown '
                    f'converged.')
  closing = ' '.join(closings)
  return ('Budget', '\n'.join(lines) + (f'\n\n{closing}' if closing else ''))

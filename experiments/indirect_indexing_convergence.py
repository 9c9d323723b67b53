"""Does PoPE's lead over RoPE on indirect indexing hold when the models train
until a held-out loss stops improving? (EXPERIMENTS.md section 7 measured it
at 4,000 steps, with every run still improving.)

  python -m experiments.indirect_indexing_convergence \
      --workdir=experiments/results/indirect_indexing_convergence
  python -m experiments.indirect_indexing_convergence --workdir=... --quick

The section's protocol (configs/indirect_indexing.py:small, the encodings of
experiments/indirect_indexing.ENCODINGS), except the budget:
  * the cosine schedule is built for CAP_STEPS, the cap;
  * the loop evaluates every EVAL_EVERY steps, each step a kept checkpoint,
    and training stops after PATIENCE evaluations in a row without a new
    lowest target loss at length 40, the longest trained (the loop's 512
    examples per length, the same at every evaluation;
    config.train.early_stop_patience);
  * the checkpoint with the lowest of those losses is scored on 512 *fresh*
    examples per length (the evaluation keys of seed + SCORE_SEED_OFFSET,
    which no run trains or selects on), so the selection does not flatter
    its own score.
Encodings: pope (zero phase bias, the section's headline) and rope at seeds
0-2, seed-major (a study stopped part way has pairs), then none at the same
seeds (section 7 could not tell rope from no position information).

Each run is reported beside the same seed's run of the 4,000-step study
(--short_dir, its committed summary.json: the loop's last evaluation, on
the seed's own evaluation examples), paired by seed.

Sized before it ran (2026-12-02, this 2-core CPU): the 4,000-step runs
took a median 5.2 minutes, so a run costs about 1.3 minutes per 1,000
steps: up to 26 minutes at the cap, the nine runs up to 4 hours. Measured:
14-22 steps/s alone, the nine runs in 2 h 02 min (4.3-31 minutes a run;
experiments/results/timings.txt). Resumable like every study.
"""

from __future__ import annotations

import copy
import os

from absl import app
import numpy as np

from configs import indirect_indexing as ii_config
from experiments import common
from experiments import convergence
from experiments import indirect_indexing as ii_study
from experiments import skeleton
from experiments import study
from selfattn.training import workdir as workdir_lib
from selfattn.training.cli_checks import parse_flags

# The 4,000-step study, whose runs of the same seeds are the short budget
# (--short_dir replaces it).
SHORT_DIR = 'experiments/results/indirect_indexing'
SHORT_STEPS = 4_000

CAP_STEPS = 20_000
EVAL_EVERY = 1_000
PATIENCE = 3
CORE = ('pope', 'rope')
MORE = ('none',)
ENCODINGS = CORE + MORE
# The scored evaluation's examples: those of another seed's evaluation
# stream. The studies train seeds 0-4, and the evaluation stream is not the
# training stream, so these strings were neither trained on nor used to
# choose the checkpoint.
SCORE_SEED_OFFSET = 1_000
SCORE_FILE = 'scored.json'
IN_DISTRIBUTION, BEYOND = ii_study.IN_DISTRIBUTION, ii_study.BEYOND


def _ii_scale(scale: str) -> str:
  """The config scale of a convergence scale (cpu: the section's small)."""
  return 'quick' if scale == 'quick' else 'small'


def study_runs(scale: str, seeds: int, labels) -> list[study.Run]:
  """Seed-major runs of `labels` with the convergence budget."""
  base = convergence.with_budget(
      ii_config.get_config(_ii_scale(scale)), scale, cap=CAP_STEPS,
      every=EVAL_EVERY, patience=PATIENCE, metric='loss')
  return common.encoding_runs(base, seeds, labels, ii_study.ENCODINGS)


# step -> the loop's target loss at length 40 (the early-stopping record).
held_out_curve = convergence.record_curve


# The evaluated step with the lowest held-out loss (the earlier of a tie).
chosen_step = convergence.lowest_step


loop_evaluations = convergence.loop_evaluations


def score_run(run: study.Run, path: str) -> dict:
  """The run's scored.json (computed once): the chosen checkpoint's
  metrics per length on fresh examples, and the loop's at that step."""
  target = os.path.join(path, SCORE_FILE)
  if os.path.exists(target):
    return workdir_lib.read_json_object(
        target, "the run's scores; delete it to rescore")
  from selfattn.training import checkpoints
  from selfattn.training.steps import Trainer
  step = chosen_step(path)
  config = copy.deepcopy(run.config)
  config.seed = run.config.seed + SCORE_SEED_OFFSET
  trainer = Trainer(config)     # the seed only picks the evaluation strings
  params, _ = checkpoints.read_params(path, trainer.params_layout(), step)
  fresh = trainer.evaluate(params)
  result = {'selected_step': step, 'eval_seed': config.seed,
            'eval': {str(n): {k: float(v) for k, v in m.items()}
                     for n, m in fresh.items()},
            'loop_eval': loop_evaluations(path).get(step)}
  workdir_lib.write_json(target, result)
  return result


def mean_accuracy(evaluation: dict, lengths) -> float:
  """Mean target accuracy over `lengths` of an evaluation ({length: metrics},
  lengths as strings); the quick scale evaluates only some of them."""
  return float(np.mean([evaluation[str(n)]['token_accuracy'] for n in lengths
                        if str(n) in evaluation]))


def short_budget(short_dir: str, label: str, seed: int) -> dict | None:
  """The 4,000-step study's summary for (label, seed), or None."""
  return convergence.same_seed_result(short_dir, label, seed, 'summary.json',
                                      "a 4,000-step run's summary")


# The fixed start of the report's title, which grows with the encodings
# trained (the owner's mark on its workdir, skeleton.Study.title_stem).
TITLE_STEM = 'Indirect indexing to convergence: pope against rope'


def report(workdir: str, runs: list[study.Run], results: dict,
           short_dir: str) -> str:
  """results.md, results.json and the curves' plot."""
  labels, long_by, short_by = convergence.by_budget(
      workdir, runs, results, ENCODINGS,
      lambda label, seed: short_budget(short_dir, label, seed))
  short_name = f'{SHORT_STEPS:,} steps'
  budgets = ((short_name, short_by), ('to convergence', long_by))
  ranges = (('20-40', IN_DISTRIBUTION), ('44-52', BEYOND))

  def accuracy(r: dict, lengths) -> float:
    return mean_accuracy(r['eval'], lengths)

  rows = []
  for label in labels:
    for budget, by_seed in budgets:
      if not by_seed.get(label):
        continue
      rs = list(by_seed[label].values())
      converged = budget == 'to convergence'
      rows.append([
          label, budget,
          *convergence.step_cells(rs, converged, SHORT_STEPS),
          *(common.mean_std([100 * accuracy(r, lengths) for r in rs])
            for _, lengths in ranges),
          len(rs)])
  table = common.markdown_table(
      ['encoding', 'budget', 'stopped at (per seed)', 'scored step',
       'accuracy % at 20-40', 'accuracy % at 44-52', 'runs'], rows)

  lines = []
  comparisons = [(('pope',), ('rope',), 'pope minus rope')]
  if long_by.get('none'):
    comparisons.append((('rope',), ('none',), 'rope minus none'))
  for span, lengths in ranges:
    values = {budget: {label: {s: accuracy(r, lengths)
                               for s, r in by.get(label, {}).items()}
                       for label in labels}
              for budget, by in budgets}
    lines += convergence.lines_at_budgets(
        values, comparisons,
        lambda budget, name: f'lengths {span}, {budget}: {name}',
        lambda name: f'lengths {span}: {name}, to convergence minus at '
                     f'{short_name}',
        unit='points', scale=100, digits=2)
  # What choosing the checkpoint on the loop's examples would have added:
  # the chosen step's accuracy there minus on the fresh ones.
  selection = [100 * (accuracy({'eval': r['loop_eval']}, IN_DISTRIBUTION)
                      - accuracy(r, IN_DISTRIBUTION))
               for r in results.values() if r.get('loop_eval')]
  plot = os.path.join(workdir, 'loss_and_accuracy_by_step.png')
  plotted = plot_curves(workdir, results, plot)
  t = runs[0].config.train
  cap, every, patience = t.num_steps, runs[0].config.eval.every, t.early_stop_patience
  examples = runs[0].config.eval.num_examples

  body = [
      ('Protocol', f"Section 7's protocol with a longer budget: cosine "
       f'schedule built for {cap:,} steps (the cap), the loop\'s target loss '
       f'at length 40 (the longest trained; {examples} examples, the same at '
       f'every evaluation) every {every:,} steps, training stopped after '
       f'{patience} evaluation(s) in a row without a new lowest; the '
       f'checkpoint with the lowest is scored on {examples} fresh examples per '
       f'length (the evaluation strings of seed + {SCORE_SEED_OFFSET}, never '
       f'trained on nor used to choose). The {short_name} rows are the same '
       f'seeds of {short_dir}, scored on their own seed\'s evaluation '
       f'strings, so the change between budgets also holds a change of test '
       f'strings (at 5% accuracy the binomial standard error of 512 strings '
       f'is about 1 point per length). '
       f'Letter-guessing level: about 3.6% at 20-40. Intervals: 95% '
       f't-intervals across seeds, the unit of replication.'),
      ('Accuracy (mean ± std over seeds)', table),
      ('Paired by seed', '\n'.join(f'- {line}' for line in lines)),
  ]
  if selection:
    body.append(('Selection', (
        f"The chosen checkpoints' accuracy at 20-40 on the loop's examples "
        f'(which chose them, by loss at 40) minus on fresh ones: '
        f'{np.mean(selection):+.2f} points, mean over {len(selection)} '
        f'run{"s" if len(selection) != 1 else ""} '
        f'(from {min(selection):+.2f} to {max(selection):+.2f}).')))
  if plotted:
    body.append(('Loss and accuracy by step',
                 '![loss and accuracy by step](loss_and_accuracy_by_step.png)'))
  json_out = {name: {k: r[k] for k in ('label', 'seed', 'selected_step',
                                       'stopped_at', 'eval_seed')}
              | {'accuracy': {n: e['token_accuracy']
                              for n, e in r['eval'].items()},
                 'held_out_loss': {str(k): v for k, v in held_out_curve(
                     os.path.join(workdir, name)).items()}}
              for name, r in ((n, {**r, 'stopped_at': convergence.stopped_at(
                  workdir, n)}) for n, r in results.items())}
  shown = TITLE_STEM + (', and none' if long_by.get('none') else '')
  return common.write_results(workdir, shown, body, json_out, stem=TITLE_STEM)


def plot_curves(workdir: str, results: dict, path: str) -> bool:
  """Left: the loop's target loss at length 40 by step (the stop's
  measure), the scored step starred; right: the loop's accuracy at 20-40
  by step. One line per run, one colour per encoding."""
  if not results:
    return False
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
  colors = dict(zip(ENCODINGS, ('C0', 'C1', 'C2')))
  for name, r in sorted(results.items()):
    path_of_run = os.path.join(workdir, name)
    color, label = colors[r['label']], r['label'] if r['seed'] == 0 else None
    curve = held_out_curve(path_of_run)
    steps = sorted(curve)
    left.plot(steps, [curve[s] for s in steps], color=color, marker='.',
              label=label)
    best = r['selected_step']
    if best in curve:
      left.plot([best], [curve[best]], color=color, marker='*', markersize=10)
    evaluations = loop_evaluations(path_of_run)
    steps = sorted(evaluations)
    right.plot(steps, [100 * mean_accuracy(evaluations[s], IN_DISTRIBUTION)
                       for s in steps], color=color, marker='.', label=label)
  left.set_ylabel('target loss at length 40 (nats)')
  right.set_ylabel("accuracy % at 20-40 (the loop's examples)")
  for ax in (left, right):
    ax.set_xlabel('training step')
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.suptitle('Indirect indexing: one line per seed, * the scored checkpoint')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return True


class IndirectIndexingConvergence(convergence.Study):
  title_stem = TITLE_STEM

  def filter_values(self):
    return {'position': ENCODINGS}

  def runs(self, scale, seeds, context):
    # The core pair at every seed first (a sitting may stop anywhere: the
    # pairs come first), then none.
    runs = study_runs(scale, seeds, CORE)
    if scale != 'quick':
      runs += study_runs(scale, seeds, MORE)
    return runs

  def score(self, run, path, context):
    score_run(run, path)

  def results(self, runs, workdir, context, *, score_missing):
    return skeleton.scored_results(runs, workdir, SCORE_FILE, score_run,
                                   score_missing=score_missing)

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, convergence.short_dir(SHORT_DIR))


STUDY = IndirectIndexingConvergence()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

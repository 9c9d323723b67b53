"""Does the music study's relative lead hold when the models train until a
held-out loss stops improving? (EXPERIMENTS.md section 6 measured it at
1,000 steps, with every run still improving.)

  python -m experiments.music_convergence \
      --workdir=experiments/results/music_convergence
  python -m experiments.music_convergence --workdir=... --quick

The music study's first-pass protocol (configs/music.py:cpu without the
meter, experiments/music.ENCODINGS; whole-piece validation and test NLL
and samples by experiments/music.evaluate_run), except the budget:
  * the cosine schedule is built for CAP_STEPS, the cap;
  * the loop evaluates EVAL_EXAMPLES crops of the *validation* pieces
    (task.eval_split='valid', untransposed) every EVAL_EVERY steps, each
    step a kept checkpoint, and training stops after PATIENCE evaluations
    in a row without a new lowest loss (config.train.early_stop_patience);
  * the checkpoint with the lowest of those losses is scored.
Encodings: shaw and sinusoidal, the section's comparison, at seeds 0-2
(seed-major: a study stopped part way has pairs), then rope and learned at
the same seeds where the budget allows (the other relative and absolute
encoding of the section's headline).

The rows and pairings are a Design: FIRST_PASS here;
experiments/music_meter_convergence.py runs the same budget on the meter
rows.

Each run is reported beside the same seed's run of the 1,000-step study
(--short_dir, its committed music.json), paired by seed: shaw, rope and
learned each minus sinusoidal, and relative (shaw, rope) minus absolute
(sinusoidal, learned) once all four have runs.

Sized before it ran (2026-11-30, this 2-core CPU): the 1,000-step runs
trained in a median 220 s, so a run costs about 4 minutes per 1,000 steps
plus its evaluations and scoring. Measured at the first cap of 8,000
steps (2.2-3.1 steps/s beside other work): shaw stopped at 5,000 in 36
minutes, sinusoidal ran to the cap in 45; at the cap of 16,000 a run may
take 1.5 hours, the twelve runs 8-15 hours, several sittings. Resumable
like every study.

The converged checkpoint is chosen on validation crops, so the converged
validation NLL is not independent of that choice (the 1,000-step runs'
last checkpoint was not chosen): test NLL is the clean comparison.
"""

from __future__ import annotations

import dataclasses
import os

from absl import app

from configs import music as music_config
from experiments import common
from experiments import convergence
from experiments import music as music_study
from experiments import skeleton
from experiments import study
from selfattn.tasks.music import jsb
from selfattn.training.cli_checks import parse_flags

# The 1,000-step study, whose runs of the same seeds are the short budget
# (--short_dir replaces it).
SHORT_DIR = 'experiments/results/music'

# 8,000 at first: sinusoidal's seed 0 ran to it unstopped (best at 7,000),
# so not shown converged (experiments/results/music_convergence_cap8000).
CAP_STEPS = 16_000
EVAL_EVERY = 500
EVAL_EXAMPLES = 256
PATIENCE = 3
CORE = ('shaw', 'sinusoidal')
MORE = ('rope', 'learned')
ENCODINGS = CORE + MORE
RELATIVE, ABSOLUTE = ('shaw', 'rope'), ('sinusoidal', 'learned')

# The fixed start of the report's title, which grows with the encodings
# trained (the owner's mark on its workdir, skeleton.Study.title_stem).
TITLE_STEM = 'Music to convergence: shaw against sinusoidal'


@dataclasses.dataclass(frozen=True)
class Design:
  """Which of the music study's rows a convergence study trains, and what
  its report pairs (every pairing by seed).

  core: (encoding, baseline), trained first at every seed; more: further
  encodings, each paired with the baseline once it has early-stopped runs;
  groups: (group a, group b, name), paired once every label of the design
  has runs; core, more and groups are paired at both budgets.
  without_dir: a workdir whose early-stopped runs of the same position
  without the meter and bar-aligned crops (the first pass) each row's
  early-stopped run is paired with, seed by seed; None pairs nothing
  outside the study.
  """
  title_stem: str
  core: tuple[str, str]
  more: tuple[str, ...] = ()
  groups: tuple[tuple[str, ...], tuple[str, ...], str] | None = None
  without_dir: str | None = None
  # The Protocol section's first words: which rows, under the budget below.
  rows: str = "The music study's first-pass protocol"

  @property
  def labels(self) -> tuple[str, ...]:
    return self.core + self.more


FIRST_PASS = Design(
    TITLE_STEM, CORE, MORE,
    (RELATIVE, ABSOLUTE, 'mean of shaw, rope minus mean of sinusoidal, '
                         'learned'))


def study_runs(scale: str, seeds: int, labels) -> list[study.Run]:
  """Seed-major runs of `labels` with the convergence budget."""
  base = convergence.with_budget(
      music_config.get_config(scale), scale, cap=CAP_STEPS, every=EVAL_EVERY,
      patience=PATIENCE, metric='loss')
  base.task.eval_split = 'valid'
  if scale != 'quick':
    base.eval.num_examples = EVAL_EXAMPLES
  return common.encoding_runs(base, seeds, labels, music_study.ENCODINGS)


# step -> the loop's loss on validation crops (the early-stopping record).
held_out_curve = convergence.record_curve


# The evaluated step with the lowest validation-crop loss (the earlier of a
# tie).
chosen_step = convergence.lowest_step


def short_budget(short_dir: str, label: str, seed: int) -> dict | None:
  """The 1,000-step study's music.json for (label, seed), or None."""
  return convergence.same_seed_result(short_dir, label, seed, 'music.json',
                                      "a 1,000-step run's scores")


def report(workdir: str, runs: list[study.Run], results: dict,
           short_dir: str, design: Design = FIRST_PASS) -> str:
  """results.md, results.json and the curves' plot."""
  labels, long_by, short_by = convergence.by_budget(
      workdir, runs, results, design.labels,
      lambda label, seed: short_budget(short_dir, label, seed))
  budgets = (('1,000 steps', short_by), ('to convergence', long_by))

  rows = []
  for label in labels:
    for budget, by_seed in budgets:
      if not by_seed.get(label):
        continue
      rs = list(by_seed[label].values())
      converged = budget == 'to convergence'
      rows.append([
          label, budget,
          *convergence.step_cells(rs, converged, 1000),
          common.mean_std([r['valid_nll'] for r in rs]),
          common.mean_std([r['test_nll'] for r in rs]), len(rs)])
  table = common.markdown_table(
      ['encoding', 'budget', 'stopped at (per seed)', 'scored step',
       'valid NLL (nats/token)', 'test NLL', 'runs'], rows)

  lines = []
  for split in ('valid', 'test'):
    values = {budget: {label: {s: r[f'{split}_nll']
                               for s, r in by.get(label, {}).items()}
                       for label in labels}
              for budget, by in budgets}
    first, baseline = design.core
    comparisons = [((first,), (baseline,), f'{first} minus {baseline}')]
    # Each further encoding against the chapter's baseline, seed by seed, as
    # soon as it has converged runs: rope is relative but not Shaw, so the
    # group line below could hide it behind shaw.
    comparisons += [((label,), (baseline,), f'{label} minus {baseline}')
                    for label in design.more if long_by.get(label)]
    if design.groups and all(long_by.get(label) for label in design.labels):
      comparisons.append(design.groups)
    lines += convergence.lines_at_budgets(
        values, comparisons,
        lambda budget, name: f'{split} NLL, {budget}: {name}',
        lambda name: f'{split} NLL: {name}, to convergence minus at 1,000 '
                     f'steps',
        unit='nats')
  if design.without_dir:
    lines += without_meter_lines(design, long_by)
  plot = os.path.join(workdir, 'valid_loss_by_step.png')
  plotted = plot_curves(workdir, results, plot, design.labels)
  # The budget as the runs were configured (--quick shrinks it).
  t = runs[0].config.train
  cap, every, patience = t.num_steps, runs[0].config.eval.every, t.early_stop_patience
  examples = runs[0].config.eval.num_examples

  body = [
      ('Protocol', f'{design.rows} with a longer budget: cosine schedule '
       f'built for {cap:,} steps (the cap), '
       f'the loop\'s loss on {examples} crops of the validation pieces '
       f'every {every:,} steps, training stopped after {patience} '
       f'evaluation(s) in a row without a new lowest; the checkpoint with the '
       f'lowest is scored on whole validation and test pieces (NLL per '
       f'token, experiments/music.evaluate_run); chosen on validation crops, '
       f'the converged validation NLL is not independent of the choice, so '
       f'test NLL is the clean comparison. The 1,000-step rows are the '
       f'same seeds of {short_dir}. Negative differences favour the first '
       f'encoding (lower NLL). Intervals: 95% t-intervals across seeds, the '
       f'unit of replication.'
       + (f' The first-pass rows paired with them are the early-stopped '
          f'runs of the same seeds in {design.without_dir}.'
          if design.without_dir else '')),
      ('Scores (mean ± std over seeds)', table),
      ('Paired by seed', '\n'.join(f'- {line}' for line in lines)),
  ]
  if plotted:
    body.append(('Validation-crop loss by step',
                 '![validation-crop loss by step](valid_loss_by_step.png)'))
  json_out = {name: {k: r[k] for k in ('label', 'seed', 'selected_step',
                                       'valid_nll', 'test_nll')}
              | {'stopped_at': convergence.stopped_at(workdir, name),
                 'valid_crop_loss': {str(k): v for k, v in held_out_curve(
                     os.path.join(workdir, name)).items()}}
              for name, r in results.items()}
  title = design.title_stem
  shown = title + (', and ' + ' and '.join(design.more)
                   if any(long_by.get(label) for label in design.more) else '')
  return common.write_results(workdir, shown, body, json_out, stem=title)


def without_meter_lines(design: Design, long_by: dict) -> list[str]:
  """Each row's early-stopped run minus the same position's early-stopped
  first-pass run of the same seed (design.without_dir), then the first
  encoding's change minus the baseline's, on validation and test NLL.
  "Early-stopped", not "converged": a run that reached the cap is not
  shown converged (the Budget section names them)."""
  lines = []
  for split in ('valid', 'test'):
    values, change = {}, {}
    for label in design.labels:
      position = music_study.ENCODINGS[label][0]
      before_label = f'{position} (first pass)'
      values[label] = {s: r[f'{split}_nll']
                       for s, r in long_by.get(label, {}).items()}
      values[before_label] = {
          s: before[f'{split}_nll'] for s in values[label]
          if (before := convergence.same_seed_result(
              design.without_dir, position, s, 'music.json',
              "an early-stopped first-pass run's scores"))}
      change[label] = {s: v - values[before_label][s]
                       for s, v in values[label].items()
                       if s in values[before_label]}
      lines.append(common.paired_by_seed(
          values, (label,), (before_label,),
          f'{split} NLL, both early-stopped: {label} minus {position} '
          f'without bar-aligned crops or the meter ({design.without_dir})',
          unit='nats'))
    first, baseline = design.core
    lines.append(common.paired_by_seed(
        change, (first,), (baseline,),
        f'{split} NLL, both early-stopped: {first}\'s change from its first '
        f'pass minus {baseline}\'s (negative: the meter and bar-aligned '
        f'crops help {first} more)', unit='nats'))
  return lines


def plot_curves(workdir: str, results: dict, path: str,
                labels=ENCODINGS) -> bool:
  """The loop's validation-crop loss by step, one line per run, one colour
  per encoding, the scored step marked."""
  if not results:
    return False
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4.2))
  colors = {label: f'C{i}' for i, label in enumerate(labels)}
  for name, r in sorted(results.items()):
    curve = held_out_curve(os.path.join(workdir, name))
    steps = sorted(curve)
    ax.plot(steps, [curve[s] for s in steps], color=colors[r['label']],
            marker='.', label=r['label'] if r['seed'] == 0 else None)
    best = r['selected_step']
    if best in curve:
      ax.plot([best], [curve[best]], color=colors[r['label']], marker='*',
              markersize=10)
  ax.set_xlabel('training step')
  ax.set_ylabel('loss on validation crops (nats/token)')
  ax.set_title('JSB Chorales: one line per seed, * the scored checkpoint')
  ax.grid(alpha=0.3)
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


class MusicConvergence(convergence.Study):

  def __init__(self, design: Design = FIRST_PASS):
    self.design = design
    self.title_stem = design.title_stem

  def filter_values(self):
    return {'position': self.design.labels}

  def prepare(self, scale):
    try:
      return {'data': jsb.load()}
    except jsb.DataError as e:
      raise skeleton.StudyError(str(e)) from None

  def runs(self, scale, seeds, context):
    # The core pair at every seed first (a sitting may stop anywhere: the
    # pairs come first), then the design's others.
    runs = study_runs(scale, seeds, self.design.core)
    if scale != 'quick':
      runs += study_runs(scale, seeds, self.design.more)
    return runs

  def _evaluate(self, run, path, context):
    return music_study.evaluate_run(run, path, context['data'],
                                    step=chosen_step(path))

  def score(self, run, path, context):
    self._evaluate(run, path, context)

  def results(self, runs, workdir, context, *, score_missing):
    return skeleton.scored_results(
        runs, workdir, 'music.json',
        lambda run, path: self._evaluate(run, path, context),
        score_missing=score_missing)

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, convergence.short_dir(SHORT_DIR),
                  self.design)


STUDY = MusicConvergence()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

"""Issue 49's convergence check: does the relative lead in translation hold
when the models train until validation BLEU stops improving?

  python -m experiments.translation_convergence \
      --workdir=experiments/results/translation_convergence
  python -m experiments.translation_convergence --workdir=... --quick

The translation study's protocol (configs/translation.py:cpu: model, data,
optimiser, label smoothing; checkpoint chosen by greedy validation BLEU; beam
search on every test set, scored by experiments/translation.evaluate_run),
except the budget:
  * the cosine schedule is built for CAP_STEPS, the cap;
  * greedy validation BLEU is computed every EVAL_EVERY steps, each step a
    kept checkpoint, and training stops after PATIENCE evaluations in a row
    without a new best (config.train.early_stop_patience).
Encodings: shaw and sinusoidal, the study's comparison, at seeds 0-2
(seed-major: a study stopped part way has pairs), then rope at the same
seeds where the budget allows; then the `+short` tier (sinusoidal, shaw and
rope trained only on pairs whose source has at most SHORT_MAX_LEN tokens,
seed-major): does the relative lead beyond the trained lengths hold at
convergence? Its runs keep this study's eval.lengths ([64]) where the
3,000-step +short runs split the loop's evaluation at 18 too: the loop's
TensorBoard curves differ, not the scores (the checkpoint is chosen by
whole-validation greedy BLEU in both, and evaluate_run splits the test
sets by source length).

Each run is reported beside the same seed's run of the 3,000-step study
(--short_dir, its committed translation.json), paired by seed.

Sized before it ran (2026-11-27, this 2-core CPU): the 3,000-step runs
trained at 3.4-3.5 steps/s, so a run costs about 5 minutes per 1,000 steps
plus about 30 s per evaluation: 1.1 h if it stops at 12,000 steps, 1.8 h
at the cap; the six core runs, 7 to 11 hours, more than one sitting; then
rope's three and the +short tier's nine (added 2026-11-30, 10-20 hours at
the rates the first tiers met): 18 runs in all. Resumable like
every study: rerunning the command resumes the unfinished run from its last
checkpoint and its early-stopping record.
"""

from __future__ import annotations

import os

from absl import app
import numpy as np

from configs import translation as translation_config
from experiments import common
from experiments import convergence
from experiments import skeleton
from experiments import study
from experiments import translation as translation_study
from selfattn.training.cli_checks import parse_flags

# The 3,000-step study, whose runs of the same seeds are the short budget
# (--short_dir replaces it).
SHORT_DIR = 'experiments/results/translation'
# The two budgets' names in the report, the short one first.
BUDGETS = ('3,000 steps', 'to convergence')

CAP_STEPS = 20_000
EVAL_EVERY = 1_000
PATIENCE = 2
ENCODINGS = ('shaw', 'sinusoidal', 'rope')
CORE = ('shaw', 'sinusoidal')
# The length-generalization tier (the 3,000-step study's `+short` runs),
# sinusoidal first: every seed's relative runs are compared with it.
SHORT_LABELS = ('sinusoidal +short', 'shaw +short', 'rope +short')
SHORT_RELATIVE = ('shaw +short', 'rope +short')
LABELS = ENCODINGS + SHORT_LABELS
SHORT_MAX_LEN = translation_study.SHORT_MAX_LEN
MAIN_TEST = translation_study.MAIN_TEST


def study_runs(scale: str, seeds: int, labels) -> list[study.Run]:
  """Seed-major runs of `labels` with the convergence budget."""
  base = convergence.with_budget(
      translation_config.get_config(scale), scale, cap=CAP_STEPS,
      every=EVAL_EVERY, patience=PATIENCE, metric='bleu')
  return common.encoding_runs(base, seeds, labels,
                              translation_study.ENCODINGS)


# step -> greedy validation BLEU of a convergence run (its early-stopping
# record).
greedy_curve = convergence.record_curve


def short_budget(short_dir: str, label: str, seed: int) -> dict | None:
  """The 3,000-step study's translation.json for (label, seed), or None."""
  return convergence.same_seed_result(short_dir, label, seed,
                                      translation_study.RESULT_FILE,
                                      "a 3,000-step run's scores")


# The fixed start of the report's title, which grows with the encodings
# trained (the owner's mark on its workdir, skeleton.Study.title_stem).
TITLE_STEM = 'Translation to convergence: shaw against sinusoidal'


def report(workdir: str, runs: list[study.Run], results: dict,
           short_dir: str) -> str:
  """results.md, results.json and the curves' plot."""
  labels, long_by, short_by = convergence.by_budget(
      workdir, runs, results, LABELS,
      lambda label, seed: short_budget(short_dir, label, seed))

  def score(r, split=MAIN_TEST):
    return r['splits'][split]['bleu']

  rows = []
  for label in labels:
    for budget, by_seed in zip(BUDGETS, (short_by.get(label, {}),
                                         long_by.get(label, {}))):
      if not by_seed:
        continue
      rs = list(by_seed.values())
      stopped = ([r['stopped_at'] for r in rs] if 'stopped_at' in rs[0]
                 else [3000] * len(rs))
      rows.append([label, budget, ', '.join(map(str, stopped)),
                   ', '.join(str(r['selected_step']) for r in rs),
                   translation_study._cell([score(r, 'val') for r in rs]),
                   translation_study._cell([score(r) for r in rs]), len(rs)])
  table = common.markdown_table(
      ['encoding', 'budget', 'stopped at (per seed)', 'chosen step',
       'val BLEU (beam)', f'{MAIN_TEST} BLEU (beam)', 'runs'], rows)

  lines = []
  for split in ('val', MAIN_TEST):
    values = {budget: {label: {s: score(r, split)
                               for s, r in by.get(label, {}).items()}
                       for label in CORE}
              for budget, by in zip(BUDGETS, (short_by, long_by))}
    lines += convergence.lines_at_budgets(
        values, [(('shaw',), ('sinusoidal',), 'shaw minus sinusoidal')],
        lambda budget, name: f'{split}, {budget}: {name}',
        lambda name: f'{split}: the lead to convergence minus the lead at '
                     f'3,000 steps',
        unit='BLEU', digits=2)
  # RoPE, the driver's last tier: against each core encoding, paired by
  # seed, where it has runs (position in the attention weights only, as the
  # intervention of EXPERIMENTS.md section 8 asks about).
  rope_lines = []
  if long_by.get('rope'):
    for split in ('val', MAIN_TEST):
      for budget, by in zip(BUDGETS, (short_by, long_by)):
        values = {label: {s: score(r, split)
                          for s, r in by.get(label, {}).items()}
                  for label in labels}
        for other in CORE:
          rope_lines.append(common.paired_by_seed(
              values, ('rope',), (other,),
              f'{split}, {budget}: rope minus {other}', unit='BLEU',
              digits=2))
  length_lines = short_tier_lines(long_by, short_by)
  other_split_lines = short_tier_other_splits(long_by, short_by)
  plot = os.path.join(workdir, 'bleu_by_step.png')
  plotted = plot_curves(workdir, results, short_by, labels, plot)
  by_length = short_length_curves(long_by, short_by)
  length_table = short_length_table(by_length)
  length_plotted = plot_short_by_length(
      by_length, os.path.join(workdir, 'bleu_by_length_short.png'))

  body = [
      ('Protocol', f'The translation study\'s protocol with a longer budget: '
       f'cosine schedule built for {CAP_STEPS:,} steps (the cap), greedy '
       f'validation BLEU every {EVAL_EVERY:,} steps, training stopped after '
       f'{PATIENCE} evaluations in a row without a new best; the checkpoint '
       f'with the best greedy validation BLEU is scored by beam search '
       f'(size {translation_study.BEAM_SIZE}, alpha '
       f'{translation_study.ALPHA}). The 3,000-step rows are the same seeds '
       f'of {short_dir} (trained on the stack its summaries record; the '
       f'convergence runs record theirs). Intervals: 95% t-intervals across '
       f'seeds, the unit of replication.'),
      ('Scores (mean ± std over seeds)', table),
      ('Shaw minus sinusoidal, paired by seed', '\n'.join(
          f'- {line}' for line in lines)),
  ]
  if rope_lines:
    body.append(('RoPE against each, paired by seed', '\n'.join(
        f'- {line}' for line in rope_lines)))
  if length_lines:
    body.append((f'Beyond the trained lengths (+short: trained on sources of '
                 f'at most {SHORT_MAX_LEN} tokens), paired by seed',
                 '\n'.join(f'- {line}' for line in length_lines)))
  if other_split_lines:
    body.append((f'Beyond the trained lengths on the other splits (+short, '
                 f'sources longer than {SHORT_MAX_LEN} tokens), paired by '
                 f'seed', '\n'.join(f'- {line}' for line in other_split_lines)))
  if length_table:
    body.append((f'+short: {MAIN_TEST} BLEU by source length at both '
                 f'budgets (mean over the seeds converged so far)',
                 length_table + ('\n\n![+short BLEU by source length]'
                                 '(bleu_by_length_short.png)'
                                 if length_plotted else '')))
  if plotted:
    body.append(('Validation BLEU by step',
                 '![greedy validation BLEU by step](bleu_by_step.png)'))
  json_out = {name: {k: r[k] for k in ('label', 'seed', 'selected_step')}
              | {'stopped_at': convergence.stopped_at(workdir, name),
                 'greedy_valid_bleu': {str(k): v for k, v in
                                       greedy_curve(os.path.join(workdir, name)).items()},
                 'bleu': {s: r['splits'][s]['bleu'] for s in r['splits']}}
              for name, r in results.items()}
  title = title_shown = TITLE_STEM
  if long_by.get('rope'):
    title_shown = title + ', and rope'
  if any(long_by.get(label) for label in SHORT_LABELS):
    title_shown += '; and the +short tier'
  return common.write_results(workdir, title_shown, body, json_out,
                              stem=title)


def short_tier_lines(long_by: dict, short_by: dict) -> list[str]:
  """The `+short` tier's comparisons on MAIN_TEST, at each budget and the
  change between them, paired by seed: on the sources longer than
  SHORT_MAX_LEN (never trained), on the others, and the difference of the
  two (does the relative lead grow beyond the trained lengths?). Empty
  without a converged +short run."""
  if not any(long_by.get(label) for label in SHORT_LABELS):
    return []
  part = lambda r, where: r['splits'][MAIN_TEST][where]['bleu']
  values = {}      # (budget, group) -> label -> seed -> BLEU
  for budget, by in zip(BUDGETS, (short_by, long_by)):
    for group in ('long_sources', 'short_sources'):
      values[budget, group] = {
          label: {s: part(r, group) for s, r in by.get(label, {}).items()}
          for label in SHORT_LABELS}
    values[budget, 'gap'] = {
        label: {s: v - values[budget, 'short_sources'][label][s]
                for s, v in values[budget, 'long_sources'][label].items()}
        for label in SHORT_LABELS}
  where = {'long_sources': f'sources longer than {SHORT_MAX_LEN} tokens '
                           f'(never trained)',
           'short_sources': f'sources of at most {SHORT_MAX_LEN} tokens',
           'gap': 'long minus short sources (the lead\'s growth beyond the '
                  'trained lengths)'}
  sinusoidal = ('sinusoidal +short',)
  groups = [(SHORT_RELATIVE, 'mean of shaw, rope')] + [
      ((label,), label.split()[0]) for label in SHORT_RELATIVE]
  lines = []
  for group, kind in where.items():
    lines += convergence.lines_at_budgets(
        {budget: values[budget, group] for budget in BUDGETS},
        [(members, sinusoidal, name) for members, name in groups],
        lambda budget, name: f'{MAIN_TEST} {kind}, {budget}: {name} minus '
                             f'sinusoidal',
        lambda name: f"{MAIN_TEST} {kind}: {name}'s lead to convergence "
                     f'minus at 3,000 steps',
        unit='BLEU', digits=2)
  if all(line.endswith(common.NO_PAIRS) for line in lines):
    # One line, not 27 that each say the same (a tier part way through).
    done = sum(len(long_by.get(label, {})) for label in SHORT_LABELS)
    return [f'No pair yet: each comparison needs two seeds with every '
            f'+short encoding finished at both budgets ({done} converged '
            f'+short run{"s" if done != 1 else ""} so far).']
  return lines


def short_tier_other_splits(long_by: dict, short_by: dict) -> list[str]:
  """Each relative `+short` encoding minus sinusoidal `+short` on the
  sources longer than SHORT_MAX_LEN of every split but MAIN_TEST (which
  short_tier_lines covers), at each budget and the change between them,
  paired by seed: does the lead beyond the trained lengths hold on the
  validation set and the other test sets? Empty until two seeds pair."""
  runs = [r for by in (long_by, short_by) for label in SHORT_LABELS
          for r in by.get(label, {}).values()]
  splits = [split for split in dict.fromkeys(
      s for r in runs for s in r['splits'])
            if split != MAIN_TEST and all(
                'long_sources' in r['splits'].get(split, {}) for r in runs)]
  lines = []
  for split in splits:
    values = {budget: {label: {s: r['splits'][split]['long_sources']['bleu']
                               for s, r in by.get(label, {}).items()}
                       for label in SHORT_LABELS}
              for budget, by in zip(BUDGETS, (short_by, long_by))}
    lines += convergence.lines_at_budgets(
        values, [((label,), ('sinusoidal +short',), label.split()[0])
                 for label in SHORT_RELATIVE],
        lambda budget, name: f'{split}, {budget}: {name} minus sinusoidal',
        lambda name: f"{split}: {name}'s lead to convergence minus at 3,000 "
                     f'steps',
        unit='BLEU', digits=2)
  if all(line.endswith(common.NO_PAIRS) for line in lines):
    return []
  return lines


def short_length_curves(long_by: dict, short_by: dict
                        ) -> dict[tuple[str, str], np.ndarray]:
  """(+short label, budget) -> seeds x LENGTH_BINS array of MAIN_TEST beam
  BLEU, for the seeds with a converged run and a 3,000-step run (the same
  seeds at both budgets, so the two lines differ by the budget alone; NaN
  where a bin is missing, and no label whose runs at a budget have no
  bin). Empty without such a seed."""
  bins = translation_study.BIN_LABELS
  row = lambda r: [r['splits'][MAIN_TEST].get('by_length', {}).get(
      b, {}).get('bleu', np.nan) for b in bins]
  curves = {}
  for label in SHORT_LABELS:
    seeds = sorted(set(long_by.get(label, {})) & set(short_by.get(label, {})))
    if not seeds:
      continue
    pair = [np.array([row(by[label][s]) for s in seeds], dtype=float)
            for by in (short_by, long_by)]
    if all(np.isfinite(values).any() for values in pair):
      curves |= dict(zip(((label, budget) for budget in BUDGETS), pair))
  return curves


def short_length_table(curves: dict) -> str:
  """The curves' means as a markdown table, one row per (label, budget):
  the numbers behind plot_short_by_length. Empty without curves."""
  if not curves:
    return ''
  bins = translation_study.BIN_LABELS
  rows = [[label, budget, len(values)]
          + [f'{m:.2f}' if np.isfinite(m) else '' for m in values.mean(0)]
          for (label, budget), values in curves.items()]
  return common.markdown_table(
      ['encoding', 'budget', 'seeds']
      + [f'{b}{" (never trained)" if lo >= SHORT_MAX_LEN else ""}'
         for b, (lo, _) in zip(bins, translation_study.LENGTH_BINS)], rows)


def plot_short_by_length(curves: dict, path: str) -> bool:
  """The +short tier's MAIN_TEST BLEU by source length: per encoding the
  converged runs (solid) and the same seeds' 3,000-step runs (dashed),
  mean over seeds with a min-max band, and a line where training lengths
  end. False (and no file) without curves."""
  if not curves:
    return False
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  bins = translation_study.BIN_LABELS
  x = np.arange(len(bins))
  colors = dict(zip(SHORT_LABELS, ('C1', 'C0', 'C2')))
  fig, ax = plt.subplots(figsize=(7, 4.2))
  for (label, budget), values in curves.items():
    common.band(ax, x, values, color=colors[label],
                label=f'{label}, {budget} ({len(values)} seed'
                      f'{"s" if len(values) != 1 else ""})',
                linestyle='-' if budget == BUDGETS[1] else '--', marker='.')
  # Between the last bin the +short runs trained on and the first they never saw.
  edge = sum(hi <= SHORT_MAX_LEN for _, hi in translation_study.LENGTH_BINS)
  ax.axvline(edge - 0.5, color='grey', linestyle=':', linewidth=1)
  ax.text(edge - 0.45, ax.get_ylim()[1], f' longer than {SHORT_MAX_LEN}: '
          f'never trained', va='top', fontsize=7, color='grey')
  ax.set_xticks(x, bins)
  ax.set_xlabel('source length (SentencePiece tokens)')
  ax.set_ylabel(f'BLEU ({MAIN_TEST}, beam {translation_study.BEAM_SIZE})')
  ax.set_title(f'Multi30k de-en, +short (trained on sources of at most '
               f'{SHORT_MAX_LEN} tokens): both budgets, same seeds',
               fontsize=9)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_curves(workdir: str, results: dict, short_by: dict, labels,
                path: str) -> bool:
  """Greedy validation BLEU by step: each convergence run (solid) and the
  same seeds' 3,000-step runs (dashed), one colour per encoding; the
  `+short` tier, where it has runs, in a second panel."""
  if not results:
    return False
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  tiers = [('all pairs', [l for l in labels if l in ENCODINGS])]
  if any(l in SHORT_LABELS for l in labels):
    tiers.append((f'+short: sources of at most {SHORT_MAX_LEN} tokens',
                  [l for l in labels if l in SHORT_LABELS]))
  tiers = [(title, tier) for title, tier in tiers if tier]
  fig, axes = plt.subplots(1, len(tiers), figsize=(7 * len(tiers), 4.2),
                           squeeze=False, sharey=True)
  colors = dict(zip(ENCODINGS, ('C0', 'C1', 'C2')))
  for ax, (title, tier) in zip(axes[0], tiers):
    for name, r in sorted(results.items()):
      if r['label'] not in tier:
        continue
      curve = greedy_curve(os.path.join(workdir, name))
      steps = sorted(curve)
      label = r['label'] if r['seed'] == 0 else None
      ax.plot(steps, [curve[s] for s in steps],
              color=colors[r['label'].split()[0]], marker='.',
              label=label and f'{label}, to convergence')
    for label in tier:
      for seed, s in sorted(short_by.get(label, {}).items()):
        curve = {int(k): v for k, v in s['valid_bleu_greedy_by_step'].items()}
        steps = sorted(curve)
        ax.plot(steps, [curve[k] for k in steps],
                color=colors[label.split()[0]], linestyle='--',
                label=f'{label}, 3,000 steps' if seed == 0 else None)
    ax.set_xlabel('training step')
    ax.set_title(f'Multi30k de-en, {title}: one line per seed', fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  axes[0][0].set_ylabel('greedy validation BLEU')
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


class Convergence(convergence.Study):
  title_stem = TITLE_STEM

  def filter_values(self):
    return {'position': LABELS}

  def runs(self, scale, seeds, context):
    # The core pair at every seed first; rope after it, then the +short
    # tier, where the budget allows (a sitting may stop anywhere: the pairs
    # come first).
    runs = study_runs(scale, seeds, CORE)
    if scale != 'quick':
      runs += study_runs(scale, seeds, ('rope',))
      runs += study_runs(scale, seeds, SHORT_LABELS)
    return runs

  def score(self, run, path, context):
    translation_study.evaluate_run(run, path, greedy_curve(path))

  def results(self, runs, workdir, context, *, score_missing):
    return skeleton.scored_results(
        runs, workdir, translation_study.RESULT_FILE,
        lambda run, path: translation_study.evaluate_run(
            run, path, greedy_curve(path)),
        score_missing=score_missing)

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, convergence.short_dir(SHORT_DIR))


STUDY = Convergence()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

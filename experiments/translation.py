"""Exercise 3 for machine translation: Multi30k German-English, every
encoding, beside the simple floors.

  python -m experiments.translation --workdir=experiments/results/translation
  python -m experiments.translation --workdir=... --quick    # a few minutes

Two protocols, each encoding at the study's seeds (configs/translation.py's
model and training):
  all     every training pair (sources up to 55 tokens);
  +short  only training pairs whose source has at most SHORT_MAX_LEN tokens,
          chosen so that about a fifth of test_2016_flickr (20.1%) is longer
          than anything trained (76% of the training pairs remain).

Each run is scored once, into its translation.json:
  * checkpoint choice: greedy BLEU on the validation split at every kept
    checkpoint (logged to the run's TensorBoard as valid/bleu_checkpoint);
    the best one is used, so validation BLEU chooses and the test sets
    tune nothing;
  * beam search (BEAM_SIZE, GNMT length penalty ALPHA) on the validation
    split and every test set: sacreBLEU BLEU and chrF (detokenized, cased,
    signature printed), and BLEU by source length (LENGTH_BINS, tokens);
  * the detokenized translations, one line per sentence in the test set's
    order, in the run's translations/<split>.en, so that anyone can
    recompute a score with `sacrebleu REF -i translations/<split>.en`.
The driver also computes the floors (experiments/translation_baselines.py).
Resumable like every study: finished runs are not retrained, nor rescored
unless an older beam search (BEAM_SEARCH) scored them.
"""

from __future__ import annotations

import os
import statistics
from typing import Any

import ml_collections
import numpy as np
from absl import app

from configs import translation as translation_config
from experiments import common
from experiments import skeleton
from experiments import study
from experiments import translation_baselines
from selfattn.tasks.translation import bleu
from selfattn.training import checkpoints
from selfattn.tasks.translation import multi30k
from selfattn.training import workdir as workdir_lib
from selfattn.errors import DataError
from selfattn.training.cli_checks import parse_flags

SHORT_MAX_LEN = 18
SHORT = {'max_len': SHORT_MAX_LEN}
# The study's plan, in the order it trains: tier by tier, seed-major within
# a tier, so that a study stopped anywhere has the most useful runs. Sized to
# the budget of about 8 idle hours of a 2-core CPU at about 16.5
# minutes a run (training 15, scoring 1.5):
#   core    the chapter's encodings and Shaw et al.'s comparison, 5 seeds
#           (20 runs, about 5.5 h);
#   +short  length generalization, Shaw's comparison plus rope, 3 seeds
#           (9 runs, about 2.5 h);
#   extras  one look each at no encoding, t5 and alibi (3 runs, about 50
#           min, past the budget): a single run is an anecdote, and the
#           report says so by giving no interval for it;
#   later relative  xl and pope, 3 seeds (6 runs, about 1.7 h, past the
#           budget; added in later sittings): enough for an interval
#           against shaw and rope, the relative encodings they compete with.
#   shaw keys  Shaw's key term without its value term, 3 seeds (issue 49's
#           test of why some encodings loop; 3 runs, about 50 min).
# --seeds=N caps every tier at N seeds.
TIERS: tuple[tuple[tuple[str, ...], int], ...] = (
    (('sinusoidal', 'learned', 'shaw', 'rope'), 5),
    (('sinusoidal +short', 'shaw +short', 'rope +short'), 3),
    (('none', 't5', 'alibi'), 1),
    (('xl', 'pope'), 3),
    (('shaw keys',), 3),
)
# Labels whose model options differ from their encoding's defaults.
MODEL_OPTIONS: dict[str, dict] = {
    # Issue 49's intervention on the looping hypothesis (EXPERIMENTS.md
    # section 8, its prediction written before the runs): Shaw's offsets in
    # the attention weights only, no relative value term.
    'shaw keys': {'relative_values': False},
}
ENCODINGS: dict[str, tuple[str, dict, dict]] = {
    label: (label.split()[0], MODEL_OPTIONS.get(label, {}),
            SHORT if label.endswith('+short') else {})
    for labels, _ in TIERS for label in labels}
QUICK_ENCODINGS = ('sinusoidal', 'shaw +short')
ABSOLUTE = ('sinusoidal', 'learned')
RELATIVE = ('shaw', 'rope')
# The later relative encodings, each against the core encoding nearest to
# it: Transformer-XL's offset terms (sinusoids of the offset through a
# learned projection) against Shaw's learned offset embeddings; PoPE (a
# rotary variant) against RoPE, as its paper compares.
PEERS = (('xl', 'shaw'), ('pope', 'rope'))
BEAM_SIZE, ALPHA = 4, 0.6
# Which beam search scored a run (translation.json's 'beam_search'). Runs
# scored before 2026-11-26 13:00 UTC have none: their search let finished
# hypotheses take live ones' places, which favours short outputs. The
# study rescores them (the checkpoint choice, by greedy BLEU, is kept).
BEAM_SEARCH = 'finished-apart'
# Source-length bins (tokens): (lo, hi]; SHORT_MAX_LEN is a boundary.
LENGTH_BINS = ((0, 10), (10, 14), (14, SHORT_MAX_LEN), (SHORT_MAX_LEN, 22),
               (22, 64))
MAIN_TEST = 'test_2016_flickr'
RESULT_FILE = 'translation.json'


def study_runs(scale: str, seeds: int, labels) -> list[study.Run]:
  """The runs of `labels` (in TIERS order), each tier at min(its seeds,
  seeds) seeds."""
  base = translation_config.get_config(scale)
  # Validation BLEU at every checkpoint comes from the scoring below, so
  # the training loop evaluates only at its end.
  base.eval.every = base.train.num_steps
  runs = []
  for tier, tier_seeds in TIERS:
    chosen = [label for label in tier if label in labels]
    runs += common.encoding_runs(base, min(seeds, tier_seeds), chosen,
                                 ENCODINGS)
  for run in runs:
    if run.config.task.max_len < base.task.max_len:
      run.config.eval.lengths = [run.config.task.max_len, base.task.max_len]
  return runs


def bin_label(lo: int, hi: int) -> str:
  return f'{lo + 1}-{hi}'


# The by_length keys of a run's scores, in LENGTH_BINS' order.
BIN_LABELS = tuple(bin_label(lo, hi) for lo, hi in LENGTH_BINS)


def write_lines(path: str, lines: list[str]) -> None:
  """Writes one sentence a line, atomically (read back by
  read_translations). A line break inside a translation (possible only
  through byte fallback) would shift every later line: it becomes a
  space."""
  text = ''.join(line.replace('\n', ' ').replace('\r', ' ') + '\n'
                 for line in lines)
  temp = f'{path}.tmp-{os.getpid()}'
  with open(temp, 'w', encoding='utf-8') as f:
    f.write(text)
  os.replace(temp, path)


def scores_by_length(hyps: list[str], references: list[str],
                     source_lens: np.ndarray) -> dict[str, Any]:
  """bleu.score of the whole set, plus BLEU/chrF per LENGTH_BINS bin
  (by_length) and for sources up to and beyond SHORT_MAX_LEN tokens
  (short_sources, long_sources; None where a group is empty)."""
  def part(rows):
    if not len(rows):
      return {'bleu': None, 'chrf': None, 'sentences': 0}
    s = bleu.score([hyps[i] for i in rows], [references[i] for i in rows])
    return {'bleu': s['bleu'], 'chrf': s['chrf'], 'sentences': int(len(rows))}
  by_length = {}
  for lo, hi in LENGTH_BINS:
    rows = np.flatnonzero((source_lens > lo) & (source_lens <= hi))
    if len(rows):
      by_length[bin_label(lo, hi)] = part(rows)
  inside = source_lens <= SHORT_MAX_LEN
  return {**bleu.score(hyps, references), 'by_length': by_length,
          'short_sources': part(np.flatnonzero(inside)),
          'long_sources': part(np.flatnonzero(~inside))}


def is_current(result: dict) -> bool:
  """Whether a run's translation.json comes from today's beam search."""
  return result.get('beam_search') == BEAM_SEARCH


def scheduled_checkpoints(steps: list[int],
                          config: ml_collections.ConfigDict) -> list[int]:
  """The kept checkpoints an uninterrupted run has too: those on the
  checkpoint_every grid and the last step. A run paused by a signal also
  keeps the step it stopped at; choosing among those would make the chosen
  checkpoint depend on when the run was paused."""
  every, last = config.train.checkpoint_every, config.train.num_steps
  return [s for s in steps if s % every == 0 or s == last]


def evaluate_run(run: study.Run, path: str,
                 greedy_by_step: dict[int, float] | None = None
                 ) -> dict[str, Any]:
  """The run's translation.json (computed once): the checkpoint chosen by
  validation BLEU, then beam-search scores on every split. A result from
  an older beam search (is_current) is rescored from the same checkpoint.

  greedy_by_step: the greedy validation BLEU of the kept checkpoints, where
  the training loop already computed it (early stopping's record); by
  default each kept checkpoint is decoded here."""
  target = os.path.join(path, RESULT_FILE)
  old = None
  if os.path.exists(target):
    old = workdir_lib.read_json_object(
        target, "the run's scores; delete it to rescore")
    if is_current(old):
      return old
  from tensorboardX import SummaryWriter

  from selfattn.training.translation_steps import TranslationTrainer
  trainer = TranslationTrainer(run.config)
  layout = trainer.params_layout()
  writer = SummaryWriter(logdir=path)
  if old is None:
    kept = scheduled_checkpoints(checkpoints.saved_steps(path), run.config)
    # The training loop's own greedy BLEU where it has one; every other kept
    # checkpoint is decoded here (a record missing a step, or none at all).
    by_step = {s: b for s, b in (greedy_by_step or {}).items() if s in kept}
    val = trainer.corpus.eval_set('val')
    for step in (s for s in kept if s not in by_step):
      params, _ = checkpoints.read_params(path, layout, step)
      hyps = trainer.translate_texts(params, val.sources)
      by_step[step] = bleu.score(hyps, val.references)['bleu']
      writer.add_scalar('valid/bleu_checkpoint', by_step[step], step)
      print(f'[translation] {run.name}: step {step} greedy valid BLEU '
            f'{by_step[step]:.2f}', flush=True)
    if not by_step:
      raise FileNotFoundError(f'no checkpoint in {path}')
    chosen = max(by_step, key=lambda s: (by_step[s], s))
  else:
    by_step = {int(s): b for s, b in old['valid_bleu_greedy_by_step'].items()}
    chosen = old['selected_step']
    print(f'[translation] {run.name}: rescoring step {chosen} with the '
          f'{BEAM_SEARCH} beam search', flush=True)
  params, _ = checkpoints.read_params(path, layout, chosen)
  result: dict[str, Any] = {
      'selected_step': chosen,
      'valid_bleu_greedy_by_step': {str(s): b for s, b in by_step.items()},
      'beam_size': BEAM_SIZE, 'alpha': ALPHA, 'beam_search': BEAM_SEARCH,
      'splits': {}}
  os.makedirs(os.path.join(path, 'translations'), exist_ok=True)
  for split in ('val',) + multi30k.TEST_SPLITS:
    data = trainer.corpus.eval_set(split)
    hyps = trainer.translate_texts(params, data.sources, method='beam',
                                   beam_size=BEAM_SIZE, alpha=ALPHA)
    write_lines(os.path.join(path, 'translations', f'{split}.en'), hyps)
    split_result = scores_by_length(hyps, data.references, data.source_lens())
    result['splits'][split] = split_result
    writer.add_scalar(f'beam/{split}/bleu', split_result['bleu'], chosen)
  writer.close()
  workdir_lib.write_json(target, result)
  return result


def _cell(values: list[float], digits: int = 2) -> str:
  if not values:
    return '–'
  if len(values) == 1:
    return f'{values[0]:.{digits}f}'
  return f'{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}'


def _by(results: dict, key) -> dict[str, dict[int, float]]:
  """label -> seed -> key(result), leaving out None (no sentences)."""
  out: dict[str, dict[int, float]] = {}
  for r in results.values():
    if key(r) is not None:
      out.setdefault(r['label'], {})[r['seed']] = key(r)
  return out


def single_run_line(by_label: dict[str, dict[int, float]]) -> str | None:
  """The rows with one seed, each beside sinusoidal at the same seed, with
  no interval: one run says what happened once, not what generalizes."""
  parts = []
  for label, by_seed in by_label.items():
    if len(by_seed) != 1 or label == 'sinusoidal':
      continue
    (seed, value), = by_seed.items()
    base = by_label.get('sinusoidal', {}).get(seed)
    if base is not None:
      parts.append(f'{label} minus sinusoidal at seed {seed}: '
                   f'{value - base:+.2f}')
  if not parts:
    return None
  return (f'{MAIN_TEST} BLEU, rows with a single run (no interval; an '
          f'anecdote): ' + '; '.join(parts))


BOOTSTRAP_RESAMPLES = 1000


def sentence_bootstrap(stats: dict[str, dict[int, np.ndarray]], a, b, name: str,
                       *, resamples: int = BOOTSTRAP_RESAMPLES,
                       rng_seed: int = 0) -> str:
  """The seed-mean BLEU difference mean(a) - mean(b), with a 95% percentile
  interval over resamples of the test sentences: the same resample for
  every run (paired), the seeds fixed. The other unit of replication beside
  the seed intervals: it says how much the difference depends on which
  sentences the test set happens to hold.

  stats: label -> seed -> bleu.sentence_statistics of that run's output."""
  labels = tuple(a) + tuple(b)
  seeds = sorted(set.intersection(*(set(stats.get(l, {})) for l in labels)))
  if not seeds:
    return f'{name}: no seed with every encoding finished.'
  n = len(next(iter(stats[labels[0]].values())))
  rng = np.random.default_rng(rng_seed)
  # counts[r, i]: how often resample r draws sentence i; counts @ stats is
  # each resample's summed statistics.
  counts = np.stack([np.bincount(rng.integers(0, n, n), minlength=n)
                     for _ in range(resamples)]).astype(np.float64)
  def seed_mean(group, rows):
    return np.mean([np.mean([bleu.bleu_of_statistics(rows @ stats[l][s])
                             for l in group], axis=0) for s in seeds], axis=0)
  ones = np.ones((1, n))
  point = float((seed_mean(a, ones) - seed_mean(b, ones))[0])
  diffs = seed_mean(a, counts) - seed_mean(b, counts)
  lo, hi = np.percentile(diffs, [2.5, 97.5])
  return (f'{name}: {point:+.2f} BLEU, mean over seeds '
          f'{", ".join(map(str, seeds))} (95% bootstrap interval over the '
          f'{n} test sentences, {resamples} paired resamples, seeds fixed: '
          f'[{lo:+.2f}, {hi:+.2f}])')


def read_translations(workdir: str, name: str, split: str) -> list[str]:
  """A run's committed translations of a split, one per sentence."""
  path = os.path.join(workdir, name, 'translations', f'{split}.en')
  with open(path, encoding='utf-8') as f:
    return f.read().split('\n')[:-1]      # the file ends with a newline


def _sentence_stats(workdir: str, results: dict, references: list[str]
                    ) -> dict[str, dict[int, np.ndarray]]:
  out: dict[str, dict[int, np.ndarray]] = {}
  for name, r in results.items():
    hyps = read_translations(workdir, name, MAIN_TEST)
    out.setdefault(r['label'], {})[r['seed']] = bleu.sentence_statistics(
        hyps, references)
  return out


def _long_source_precisions(workdir: str, results: dict, examples: dict
                            ) -> dict[str, dict[int, float]]:
  """label -> seed -> BLEU / brevity penalty of the run's MAIN_TEST
  translations of sources longer than SHORT_MAX_LEN tokens (the scores keep
  no brevity penalty per source group, so it is recomputed from the
  committed translations). examples: {'references', 'source_lens'}."""
  rows = np.flatnonzero(np.asarray(examples['source_lens']) > SHORT_MAX_LEN)
  references = [examples['references'][i] for i in rows]
  out: dict[str, dict[int, float]] = {}
  for name, r in results.items():
    hyps = read_translations(workdir, name, MAIN_TEST)
    s = bleu.score([hyps[i] for i in rows], references)
    if s['bp'] > 0:        # 0 only for empty outputs: no precision to show
      out.setdefault(r['label'], {})[r['seed']] = s['bleu'] / s['bp']
  return out


def repeats_a_trigram(sentence: str) -> bool:
  """Whether some run of three whitespace words occurs twice: the mark of
  a decoder looping ("... in front of a white fence in front of a white
  fence"), rare in the references (7, 5 and 1 in the three test sets)."""
  words = sentence.split()
  grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
  return len(grams) != len(set(grams))


def repetition_table(workdir: str, results: dict, labels) -> str | None:
  """Per encoding and test set (mean ± std over seeds): output length over
  reference length (13a tokens), and how many outputs repeat a 3-gram."""
  rows = []
  for label in labels:
    mine = {name: r for name, r in results.items()
            if r['label'] == label and 'sys_len' in r['splits'][MAIN_TEST]}
    if not mine:
      continue
    row = [label]
    for split in multi30k.TEST_SPLITS:
      row.append(_cell([r['splits'][split]['sys_len']
                        / r['splits'][split]['ref_len']
                        for r in mine.values()], 3))
      row.append(_cell([float(sum(map(repeats_a_trigram,
                                      read_translations(workdir, name, split))))
                        for name in mine], 1))
    rows.append(row)
  if not rows:
    return None
  header = ['encoding']
  for split in multi30k.TEST_SPLITS:
    header += [f'{split} length ratio', f'{split} outputs repeating a 3-gram']
  return common.markdown_table(header, rows)


def example_rows(source_lens: np.ndarray) -> list[int]:
  """The first sentence of each LENGTH_BINS bin, in test-set order: a rule
  fixed before any translation is read, so the examples are not chosen
  for flattering (or damning) any encoding."""
  rows = []
  for lo, hi in LENGTH_BINS:
    inside = np.flatnonzero((source_lens > lo) & (source_lens <= hi))
    if len(inside):
      rows.append(int(inside[0]))
  return rows


def example_translations(workdir: str, results: dict, labels,
                         examples: dict) -> str | None:
  """Markdown: for each of example_rows, the German source, the reference
  and each label's committed translation at the lowest seed every listed
  label has. examples: {'sources', 'references', 'source_lens'} of
  MAIN_TEST. None when no run has translations yet."""
  by_label: dict[str, dict[int, str]] = {}
  for name, r in results.items():
    by_label.setdefault(r['label'], {})[r['seed']] = name
  shown = [label for label in labels if label in by_label]
  if not shown:
    return None
  seeds = set.intersection(*(set(by_label[label]) for label in shown))
  seed = min(seeds) if seeds else None
  if seed is None:       # no seed shared by all: show each label's lowest
    names = {label: by_label[label][min(by_label[label])] for label in shown}
  else:
    names = {label: by_label[label][seed] for label in shown}
  lines_of = {label: read_translations(workdir, name, MAIN_TEST)
              for label, name in names.items()}
  where = (f'seed {seed}' if seed is not None
           else 'each row\'s lowest seed')
  parts = [f'The first sentence of {MAIN_TEST} in each source-length bin '
           f'(a rule fixed before reading any translation), beam search, '
           f'{where}:']
  lens = examples['source_lens']
  for row in example_rows(lens):
    parts.append(f'\n**Sentence {row + 1}** ({int(lens[row])} source tokens)\n')
    parts.append(f'- German: {examples["sources"][row]}')
    parts.append(f'- reference: {examples["references"][row]}')
    parts += [f'- {label}: {lines_of[label][row]}' for label in shown]
  return '\n'.join(parts)


# The report's title, the owner's mark on its workdir (skeleton.Study.title).
TITLE = 'Multi30k German-English'


def report(workdir: str, runs: list[study.Run], results: dict, scale: str,
           floors: dict, examples: dict | None = None) -> str:
  """results.md, results.json and the BLEU-by-length plot; with
  examples (see example_translations), a few translations side by side."""
  labels = list(dict.fromkeys(r.tags['position'] for r in runs))
  splits = ('val',) + multi30k.TEST_SPLITS
  score = lambda split, metric='bleu': (
      lambda r: r['splits'][split][metric])
  rows = []
  for label in labels:
    mine = [r for r in results.values() if r['label'] == label]
    rows.append([label] + [_cell([score(s)(r) for r in mine]) for s in splits]
                + [_cell([score(MAIN_TEST, 'chrf')(r) for r in mine]),
                   str(len(mine))])
  for name, by_split in floors.items():
    rows.append([f'{name} (floor)'] + [f'{by_split[s]["bleu"]:.2f}'
                                       for s in splits]
                + [f'{by_split[MAIN_TEST]["chrf"]:.2f}', '–'])
  table = common.markdown_table(
      ['encoding', 'val BLEU'] + [f'{s} BLEU' for s in splits[1:]]
      + [f'{MAIN_TEST} chrF', 'seeds'], rows)
  best_floor = max(floors, key=lambda f: floors[f]['val']['bleu'])
  floor_line = (f'The strongest floor on validation is `{best_floor}` '
                f'({floors[best_floor]["val"]["bleu"]:.2f} val, '
                f'{floors[best_floor][MAIN_TEST]["bleu"]:.2f} {MAIN_TEST}).')
  beaten = []
  for label in labels:
    mine = [r for r in results.values() if r['label'] == label]
    if mine:
      wins = sum(r['splits'][MAIN_TEST]['bleu']
                 > floors[best_floor][MAIN_TEST]['bleu'] for r in mine)
      beaten.append(f'{label} {wins}/{len(mine)}')
  if beaten:
    floor_line += (f' Runs above it on {MAIN_TEST}: ' + ', '.join(beaten)
                   + '.')

  bins = BIN_LABELS
  length_rows = []
  for label in labels:
    mine = [r for r in results.values() if r['label'] == label]
    length_rows.append(
        [label] + [_cell([r['splits'][MAIN_TEST]['by_length'][b]['bleu']
                          for r in mine
                          if b in r['splits'][MAIN_TEST]['by_length']])
                   for b in bins])
  length_rows.append(
      [f'{best_floor} (floor)'] + [
          f'{floors[best_floor][MAIN_TEST]["by_length"][b]["bleu"]:.2f}'
          if b in floors[best_floor][MAIN_TEST]['by_length'] else '–'
          for b in bins])
  counts = {}
  if results:
    any_run = next(iter(results.values()))
    counts = {b: v['sentences'] for b, v in
              any_run['splits'][MAIN_TEST]['by_length'].items()}
  length_table = common.markdown_table(
      ['encoding'] + [f'{b} ({counts.get(b, "?")} sentences)' for b in bins],
      length_rows)

  # Output length: BLEU's brevity penalty multiplies the n-gram precisions,
  # so a BLEU difference can be length alone; BLEU / BP leaves the
  # precisions.
  # bp is 0 only for an empty output; such a run has no BLEU / BP.
  has_bp = lambda r: r['splits'][MAIN_TEST].get('bp', 0) > 0
  ratio_rows = []
  for label in labels:
    mine = [r['splits'][MAIN_TEST] for r in results.values()
            if r['label'] == label and has_bp(r)]
    if mine:
      ratio_rows.append([label, _cell([m['sys_len'] / m['ref_len'] for m in mine], 3),
                          _cell([m['bp'] for m in mine], 3),
                          _cell([m['bleu'] / m['bp'] for m in mine])])
  output_length = None
  if ratio_rows:
    output_length = common.markdown_table(
        ['encoding', 'length ratio (output / reference)', 'brevity penalty',
         'BLEU / brevity penalty'], ratio_rows)
  main_bleu = _by(results, score(MAIN_TEST))
  precision_bleu = _by(results, lambda r: r['splits'][MAIN_TEST]['bleu']
                       / r['splits'][MAIN_TEST]['bp'] if has_bp(r) else None)
  long_bleu = _by(results, lambda r: r['splits'][MAIN_TEST]['long_sources']['bleu'])
  short_bleu = _by(results, lambda r: r['splits'][MAIN_TEST]['short_sources']['bleu'])
  # Per run, long minus short: paired by seed, it says whether an
  # encoding's lead grows with the source's length (a difference of
  # differences; BLEU of a subset is its own corpus score, not a sum).
  length_gap = {label: {seed: long_bleu[label][seed] - by_seed[seed]
                        for seed in by_seed if seed in long_bleu.get(label, {})}
                for label, by_seed in short_bleu.items()}
  short_relative = tuple(f'{p} +short' for p in RELATIVE)
  pair = lambda by_label, a, b, name: common.paired_by_seed(
      by_label, a, b, name, unit='BLEU', digits=2)
  comparisons = [
      pair(main_bleu, ('shaw',), ('sinusoidal',),
           f"{MAIN_TEST} BLEU, shaw minus sinusoidal (Shaw et al.'s "
           f'comparison)'),
      pair(main_bleu, RELATIVE, ABSOLUTE,
           f'{MAIN_TEST} BLEU, mean of {", ".join(RELATIVE)} minus mean of '
           f'{", ".join(ABSOLUTE)}'),
      pair(short_bleu, RELATIVE, ABSOLUTE,
           f'{MAIN_TEST} sources of at most {SHORT_MAX_LEN} tokens, mean of '
           f'{", ".join(RELATIVE)} minus mean of {", ".join(ABSOLUTE)}'),
      pair(long_bleu, RELATIVE, ABSOLUTE,
           f'{MAIN_TEST} sources longer than {SHORT_MAX_LEN} tokens (trained '
           f'on all), mean of {", ".join(RELATIVE)} minus mean of '
           f'{", ".join(ABSOLUTE)}'),
      pair(length_gap, RELATIVE, ABSOLUTE,
           'how much more the relative encodings lead on the longer sources '
           '(the line above minus the one before it)'),
      pair(precision_bleu, ('shaw',), ('sinusoidal',),
           f'{MAIN_TEST} BLEU without its brevity penalty (BLEU / BP: the '
           f'n-gram precisions, which shorter outputs tend to raise), shaw '
           f'minus sinusoidal'),
      pair(precision_bleu, RELATIVE, ABSOLUTE,
           f'{MAIN_TEST} BLEU / BP, mean of {", ".join(RELATIVE)} minus '
           f'mean of {", ".join(ABSOLUTE)}'),
      pair(main_bleu, ('rope',), ('shaw',),
           f'{MAIN_TEST} BLEU, rope minus shaw'),
      pair(main_bleu, ('learned',), ('sinusoidal',),
           f'{MAIN_TEST} BLEU, learned minus sinusoidal (exercise 2)'),
      pair(short_bleu, short_relative, ('sinusoidal +short',),
           f'+short protocol, {MAIN_TEST} sources of at most '
           f'{SHORT_MAX_LEN} tokens (the trained range): mean of '
           f'{", ".join(RELATIVE)} minus sinusoidal'),
      pair(long_bleu, short_relative, ('sinusoidal +short',),
           f'+short protocol, {MAIN_TEST} sources longer than '
           f'{SHORT_MAX_LEN} tokens (never trained): mean of '
           f'{", ".join(RELATIVE)} minus sinusoidal'),
      pair(length_gap, short_relative, ('sinusoidal +short',),
           '+short protocol: how much more the relative encodings lead '
           'beyond the trained lengths (the line above minus the one before '
           'it)'),
  ] + [
      pair(long_bleu, (f'{label} +short',), ('sinusoidal +short',),
           f'+short protocol, {MAIN_TEST} sources longer than '
           f'{SHORT_MAX_LEN} tokens: {label} minus sinusoidal')
      for label in RELATIVE
  ] + [
      pair(bleu_of, (label,), (f'{label} +short',),
           f'{label} on sources {where} {SHORT_MAX_LEN}: trained on all '
           f'minus trained on short (never seeing a long source, and 24% '
           f'fewer distinct pairs, as many steps)')
      for bleu_of, where in ((long_bleu, 'longer than'),
                             (short_bleu, 'of at most'))
      for label in ('sinusoidal',) + RELATIVE]
  # Whose cost of short training is larger (each encoding's all-minus-short
  # on the long sources, paired by seed), and whether the relative lead
  # grows with length more when the long sources were never trained than
  # when they were (the growth line of each protocol, paired by seed).
  cost = {}
  for label in ('sinusoidal',) + RELATIVE:
    trained_short = long_bleu.get(f'{label} +short', {})
    cost[label] = {seed: bleu_all - trained_short[seed]
                   for seed, bleu_all in long_bleu.get(label, {}).items()
                   if seed in trained_short}
  comparisons += [pair(cost, (a,), (b,),
                       f'cost of short training on sources longer than '
                       f'{SHORT_MAX_LEN}, {a} minus {b}')
                  for a, b in (('sinusoidal', 'shaw'), ('sinusoidal', 'rope'),
                               ('rope', 'shaw'))]
  relative_growth = {
      protocol: {seed: statistics.mean(length_gap[f'{p}{suffix}'][seed]
                                       for p in RELATIVE)
                 - length_gap[f'sinusoidal{suffix}'][seed]
                 for seed in set.intersection(*[
                     set(length_gap.get(f'{p}{suffix}', {}))
                     for p in ('sinusoidal',) + RELATIVE])}
      for protocol, suffix in (('+short', ' +short'), ('all', ''))}
  comparisons.append(pair(
      relative_growth, ('+short',), ('all',),
      'growth of the relative lead (mean of shaw, rope minus sinusoidal, '
      'long minus short sources) under +short minus under all pairs: '
      'whether never seeing a long source widens it more'))
  # Validation, the split that chooses (checkpoints, the CPU default).
  val_bleu = _by(results, score('val'))
  comparisons += [
      pair(val_bleu, ('shaw',), ('sinusoidal',),
           'val BLEU (the split that chooses), shaw minus sinusoidal'),
      pair(val_bleu, ('rope',), ('shaw',), 'val BLEU, rope minus shaw')]
  comparisons += [
      line
      for a, b in PEERS
      for line in (
          pair(main_bleu, (a,), (b,), f'{MAIN_TEST} BLEU, {a} minus {b}'),
          pair(main_bleu, (a,), ('sinusoidal',),
               f'{MAIN_TEST} BLEU, {a} minus sinusoidal'),
          pair(long_bleu, (a,), (b,),
               f'{MAIN_TEST} sources longer than {SHORT_MAX_LEN} tokens, '
               f'{a} minus {b}'),
          pair(val_bleu, (a,), (b,), f'val BLEU, {a} minus {b}'))]
  # The other test sets, for whether an ordering holds beyond the standard
  # one (test_2017_mscoco is out of domain).
  for split in multi30k.TEST_SPLITS:
    if split == MAIN_TEST:
      continue
    split_bleu = _by(results, score(split))
    comparisons += [
        pair(split_bleu, ('shaw',), ('sinusoidal',),
             f'{split} BLEU, shaw minus sinusoidal'),
        pair(split_bleu, RELATIVE, ABSOLUTE,
             f'{split} BLEU, mean of {", ".join(RELATIVE)} minus mean of '
             f'{", ".join(ABSOLUTE)}'),
    ] + [pair(split_bleu, (a,), (b,), f'{split} BLEU, {a} minus {b}')
         for a, b in (('rope', 'shaw'),) + PEERS]
  if examples:
    long_plain = _long_source_precisions(workdir, results, examples)
    comparisons += [
        pair(long_plain, (label,), (f'{label} +short',),
             f'{MAIN_TEST} sources longer than {SHORT_MAX_LEN} tokens, BLEU '
             f'/ BP (brevity penalty divided out): {label} trained on '
             f'all minus trained on short')
        for label in ('sinusoidal',) + RELATIVE]
    comparisons.append(pair(
        long_plain, short_relative, ('sinusoidal +short',),
        f'+short protocol, {MAIN_TEST} sources longer than {SHORT_MAX_LEN} '
        f'tokens, BLEU / BP: mean of {", ".join(RELATIVE)} minus sinusoidal'))
    stats = _sentence_stats(workdir, results, examples['references'])
    comparisons += [
        sentence_bootstrap(stats, ('shaw',), ('sinusoidal',),
                           f'{MAIN_TEST} BLEU, shaw minus sinusoidal, '
                           f'over sentences'),
        sentence_bootstrap(stats, RELATIVE, ABSOLUTE,
                           f'{MAIN_TEST} BLEU, relative minus absolute, over '
                           f'sentences')]
  single = single_run_line(main_bleu)
  if single:
    comparisons.append(single)
  base = translation_config.get_config(scale)
  m, t = base.model, base.train
  signature = ''
  if results:
    signature = next(iter(results.values()))['splits']['val']['bleu_signature']
  protocol = (
      f'scale={scale}: Multi30k task 1 German to English (29,000 training '
      f'pairs; val 1,014; test_2016_flickr 1,000; test_2017_flickr 1,000; '
      f'test_2017_mscoco 461), a joint SentencePiece unigram vocabulary of '
      f'{base.task.vocab_size} trained on the training split. Encoder and '
      f'decoder of {m.num_layers} layers each, width {m.num_hiddens}, '
      f'{m.num_heads} heads, FFN {m.ffn_num_hiddens}, norm {m.norm}, dropout '
      f'{m.dropout}, tied embeddings; the encoding in both stacks\' '
      f'self-attention, none in cross-attention. Length-bucketed batches of '
      f'about {t.batch_tokens or "batch_size x longest bucket"} padded tokens '
      f'in both protocols, {t.num_steps} steps, AdamW lr {t.learning_rate} ({t.warmup_steps} warmup, cosine '
      f'to {t.final_lr_fraction} of the peak), beta2 {t.b2}, label smoothing '
      f'{t.label_smoothing}. Checkpoint chosen by greedy validation BLEU; '
      f'scores from beam search (beam {BEAM_SIZE}, GNMT length penalty '
      f'alpha {ALPHA}, finished hypotheses kept apart from the live ones). '
      f'sacreBLEU signature: {signature or "(no run yet)"}. Rows '
      f'"+short": trained only on pairs whose source has at most '
      f'{SHORT_MAX_LEN} tokens. Cells: mean ± std over seeds (the seed is '
      f'the unit of replication: it draws the parameters, the batches and '
      f'dropout).')
  sections = [
      ('Status', f'{len(results)} of {len(runs)} runs finished and scored.'),
      ('Protocol', protocol),
      ('BLEU', table + '\n\n' + floor_line),
      (f'BLEU by source length ({MAIN_TEST}, tokens)', length_table),
  ]
  if output_length:
    repetition = repetition_table(workdir, results, labels)
    sections.append((f'Output length ({MAIN_TEST}, 13a tokens)',
                     output_length + '\n\nEvery test set: the length ratio, '
                     'and how many outputs repeat a run of three words (a '
                     'decoder looping):\n\n' + repetition))
  sections.append(('Paired by seed',
                   '\n'.join(f'- {c}' for c in comparisons)))
  if results and plot_by_length(
      results, labels, os.path.join(workdir, 'bleu_by_length.png'),
      floor=(best_floor, floors[best_floor][MAIN_TEST]['by_length'])):
    sections.append(('Plot', '![BLEU by source length](bleu_by_length.png)'))
  if results and plot_by_step(results, labels,
                              os.path.join(workdir, 'bleu_by_step.png'),
                              floor=(best_floor,
                                     floors[best_floor]['val']['bleu'])):
    sections.append(('Training curve',
                     'Greedy validation BLEU at every kept checkpoint (the '
                     'numbers that choose the checkpoint):\n\n'
                     '![validation BLEU by step](bleu_by_step.png)'))
  shown = examples and example_translations(workdir, results, labels,
                                            examples)
  if shown:
    sections.append(('A few translations', shown))
  data = {'scale': scale, 'protocol': protocol, 'floors': floors,
          'runs': results}
  return common.write_results(workdir, TITLE, sections,
                              data)


def _plot_by_label(path: str, labels, curves_of, decorate, *, xlabel: str,
                   ylabel: str, title: str) -> bool:
  """One band per label (mean over seeds, min-max band; dashed for +short
  rows, dash-dot past the tenth label) from curves_of(label) -> (x, seeds x
  points) or None, then decorate(ax) for floors and marks. False (and no file) with no curve."""
  import matplotlib
  matplotlib.use('Agg')
  from matplotlib import pyplot as plt
  fig, ax = plt.subplots(figsize=(7, 4))
  drawn = False
  for i, label in enumerate(labels):
    curves = curves_of(label)
    if curves is None:
      continue
    x, values = curves
    # Ten colours, so from the eleventh label on, a colour comes back with
    # a dash-dot line.
    style = '--' if '+short' in label else ('-.' if i >= 10 else '-')
    common.band(ax, x, values, color=f'C{i % 10}', label=label,
                linestyle=style)
    drawn = True
  if not drawn:
    plt.close(fig)
    return False
  decorate(ax)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.set_title(title, fontsize=9)
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return True


def plot_by_length(results: dict, labels, path: str,
                   floor: tuple[str, dict] | None = None) -> bool:
  """test_2016 BLEU by source-length bin, one line per encoding (mean over
  seeds, band min-max), the floor's (name, by_length) dotted, and a line
  where +short training stops."""
  bins = BIN_LABELS
  x = np.arange(len(bins))

  def curves_of(label):
    curves = [[r['splits'][MAIN_TEST]['by_length'].get(b, {}).get(
        'bleu', np.nan) for b in bins]
              for r in results.values() if r['label'] == label]
    return (x, np.array(curves)) if curves else None

  def decorate(ax):
    if floor is not None:
      name, by_length = floor
      ax.plot(x, [by_length.get(b, {}).get('bleu', np.nan) for b in bins],
              color='black', linestyle=':', marker='x',
              label=f'{name} (floor)')
    ax.axvline(2.5, color='grey', linestyle=':', linewidth=1)
    ax.text(2.55, ax.get_ylim()[1], f' longer than {SHORT_MAX_LEN} (+short: '
            f'never trained)', va='top', fontsize=7, color='grey')
    ax.set_xticks(range(len(bins)), bins)

  return _plot_by_label(
      path, labels, curves_of, decorate,
      xlabel='source length (SentencePiece tokens)',
      ylabel=f'BLEU ({MAIN_TEST}, beam {BEAM_SIZE})',
      title='Multi30k de-en: BLEU by source length (mean over seeds, band '
            'min-max)')


def plot_by_step(results: dict, labels, path: str,
                 floor: tuple[str, float] | None = None) -> bool:
  """Greedy validation BLEU against the training step, one line per
  encoding (mean over seeds, band min-max), the floor's validation BLEU
  dotted: whether the runs had stopped improving."""
  def curves_of(label):
    mine = [r['valid_bleu_greedy_by_step'] for r in results.values()
            if r['label'] == label]
    if not mine:
      return None
    steps = sorted(set.intersection(*[{int(s) for s in m} for m in mine]))
    if not steps:
      return None
    return (np.array(steps),
            np.array([[m[str(s)] for s in steps] for m in mine]))

  def decorate(ax):
    if floor is not None:
      ax.axhline(floor[1], color='black', linestyle=':',
                 label=f'{floor[0]} (floor)')

  return _plot_by_label(
      path, labels, curves_of, decorate, xlabel='training step',
      ylabel='greedy validation BLEU',
      title='Multi30k de-en: validation BLEU by step (mean over seeds, band '
            'min-max)')


def _outdated(path: str) -> bool:
  target = os.path.join(path, RESULT_FILE)
  return os.path.exists(target) and not is_current(
      workdir_lib.read_json_object(target, "the run's scores"))


class Translation(skeleton.Study):
  """--scale: cpu (the CPU study), gpu (Shaw et al.'s base model), quick."""
  title = TITLE
  scales = tuple(translation_config.SCALES)
  default_scale = 'cpu'
  default_seeds = 5     # each tier of TIERS caps its own

  def filter_values(self):
    return {'position': tuple(ENCODINGS)}

  def prepare(self, scale):
    try:
      from selfattn.tasks.translation import data as translation_data
      tokens = translation_data.tokenizer_for(
          translation_config.get_config(scale).task.vocab_size)
      lengths = lambda split: np.array(
          [len(ids) for ids in tokens.encode(multi30k.pairs(split)[0])])
      floors = translation_baselines.floors(
          scorer=lambda split, hyps, refs: scores_by_length(
              hyps, refs, lengths(split)))
      sources, references = multi30k.pairs(MAIN_TEST)
      examples = {'sources': sources, 'references': references,
                  'source_lens': lengths(MAIN_TEST)}
    except DataError as e:
      raise skeleton.StudyError(str(e)) from None
    print('floors: ' + '; '.join(
        f'{name} val {v["val"]["bleu"]:.2f} {MAIN_TEST} '
        f'{v[MAIN_TEST]["bleu"]:.2f}' for name, v in floors.items()))
    return {'floors': floors, 'examples': examples}

  def runs(self, scale, seeds, context):
    labels = QUICK_ENCODINGS if scale == 'quick' else tuple(ENCODINGS)
    return study_runs(scale, seeds, labels)

  def score(self, run, path, context):
    evaluate_run(run, path)

  def results(self, runs, workdir, context, *, score_missing):
    if not score_missing:
      # --collect_only rescores nothing, and one table must not mix two
      # beam searches: runs scored by the older one are left out, said so.
      outdated = {r.name for r in runs
                  if _outdated(os.path.join(workdir, r.name))}
      if outdated:
        print(f'[translation] {len(outdated)} runs scored by an older beam '
              f'search are left out; run the study without --collect_only '
              f'to rescore them', flush=True)
        runs = [r for r in runs if r.name not in outdated]
    return skeleton.scored_results(runs, workdir, RESULT_FILE, evaluate_run,
                                   score_missing=score_missing)

  def report(self, workdir, runs, results, scale, context):
    return report(workdir, runs, results, scale, context['floors'],
                  context['examples'])


STUDY = Translation()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

"""Exercise 3 on real music: JSB Chorales language models, every encoding.

  python -m experiments.music --workdir=experiments/results/music
  python -m experiments.music --workdir=... --scale=paper     # PoPE's recipe, a GPU
  python -m experiments.music --workdir=... --quick           # under a minute

Each run trains a causal TransformerDecoder on random crops of N tokens
(configs/music.py), then is scored once, into the run's music.json:
  * per-token NLL in nats over whole valid and test pieces ([START] + the
    serialized piece, every token scored once), pieces longer than N in
    strided windows of N tokens (stride N/2: each token sees at least N/2 of
    context; selfattn/tasks/music/lm_eval.py, tested equal to one pass where it fits);
  * NLL by position on whole test pieces scored in one pass of up to 4N
    tokens: does NLL stay flat past the trained window?
  * samples: continuations of test-piece prompts through the key/value cache
    (temperature 1.0, top-k 20), as MIDI, piano rolls and TensorBoard
    image/audio, with descriptive statistics beside the data's.
Resumable like every study: finished runs are not retrained or rescored.
The driver also computes unigram and n-gram floors on the same pieces.
"""

from __future__ import annotations

import json
import os
import statistics

import numpy as np
from absl import app

from configs import music as music_config
from experiments import common
from experiments import music_baselines
from experiments import music_samples
from experiments import skeleton
from experiments import study
from selfattn.tasks.music import jsb
from selfattn.tasks.music import lm_eval
from selfattn.training import workdir as workdir_lib
from selfattn.training.cli_checks import parse_flags

# Section 6's first pass ran before the CPU default knew the meter: its rows
# turn the meter off, so that they keep the configs they were trained with.
NO_METER_MODEL = {'meter_period': 0}
NO_METER_TASK = {'crop_align': 1}
# The meter as position information (issue 34): bar-aligned crops (every
# crop starts on a 4/4 bar line, so target i always has step phase
# (i // 4) % 16), and on top of them a learned embedding of that phase.
BAR = {'crop_align': 16}
METER = {'meter_period': 16, 'meter_step_tokens': 4}


def _first_pass(position: str, model: dict | None = None,
                task: dict | None = None) -> tuple[str, dict, dict]:
  return (position, {**NO_METER_MODEL, **(model or {})},
          {**NO_METER_TASK, **(task or {})})


# Study label -> (position, encoding options, task options).
ENCODINGS = {
    'none': _first_pass('none'),
    'sinusoidal': _first_pass('sinusoidal'),
    'learned': _first_pass('learned'),
    'shaw': _first_pass('shaw'),
    'huang': _first_pass('huang'),
    'rope': _first_pass('rope'),
    'pope': _first_pass('pope'),
    # PoPE as its paper initialises it for JSB (Table 6): delta ~ U(-2 pi, 0).
    'pope_uniform': _first_pass('pope', {'pope_delta_init': 'uniform'}),
    'alibi': _first_pass('alibi'),
    't5': _first_pass('t5'),
    'xl': _first_pass('xl'),
    'rope +transpose': _first_pass('rope', task={'transpose': 3}),
}
METER_POSITIONS = ('shaw', 'xl', 'rope', 'pope', 'sinusoidal')
for _p in METER_POSITIONS:
  ENCODINGS[f'{_p} +bar'] = (_p, NO_METER_MODEL, BAR)
  ENCODINGS[f'{_p} +bar+meter'] = (_p, METER, BAR)
METER_RELATIVE = ('shaw', 'xl', 'rope', 'pope')
ABSOLUTE = ('sinusoidal', 'learned')
RELATIVE = ('shaw', 'huang', 'rope', 'pope', 'alibi', 't5', 'xl')
QUICK_ENCODINGS = ('sinusoidal', 'shaw')
PUBLISHED = {'rope': 0.5081, 'pope': 0.4889}   # PoPE Table 2, test NLL
SAMPLE_STEPS = 64                               # sixteenths after the prompt
NUM_SAMPLES = 4


def study_runs(scale: str, seeds: int, labels=tuple(ENCODINGS)
               ) -> list[study.Run]:
  return common.encoding_runs(music_config.get_config(scale), seeds, labels,
                              ENCODINGS)


def sequences(grids: list[np.ndarray]) -> list[np.ndarray]:
  return [np.concatenate([[jsb.START], jsb.serialize(g)]).astype(np.int32)
          for g in grids]


def evaluate_run(run: study.Run, path: str, data: dict,
                 step: int | None = None) -> dict:
  """The run's music.json: NLLs, NLL by position, samples (computed once),
  of its last checkpoint or, given `step`, of that one (recorded as
  'selected_step')."""
  target = os.path.join(path, 'music.json')
  if os.path.exists(target):
    return workdir_lib.read_json_object(
        target, "the run's music scores; delete it to rescore")
  window = run.config.task.max_len
  model = common.trained_model(run.config, path, step)
  result = {} if step is None else {'selected_step': step}
  at_step = run.config.train.num_steps if step is None else step
  for split in ('valid', 'test'):
    total, count = lm_eval.score(model, sequences(data[split]), window)
    result[f'{split}_nll'] = total / count
    result[f'{split}_tokens'] = count
  totals, counts = lm_eval.nll_by_position(model, sequences(data['test']),
                                           4 * window)
  result['test_nll_by_position'] = (totals / np.maximum(counts, 1)).tolist()
  result['test_count_by_position'] = counts.tolist()
  beyond = slice(window, 4 * window)
  result['test_nll_beyond_window'] = float(totals[beyond].sum()
                                           / counts[beyond].sum())
  result['test_nll_within_window'] = float(totals[:window].sum()
                                           / counts[:window].sum())
  grids = music_samples.continue_pieces(
      model, data['test'][:NUM_SAMPLES], SAMPLE_STEPS, run.config.seed)
  result['sample_statistics'] = music_samples.describe(grids, data['train'])
  from tensorboardX import SummaryWriter
  writer = SummaryWriter(logdir=path)
  for split in ('valid', 'test'):
    writer.add_scalar(f'music/{split}_nll', result[f'{split}_nll'], at_step)
  music_samples.save(grids, os.path.join(path, 'samples'), writer, at_step,
                     label=run.tags.get('position', run.config.model.position),
                     seed=run.config.seed)
  writer.close()
  with open(target + '.tmp', 'w') as f:
    json.dump(result, f, indent=1)
  os.replace(target + '.tmp', target)
  return result


def _cell(values: list[float]) -> str:
  return common.mean_std(values) if values else '–'


def _paired(by_label: dict, a: tuple[str, ...], b: tuple[str, ...],
            name: str) -> str:
  return common.paired_by_seed(by_label, a, b, name, unit='nats')


def against_floor(by: dict, label: str, floor_name: str,
                  floor: dict) -> str:
  """One report line: a row's NLL minus a floor's (a constant), on valid
  and test, with a 95% t-interval across the row's seeds and the number of
  seeds below the floor on both splits."""
  values = {split: by[f'{split}_nll'].get(label, {})
            for split in ('valid', 'test')}
  seeds = sorted(set(values['valid']) & set(values['test']))
  name = f'{label} minus the {floor_name} floor'
  if len(seeds) < 2:
    return f'{name}: fewer than two seeds finished.'
  parts = []
  for split, by_seed in values.items():
    diffs = [by_seed[s] - floor[split] for s in seeds]
    lo, hi = common.seed_interval(diffs)
    parts.append(f'{split} {statistics.mean(diffs):+.4f} [{lo:+.4f}, '
                 f'{hi:+.4f}]')
  below = sum(all(values[split][s] < floor[split] for split in values)
              for s in seeds)
  return (f'{name}: ' + ', '.join(parts) + f' nats over {len(seeds)} seeds '
          f'(95% t-intervals across seeds); below it on valid and test on '
          f'{below} of {len(seeds)} seeds')


def plot_by_position(results: dict, labels, window: int, path: str) -> None:
  """Mean NLL per position bucket over seeds, with a min-max band; solid
  lines for relative encodings, dashed for absolute ones and none."""
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(9, 5))
  # One colour per encoding: tab10, black, then Dark2 (12 encodings).
  colors = (list(plt.get_cmap('tab10').colors) + [(0.0, 0.0, 0.0)]
            + list(plt.get_cmap('Dark2').colors))
  bucket = max(window // 8, 4)
  for i, label in enumerate(labels):
    curves = [np.asarray(r['test_nll_by_position']) for r in results.values()
              if r['label'] == label]
    if not curves:
      continue
    n = len(curves[0]) // bucket * bucket
    pooled = np.array([c[:n].reshape(-1, bucket).mean(1) for c in curves])
    x = (np.arange(pooled.shape[1]) + 0.5) * bucket
    color = colors[i % len(colors)]
    style = '-' if ENCODINGS[label][0] in RELATIVE else '--'
    common.band(ax, x, pooled, color=color, ls=style, lw=1.4,
                label=f'{label} (n={len(curves)})')
  ax.axvline(window, color='gray', ls=':', lw=1)
  ax.set_xlabel('token position in the test piece')
  ax.set_ylabel('NLL (nats per token)')
  ax.set_title(f'JSB Chorales test pieces, one pass each: NLL by position '
               f'({bucket}-token buckets)\ndotted: the trained window '
               f'{window}; line: mean over seeds, band: min-max; solid: '
               f'relative, dashed: absolute or none', fontsize=9)
  ax.legend(fontsize=7, ncol=3)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)


def plot_samples(workdir: str, results: dict, labels, real: np.ndarray,
                 path: str, seed: int = 0) -> bool:
  """One piano roll per encoding: the first sample of the run at `seed`
  (its one-bar prompt, then what the model drew; the white line is where
  the prompt ends), beside the real continuation of the same prompt."""
  import matplotlib.pyplot as plt
  from selfattn.tasks.music import listening as music
  panels = [('data (the real continuation)', real)]
  for label in labels:
    name = next((n for n, r in results.items()
                 if r['label'] == label and r['seed'] == seed), None)
    midi = None if name is None else os.path.join(workdir, name, 'samples',
                                                  'sample_0.mid')
    if midi is not None and os.path.exists(midi):
      grid = music.midi_to_grid(midi)     # MIDI drops trailing silence
      missing = max(0, len(real) - len(grid))
      panels.append((label, np.pad(grid, ((0, missing), (0, 0)),
                                   constant_values=-1)))
  if len(panels) == 1:
    return False
  cols = 3
  rows = -(-len(panels) // cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 1.9 * rows),
                           squeeze=False)
  for ax in axes.flat:
    ax.axis('off')
  for ax, (title, grid) in zip(axes.flat, panels):
    ax.imshow(music.piano_roll_image(grid, scale=1), aspect='auto',
              interpolation='nearest')
    ax.axvline(music_samples.PROMPT_STEPS - 0.5, color='white', lw=0.8)
    ax.set_title(title, fontsize=9)
  fig.suptitle(f'JSB Chorales: a one-bar prompt of test piece 0 and '
               f'{SAMPLE_STEPS} sampled sixteenths (seed {seed}, '
               f'temperature {music_samples.TEMPERATURE}, top-k '
               f'{music_samples.TOP_K}; colours: S A T B)', fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=100)
  plt.close(fig)
  return True


# The report's title, the owner's mark on its workdir (skeleton.Study.title).
TITLE = 'JSB Chorales'


def report(workdir: str, runs: list[study.Run], results: dict, scale: str,
           floors: dict, reference: dict,
           real_excerpt: np.ndarray | None = None) -> str:
  """results.md, results.json and the NLL-by-position plot. reference: the
  sample statistics of real test excerpts of the samples' length."""
  labels = list(dict.fromkeys(r.tags['position'] for r in runs))
  by = {key: {} for key in ('valid_nll', 'test_nll', 'test_nll_beyond_window',
                            'test_nll_within_window')}
  for r in results.values():
    for key in by:
      by[key].setdefault(r['label'], {})[r['seed']] = r[key]
  rows = []
  for label in labels:
    rows.append([label] + [_cell(list(by[k].get(label, {}).values()))
                           for k in by]
                + [f'{PUBLISHED[label]:.4f}' if label in PUBLISHED else '–'])
  for name, row in floors.items():
    rows.append([f'{name} (floor)', f'{row["valid"]:.4f}',
                 f'{row["test"]:.4f}', '', '', ''])
  base = music_config.get_config(scale)
  n = base.task.max_len
  table = common.markdown_table(
      ['encoding', 'valid NLL', 'test NLL', f'test NLL at positions {n}-{4 * n}',
       f'test NLL at positions 0-{n}', 'PoPE paper test NLL'], rows)
  samples = common.markdown_table(
      ['encoding', 'out of range', 'pitch-class distance', 'parallels rate',
       'repeat fraction'],
      [[label] + [_cell([r['sample_statistics'][k] for r in results.values()
                         if r['label'] == label])
                  for k in ('out_of_range', 'pitch_class_distance',
                            'parallels_rate', 'repeat_fraction')]
       for label in labels]
      + [['data (test excerpts)'] + [f'{reference[k]:.3f}' for k in (
          'out_of_range', 'pitch_class_distance', 'parallels_rate',
          'repeat_fraction')]])
  comparisons = [
      _paired(by['test_nll'], RELATIVE, ABSOLUTE,
              'test NLL, mean of the relative encodings minus mean of '
              'the absolute ones'),
      _paired(by['test_nll'], ('shaw',), ('sinusoidal',),
              'test NLL, shaw minus sinusoidal'),
      _paired(by['test_nll'], ('pope',), ('rope',),
              'test NLL, pope minus rope'),
      _paired(by['test_nll'], ('pope_uniform',), ('rope',),
              'test NLL, pope_uniform (the paper\'s JSB initialisation) '
              'minus rope'),
      _paired(by['test_nll'], ('pope_uniform',), ('pope',),
              'test NLL, pope_uniform minus pope (delta = 0)'),
      _paired(by['test_nll_beyond_window'], RELATIVE, ABSOLUTE,
              f'NLL beyond {n}, relative minus absolute'),
  ]
  for p in METER_POSITIONS:
    comparisons += [
        _paired(by['test_nll'], (f'{p} +bar',), (p,),
                f'test NLL, {p}: bar-aligned crops minus any-step crops'),
        _paired(by['test_nll'], (f'{p} +bar+meter',), (f'{p} +bar',),
                f'test NLL, {p}: + meter embedding minus bar-aligned crops'),
    ]
  comparisons += [
      _paired(by['test_nll'], tuple(f'{p} +bar+meter' for p in METER_RELATIVE),
              ('sinusoidal +bar+meter',),
              'test NLL with the meter, mean of shaw, xl, rope, pope minus '
              'sinusoidal'),
      _paired(by['test_nll'], METER_RELATIVE, ('sinusoidal',),
              'test NLL without it (section 6 runs), the same mean minus '
              'sinusoidal'),
      _paired(by['test_nll'], ('shaw +bar+meter',), ('xl +bar+meter',),
              'test NLL with the meter, shaw minus xl'),
  ]
  if floors:
    strongest = min(floors, key=lambda f: floors[f]['valid'])
    comparisons += [against_floor(by, f'{p} +bar+meter', strongest,
                                  floors[strongest])
                    for p in METER_POSITIONS if f'{p} +bar+meter' in labels]
  m, t = base.model, base.train
  protocol = (
      f'scale={scale}: JSB Chorales (Jsb16thSeparated.json, 229/76/77 '
      f'pieces), the Music Transformer serialization (S, A, T, B per '
      f'sixteenth; vocabulary {jsb.VOCAB_SIZE}: 88 pitches, silence, start, '
      f'pad). A causal decoder of {m.num_layers} layers, width '
      f'{m.num_hiddens}, {m.num_heads} heads, FFN {m.ffn_num_hiddens}, norm '
      f'{m.norm}, dropout {m.dropout}; random crops of {n} tokens, batch '
      f'{t.batch_size}, {t.num_steps} steps, AdamW lr {t.learning_rate} '
      f'({t.warmup_steps} warmup, cosine to {t.final_lr_fraction} of the '
      f'peak), beta2 {t.b2}, weight decay {t.weight_decay}, clip '
      f'{t.grad_clip}. Scored on whole pieces, windows of {n} with stride '
      f'{max(4, n // 2 // 4 * 4)}. Cells: mean ± std over seeds. Rows '
      f'"+bar": crops start on a 4/4 bar line (task.crop_align 16, so '
      f'target i has sixteenth (i // 4) % 16 of its bar); "+bar+meter": '
      f'also a learned embedding of that sixteenth added to the inputs '
      f'(model.meter_period 16, zero at the start); both otherwise the '
      f'configs above, paired by seed with the rows without.')
  sections = [
      ('Status', f'{len(results)} of {len(runs)} runs finished and scored.'),
      ('Protocol', protocol),
      ('NLL (nats per token)', table),
      ('Paired by seed', '\n'.join(f'- {c}' for c in comparisons)),
      ('NLL by position', '![NLL by position](nll_by_position.png)'),
      ('Samples', f'{NUM_SAMPLES} continuations of {SAMPLE_STEPS} sixteenths '
       f'after a one-bar prompt of a test piece, per run (temperature '
       f'{music_samples.TEMPERATURE}, top-k {music_samples.TOP_K}); MIDI and '
       f'piano rolls in each run\'s samples/, images and audio in '
       f'TensorBoard. Statistics of the sampled part, mean ± std over '
       f'seeds:\n\n{samples}'),
  ]
  if results:
    # The meter rows have their own paired lines; the plot keeps section 6's.
    plot_by_position(results, [x for x in labels if '+bar' not in x], n,
                     os.path.join(workdir, 'nll_by_position.png'))
  if (results and real_excerpt is not None
      and plot_samples(workdir, results, labels, real_excerpt,
                       os.path.join(workdir, 'samples.png'))):
    sections.append(('Sample piano rolls', '![samples](samples.png)'))
  data = {'scale': scale, 'protocol': protocol, 'floors': floors,
          'data_sample_statistics': reference, 'runs': results}
  return common.write_results(workdir, TITLE, sections, data)


class Music(skeleton.Study):
  """--scale: cpu (the CPU study), paper (PoPE's JSB recipe), quick."""
  title = TITLE
  scales = tuple(music_config.SCALES)
  default_scale = 'cpu'

  def filter_values(self):
    return {'position': tuple(ENCODINGS)}

  def prepare(self, scale):
    try:
      data = jsb.load()
    except jsb.DataError as e:
      raise skeleton.StudyError(str(e)) from None
    floors = music_baselines.baselines(data)
    print('floors: ' + ', '.join(f'{k} valid {v["valid"]:.4f} test '
                                 f'{v["test"]:.4f}' for k, v in floors.items()))
    return {'data': data, 'floors': floors}

  def runs(self, scale, seeds, context):
    labels = QUICK_ENCODINGS if scale == 'quick' else tuple(ENCODINGS)
    return study_runs(scale, seeds, labels)

  def score(self, run, path, context):
    evaluate_run(run, path, context['data'])

  def results(self, runs, workdir, context, *, score_missing):
    """{name: music.json + tags} of the finished runs (skeleton.scored_results)."""
    return skeleton.scored_results(
        runs, workdir, 'music.json',
        lambda run, path: evaluate_run(run, path, context['data']),
        score_missing=score_missing)

  def report(self, workdir, runs, results, scale, context):
    data = context['data']
    reference = music_samples.data_statistics(data['test'], data['train'],
                                              SAMPLE_STEPS)
    real = data['test'][0][:music_samples.PROMPT_STEPS + SAMPLE_STEPS]
    return report(workdir, runs, results, scale, context['floors'],
                  reference, real)


STUDY = Music()

if __name__ == '__main__':
  app.run(skeleton.main(STUDY), flags_parser=parse_flags)

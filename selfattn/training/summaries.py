"""TensorBoard output through tensorboardX (no TensorFlow needed).

Tags: train/* and eval/* scalars, eval/<metric>/len_NNNN per evaluation length
(one chart group per metric), the headline scalars Score and Score/* (below)
at every evaluation, attention/layer_N and positions/table figures
(selfattn/training/figures.py), one `description` text per run, and the HParams
plugin's session so runs with different encodings can be filtered and
compared (tests/training/test_tensorboard.py checks it against a real TensorBoard
server and in headless Chromium).

What TensorBoard 2.21's HParams tab shows in a fresh browser, and why the
names below are what they are:
- The server (plugins/hparams/backend_context.py,
  `_sort_and_reduce_to_hparams_limit`) orders the hparams by (not differs,
  name): those whose values differ across the runs first, then by name, as
  Python compares strings (upper case before lower case). An hparam differs
  when it has two distinct values among the runs that have it.
- The dashboard (tf-hparams-query-pane's `_computeHParams`, in webfiles.zip)
  keeps that order, sorts differing ones first again, and ticks only the
  first 5; `_computeMetrics` ticks the first 5 metrics in the server's order,
  which `_compute_metric_names` sorts by (tag, group): every scalar tag of a
  run is a metric.
- Parallel coordinates (tf-hparams-parallel-coords-plot,
  `_computeValidSessionGroups`) drop every run that lacks a value in any
  ticked column. So the ticked columns must be ones every run has: a column
  only some runs have (eval/loss/len_0004, an option of one encoding) hides
  the others.
- A `display_name` is only read from an experiment summary
  (`_hparams_/experiment`), which selfattn must not write (see
  Writer.hparams): the names are the column headers.
Hence:
- Five headline hparams (HEADLINE_HPARAMS), capitalised so that they sort
  before every lower-case `model.*`, `task.*`, `train.*` name and are the
  five ticked whenever they differ; every run has all five. An encoding's
  options are one string, `Encoding options`, with their effective values
  (defaults filled in), not one column per option: a column only shaw runs
  have would drop the others from parallel coordinates once it differs.
- Five headline metrics (SCORE_TAGS), three logged by every run at every
  evaluation and the two training-lengths ones wherever an evaluated length
  lies in the training range, capitalised so they sort before eval/* and train/*.
  Each is a curve: the Scalars charts' default "Ignore outliers" drops the
  lowest and highest 5% of a chart's points (at least one each), which hid
  whole runs while each run was a single point.
- The dashboard ticks 5 hparams even when fewer than 5 differ: constants
  then fill the rest, in name order. No run can tell what its neighbours
  vary, so this is TensorBoard's choice; with five headline hparams, a
  constant is ticked only when fewer than five fields differ at all.

Integers: TensorBoard's HParams have float, string and bool types only, and
a float column shows 32 as "32.000". Integer hparams (layer counts, widths,
heads, max_len, steps, batch size, seed) are logged as strings ("32"): they
read as written, and a string column is filtered by ticking values (up to 9
distinct ones; a regular expression beyond), which suits the handful of
sizes a study tries. What is given up: interval filtering (min/max boxes)
and numeric order when sorting by such a column ("128" sorts before "32").
Learning rates and other floats stay numeric. Unset (None) fields are left
out rather than logged as a string, so a float hparam stays a float.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np
import tensorboardX
from absl import logging
from tensorboardX import SummaryWriter
from tensorboardX.summary import hparams as hparams_summary

from selfattn.training import build as build_lib
from selfattn.nn import positions

# Config fields that never distinguish one experiment from another: where and
# how often a run logs, and the device mesh. Everything else is an hparam.
# Fields that change how a run is executed, not what it computes (the
# attention implementations and layer scanning give the same numbers).
NOT_HPARAMS = ('mesh.', 'eval.', 'train.log_every', 'train.checkpoint_every',
               'train.keep_checkpoints', 'model.attention_impl',
               'model.gpu_kernel', 'model.remat', 'model.scan_layers')


def eval_tag(metric: str, length: int) -> str:
  return f'eval/{metric}/len_{length:04d}'


# Config field -> the name (the column header) it is logged under in the
# HParams tab; capitalised so that these columns come first (see above).
# 'Encoding options' is not a config field: see encoding_options.
HEADLINE_HPARAMS = {
    'model.position': 'Encoding',
    'Encoding options': 'Encoding options',
    'model.randomize_positions': 'Encoding randomized',
    'task.name': 'Task',
    'task.layout': 'Task layout',
}

# The headline metrics (see above), all accuracies, so that a music run sits
# on the same scale as a synthetic one (a loss or a chance level of 1/90
# beside 1/8 would put the music runs outside the charts' default y range):
# token accuracy over the lengths Score is taken over (score_lengths), the
# same rescaled so that chance is 0 and perfect 1, sequence accuracy there,
# and token and sequence accuracy over the evaluated lengths inside the
# training range. Tags allow no spaces; upper case sorts them before eval/*
# and train/*.
SCORE_TAG = 'Score'
ABOVE_CHANCE_TAG = 'Score/above_chance'
SCORE_SEQUENCE_TAG = 'Score/sequence_accuracy'
TRAINING_LENGTHS_SCORE_TAG = 'Score/training_lengths'
TRAINING_LENGTHS_SEQUENCE_TAG = 'Score/training_lengths_sequence_accuracy'
SCORE_TAGS = (SCORE_TAG, ABOVE_CHANCE_TAG, SCORE_SEQUENCE_TAG,
              TRAINING_LENGTHS_SCORE_TAG, TRAINING_LENGTHS_SEQUENCE_TAG)


def score_lengths(lengths, max_train_len: int) -> tuple[list[int], bool]:
  """The evaluated lengths Score averages over, and whether they lie beyond
  training: those above max_train_len (report.generalization_score's), or,
  for a run that evaluates none (music: the window only), all of them, so
  that every run has a Score (and stays in parallel coordinates)."""
  beyond = [int(n) for n in lengths if int(n) > max_train_len]
  return (beyond, True) if beyond else ([int(n) for n in lengths], False)


def score_scalars(results: Mapping[Any, Mapping[str, float]],
                  train_lengths: tuple[int, int] | list[int],
                  chance: float) -> dict[str, float]:
  """The SCORE_TAGS values of one evaluation ({length: {metric: value}}).
  The Score/training_lengths* pair is left out when no evaluated length is
  inside the training range."""
  lo, hi = train_lengths
  lengths, _ = score_lengths(results, hi)
  if not lengths:
    return {}
  by_length = {int(n): m for n, m in results.items()}

  def mean(metric: str, over: list[int]) -> float:
    return float(np.mean([by_length[n][metric] for n in over]))

  score = mean('token_accuracy', lengths)
  values = {SCORE_TAG: score,
            ABOVE_CHANCE_TAG: (score - chance) / (1 - chance),
            SCORE_SEQUENCE_TAG: mean('sequence_accuracy', lengths)}
  inside = [n for n in by_length if lo <= n <= hi]
  if inside:
    values[TRAINING_LENGTHS_SCORE_TAG] = mean('token_accuracy', inside)
    values[TRAINING_LENGTHS_SEQUENCE_TAG] = mean('sequence_accuracy', inside)
  return values


def score_meaning(eval_lengths, train_lengths, chance: float) -> str:
  """One line: what Score is for this run, and its chance level."""
  lo, hi = train_lengths
  lengths, beyond = score_lengths(eval_lengths, hi)
  where = ('beyond the training lengths' if beyond
           else 'at the evaluated lengths (none is beyond training)')
  return (f'Score: token accuracy {where} {lo}-{hi}, averaged over lengths '
          f'{", ".join(map(str, lengths))}; higher is better, chance '
          f'{chance:.3f} (Score/above_chance: 0 at chance, 1 perfect).')


def encoding_options(model: Mapping[str, Any]) -> dict[str, Any]:
  """The encoding's options with their effective values (the registry's
  defaults filled in): {'clip_distance': 16, ...}; {} for an encoding
  without options. model: config.model (a ConfigDict or a dict)."""
  _, options = positions.get_position(model['position'],
                                      build_lib.position_options(model))
  return options


def options_text(options: Mapping[str, Any]) -> str:
  """{'clip_distance': 16} -> 'clip_distance=16'; {} -> '-'."""
  return ', '.join(f'{k}={v}' for k, v in sorted(options.items())) or '-'


def flatten_config(config: Mapping[str, Any], prefix: str = '') -> dict:
  """Nested config -> {'model.position': 'shaw', ...} with TensorBoard-safe
  values: bools, ints, floats and strings as they are, lists as JSON. Unset
  fields (None, or '' as in train.init_from) are left out: logged as a string
  they would turn a numeric hparam into a string one in the HParams tab."""
  flat = {}
  for key, value in config.items():
    name = f'{prefix}{key}'
    if isinstance(value, Mapping):
      flat.update(flatten_config(value, name + '.'))
    elif value is None or value == '':
      continue
    elif isinstance(value, (bool, int, float, str)):
      flat[name] = value
    else:
      flat[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
  return flat


def researcher_hparams(config: Mapping[str, Any]) -> dict:
  """The config fields a researcher varies, for the HParams tab: the
  headline fields first under their HEADLINE_HPARAMS names (the encoding's
  options as one string of effective values), then the rest under their
  dotted config names; integers as strings (see the module docstring)."""
  option_fields = {f'model.{name}' for name in positions.option_types()}
  flat = {name: value for name, value in flatten_config(config).items()
          if not name.startswith(NOT_HPARAMS) and name not in option_fields}
  flat['Encoding options'] = options_text(encoding_options(config['model']))
  headline = {HEADLINE_HPARAMS[name]: flat.pop(name)
              for name in HEADLINE_HPARAMS if name in flat}
  return {name: (str(value) if type(value) is int else value)
          for name, value in {**headline, **flat}.items()}


def effective_config(config: Mapping[str, Any]) -> dict[str, Any]:
  """The flattened config as it ran: unset fields left out, and the
  encoding's options with their effective values in place of the unset
  option fields ({'model.clip_distance': 16, ...} for shaw only)."""
  option_fields = {f'model.{name}' for name in positions.option_types()}
  flat = {name: value for name, value in flatten_config(config).items()
          if name not in option_fields}
  flat.update({f'model.{name}': value for name, value
               in encoding_options(config['model']).items()})
  return dict(sorted(flat.items()))


def description(config: Mapping[str, Any], chance: float,
                score: float | None = None, step: int | None = None) -> str:
  """The run's one Text-tab entry (markdown): encoding with its options,
  task and score first, what Score is and its chance level, then the config
  as it ran (effective_config), one `name: value` a line. score None: not
  evaluated yet."""
  model, task = config['model'], config['task']
  randomized = ', randomized positions' if model['randomize_positions'] else ''
  result = ('not evaluated yet' if score is None
            else f'**{score:.4f}** at step {step}')
  train_lengths = (task['min_len'], task['max_len'])
  lines = [f'{name}: {value}' for name, value in effective_config(config).items()]
  return '\n\n'.join([
      f'**{model["position"]}** ({options_text(encoding_options(model))}'
      f'{randomized}) on **{task["name"]}** ({task["layout"]}, trained on '
      f'lengths {train_lengths[0]}-{train_lengths[1]}): Score {result}',
      score_meaning(config['eval']['lengths'], train_lengths, chance),
      '```\n' + '\n'.join(lines) + '\n```'])


def run_title(config: Mapping[str, Any]) -> tuple[str, str]:
  """For figure titles, two lines each short enough for a figure's width:
  ('shaw on reverse, seed 0', 'clip_distance=16, ...'), the second the
  encoding's options ('-' for none) and whether positions are randomized."""
  model = config['model']
  randomized = ', randomized positions' if model['randomize_positions'] else ''
  options = encoding_options(model)
  return (f'{model["position"]} on {config["task"]["name"]}, seed '
          f'{config["seed"]}',
          (options_text(options) if options else 'no encoding options')
          + randomized)


_TBX_VERSION = getattr(tensorboardX, '__version__', 'unknown')


def _write_in_the_callers_thread(writer: SummaryWriter) -> bool:
  """Makes `writer.flush()` put every event added so far on disk; False
  where this tensorboardX's parts are not the expected ones.

  tensorboardX (2.6.5, the latest) hands each event to a thread through a
  queue, and its flush() writes out only what that thread has taken: a kill
  after a flush lost the events still queued (10 of 14 scalars reached the
  disk in a probe), though the loop flushes before each checkpoint and
  before it records an evaluation as made. So the thread is stopped (it
  writes out the queue first: the file-version and purge events) and each
  event is written when it is added. Events are few and small (scalars, a
  few figures per evaluation): the caller's thread loses nothing to this.
  """
  events = writer._get_file_writer().event_writer
  worker = getattr(events, '_worker', None)
  sink = getattr(events, '_ev_writer', None)
  if worker is None or not hasattr(sink, 'write_event'):
    # Another tensorboardX than requirements.txt's: its own writing, whose
    # flush may or may not reach the disk.
    logging.warning('tensorboardX %s: events keep its own queue; a kill may '
                    'lose those written since its last flush', _TBX_VERSION)
    return False
  worker.stop()
  events.add_event = sink.write_event
  return True


class Writer:
  """Writes only when enabled (process 0 in multi-process runs)."""

  def __init__(self, logdir: str, enabled: bool = True,
               purge_step: int | None = None):
    """purge_step: events of earlier files at this step and after are
    hidden from TensorBoard (a resumed run rewrites them; a kill left those
    written after its last checkpoint)."""
    self._writer = (SummaryWriter(logdir=logdir, purge_step=purge_step)
                    if enabled else None)
    # Whether a flush puts every event on disk (see below): where not, a
    # killed process may have lost even its first events.
    self.synchronous = bool(self._writer) and _write_in_the_callers_thread(
        self._writer)

  @property
  def enabled(self) -> bool:
    """Whether anything is written: figures need not be drawn otherwise."""
    return self._writer is not None

  def scalars(self, step: int, values: Mapping[str, float]) -> None:
    if self._writer:
      for tag, value in values.items():
        self._writer.add_scalar(tag, float(value), step)

  def image(self, tag: str, step: int, image: np.ndarray) -> None:
    """(H, W) grey or (H, W, 3) colour uint8."""
    if self._writer:
      self._writer.add_image(tag, image, step,
                             dataformats='HW' if image.ndim == 2 else 'HWC')

  def text(self, tag: str, step: int, text: str) -> None:
    if self._writer:
      self._writer.add_text(tag, text, step)

  def hparams(self, hparams: Mapping[str, Any]) -> None:
    """Registers this run as an HParams *session* (its hparams), and writes no
    experiment summary: TensorBoard then builds one experiment from every
    session under the logdir, with each hparam's values across runs (strings
    as discrete domains, `differs` where runs differ) and every run's scalar
    tags as metrics. A per-run experiment summary would make TensorBoard pick
    one run's arbitrarily and hide the others' metrics and encodings."""
    if self._writer:
      _, session_start, session_end = hparams_summary(dict(hparams), {})
      file_writer = self._writer._get_file_writer()
      for summary in (session_start, session_end):
        file_writer.add_summary(summary)

  def flush(self) -> None:
    if self._writer:
      self._writer.flush()

  def close(self) -> None:
    if self._writer:
      self._writer.close()

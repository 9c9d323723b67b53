"""train_and_evaluate(config, workdir): the one training loop and its I/O.

Data flows one way: config -> task batches -> model -> loss/metrics -> writer
and checkpoints. The compiled pieces (step, batches, evaluation) live in
steps.py; this file drives them, checkpoints, logs and summarises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from absl import logging

from selfattn.training import checkpoints
from selfattn.training import early_stopping
from selfattn.training import figures
from selfattn.training import report
from selfattn.training import software
from selfattn.training import summaries
from selfattn import tasks as tasks_lib
from selfattn.training import workdir as workdir_lib
from selfattn.training.config_checks import validate_config
from selfattn.errors import CheckpointError
from selfattn.errors import ConfigError
from selfattn.errors import NonFiniteError
from selfattn.errors import TrainingInterrupted
from selfattn.training.steps import Trainer
from selfattn.training.trainers import make_trainer
from selfattn.training.timing import StepTimer
from selfattn.training.timing import duration



# --------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------

class _StopRequests:
  """Turns SIGINT/SIGTERM into a request the loop honours at the end of the
  current step (save, flush, stop), instead of a traceback mid-step.
  Preemption on cloud accelerators arrives as SIGTERM. Installed only in the
  main thread of a single-process run: in a multi-process run every process
  would have to stop at the same step."""

  def __init__(self):
    self.signum: int | None = None
    self._previous: dict[int, Any] = {}

  def __enter__(self) -> '_StopRequests':
    if (threading.current_thread() is threading.main_thread()
        and jax.process_count() == 1):
      for signum in (signal.SIGINT, signal.SIGTERM):
        self._previous[signum] = signal.signal(signum, self._request)
    return self

  def _request(self, signum, frame) -> None:
    del frame
    self.signum = signum

  def __exit__(self, *exc) -> None:
    for signum, handler in self._previous.items():
      signal.signal(signum, handler)


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str
                       ) -> dict[str, Any]:
  """Trains, evaluates at every config.eval.lengths, checkpoints, logs.

  Resumes from the latest checkpoint in `workdir` (skipping checkpoints that
  do not restore). Returns the summary that is also written to
  `workdir/summary.json`. SIGINT/SIGTERM stop the run after the current step
  with a checkpoint (TrainingInterrupted); a second live process on the same
  workdir is refused (ConfigError).
  """
  # ---- Validation: before anything is compiled or written. ----
  task = validate_config(config, num_devices=jax.device_count())
  is_main = jax.process_index() == 0
  with workdir_lib.workdir_lock(workdir, enabled=is_main), \
      _StopRequests() as stop, kernel_choice(config):
    return _run(config, workdir, is_main, stop, task)


def kernel_choice(config: ml_collections.ConfigDict
                  ) -> contextlib.AbstractContextManager:
  """config.model.gpu_kernel around what is traced inside it: the run's
  steps, evaluation and decoding (train_and_evaluate), and a study's
  scoring of the run after it (experiments/)."""
  # A config without the field (stored before it existed, or a study's
  # stand-in) chose nothing: 'auto'.
  choice = config.get('model', {}).get('gpu_kernel', 'auto')
  if choice == 'auto':
    return contextlib.nullcontext()       # Pallas loads only when asked for
  from selfattn.nn import pallas_attention
  return pallas_attention.default_gpu_kernel(choice)


def _run(config: ml_collections.ConfigDict, workdir: str, is_main: bool,
         stop: _StopRequests, task: tasks_lib.Task) -> dict[str, Any]:
  """train_and_evaluate inside the workdir lock, with stop requests on."""
  finished = _prepare_workdir(config, workdir)
  if finished is not None:
    return finished
  trainer = make_trainer(config, task=task)
  state = trainer.init_state()
  started_from = None
  if config.train.init_from and not workdir_lib.has_checkpoints(workdir):
    # Before config.json is stored and orbax's manager makes checkpoints/:
    # a source that does not fit or does not restore leaves no config.json
    # that would refuse the corrected command (and, refused by config, no
    # trace in a workdir the run made: workdir_lock).
    _check_parameter_shapes(config.train.init_from, config, state)
    started_from = _parameters_from(config.train.init_from, state)
  # A change of how attention is executed is recorded before config.json
  # takes the new values: stored first, a stop in between would leave no
  # trace of it.
  execution_changes = workdir_lib.check_or_store_config(workdir, config,
                                                        write=False)
  if is_main and not execution_changes:
    workdir_lib.store_config(workdir, config)
  start = _starting_point(config, state, workdir, started_from)
  if execution_changes:
    if start.step:
      _note_execution_changes(config, workdir, is_main, start.step,
                              execution_changes)
    if is_main:
      workdir_lib.store_config(workdir, config)
  events = _EventLog(config, trainer, workdir, is_main, start.step)
  loop = _TrainingLoop(config, trainer, workdir, is_main, stop, start, events)
  loop.run()
  checkpoints.wait(start.mngr)
  results = loop.results
  evaluated_now = results is not None
  if results is None:   # nothing left to train: evaluate the restored state
    results = trainer.evaluate(loop.state['params'])
  summary = _summary(config, trainer.task, loop, results)
  _publish_summary(summary, workdir, is_main, events.writer, evaluated_now)
  events.writer.close()
  start.mngr.close()
  if stop.signum is not None:
    # Asked to stop after the last step (during the final evaluation): the
    # run is finished and published, but the caller (a study about to
    # train its next run) must stop too, not lose the request.
    raise TrainingInterrupted(
        f'{signal.Signals(stop.signum).name} received: the run in {workdir} '
        f'finished first (its summary is written), so nothing of it is left '
        f'to do (in a study: rerun the study\'s command for its other runs)',
        stop.signum)
  return summary


# Evaluation results: {length: {metric: value}}.
_Results = dict[int, dict[str, float]]


def _prepare_workdir(config: ml_collections.ConfigDict, workdir: str
                     ) -> dict[str, Any] | None:
  """Refuses a config that differs from the one the workdir was started
  with, and an unusable init_from for a run that starts now (a resumed or
  finished run no longer reads its source, which may be gone). Returns the
  summary of a run that already finished, else None (_run stores
  config.json once an init_from source's parameters are known to fit)."""
  workdir_lib.check_or_store_config(workdir, config, write=False)
  finished = workdir_lib.finished_summary(workdir, config.train.num_steps)
  if finished is not None:
    # Rerunning a finished run changes nothing (no retraining, no new events,
    # and its config.json stays the one its summary came from).
    print(f'{workdir} already finished at step {finished["step"]}; its '
          f'summary is {os.path.join(workdir, workdir_lib.SUMMARY_FILE)}')
    return finished
  if not workdir_lib.has_checkpoints(workdir):
    problem = workdir_lib.init_from_problem(config)
    if problem:
      raise ConfigError(problem)
  return None


@dataclasses.dataclass
class _Start:
  """Where the loop begins: the workdir's checkpoint manager and the state
  at `step` (restored from the latest checkpoint, or fresh at 0)."""
  mngr: ocp.CheckpointManager
  state: dict[str, Any]
  step: int
  # The newest checkpoint of this workdir known to be good: restored and
  # matching its checksum, or saved by this loop after a health check.
  last_checkpoint: int | None


def _note_execution_changes(config: ml_collections.ConfigDict, workdir: str,
                            is_main: bool, step: int,
                            changes: list[tuple[str, Any, Any]]) -> None:
  """Logs and records (workdir_lib.EXECUTION_FILE) a resume that executes
  attention differently from the steps before it."""
  if not is_main:
    return
  # The chunked path draws dropout masks per block, the others over the
  # whole array (Pallas and cuDNN hand dropout to the plain path).
  impl = [(a, b) for field, a, b in changes
          if field == 'model.attention_impl']
  masks = (config.model.dropout > 0 and impl
           and {'chunked', 'auto'} & set(impl[0]))
  logging.warning(
      'Resuming at step %d with %s: the same model and maths, executed '
      'differently, so later numbers match an uninterrupted run only to '
      'rounding%s; recorded in %s', step, ', '.join(
          f'config.{field} {a!r} -> {b!r}' for field, a, b in changes),
      '; and with dropout, the chunked path draws other masks than the '
      'others, so the later steps are another draw of the same training'
      if masks else '', os.path.join(workdir, workdir_lib.EXECUTION_FILE))
  workdir_lib.record_execution_changes(workdir, step, changes)


def _starting_point(config: ml_collections.ConfigDict, state: dict[str, Any],
                    workdir: str, started_from: dict[str, Any] | None) -> _Start:
  """Resumes from the latest checkpoint in `workdir` that restores; without
  one, starts from config.train.init_from's parameters (`started_from`
  where _run already read them) or `state` (fresh)."""
  mngr = checkpoints.manager(workdir, config.train.keep_checkpoints)
  restored = checkpoints.restore_latest(mngr, state)
  if restored is not None:
    state, step = restored
    logging.info('Resumed from checkpoint at step %d in %s', step, workdir)
    return _Start(mngr, state, step, last_checkpoint=step)
  if started_from is not None:
    state = started_from
  elif config.train.init_from:    # every checkpoint here was damaged
    state = _parameters_from(config.train.init_from, state)
  return _Start(mngr, state, 0, last_checkpoint=None)


class _EventLog:
  """The run's TensorBoard events: its description and hyperparameters at
  the start, and per evaluation its scalars (the headline Score/* among
  them, so each is a curve), attention maps and position table as figures.
  `writer` is also where the loop writes its training scalars."""

  def __init__(self, config: ml_collections.ConfigDict, trainer: Trainer,
               workdir: str, is_main: bool, start: int):
    # Resumed at `start`: what a killed process wrote after that checkpoint
    # is rewritten by this one, so TensorBoard hides the old copies. From
    # step 0 (no checkpoint yet), all of a killed process's events are:
    # step 0's description and hparams too, which this one writes again.
    self.writer = summaries.Writer(workdir, enabled=is_main,
                                   purge_step=start + 1 if start else 0)
    self._trainer = trainer
    self._config = config.to_dict()
    self._chance = trainer.task.chance
    self._run, self._options = summaries.run_title(self._config)
    if start == 0 or (self.writer.enabled and not self.writer.synchronous):
      # A resume keeps the first process's (at step 0, below every purge):
      # one HParams session per run, whatever its number of resumes; but
      # where events were queued (another tensorboardX), the first may
      # never have reached the disk, and a second copy is the lesser harm.
      self.writer.text('description', 0,
                       summaries.description(self._config, self._chance))
      self.writer.hparams(summaries.researcher_hparams(self._config))
    self._figures = bool(config.eval.figures)
    self._probe = report.AttentionProbe(trainer) if self._figures else None
    self._tables_logged: list[int] = []   # a fixed table is logged once per process

  def write_eval(self, step: int, params: Any, results: _Results) -> None:
    """Every event of the evaluation at `step`, written together after the
    figures are drawn: a kill while they are drawn (seconds) leaves none of
    them, so the resumed run's remade evaluation writes each once."""
    config = self._config
    scalars: dict[str, float] = {}
    for length, m in results.items():
      scalars.update({summaries.eval_tag(k, length): v for k, v in m.items()})
    scalars.update(summaries.score_scalars(
        results, (config['task']['min_len'], config['task']['max_len']),
        self._chance))
    # Every process runs the probes (they are computations over global
    # arrays); only the process that writes draws the figures.
    attention, (table, trainable) = [], (None, False)
    if self._figures:
      attention = self._probe.attention(params)
      table, trainable = self._probe.position_table(params)
    if not self.writer.enabled:
      return
    images, texts = [], []
    for layer, weights in enumerate(attention):
      figure = figures.attention_figure(
          weights, f'{self._run}: layer {layer} attention, step {step}\n'
          f'{self._options}')
      images.append((f'attention/layer_{layer}', figures.render(figure)))
    if table is not None and (trainable or not self._tables_logged):
      model = config['model']
      figure = figures.table_figure(
          table, model['position'], summaries.encoding_options(model),
          model['num_heads'], f'{self._run}, step {step}\n{self._options}')
      images.append(('positions/table', figures.render(figure)))
      self._tables_logged.append(step)
    # What the task's trainer adds (translation: whole-set validation
    # scores, sample translations and one sentence's cross-attention).
    for kind, tag, value in self._trainer.extra_summaries():
      if kind == 'scalar':
        scalars[tag] = value
      elif kind == 'text':
        texts.append((tag, value))
      elif self._figures:
        images.append((tag, value))
    self.writer.scalars(step, scalars)
    for tag, image in images:
      self.writer.image(tag, step, image)
    for tag, text in texts:
      self.writer.text(tag, step, text)
    self.writer.flush()


@dataclasses.dataclass(frozen=True)
class _Boundary:
  """What the loop does after step `done` (counted from 1); any of it
  fetches the metrics of the steps since the previous boundary."""
  done: int
  log: bool           # training scalars and a progress line
  checkpoint: bool
  stopping: bool      # SIGINT/SIGTERM: checkpoint, then stop (no evaluation)
  evaluate: bool

  @property
  def fetches(self) -> bool:
    return self.log or self.checkpoint or self.evaluate


class _TrainingLoop:
  """Trains from the starting point to config.train.num_steps. Metrics stay
  on the devices until a boundary (log, checkpoint, evaluation, stop), which
  fetches them at once, checks them, then logs, checkpoints, stops or
  evaluates. A kill loses at most the steps since the last checkpoint.
  After `run`, the public attributes are what the summary reports."""

  def __init__(self, config: ml_collections.ConfigDict, trainer: Trainer,
               workdir: str, is_main: bool, stop: _StopRequests,
               start: _Start, events: _EventLog):
    self._config = config
    self._trainer = trainer
    self._workdir = workdir
    self._is_main = is_main
    self._stop = stop
    self._mngr = start.mngr
    self._events = events
    self._writer = events.writer
    self._num_steps: int = config.train.num_steps
    self._log_every: int = config.train.log_every
    self._checkpoint_every: int = config.train.checkpoint_every
    self._eval_every: int = config.eval.every
    self.start = start.step
    self.state = start.state
    self._last_checkpoint = start.last_checkpoint   # see _Start
    self.last_good = start.step
    self._pending: list[dict] = []       # metrics of steps not yet fetched
    self.timer = StepTimer()
    self._segment_steps = 0
    self.run_start = time.perf_counter()
    self.results: _Results | None = None            # the latest evaluation
    # Every evaluation of the run, those before a resume included.
    self._eval_settings = workdir_lib.evaluation_settings(config)
    self.history = workdir_lib.evaluation_history(workdir, start.step,
                                                  self._eval_settings)
    self._early = early_stopping.EarlyStopping.for_run(config, workdir,
                                                       start.step)
    # Set when early stopping ends the run: what the summary records.
    self.stopped_early: dict[str, Any] | None = None

  def run(self) -> None:
    config, task = self._config, self._trainer.task
    if self._is_main and self.start < self._num_steps:
      logging.info('Training %s on %s (%s) for %d steps on %d device(s)',
                   config.model.position, task.name, task.description,
                   self._num_steps, self._trainer.mesh.size)
    platform = self._trainer.mesh.devices.flat[0].platform
    for note in (report.table_reach_note(config, task),
                 report.execution_note(config, platform)):
      if self._is_main and note:
        logging.warning(note)
    if self.start > 0:
      self._resume_evaluation()
      if self.stopped_early is not None:
        return
    for step in range(self.start, self._num_steps):
      self.state, metrics = self._trainer.advance(self.state)
      self._pending.append(metrics)
      self._segment_steps += 1
      boundary = self._boundary_after(step + 1,
                                      stopping=self._stop.signum is not None)
      if boundary.fetches:
        self._at_boundary(boundary)
      if self.stopped_early is not None:
        break

  def _boundary_after(self, done: int, stopping: bool) -> _Boundary:
    is_last = done == self._num_steps
    return _Boundary(
        done=done,
        # A stop request logs too: a run cut short says how far and how fast.
        log=done % self._log_every == 0 or is_last or stopping,
        checkpoint=done % self._checkpoint_every == 0 or is_last or stopping,
        stopping=stopping,
        evaluate=(done % self._eval_every == 0 or is_last) and not stopping)

  def _at_boundary(self, boundary: _Boundary) -> None:
    done = boundary.done
    fetched = self._fetch_pending()
    self._check_finite(fetched, done)
    self.timer.stop(self._segment_steps)
    self._segment_steps = 0
    if boundary.log:
      self._log_progress(fetched, done)
    if boundary.checkpoint:
      self._checkpoint(done)
    if boundary.stopping:
      self._raise_interrupted(done)
    if boundary.evaluate:
      self._evaluate(done)
    self.timer.start()

  def _fetch_pending(self) -> dict[str, np.ndarray]:
    """The pending steps' metrics, each stacked to shape (steps,)."""
    # One transfer per metric, not one per metric per step.
    fetched = jax.device_get(jax.tree.map(lambda *x: jnp.stack(x),
                                          *self._pending))
    self._pending = []
    return fetched

  def _check_finite(self, fetched: dict[str, np.ndarray], done: int) -> None:
    bad = ~(np.isfinite(fetched['loss']) & np.isfinite(fetched['grad_norm']))
    if bad.any():
      i = int(np.argmax(bad))
      self._raise_non_finite(
          f'non-finite loss ({fetched["loss"][i]}) or gradient norm '
          f'({fetched["grad_norm"][i]}) at step {done - len(bad) + 1 + i}')

  def _raise_non_finite(self, what: str) -> None:
    _stop_non_finite(self._mngr, self._writer, self._workdir, what,
                     self._last_checkpoint)

  def _log_progress(self, fetched: dict[str, np.ndarray], done: int) -> None:
    mean = {k: float(np.mean(v)) for k, v in fetched.items()}
    rate = self.timer.report_rate()
    mean['steps_per_sec'] = rate
    self._writer.scalars(done, {f'train/{k}': v for k, v in mean.items()})
    if self._is_main:
      seconds_left = self.timer.seconds_left(self._num_steps - done)
      left = ('(compiling)' if seconds_left is None
              else duration(seconds_left) + ' left')
      logging.info('step %6d/%d  loss %.4f  token acc %.4f  %.1f steps/s  '
                   '%s', done, self._num_steps, mean['loss'],
                   mean['token_accuracy'], rate, left)

  def _checkpoint(self, done: int) -> None:
    # The loss checked at this boundary was computed before this step's
    # update: check the parameters themselves, so a saved checkpoint is
    # always usable.
    if not self._trainer.healthy(self.state):
      self._raise_non_finite(f'the parameters after step {done} are '
                            f'non-finite or give a non-finite loss')
    checkpoints.save(self._mngr, done, self.state)
    self._writer.flush()       # events up to the checkpoint survive a kill
    self.last_good = self._last_checkpoint = done

  def _raise_interrupted(self, done: int) -> None:
    """After the boundary's checkpoint: waits for it, closes, stops."""
    checkpoints.wait(self._mngr)
    self._writer.close()
    self._mngr.close()
    signum = self._stop.signum
    assert signum is not None       # a stop request is never withdrawn
    name = signal.Signals(signum).name
    raise TrainingInterrupted(
        f'{name} received: stopped after step {done} with a checkpoint in '
        f'{self._workdir}; rerun the same command to resume', signum)

  def _resume_evaluation(self) -> None:
    """A resumed run makes the evaluations an uninterrupted one would have:
    the one at its starting checkpoint, when a stop request or a kill came
    between that checkpoint and its evaluation (its TensorBoard scalars and
    images, and early stopping's count), is made now; and an early-stopping
    record that already says stop (a kill after the decision) stops."""
    early = self._early
    evaluated_here = (self.start % self._eval_every == 0
                      or self.start == self._num_steps)
    made = (early.has(self.start) if early is not None
            else workdir_lib.last_evaluated(self._workdir) >= self.start)
    if evaluated_here and not made:
      self._evaluate(self.start)
    elif (early is not None and early.should_stop()
          and self.start < self._num_steps):
      self.stopped_early = early.outcome()

  def _evaluate(self, done: int) -> None:
    params = self.state['params']
    self.results = results = self._trainer.evaluate(params)
    # A resume may remake an evaluation the record already holds (early
    # stopping's record, written after it, missed it): once per step.
    self.history = [h for h in self.history if h['step'] < done] + [
        {'step': done, 'eval': {str(n): m for n, m in results.items()}}]
    self._events.write_eval(done, params, results)
    if self._is_main:
      logging.info('eval at step %d: %s', done, report.short(results))
      self._writer.flush()      # its events on disk before it counts as made
      workdir_lib.record_evaluation(self._workdir, self.history,
                                    self._eval_settings)
    if self._early is not None and self._early.observe(
        done, results, write=self._is_main) and done < self._num_steps:
      self.stopped_early = self._early.outcome()
      if self._last_checkpoint != done:
        self._checkpoint(done)     # the run ends here: its state is kept
      if self._is_main:
        logging.info('early stopping at step %d: %d evaluations without a '
                     'better %s than step %d\'s %.4f', done,
                     self._early.patience, self._early.metric,
                     self.stopped_early['best_step'],
                     self.stopped_early['best'])


def _summary(config: ml_collections.ConfigDict, task: tasks_lib.Task,
             loop: _TrainingLoop, results: _Results) -> dict[str, Any]:
  """What summary.json records and train_and_evaluate returns."""
  return {
      'task': task.name, 'position': config.model.position,
      'layout': task.layout,
      'randomize_positions': bool(config.model.randomize_positions),
      'chance': task.chance, 'step': max(loop.last_good, loop.start),
      'train_lengths': [config.task.min_len, config.task.max_len],
      'eval': {str(n): m for n, m in results.items()},
      'score': report.generalization_score(results, config.task.max_len),
      'history': loop.history,      # every evaluation, across resumes
      'train_seconds': loop.timer.train_seconds,
      # Steps per second of the loop after its first segment (which compiles).
      'steps_per_sec': loop.timer.warm_rate,
      'wall_seconds': time.perf_counter() - loop.run_start,
      'config': json.loads(config.to_json_best_effort()),
      # Which stack made these numbers (JAX's numerics move between releases).
      'versions': software.versions(),
      # Early stopping's outcome (config.train.early_stop_patience).
      **({'stopped_early': loop.stopped_early} if loop.stopped_early else {}),
  }


def _publish_summary(summary: dict[str, Any], workdir: str, is_main: bool,
                     writer: summaries.Writer, evaluated_now: bool) -> None:
  """Writes summary.json and prints the results table (process 0), and
  the run's description with its final score. The Score/* scalars were
  written at each evaluation; an invocation that evaluated nothing (a
  resumed run whose training had finished) writes them here."""
  if is_main:
    # Atomic: a crash or a full disk mid-write leaves no truncated summary,
    # which the next run would read as this one's.
    workdir_lib.write_json(os.path.join(workdir, workdir_lib.SUMMARY_FILE), summary)
    print(report.results_table(summary))
  config, step = summary['config'], summary['step']
  scores = summaries.score_scalars(summary['eval'], summary['train_lengths'],
                                   summary['chance'])
  if not evaluated_now:
    writer.scalars(step, scores)
  writer.text('description', step, summaries.description(
      config, summary['chance'], scores.get(summaries.SCORE_TAG), step))


def _check_parameter_shapes(source: str, config: ml_collections.ConfigDict,
                            state: dict[str, Any]) -> None:
  """ConfigError when the newest checkpoint of init_from's run holds
  parameters of other shapes than `state`'s, read from orbax's metadata: a
  restore into other shapes fails as if every checkpoint were damaged. The
  model fields were compared before any work (init_from_problem), so the
  cause is elsewhere: often the task (its vocabulary sizes the embedding
  and the head)."""
  differences = checkpoints.parameter_shape_differences(source, state['params'])
  if differences:
    fields = workdir_lib.init_from_differences(config, 'task')
    raise ConfigError(
        f'config.train.init_from={source!r} holds parameters of other shapes '
        f'than this model\'s: ' + '; '.join(differences) + '. '
        + ('The configs differ in ' + '; '.join(fields) if fields else
           'Its config.model and config.task are this run\'s: the code '
           'that made its parameters differs'))


def _parameters_from(source: str, state: dict[str, Any]) -> dict[str, Any]:
  """`state` with the parameters of `source`'s newest checkpoint that
  restores and matches its checksum; the optimiser state and the step stay
  fresh (a new schedule from step 0). `source` is another run's workdir:
  it is only read (a damaged checkpoint there is skipped, not moved)."""
  try:
    restored = checkpoints.read_params(source, state['params'])
  except CheckpointError as e:
    raise CheckpointError(
        f'config.train.init_from={source!r}: {e}') from None
  if restored is None:
    raise ConfigError(f'config.train.init_from={source!r} has no checkpoint '
                      f'that restores')
  logging.info('Starting from the parameters of %s (its step %d)', source,
               restored[1])
  return {**state, 'params': restored[0]}


def _stop_non_finite(mngr, writer, workdir: str, what: str,
                     last: int | None) -> None:
  """Raises NonFiniteError naming the checkpoint to go back to: `last`, the
  newest one this run restored (checksum verified) or saved (after a health
  check), not merely the newest step directory on disk."""
  checkpoints.wait(mngr)
  writer.flush()
  where = (f'the last good checkpoint is step {last} in {workdir}'
           if last is not None else f'no checkpoint was saved in {workdir}')
  raise NonFiniteError(f'{what}; {where}. Lower config.train.learning_rate '
                       f'(or raise warmup_steps) in a new --workdir')

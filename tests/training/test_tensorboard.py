"""TensorBoard itself reading selfattn's runs: the HParams tab must show every
run's encoding and every run's metrics when runs are mixed under one logdir
(what the README recommends: `tensorboard --logdir runs`)."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from selfattn.training import report
from selfattn.training import summaries


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(('localhost', 0))
    return s.getsockname()[1]


def _post(port: int, path: str, body: dict) -> dict:
  request = urllib.request.Request(
      f'http://localhost:{port}{path}', data=json.dumps(body).encode(),
      headers={'Content-Type': 'application/json',
               'X-TensorBoard-Plugin': 'hparams'})   # not required; harmless
  with urllib.request.urlopen(request, timeout=10) as response:
    return json.loads(response.read())


def _write_run(logdir, position: str, lengths, config=None, **overrides
               ) -> None:
  """A run as train.py logs it: its hparams, eval and train scalars and its
  Score/* at three evaluations (steps 10, 20, 30), without training.
  overrides: {'task.name': 'sort', ...}; config: configs/tiny.py if None."""
  if config is None:
    from configs import tiny
    config = tiny.get_config()
  config.model.position = position
  for field, value in overrides.items():
    section, name = field.split('.')
    config[section][name] = value
  writer = summaries.Writer(str(logdir))
  writer.hparams(summaries.researcher_hparams(config.to_dict()))
  for step in (10, 20, 30):
    evals = {}
    for i, n in enumerate(lengths):
      evals[n] = {'token_accuracy': 0.9 - 0.1 * i, 'loss': 1.0 + i,
                  'sequence_accuracy': 0.5 - 0.1 * i}
      writer.scalars(step, {summaries.eval_tag(k, n): v
                            for k, v in evals[n].items()})
    writer.scalars(step, {f'train/{k}': 1.0 for k in (
        'loss', 'token_accuracy', 'grad_norm', 'learning_rate',
        'steps_per_sec')})
    writer.scalars(step, summaries.score_scalars(
        evals, (config.task.min_len, config.task.max_len), 0.125))
  writer.close()


def _write_mixed_logdir(logdir) -> None:
  """Runs differing in encoding (and its options), task, layout and
  randomized positions, one also in its architecture (as a logdir mixing
  tiny and default runs does), and a music run (configs/music.py:quick:
  evaluated at its training window only, its own architecture)."""
  from configs import music
  _write_run(logdir / 'sinusoidal', 'sinusoidal', (8, 16))
  _write_run(logdir / 'rope', 'rope', (8, 16, 32, 64), **{
      'task.name': 'sort', 'task.layout': 'autoregressive'})
  _write_run(logdir / 'shaw', 'shaw', (8, 16), **{
      'model.randomize_positions': True, 'model.max_random_len': 64,
      'model.clip_distance': 4})
  _write_run(logdir / 'alibi', 'alibi', (8, 16), **{
      'model.num_hiddens': 32, 'model.num_heads': 4, 'model.num_layers': 2,
      'model.ffn_num_hiddens': 64, 'model.max_len': 128,
      'model.max_random_len': 128, 'model.randomize_positions': True})
  _write_run(logdir / 'music_shaw', 'shaw', (64,), music.get_config('quick'))


class _TensorBoard:
  """`tensorboard` over a logdir on a free port of 127.0.0.1."""

  def __init__(self, logdir):
    self.port = _free_port()
    self.server = subprocess.Popen(
        [sys.executable, '-m', 'tensorboard.main', '--logdir', str(logdir),
         '--host', '127.0.0.1', '--port', str(self.port), '--load_fast=false',
         '--reload_interval=1'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.server.terminate()
    self.server.wait(timeout=30)

  def experiment(self, runs: int) -> dict:
    """The HParams experiment once TensorBoard has read every run's score."""
    experiment = None
    for _ in range(120):
      try:
        experiment = _post(self.port, '/data/plugin/hparams/experiment',
                           {'experimentName': '', 'hparamsLimit': 1000})
        groups = self.session_groups()
        if (len(groups) == runs and all(
            any(v['name']['tag'] == summaries.SCORE_TAG
                for v in g['metricValues']) for g in groups)):
          return experiment
      except OSError:
        pass
      time.sleep(0.5)
    raise AssertionError(f'TensorBoard never showed {runs} runs: {experiment}')

  def session_groups(self, col_params=()) -> list:
    return _post(self.port, '/data/plugin/hparams/session_groups', {
        'experimentName': '', 'startIndex': 0, 'sliceSize': 10,
        'allowedStatuses': ['STATUS_UNKNOWN', 'STATUS_SUCCESS',
                            'STATUS_FAILURE', 'STATUS_RUNNING'],
        'colParams': list(col_params)}).get('sessionGroups', [])


def _default_columns(experiment: dict) -> tuple[list[str], list[str]]:
  """The hparam and metric columns a fresh browser ticks, as TensorBoard
  2.21's dashboard chooses them (tf-hparams-query-pane: `_computeHParams`
  stable-sorts the server's hparams differing-first and ticks 5,
  `_computeMetrics` ticks the server's first 5 metrics)."""
  infos = sorted(experiment['hparamInfos'], key=lambda h: not h.get('differs'))
  metrics = [m['name'].get('tag', '') for m in experiment['metricInfos']]
  return [h['name'] for h in infos[:5]], metrics[:5]


@pytest.mark.slow
def test_hparams_tab_shows_each_runs_encoding_and_all_metrics(tmp_path):
  _write_run(tmp_path / 'sinusoidal', 'sinusoidal', (8, 16))
  _write_run(tmp_path / 'rope', 'rope', (8, 16, 32, 64))
  with _TensorBoard(tmp_path) as tb:
    experiment = tb.experiment(runs=2)
    infos = {h['name']: h for h in experiment['hparamInfos']}
    position = infos['Encoding']
    assert position['differs'] is True
    assert set(position['domainDiscrete']) == {'sinusoidal', 'rope'}
    # Only what a researcher varies: no mesh or logging cadence.
    assert not any(name.startswith('mesh.') for name in infos)
    assert 'train.log_every' not in infos
    metrics = {m['name']['tag'] for m in experiment['metricInfos']}
    assert {summaries.eval_tag('token_accuracy', n)
            for n in (8, 16, 32, 64)} <= metrics
    seen = {g['hparams']['Encoding'] for g in tb.session_groups()}
    assert seen == {'sinusoidal', 'rope'}


@pytest.mark.slow
def test_hparams_tab_shows_the_comparison_by_default_sorted_by_score(tmp_path):
  """Issues 25 and 36: over a mixed logdir (a music run among them) a fresh
  browser's columns are the headline hparams and the five Score metrics;
  every run has a value in each of them (parallel coordinates drop a run
  that lacks one), no constant hparam is among them, and runs sort by
  Score."""
  _write_mixed_logdir(tmp_path)
  with _TensorBoard(tmp_path) as tb:
    experiment = tb.experiment(runs=5)
    hparams, metrics = _default_columns(experiment)
    assert hparams == list(summaries.HEADLINE_HPARAMS.values()), hparams
    assert metrics == list(summaries.SCORE_TAGS), metrics
    infos = {h['name']: h for h in experiment['hparamInfos']}
    assert not any(infos[name].get('differs') is not True
                   for name in hparams), 'a constant hparam is shown'
    groups = tb.session_groups()
    assert len(groups) == 5
    for group in groups:
      assert set(hparams) <= set(group['hparams']), group['hparams']
      tags = {v['name']['tag'] for v in group['metricValues']}
      assert set(metrics) <= tags, (group['hparams']['Task'], tags)
    # Integers are strings ("64", not 64.000); unset ones are absent, not
    # the string "default"; booleans stay booleans.
    assert infos['model.max_random_len']['type'] == 'DATA_TYPE_STRING'
    assert set(infos['model.max_random_len']['domainDiscrete']) == {
        '64', '128'}
    assert infos['train.learning_rate']['type'] == 'DATA_TYPE_FLOAT64'
    for info in experiment['hparamInfos']:
      assert 'default' not in info.get('domainDiscrete', []), info
    assert infos['Encoding randomized']['type'] == 'DATA_TYPE_BOOL'
    # Encoding options with their effective values, one column.
    assert set(infos['Encoding options']['domainDiscrete']) == {
        '-', 'alibi_symmetric=False', 'rope_base=10000.0',
        'clip_distance=4, relative_values=True, shared_heads=True',
        'clip_distance=16, relative_values=True, shared_heads=True'}
    assert 'model.clip_distance' not in infos
    # Sorted by score, best first. The score averages token accuracy over
    # the lengths above max_len 8: 0.8 (length 16) for three runs, and
    # (0.8 + 0.7 + 0.6) / 3 for rope's lengths 16, 32, 64; the music run
    # evaluates only its window (64 = max_len): 0.9 there.
    by_score = tb.session_groups([{
        'metric': {'tag': summaries.SCORE_TAG}, 'order': 'ORDER_DESC'}])
    scores = [next(v['value'] for v in g['metricValues']
                   if v['name']['tag'] == summaries.SCORE_TAG)
              for g in by_score]
    assert scores == pytest.approx([0.9, 0.8, 0.8, 0.8, 0.7])
    assert by_score[0]['hparams']['Task'] == 'jsb_chorales'
    assert by_score[-1]['hparams']['Encoding'] == 'rope'
    # Every run keeps a point inside each Score chart's default y range.
    from scripts import screenshot_tensorboard
    assert screenshot_tensorboard.runs_off_chart(tb.port) == {}


def test_outlier_clipping_hides_runs_that_are_single_points():
  """What the Score chart did before issue 36: one point per run, and
  TensorBoard's default range drops the lowest and highest point, so the
  best and worst runs vanished. With a curve per run, each keeps a point."""
  from scripts import screenshot_tensorboard
  clipped_range = screenshot_tensorboard.clipped_range
  assert clipped_range([0.12, 0.15, 0.16, 0.182]) == (0.15, 0.16)
  worst, best = [0.10, 0.12], [0.17, 0.182]
  low, high = clipped_range([0.15, 0.16, *worst, *best])
  assert any(low <= v <= high for v in worst)
  assert any(low <= v <= high for v in best)


def test_hparams_are_typed_and_headline_fields_come_first():
  """No "default" strings: unset fields are absent, integers are strings
  (TensorBoard would show 16 as 16.000), floats floats, booleans booleans;
  the headline fields come first under names that sort before every config
  name (TensorBoard orders hparams by name)."""
  from configs import tiny
  config = tiny.get_config()
  hparams = summaries.researcher_hparams(config.to_dict())
  assert list(hparams)[:5] == list(summaries.HEADLINE_HPARAMS.values())
  assert hparams['Encoding'] == 'sinusoidal' and hparams['Task'] == 'reverse'
  assert hparams['Encoding randomized'] is False
  assert hparams['Encoding options'] == '-'
  assert 'model.position' not in hparams and 'task.name' not in hparams
  assert 'model.max_random_len' not in hparams      # None: unset
  assert 'train.init_from' not in hparams           # '': unset
  assert 'default' not in hparams.values()
  assert hparams['model.num_hiddens'] == '16'
  assert hparams['seed'] == '0'
  assert type(hparams['train.learning_rate']) is float
  others = [name for name in hparams
            if name not in summaries.HEADLINE_HPARAMS.values()]
  assert max(summaries.HEADLINE_HPARAMS.values()) < min(others)
  config.model.max_random_len = 64
  assert summaries.researcher_hparams(config.to_dict())[
      'model.max_random_len'] == '64'


def test_encoding_options_are_written_with_their_effective_values():
  """Shaw's clip_distance left at its default is 16, not absent or null."""
  from configs import tiny
  config = tiny.get_config()
  config.model.position = 'shaw'
  config.model.shared_heads = False
  hparams = summaries.researcher_hparams(config.to_dict())
  assert hparams['Encoding options'] == (
      'clip_distance=16, relative_values=True, shared_heads=False')
  assert 'model.shared_heads' not in hparams       # one column, not three
  text = summaries.description(config.to_dict(), chance=0.125)
  assert text.startswith('**shaw** (clip_distance=16, relative_values=True, '
                         'shared_heads=False) on **reverse**')
  assert '\nmodel.clip_distance: 16\n' in text    # not null
  assert 'null' not in text and 'None' not in text
  assert 'model.rope_base' not in text             # another encoding's


def test_score_scalars_cover_every_run_and_sort_first():
  results = {4: {'token_accuracy': 1.0, 'loss': 0.1, 'sequence_accuracy': 1.0},
             8: {'token_accuracy': 0.5, 'loss': 1.0, 'sequence_accuracy': 0.5},
             12: {'token_accuracy': 0.25, 'loss': 2.0,
                  'sequence_accuracy': 0.0}}
  assert summaries.score_scalars(results, (1, 8), 0.125) == pytest.approx({
      summaries.SCORE_TAG: 0.25, summaries.ABOVE_CHANCE_TAG: 1 / 7,
      summaries.SCORE_SEQUENCE_TAG: 0.0,
      summaries.TRAINING_LENGTHS_SCORE_TAG: 0.75,
      summaries.TRAINING_LENGTHS_SEQUENCE_TAG: 0.75})
  # A run that evaluates no length beyond training (music: its window) is
  # scored at the lengths it evaluates, and its description says so.
  window = summaries.score_scalars({64: results[8]}, (64, 64), 1 / 90)
  assert window[summaries.SCORE_TAG] == 0.5
  assert 'none is beyond training' in summaries.score_meaning([64], (64, 64),
                                                              1 / 90)
  assert 'beyond the training lengths 1-8' in summaries.score_meaning(
      [4, 8, 12], (1, 8), 0.125)
  # TensorBoard's HParams tab ticks the first five metrics by tag.
  assert list(summaries.SCORE_TAGS) == sorted(summaries.SCORE_TAGS)
  assert max(summaries.SCORE_TAGS) < min(
      summaries.eval_tag('free_running_sequence_accuracy', 1), 'music/',
      'train/')


def test_figures_off_writes_the_same_scalars_and_no_image(tiny_config,
                                                         tmp_path):
  """config.eval.figures=False: an evaluation writes its scalars as with
  figures on, and no attention map or position table."""
  from tensorboard.backend.event_processing import event_accumulator
  from selfattn.training import steps
  from selfattn.training import train
  trainer = steps.Trainer(tiny_config)
  params = trainer.init_state()['params']
  results = {n: {'token_accuracy': 0.5, 'loss': 1.0, 'sequence_accuracy': 0.0}
             for n in tiny_config.eval.lengths}
  tags = {}
  for figures in (True, False):
    tiny_config.eval.figures = figures
    workdir = tmp_path / str(figures)
    events = train._EventLog(tiny_config, trainer, str(workdir), True, 0)
    events.write_eval(5, params, results)
    events.writer.close()
    acc = event_accumulator.EventAccumulator(str(workdir), size_guidance={
        event_accumulator.IMAGES: 0, event_accumulator.TENSORS: 0})
    acc.Reload()
    tags[figures] = acc.Tags()
  assert tags[True]['images'] and not tags[False]['images']
  assert tags[False]['scalars'] == tags[True]['scalars']


def test_an_evaluation_killed_while_drawing_leaves_none_of_its_events(
    tiny_config, tmp_path, monkeypatch):
  """The figures take seconds to draw; a kill then must not leave the
  evaluation's scalars on disk, or the resumed run's remade evaluation
  would put a second copy beside them (purge_step hides only the steps
  after the checkpoint, and this evaluation is at it)."""
  from tensorboard.backend.event_processing import event_accumulator
  from selfattn.training import figures
  from selfattn.training import steps
  from selfattn.training import train
  tiny_config.eval.figures = True
  trainer = steps.Trainer(tiny_config)
  params = trainer.init_state()['params']
  events = train._EventLog(tiny_config, trainer, str(tmp_path), True, 0)

  def killed(figure):
    raise KeyboardInterrupt('killed while drawing')
  monkeypatch.setattr(figures, 'render', killed)
  with pytest.raises(KeyboardInterrupt):
    events.write_eval(5, params, {n: {
        'token_accuracy': 0.5, 'loss': 1.0, 'sequence_accuracy': 0.0}
        for n in tiny_config.eval.lengths})
  events.writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path))
  acc.Reload()
  assert acc.Tags()['scalars'] == []
  assert acc.Tags()['images'] == []


def test_score_is_a_curve_with_one_point_per_evaluation(tiny_config, tmp_path):
  """Issue 36: Score was written once, at the end, so every run was one dot
  that outlier clipping hid. Each evaluation writes it, as it writes the
  per-length accuracies; the attention figure per evaluation, and a table
  that cannot change (sinusoidal) once."""
  from tensorboard.backend.event_processing import event_accumulator
  from selfattn.training import steps
  from selfattn.training import train
  tiny_config.eval.figures = True
  trainer = steps.Trainer(tiny_config)
  params = trainer.init_state()['params']
  events = train._EventLog(tiny_config, trainer, str(tmp_path), True, 0)
  for step, accuracy in ((5, 0.2), (10, 0.4), (15, 0.6)):
    events.write_eval(step, params, {n: {
        'token_accuracy': accuracy, 'loss': 1.0, 'sequence_accuracy': 0.0}
        for n in tiny_config.eval.lengths})
  events.writer.close()
  acc = event_accumulator.EventAccumulator(str(tmp_path), size_guidance={
      event_accumulator.IMAGES: 0, event_accumulator.TENSORS: 0})
  acc.Reload()
  for tag in summaries.SCORE_TAGS:
    assert [e.step for e in acc.Scalars(tag)] == [5, 10, 15], tag
  assert [e.value for e in acc.Scalars(summaries.SCORE_TAG)] == pytest.approx(
      [0.2, 0.4, 0.6])
  assert [e.step for e in acc.Images('attention/layer_0')] == [5, 10, 15]
  assert [e.step for e in acc.Images('positions/table')] == [5]
  assert 'description/text_summary' in acc.Tags()['tensors']


def test_tiny_run_describes_itself_and_scores_each_evaluation(tiny_run):
  from tensorboard.backend.event_processing import event_accumulator
  workdir, summary, _ = tiny_run
  acc = event_accumulator.EventAccumulator(str(workdir), size_guidance={
      event_accumulator.TENSORS: 0})
  acc.Reload()
  score = acc.Scalars(summaries.SCORE_TAG)
  assert [e.step for e in score] == [h['step'] for h in summary['history']]
  assert score[-1].value == pytest.approx(summary['score'])
  texts = acc.Tensors('description/text_summary')
  assert [t.step for t in texts] == [0, summary['step']]
  final = texts[-1].tensor_proto.string_val[0].decode()
  assert final.startswith('**sinusoidal** (-) on **reverse**')
  assert f'Score **{summary["score"]:.4f}**' in final
  assert 'chance 0.' in final
  assert 'images/help' not in acc.Tags()['tensors']


def _browser_check():
  """scripts/screenshot_tensorboard.py, or a skip naming what is missing."""
  pytest.importorskip('playwright.sync_api')
  from scripts import screenshot_tensorboard
  if not os.path.exists(screenshot_tensorboard.BROWSER):
    pytest.skip(f'no Chromium at {screenshot_tensorboard.BROWSER} '
                '(apt-get install chromium-headless-shell)')
  return screenshot_tensorboard


@pytest.mark.slow
def test_fresh_browser_shows_encoding_task_and_score(tmp_path):
  """In headless Chromium, not only through the HTTP API: the HParams
  table's default columns over a mixed logdir."""
  script = _browser_check()
  logdir = tmp_path / 'runs'
  _write_mixed_logdir(logdir)
  server, port = script.start_tensorboard(str(logdir))
  try:
    headers = script.browser_headers(port, str(tmp_path / 'hparams.png'))
  finally:
    server.terminate()
    server.wait(timeout=30)
  for header in (*summaries.HEADLINE_HPARAMS.values(), *summaries.SCORE_TAGS):
    assert header in headers, headers
  assert (tmp_path / 'hparams.png').stat().st_size > 0


def test_randomized_runs_draw_attention_at_the_positions_they_used(tiny_config):
  """The attention images of a run with randomized positions come from the
  positions its evaluation draws, not from 0..T-1 (ALiBi's weights depend on
  them)."""
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from selfattn import tasks
  from selfattn.training import steps
  tiny_config.model.position = 'alibi'
  tiny_config.model.randomize_positions = True
  tiny_config.model.max_random_len = 64
  trainer = steps.Trainer(tiny_config)
  params = trainer.init_state()['params']
  drawn = report.AttentionProbe(trainer).attention(params)[0]
  batch = tasks.make_eval_batch(trainer.task, tiny_config.seed, 8,
                                jnp.arange(1), max_random_len=64)
  model = trainer.model(params)

  def weights(positions):
    _, inter = nnx.capture(model, nnx.Intermediate)(
        batch.inputs, batch.valid_lens, positions=positions)
    return np.asarray(inter['encoder']['blks'][0]['attention'][
        'attention_weights'][...][0])

  np.testing.assert_allclose(drawn, weights(batch.positions), atol=1e-6)
  assert np.abs(drawn - weights(None)).max() > 1e-3


def test_scanned_runs_draw_each_layers_attention_as_the_loop_would(
    tiny_config):
  """A run with scan_layers drew no attention images: the stacked block's
  weights came as one array. They now come per layer, the loop's for the
  same parameters."""
  import numpy as np
  from flax import nnx
  from reference import stack_loop_into_scan
  from selfattn.training import steps
  tiny_config.model.position = 't5'
  tiny_config.model.num_layers = 2
  loop = steps.Trainer(tiny_config)
  tiny_config.model.scan_layers = True
  scanned = steps.Trainer(tiny_config)
  loop_params = loop.init_state()['params']
  scanned_model = scanned.model(scanned.init_state()['params'])
  stack_loop_into_scan(loop.model(loop_params).stack, scanned_model.stack)
  drawn = report.AttentionProbe(scanned).attention(
      nnx.state(scanned_model, nnx.Param))
  want = report.AttentionProbe(loop).attention(loop_params)
  assert len(drawn) == len(want) == 2
  for d, w in zip(drawn, want):
    np.testing.assert_allclose(d, w, atol=1e-6)


def test_the_screenshot_script_names_what_it_lacks_before_training(
    tmp_path, monkeypatch):
  """Issue 50: it trained for minutes, then died in CalledProcessError
  when the music data was missing; now it checks first, in one line."""
  from scripts import screenshot_tensorboard
  monkeypatch.setenv('SELFATTN_DATA_DIR', str(tmp_path / 'data'))
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  import urllib.error
  import urllib.request
  def offline(*args, **kwargs):
    raise urllib.error.URLError('network disabled in tests')
  monkeypatch.setattr(urllib.request, 'urlopen', offline)
  missing = screenshot_tensorboard.missing_prerequisites(
      str(tmp_path / 'no-browser'), need_music_data=True)
  assert any(m.startswith(f'the browser {tmp_path / "no-browser"}')
             for m in missing)
  assert any(m.startswith('the JSB Chorales data') for m in missing)
  # A logdir given: no training, so no music data needed.
  assert not any('JSB' in m for m in screenshot_tensorboard.missing_prerequisites(
      str(tmp_path / 'no-browser'), need_music_data=False))
  assert screenshot_tensorboard._OUTDIR.default == 'runs/tensorboard_screenshots'


def test_a_flush_puts_every_event_on_disk_before_a_kill(tmp_path):
  """Writer.flush() is what the loop relies on before a checkpoint and
  before it records an evaluation as made. tensorboardX's own flush left
  the events still queued for its writer thread: a process killed after
  flushing 14 scalars had 10 on disk in a probe."""
  from tensorboard.backend.event_processing import event_accumulator
  script = (
      'import os, sys\n'
      'from selfattn.training import summaries\n'
      'w = summaries.Writer(sys.argv[1])\n'
      'w.scalars(20, {f"eval/metric_{i:02d}": float(i) for i in range(14)})\n'
      'w.flush()\n'
      'os._exit(0)\n')                  # a kill: no close, no exit handlers
  subprocess.run([sys.executable, '-c', script, str(tmp_path)], check=True,
                 timeout=120, env={**os.environ, 'JAX_PLATFORMS': 'cpu'})
  events = event_accumulator.EventAccumulator(str(tmp_path))
  events.Reload()
  assert sorted(events.Tags()['scalars']) == [f'eval/metric_{i:02d}'
                                               for i in range(14)]


def test_another_tensorboardx_keeps_its_own_writing_with_a_warning(caplog):
  """The synchronous writing reaches into tensorboardX 2.6.5's event writer;
  one without those parts (another version) is left as it is, said once."""
  import types
  events = types.SimpleNamespace(add_event=print)       # no worker, no sink
  writer = types.SimpleNamespace(_get_file_writer=lambda: types.SimpleNamespace(
      event_writer=events))
  with caplog.at_level('WARNING'):
    assert not summaries._write_in_the_callers_thread(writer)
  assert events.add_event is print
  assert 'keep its own queue' in caplog.text


def _hparams_sessions(workdir) -> int:
  from tensorboard.backend.event_processing import event_file_loader
  return sum(value.tag == '_hparams_/session_start_info'
             for name in os.listdir(workdir)
             if name.startswith('events.out.tfevents')
             for event in event_file_loader.EventFileLoader(
                 os.path.join(workdir, name)).Load()
             for value in event.summary.value)


def test_a_resume_writes_the_hparams_session_again_where_events_were_queued(
    tiny_run, tmp_path, monkeypatch):
  """A resume leaves the HParams session to the first process (one per
  run), which the synchronous writer put on disk. Under another
  tensorboardX, whose queue a kill may have emptied before the first
  flush, the resume writes it again: a second copy, never none."""
  from runs import crashed_copy
  from configs import tiny
  from selfattn.training import train
  workdir, _, _ = tiny_run
  assert _hparams_sessions(workdir) == 1
  resumed = crashed_copy(workdir, tmp_path / 'resumed', 10)   # no events
  monkeypatch.setattr(summaries, '_write_in_the_callers_thread',
                      lambda writer: False)
  train.train_and_evaluate(tiny.get_config(), str(resumed))
  assert _hparams_sessions(resumed) == 1

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

from selfattn import report
from selfattn import summaries


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


def _write_run(logdir, position: str, lengths, **overrides) -> None:
  """A run as train.py logs it: its hparams, eval and train scalars, and
  its score, without training. overrides: {'task.name': 'sort', ...}."""
  from configs import tiny
  config = tiny.get_config()
  config.model.position = position
  for field, value in overrides.items():
    section, name = field.split('.')
    config[section][name] = value
  writer = summaries.Writer(str(logdir))
  writer.hparams(summaries.researcher_hparams(config.to_dict()))
  evals = {}
  for i, n in enumerate(lengths):
    evals[str(n)] = {'token_accuracy': 0.9 - 0.1 * i, 'loss': 1.0 + i,
                     'sequence_accuracy': 0.5 - 0.1 * i}
    writer.scalars(20, {summaries.eval_tag(k, n): v
                        for k, v in evals[str(n)].items()})
  writer.scalars(20, {f'train/{k}': 1.0 for k in (
      'loss', 'token_accuracy', 'grad_norm', 'learning_rate', 'steps_per_sec')})
  score = report.generalization_score(evals, config.task.max_len)
  writer.scalars(20, summaries.score_scalars(
      {'score': score, 'eval': evals, 'step': 20,
       'train_lengths': [config.task.min_len, config.task.max_len]}))
  writer.close()


def _write_mixed_logdir(logdir) -> None:
  """Runs differing in encoding, task, layout and randomized positions, one
  also in its architecture (as a logdir mixing tiny and default runs does):
  today's first five hparams alphabetically, model.ffn_num_hiddens ...
  model.num_hiddens, all differ there."""
  _write_run(logdir / 'sinusoidal', 'sinusoidal', (8, 16))
  _write_run(logdir / 'rope', 'rope', (8, 16, 32, 64), **{
      'task.name': 'sort', 'task.layout': 'autoregressive'})
  _write_run(logdir / 'shaw', 'shaw', (8, 16), **{
      'model.randomize_positions': True, 'model.max_random_len': 64})
  _write_run(logdir / 'alibi', 'alibi', (8, 16), **{
      'model.num_hiddens': 32, 'model.num_heads': 4, 'model.num_layers': 2,
      'model.ffn_num_hiddens': 64, 'model.max_len': 128,
      'model.max_random_len': 128, 'model.randomize_positions': True})


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
  """Issue 25 §4: over a mixed logdir a fresh browser showed the first five
  hparams alphabetically (model.ffn_num_hiddens ... model.num_hiddens) and
  five eval/loss metrics; it must show the encoding, task, layout and
  randomization, and the score, by which runs can be sorted."""
  _write_mixed_logdir(tmp_path)
  with _TensorBoard(tmp_path) as tb:
    experiment = tb.experiment(runs=4)
    hparams, metrics = _default_columns(experiment)
    assert set(summaries.HEADLINE_HPARAMS.values()) <= set(hparams), hparams
    assert metrics[:2] == [summaries.SCORE_TAG,
                           summaries.TRAINING_LENGTHS_SCORE_TAG], metrics
    infos = {h['name']: h for h in experiment['hparamInfos']}
    # Numeric hparams stay numeric: an unset max_random_len (None in the
    # sinusoidal and rope runs) is absent, not the string "default".
    assert infos['model.max_random_len']['type'] == 'DATA_TYPE_FLOAT64'
    assert infos['model.max_random_len']['domainInterval'] == {
        'minValue': 64.0, 'maxValue': 128.0}
    for info in experiment['hparamInfos']:
      assert 'default' not in info.get('domainDiscrete', []), info
    assert infos['Encoding randomized']['type'] == 'DATA_TYPE_BOOL'
    # Sorted by score, best first. The score averages token accuracy over
    # the lengths above max_len 8: 0.8 (length 16) for three runs, and
    # (0.8 + 0.7 + 0.6) / 3 for rope's lengths 16, 32, 64.
    by_score = tb.session_groups([{
        'metric': {'tag': summaries.SCORE_TAG}, 'order': 'ORDER_DESC'}])
    scores = [next(v['value'] for v in g['metricValues']
                   if v['name']['tag'] == summaries.SCORE_TAG)
              for g in by_score]
    assert scores == pytest.approx([0.8, 0.8, 0.8, 0.7])
    assert by_score[-1]['hparams']['Encoding'] == 'rope'


def test_hparams_are_typed_and_headline_fields_come_first():
  """No "default" strings: unset fields are absent, integers stay integers,
  booleans booleans; the headline fields come first under names that sort
  before every config name (TensorBoard orders hparams by name)."""
  from configs import tiny
  config = tiny.get_config()
  hparams = summaries.researcher_hparams(config.to_dict())
  assert list(hparams)[:4] == list(summaries.HEADLINE_HPARAMS.values())
  assert hparams['Encoding'] == 'sinusoidal' and hparams['Task'] == 'reverse'
  assert hparams['Encoding randomized'] is False
  assert 'model.position' not in hparams and 'task.name' not in hparams
  assert 'model.max_random_len' not in hparams      # None: unset
  assert 'train.init_from' not in hparams           # '': unset
  assert 'default' not in hparams.values()
  assert type(hparams['model.num_hiddens']) is int
  assert type(hparams['train.learning_rate']) is float
  others = [name for name in hparams
            if name not in summaries.HEADLINE_HPARAMS.values()]
  assert max(summaries.HEADLINE_HPARAMS.values()) < min(others)
  config.model.max_random_len = 64
  assert summaries.researcher_hparams(config.to_dict())[
      'model.max_random_len'] == 64


def test_score_scalars_sort_first_and_match_the_summary():
  summary = {'score': 0.25, 'train_lengths': [1, 8], 'step': 20,
             'eval': {'4': {'token_accuracy': 1.0}, '8': {'token_accuracy': 0.5},
                      '12': {'token_accuracy': 0.25}}}
  assert summaries.score_scalars(summary) == {
      summaries.SCORE_TAG: 0.25, summaries.TRAINING_LENGTHS_SCORE_TAG: 0.75}
  summary['score'] = None        # no evaluated length beyond training
  assert summaries.SCORE_TAG not in summaries.score_scalars(summary)
  # TensorBoard's HParams tab ticks the first five metrics by tag.
  assert summaries.SCORE_TAG < summaries.TRAINING_LENGTHS_SCORE_TAG < min(
      summaries.eval_tag('free_running_sequence_accuracy', 1), 'train/')


def test_tiny_run_logs_its_score_as_a_scalar(tiny_run):
  from tensorboard.backend.event_processing import event_accumulator
  workdir, summary, _ = tiny_run
  acc = event_accumulator.EventAccumulator(str(workdir))
  acc.Reload()
  score = acc.Scalars(summaries.SCORE_TAG)[-1]
  assert score.step == summary['step']
  assert score.value == pytest.approx(summary['score'])


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
  for header in (*summaries.HEADLINE_HPARAMS.values(), summaries.SCORE_TAG):
    assert header in headers, headers
  assert (tmp_path / 'hparams.png').stat().st_size > 0


def test_attention_image_normalises_each_head_and_marks_gaps_white():
  """A broad head (max weight 0.2) is drawn with the full colour range, like
  a sharp one; the gap between heads is white, unlike any weight."""
  import numpy as np
  weights = np.full((2, 3, 3), 0.1)
  weights[0, 0, 0] = 0.2
  weights[1] = np.eye(3)
  image = summaries.tile_heads(weights, scale=1)
  assert image.shape == (3, 7, 3) and image.dtype == np.uint8
  assert np.all(image[:, 3] == 255)
  np.testing.assert_array_equal(image[0, 0], image[0, 4])   # each head's max
  assert not np.array_equal(image[0, 0], image[0, 1])
  table = summaries.heatmap(np.arange(6.0).reshape(2, 3), scale=2)
  assert table.shape == (4, 6, 3)


def test_randomized_runs_draw_attention_at_the_positions_they_used(tiny_config):
  """The attention images of a run with randomized positions come from the
  positions its evaluation draws, not from 0..T-1 (ALiBi's weights depend on
  them)."""
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx
  from selfattn import steps, tasks
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

"""TensorBoard itself reading selfattn's runs: the HParams tab must show every
run's encoding and every run's metrics when runs are mixed under one logdir
(what the README recommends: `tensorboard --logdir runs`)."""

import json
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

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


def _write_run(logdir, position: str, lengths) -> None:
  from configs import tiny
  config = tiny.get_config()
  config.model.position = position
  writer = summaries.Writer(str(logdir))
  writer.hparams(summaries.researcher_hparams(config.to_dict()))
  for n in lengths:
    writer.scalars(20, {summaries.eval_tag('token_accuracy', n): 0.5})
  writer.close()


@pytest.mark.slow
def test_hparams_tab_shows_each_runs_encoding_and_all_metrics(tmp_path):
  _write_run(tmp_path / 'sinusoidal', 'sinusoidal', (8, 16))
  _write_run(tmp_path / 'rope', 'rope', (8, 16, 32, 64))
  port = _free_port()
  server = subprocess.Popen(
      [sys.executable, '-m', 'tensorboard.main', '--logdir', str(tmp_path),
       '--port', str(port), '--load_fast=false', '--reload_interval=1'],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    experiment = None
    for _ in range(120):
      try:
        experiment = _post(port, '/data/plugin/hparams/experiment',
                           {'experimentName': ''})
        if experiment.get('metricInfos'):
          break
      except OSError:
        pass
      time.sleep(0.5)
    assert experiment and experiment.get('hparamInfos'), experiment
    infos = {h['name']: h for h in experiment['hparamInfos']}
    position = infos['model.position']
    assert position['differs'] is True
    assert set(position['domainDiscrete']) == {'sinusoidal', 'rope'}
    # Only what a researcher varies: no mesh or logging cadence.
    assert not any(name.startswith('mesh.') for name in infos)
    assert 'train.log_every' not in infos
    metrics = {m['name']['tag'] for m in experiment['metricInfos']}
    assert {summaries.eval_tag('token_accuracy', n)
            for n in (8, 16, 32, 64)} <= metrics
    groups = _post(port, '/data/plugin/hparams/session_groups', {
        'experimentName': '', 'startIndex': 0, 'sliceSize': 10,
        'allowedStatuses': ['STATUS_UNKNOWN', 'STATUS_SUCCESS',
                            'STATUS_FAILURE', 'STATUS_RUNNING'],
        'colParams': []})
    seen = {g['hparams']['model.position'] for g in groups['sessionGroups']}
    assert seen == {'sinusoidal', 'rope'}
  finally:
    server.terminate()
    server.wait(timeout=30)


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

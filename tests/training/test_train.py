"""train_and_evaluate end to end on the tiny config."""

import json
import os
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from selfattn.training import report
from selfattn.training import steps
from selfattn.training import train
from selfattn.training import workdir as workdir_lib
from selfattn.training.config_checks import validate_config
from selfattn.errors import ConfigError
from runs import cli, crashed_copy, saved_params
from tiers import EXTENDED


def test_tiny_run_writes_summary_table_and_checkpoints(tiny_run):
  tmp_path, summary, out = tiny_run
  assert summary['step'] == 20
  assert set(summary['eval']) == {'4', '8', '12'}
  for m in summary['eval'].values():
    assert 0.0 <= m['token_accuracy'] <= 1.0 and np.isfinite(m['loss'])
  with open(tmp_path / 'summary.json') as f:
    assert json.load(f)['eval'] == summary['eval']
  assert '| 12 | no |' in out and '| 8 | yes |' in out
  assert sorted(os.listdir(tmp_path / 'checkpoints')) == ['10', '20']
  # Pinned metrics: an unintended change of the model, data or optimiser
  # moves these (values from this test's first run with requirements.txt).
  np.testing.assert_allclose(summary['eval']['8']['loss'], PINNED_LOSS_LEN8,
                             rtol=2e-3)


def test_tensorboard_events_read_back_with_tags_images_and_hparams(tiny_run):
  from tensorboard.backend.event_processing import event_accumulator
  from tensorboard.plugins.hparams import plugin_data_pb2
  workdir, summary, _ = tiny_run
  acc = event_accumulator.EventAccumulator(
      str(workdir), size_guidance={event_accumulator.IMAGES: 0,
                                   event_accumulator.TENSORS: 0})
  acc.Reload()
  tags = acc.Tags()
  for tag in ('train/loss', 'train/token_accuracy', 'train/grad_norm',
              'train/learning_rate', 'train/steps_per_sec',
              'eval/token_accuracy/len_0008', 'eval/sequence_accuracy/len_0012'):
    assert tag in tags['scalars'], tag
  assert [e.step for e in acc.Scalars('train/loss')] == [5, 10, 15, 20]
  final = acc.Scalars('eval/token_accuracy/len_0012')[-1]
  assert final.step == 20
  assert final.value == pytest.approx(summary['eval']['12']['token_accuracy'])
  assert 'attention/layer_0' in tags['images']
  assert 'positions/table' in tags['images']
  image = acc.Images('attention/layer_0')[-1]
  assert image.width > image.height > 0        # heads side by side
  assert 'description/text_summary' in tags['tensors']
  content = acc.PluginTagToContent('hparams')
  start = plugin_data_pb2.HParamsPluginData.FromString(
      content['_hparams_/session_start_info']).session_start_info
  assert start.hparams['Encoding'].string_value == 'sinusoidal'   # model.position
  # Integers as strings (summaries.py: TensorBoard has no integer type).
  assert start.hparams['model.num_hiddens'].string_value == '16'
  assert 'mesh.data' not in start.hparams
  assert 'model.attention_impl' not in start.hparams
  # No per-run experiment summary: TensorBoard builds one from all sessions.
  assert '_hparams_/experiment' not in content


PINNED_LOSS_LEN8 = 2.235306978225708


# Extended: test_killed_run_resumes_to_the_same_parameters makes the same
# claim through a kill, with dropout off; dropout keys come from (seed,
# step), checked in test_steps.py::test_dropout_masks_change_with_the_step
# (tests/README.md).
@EXTENDED
def test_resumed_run_ends_with_the_same_parameters(tiny_config, tmp_path):
  """With dropout on: the resumed steps redraw the masks they drew the first
  time (dropout keys come from (seed, step), not from carried rng state)."""
  tiny_config.train.num_steps = 30
  tiny_config.model.dropout = 0.2
  straight = tmp_path / 'straight'
  train.train_and_evaluate(tiny_config, str(straight))
  # Resume from the step-10 checkpoint of the same run, as after a crash.
  resumed = crashed_copy(straight, tmp_path / 'resumed', 10)
  summary = train.train_and_evaluate(tiny_config, str(resumed))
  assert summary['step'] == 30
  assert sorted(os.listdir(resumed / 'checkpoints')) == ['10', '20', '30']
  for a, b in zip(saved_params(straight), saved_params(resumed), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  assert not np.allclose(saved_params(straight, 10)[0], saved_params(straight)[0])


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_parameters(tmp_path, tiny_config):
  overrides = ['--config.train.num_steps=300', '--config.train.checkpoint_every=50',
               '--config.train.log_every=50', '--config.eval.every=300']
  # The uninterrupted reference in this process (one start-up fewer; the
  # same programs under the same XLA flags), its last checkpoint only.
  for section, name, value in (('train', 'num_steps', 300),
                               ('train', 'checkpoint_every', 300),
                               ('train', 'log_every', 50),
                               ('eval', 'every', 300)):
    tiny_config[section][name] = value
  train.train_and_evaluate(tiny_config, str(tmp_path / 'reference'))
  victim = tmp_path / 'victim'
  proc = cli(victim, *overrides, wait=False, xla_cache=tmp_path / 'xla')
  deadline = time.time() + 300
  while time.time() < deadline and proc.poll() is None:
    done = [d for d in os.listdir(victim / 'checkpoints')
            if d.isdigit()] if (victim / 'checkpoints').exists() else []
    if done:
      break
    time.sleep(0.02)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert proc.returncode == -signal.SIGKILL       # it really died mid-run
  finished = [int(d) for d in os.listdir(victim / 'checkpoints') if d.isdigit()]
  assert finished and max(finished) < 300
  again = cli(victim, *overrides)
  assert again.returncode == 0, again.stderr[-2000:]
  assert 'Resumed from checkpoint at step' in again.stderr
  # The whole state: a resume that skipped the last step (its learning rate
  # near 0 at the cosine's end) left the parameters within atol, but not
  # the step or Adam's count (a mutation audit's).
  for a, b in zip(saved_params(tmp_path / 'reference', part=None),
                  saved_params(victim, part=None), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)


# Extended: a learning outcome; 'none' and 'sinusoidal' train through the
# same loop in the commit tier (tiny_run: sinusoidal; the 'none' attention
# path in test_robustness.py::test_nan_in_padded_inputs_to_attention_changes_no_valid_output[none-plain])
# (tests/README.md).
@EXTENDED
@pytest.mark.slow
def test_no_position_information_stays_near_chance_on_order_tasks(tiny_config,
                                                                  tmp_path):
  # `precedes` depends on nothing but the order of two markers, so a model
  # without positions is held to chance exactly. (On token tasks such as
  # reverse an order-blind model beats 1/V by guessing the commonest input
  # symbol; see selfattn/tasks/registry.py.)
  c = tiny_config
  c.task.name, c.task.vocab_size = 'precedes', 4
  c.task.min_len, c.task.max_len = 4, 8
  c.model.num_layers, c.model.num_hiddens, c.model.num_heads = 2, 32, 4
  c.model.ffn_num_hiddens = 64
  c.train.num_steps, c.train.batch_size = 300, 32
  c.train.learning_rate, c.train.warmup_steps = 3e-3, 30
  c.train.log_every, c.train.checkpoint_every, c.eval.every = 100, 300, 300
  c.eval.lengths, c.eval.num_examples = [8], 256
  accuracy = {}
  for position in ('none', 'sinusoidal'):
    c.model.position = position
    summary = train.train_and_evaluate(c, str(tmp_path / position))
    accuracy[position] = summary['eval']['8']['token_accuracy']
  chance = summary['chance']
  assert chance == 0.5
  assert abs(accuracy['none'] - chance) < 0.08, accuracy
  assert accuracy['sinusoidal'] > 0.95, accuracy


# Extended: bfloat16 activations over float32 parameters through the same
# training step are lowered in tests/nn/test_lowering.py (every step there is
# a bfloat16 model) and run forward in
# tests/nn/test_encoder.py::test_low_precision_forward_is_finite_and_close_to_float32
# (tests/README.md).
@EXTENDED
def test_bfloat16_activations_train_with_float32_parameters(tiny_config, tmp_path):
  import jax.numpy as jnp
  from selfattn.training.steps import Trainer
  tiny_config.model.dtype = 'bfloat16'
  tiny_config.train.num_steps = 10
  trainer = Trainer(tiny_config)
  model = trainer.model(trainer.init_state()['params'])
  batch = trainer.train_batch(0)
  assert model.encoder(batch.inputs, batch.valid_lens).dtype == jnp.bfloat16
  summary = train.train_and_evaluate(tiny_config, str(tmp_path))
  saved = saved_params(tmp_path)
  assert all(p.dtype == np.float32 for p in saved)
  assert all(np.isfinite(m['loss']) for m in summary['eval'].values())
  # The steps moved the parameters (bfloat16 gradients that underflowed to
  # zero would leave a finite loss and float32 parameters too).
  import jax
  initial = jax.tree.leaves(trainer.init_state()['params'])
  assert len(initial) == len(saved)
  assert max(float(np.abs(np.asarray(a) - b).max())
             for a, b in zip(initial, saved)) > 1e-3


@pytest.mark.parametrize('field, value, message', [
    ('task.name', 'copy', 'config.task.name.*valid: even_pairs, '),
    ('task.layout', 'sideways', 'config.task.layout.*valid: in_place, placeholders'),
    ('task.name', 'duplicate_string',
     "task 'duplicate_string' cannot use layout 'in_place'.*valid: placeholders"),
    ('train.schedule', 'linear', 'config.train.schedule.*valid: cosine, constant'),
    ('model.alibi_symmetric', True, 'alibi_symmetric is an option of alibi, not of'),
    ('model.randomize_positions', True,
     'config.model.max_random_len=None must be an integer >= 12'),
    ('model.max_random_len', 10,
     'config.model.max_random_len=10 must be an integer >= 12'),
    ('model.position', 'xpos', 'config.model.position.*valid: none, sinusoidal'),
    # A repeat was evaluated twice, the second result overwriting the first.
    ('eval.lengths', [8, 8], r'config.eval.lengths must increase, without '
     r'repeats; got \[8, 8\] \(sorted: \[8\]\)'),
    ('eval.lengths', [12, 8, 4], 'config.eval.lengths must increase'),
    ('model.num_heads', 3, 'config.model.num_hiddens=16 is not divisible by num_heads=3'),
    ('model.num_layers', 0, 'config.model.num_layers must be a positive'),
    ('train.batch_size', -4, 'config.train.batch_size must be a positive'),
    ('model.norm', 'sandwich', 'config.model.norm.*valid: post, pre, none'),
    ('model.norm_type', 'batchnorm',
     'config.model.norm_type.*valid: layernorm, rmsnorm'),
    ('eval.free_running', 'beam',
     'config.eval.free_running.*valid: fixed_point, cache'),
    ('model.clip_distance', 4, 'clip_distance is an option of shaw, not of'),
    ('task.vocab_size', 3, None),
    ('model.attention_impl', 'flash',
     'config.model.attention_impl.*valid: plain, fused'),
    # An option of another task would be ignored.
    ('task.shift', 3, "config.task.shift=3 is an option of shift, not of "
     "task 'reverse', which would ignore it"),
    ('train.batch_tokens', 4096,
     "config.train.batch_tokens=4096 sizes the length-bucketed batches"),
    ('model.gpu_kernel', 'flash',
     'config.model.gpu_kernel.*valid: auto, cudnn, hopper, triton'),
    ('model.gpu_kernel', 'triton',
     "gpu_kernel='triton' chooses among the kernels of "
     "attention_impl='pallas'.*attention_impl is 'plain'"),
])
def test_invalid_configs_fail_before_any_work(tiny_config, tmp_path, field,
                                              value, message):
  section, name = field.split('.')
  tiny_config[section][name] = value
  if field == 'task.vocab_size':
    tiny_config.task.name = 'parity_check'
    message = "task 'parity_check' has a fixed alphabet of 2 symbols"
  if field == 'model.max_random_len':
    tiny_config.model.randomize_positions = True
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=message):
    train.train_and_evaluate(tiny_config, str(workdir))
  assert not workdir.exists()


def test_a_task_added_to_the_registry_at_run_time_is_valid(tiny_config,
                                                          monkeypatch):
  """validate_config read TASK_NAMES, a tuple fixed at import: a task a
  researcher put in tasks.TASKS was built by get_task but refused as
  unknown by the config check."""
  from selfattn import tasks
  from selfattn.training import config_checks
  monkeypatch.setitem(tasks.TASKS, 'my_reverse', tasks.TASKS['reverse'])
  tiny_config.task.name = 'my_reverse'
  assert config_checks.validate_config(tiny_config).name == 'my_reverse'


def test_switches_that_are_not_booleans_are_refused_by_name(tiny_config):
  """A config file (not an override: ConfigDict keeps a field's type) that
  sets a switch to something else than True or False is refused by
  validate_config (the first thing a run does), naming the field."""
  import ml_collections
  from selfattn.training import config_checks
  for field in ('eval.figures', 'model.remat'):
    section, name = field.split('.')
    values = tiny_config.to_dict()
    values[section][name] = 'no'
    with pytest.raises(ConfigError, match=f'config.{field} must be True or '
                       "False; got 'no'"):
      config_checks.validate_config(ml_collections.ConfigDict(values))


def test_numbers_of_the_wrong_type_are_refused_by_name(tiny_config):
  """A config file (ConfigDict keeps an override's type, a file's dict
  does not) with a string for a rate or a float for a count: refused by
  name, where a range check used to fail inside the validator."""
  import ml_collections
  from selfattn.training import config_checks
  for field, value, message in (
      ('model.dropout', '0.1',
       "config.model.dropout must be a finite number; got '0.1'"),
      ('train.warmup_steps', 1.5,
       'config.train.warmup_steps must be an integer; got 1.5')):
    section, name = field.split('.')
    values = tiny_config.to_dict()
    values[section][name] = value
    with pytest.raises(ConfigError, match=message):
      config_checks.validate_config(ml_collections.ConfigDict(values))


@pytest.mark.parametrize('settings, message', [
    ({'train.grad_clip': 0.0}, r'config.train.grad_clip must be > 0'),
    ({'train.grad_clip': -1.0}, r'config.train.grad_clip must be > 0'),
    ({'task.name': 'shift', 'task.shift': 20},
     r'config.task.shift=20 must be between 1 and config.task.max_len - 1 = 7'),
    ({'task.name': 'window_sum', 'task.window': -1},
     r'config.task.window must be >= 0'),
    ({'model.position': 'rope', 'model.rope_base': 0.0},
     r'config.model.rope_base must be > 0'),
    ({'model.position': 't5', 'model.max_distance': 0},
     r'config.model.max_distance must be > num_buckets / 4'),
    # True is an int to Python; JAX's int32 seeds stop at 2**31.
    ({'eval.lengths': [8, True]},
     r'config.eval.lengths must be a non-empty list of integers'),
    ({'seed': 99999999999}, r'config.seed must be an integer in \[0, 2\*\*31\)'),
    # A helper's fuzzing (2026-11-30): these trained, or failed at step 2
    # with a misleading message, or deep inside the validator.
    ({'train.weight_decay': -1.0}, r'config.train.weight_decay must be >= 0'),
    ({'train.learning_rate': float('inf')},
     r'config.train.learning_rate must be a finite number'),
    ({'model.position': 'rope', 'model.rope_base': float('inf')},
     r'config.model.rope_base must be a finite number'),
    ({'task.layout': 'autoregressive', 'model.position': 'xl',
      'eval.free_running': 'cache', 'model.max_len': 2},
     r"max_len=2 is below the longest sequence.*xl's cached decoding"),
    # A mutation audit (2026-12-01): each of these checks could go, or
    # measure the wrong length, with every other test passing. More heads
    # than dims were reported as an option of the encoding; a learned
    # table shorter than an autoregressive sequence (twice the task
    # length) failed at step 1 with the workdir written; b2 = 1 trains NaN.
    ({'model.position': 'rope', 'model.num_heads': 32},
     r'config.model.num_hiddens=16 is not divisible by num_heads=32'),
    ({'task.layout': 'autoregressive', 'model.position': 'learned',
      'model.max_len': 12},
     r"config.eval.lengths reach sequence length 24, above the learned "
     r"encoding's config.model.max_len=12"),
    ({'train.b2': 1.0}, r'config.train.b2 must be in \(0, 1\); got 1.0'),
])
def test_values_that_would_train_wrongly_fail_first(tiny_config, tmp_path,
                                                   settings, message):
  """They used to run to exit 0 (zero gradients, gradient ascent, nothing
  counted) or fail after compiling, with config.json already written."""
  for field, value in settings.items():
    section, _, name = field.rpartition('.')
    (tiny_config[section] if section else tiny_config)[name] = value
  workdir = tmp_path / 'run'
  with pytest.raises(ConfigError, match=message):
    train.train_and_evaluate(tiny_config, str(workdir))
  assert not workdir.exists()


@pytest.mark.parametrize('field,value,message', [
    ('transpose', 13, 'config.task.transpose must be between 0 and 12'),
    ('shift', 2, 'config.task.shift=2 is an option of shift'),
])
def test_a_data_tasks_wrong_option_is_named_before_its_data_is_read(
    monkeypatch, field, value, message):
  """Without the JSB file, a wrong music option was hidden behind the
  missing-data error: the spec's checks come before the task is built."""
  from configs import music
  from selfattn.tasks.music import task as music_task
  monkeypatch.setattr(music_task, 'training_corpus', lambda *a: pytest.fail(
      'the data set was read before the options were checked'))
  config = music.get_config('quick')
  config.task[field] = value
  with pytest.raises(ConfigError, match=message):
    validate_config(config)


def test_eval_length_beyond_learned_table_is_rejected(tiny_config, tmp_path):
  tiny_config.model.position = 'learned'
  tiny_config.eval.lengths = [8, 100]
  with pytest.raises(ConfigError, match='sequence length 100.*max_len=64'):
    train.train_and_evaluate(tiny_config, str(tmp_path / 'run'))


def test_evaluation_padding_stops_at_the_positions_the_model_has(tiny_config):
  """Evaluation pads a length up to a bucket (steps.eval_padded_length: 12
  -> 16) to share compiled programs; a learned table of 12 rows, or a
  randomized range of 12, passes validation at length 12 and used to fail
  at the first evaluation, after training, asking for row 16."""
  from selfattn.training import steps
  tiny_config.model.position = 'learned'
  tiny_config.model.max_len = 12
  tiny_config.eval.lengths = [4, 12]
  trainer = steps.Trainer(tiny_config)
  assert steps.eval_padded_length(12) == 16
  assert trainer.eval_padding(12) == 12 and trainer.eval_padding(4) == 8
  results = trainer.evaluate(trainer.init_state()['params'])
  assert set(results) == {4, 12}


def test_table_reach_is_stated_for_huang_beyond_max_len(tiny_config):
  """huang's learned table ends at max_len; xl's sinusoid does not (its
  chunked path is unbounded too: tests/nn/test_chunked.py), so no note."""
  from selfattn.training.config_checks import task_from_config
  tiny_config.model.position = 'huang'
  tiny_config.eval.lengths = [8, 100]
  note = report.table_reach_note(tiny_config, task_from_config(tiny_config))
  assert 'sequence length 100 > config.model.max_len=64' in note
  tiny_config.model.position = 'xl'
  assert report.table_reach_note(tiny_config, task_from_config(tiny_config)) is None
  tiny_config.model.position = 'huang'
  tiny_config.eval.lengths = [8, 12]
  assert report.table_reach_note(tiny_config, task_from_config(tiny_config)) is None


def test_attention_settings_that_do_not_act_as_named_are_stated(tiny_config):
  """Pallas on a CPU is its interpreter, and a gpu_kernel choice means
  nothing off a CUDA GPU: the run's start says so instead of running
  silently."""
  assert report.execution_note(tiny_config, 'cpu') is None
  tiny_config.model.attention_impl = 'pallas'
  assert 'interpreter' in report.execution_note(tiny_config, 'cpu')
  assert report.execution_note(tiny_config, 'gpu') is None
  tiny_config.model.gpu_kernel = 'triton'
  note = report.execution_note(tiny_config, 'tpu')
  assert "gpu_kernel='triton'" in note and 'interpreter' not in note
  assert report.execution_note(tiny_config, 'gpu') is None
  both = report.execution_note(tiny_config, 'cpu')
  assert 'interpreter' in both and "gpu_kernel='triton'" in both


@pytest.mark.parametrize('field, value, kernels_run', [
    ('model.position', 'xl', False),
    ('model.randomize_positions', True, False),
    ('model.dropout', 0.1, True)])    # evaluation still runs the kernels
def test_pallas_that_takes_the_plain_path_says_so_and_why(
    tiny_config, field, value, kernels_run):
  """attention_impl='pallas' where MultiHeadAttention sends attention to
  the plain path: the note names the field, and speaks of the interpreter
  only where the kernels run at all."""
  tiny_config.model.attention_impl = 'pallas'
  for name in ('alibi', 't5', 'shaw', 'rope', 'pope', 'learned', 'none'):
    tiny_config.model.position = name
    assert report.pallas_plain_reasons(tiny_config) == {}, name
  section, key = field.split('.')
  tiny_config[section][key] = value
  assert list(report.pallas_plain_reasons(tiny_config)) == [field]
  note = report.execution_note(tiny_config, 'gpu')
  assert note.startswith("attention_impl='pallas' falls back to the plain "
                         "path: config." + field)
  assert ('interpreter' in report.execution_note(tiny_config, 'cpu')
          ) == kernels_run


def test_translation_with_an_encoding_the_kernels_lack_still_runs_them(
    tiny_multi30k):
  """The decoder's cross-attention has no encoding, so with xl the kernels
  still run there (interpreted on a CPU): the note says both."""
  from tiny_corpus import tiny_translation_config
  config = tiny_translation_config(**{'model.attention_impl': 'pallas',
                                      'model.position': 'xl'})
  note = report.execution_note(config, 'cpu')
  assert note.startswith("attention_impl='pallas' falls back to the plain "
                         "path: config.model.position='xl' is an encoding")
  assert ("self-attention only: the decoder's cross-attention has no "
          "encoding and runs the kernels") in note and 'interpreter' in note


def test_resume_with_different_model_is_refused(tiny_config, tmp_path):
  tiny_config.train.num_steps = 10
  train.train_and_evaluate(tiny_config, str(tmp_path))
  tiny_config.model.num_hiddens = 32
  with pytest.raises(ConfigError, match='config.model.num_hiddens: stored 16, now 32'):
    train.train_and_evaluate(tiny_config, str(tmp_path))
  # What is evaluated is not the run's: without early stopping it may change
  # (with it, test_early_stopping refuses the change).
  tiny_config.model.num_hiddens, tiny_config.eval.lengths = 16, [4, 8]
  assert train.train_and_evaluate(tiny_config, str(tmp_path))['step'] == 10


def test_a_resume_may_execute_attention_differently_and_records_it(
    tiny_config, tmp_path, monkeypatch):
  """attention_impl, gpu_kernel and remat change how attention runs, not
  what it computes: a run resumed with other values (as when a CPU run
  continues on a GPU) goes on from its checkpoint, ends near the
  uninterrupted run, and records from which step it ran how."""
  straight = tmp_path / 'straight'
  train.train_and_evaluate(tiny_config, str(straight))
  resumed = crashed_copy(straight, tmp_path / 'resumed', 10)
  tiny_config.model.attention_impl = 'chunked'
  tiny_config.model.remat = True
  # A stop before the change is recorded leaves config.json as it was, so
  # the rerun still sees (and records) the change.
  with monkeypatch.context() as patch:
    def stopped(*args):
      raise KeyboardInterrupt
    patch.setattr(train, '_starting_point', stopped)
    with pytest.raises(KeyboardInterrupt):
      train.train_and_evaluate(tiny_config, str(resumed))
  stored = json.loads((resumed / workdir_lib.CONFIG_FILE).read_text())
  assert stored['model']['attention_impl'] == 'plain'
  # A record that cannot be read is kept aside, not overwritten.
  (resumed / workdir_lib.EXECUTION_FILE).write_text('{"truncat')
  assert train.train_and_evaluate(tiny_config, str(resumed))['step'] == 20
  assert (resumed / (workdir_lib.EXECUTION_FILE + '.damaged')).read_text() == (
      '{"truncat')
  for a, b in zip(saved_params(straight), saved_params(resumed), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=0)
  assert json.loads((resumed / workdir_lib.EXECUTION_FILE).read_text()) == [
      {'step': 10, 'field': 'model.attention_impl', 'stored': 'plain',
       'now': 'chunked'},
      {'step': 10, 'field': 'model.remat', 'stored': False, 'now': True}]
  stored = json.loads((resumed / workdir_lib.CONFIG_FILE).read_text())
  assert stored['model']['attention_impl'] == 'chunked'
  # A model field that shapes the parameters is still refused.
  tiny_config.model.position = 'shaw'
  with pytest.raises(ConfigError, match="config.model.position: stored "
                     "'sinusoidal', now 'shaw'"):
    train.train_and_evaluate(tiny_config, str(resumed))
  assert not (straight / workdir_lib.EXECUTION_FILE).exists()


def test_training_longer_goes_through_init_from_and_the_guard_needs_no_config_json(
    tiny_config, tmp_path):
  """A finished run cannot be lengthened in place (the error says why and
  how); init_from starts a new workdir from its parameters, recorded in the
  stored config, and refused in one line for another model or other
  parameter shapes; checkpoints without a config.json are refused."""
  first, longer, copied = (tmp_path / n for n in ('first', 'longer', 'copied'))
  tiny_config.train.num_steps, tiny_config.seed = 10, 1
  train.train_and_evaluate(tiny_config, str(first))
  tiny_config.train.num_steps = 20
  with pytest.raises(ConfigError, match=f'init_from={first}'):
    train.train_and_evaluate(tiny_config, str(first))

  # One step: Adam moves each parameter by at most about the learning rate,
  # so the new run (seed 0) ends within that of the first run's parameters
  # (seed 1), far from its own seed's initialisation.
  tiny_config.train.num_steps, tiny_config.train.init_from = 1, str(first)
  tiny_config.seed = 0
  train.train_and_evaluate(tiny_config, str(longer))
  step = 1.5 * tiny_config.train.learning_rate
  fresh = jax.tree.leaves(steps.Trainer(tiny_config).init_state()['params'])
  for got, want, init in zip(saved_params(longer), saved_params(first), fresh):
    assert np.abs(got - want).max() <= step
  assert max(np.abs(np.asarray(i) - w).max() for i, w in
             zip(fresh, saved_params(first))) > 10 * step
  assert json.loads((longer / 'config.json').read_text())['train'][
      'init_from'] == str(first)

  tiny_config.model.num_hiddens = 32
  with pytest.raises(ConfigError, match='holds a different model.*'
                                        'num_hiddens: stored 16, now 32'):
    train.train_and_evaluate(tiny_config, str(tmp_path / 'other'))

  # The same model on a larger alphabet: the embedding and head differ in
  # shape. Said before any restore is tried (which would call every
  # checkpoint damaged), naming the task field; the refused run leaves
  # nothing behind, so the corrected command runs there.
  tiny_config.model.num_hiddens, tiny_config.task.vocab_size = 16, 12
  other = tmp_path / 'other_alphabet'
  with pytest.raises(ConfigError, match=r'other shapes than this model.s: '
                     r'encoder/embedding/embedding: stored \(9, 16\), this '
                     r'model \(13, 16\);.*config.task.vocab_size: stored '
                     r'8, now 12'):
    train.train_and_evaluate(tiny_config, str(other))
  assert not other.exists()
  tiny_config.task.vocab_size = None
  train.train_and_evaluate(tiny_config, str(other))
  assert (other / 'config.json').exists()

  shutil.copytree(first / 'checkpoints', copied / 'checkpoints')
  tiny_config.model.num_hiddens, tiny_config.train.init_from = 16, ''
  with pytest.raises(ConfigError, match='holds checkpoints but no config.json'):
    train.train_and_evaluate(tiny_config, str(copied))


@pytest.mark.slow
def test_cli_overrides_list_fields(tmp_path):
  """'--config.eval.lengths=[..]' and '=a,b' both work (README: any field):
  one real run, and the parser's other spelling checked directly."""
  from selfattn.training.list_flag import ListParser
  assert ListParser().parse('4,12') == ListParser().parse('[4, 12]') == [4, 12]
  result = cli(tmp_path / 'run', '--config.train.num_steps=5',
               '--config.train.log_every=5', '--config.train.checkpoint_every=5',
               '--config.eval.every=5', '--config.eval.lengths=[4,12]')
  assert result.returncode == 0, result.stderr[-2000:]
  with open(tmp_path / 'run' / 'summary.json') as f:
    summary = json.load(f)
  assert list(summary['eval']) == ['4', '12']
  # The run names the stack that made its numbers.
  assert summary['versions']['jax'] == jax.__version__
  assert summary['versions']['backend'] == 'cpu'
  # A list that does not parse: test_config_types.py, in process.


@pytest.mark.slow
def test_cli_mistakes_get_one_line_not_a_traceback(tmp_path):
  """A broken config file, a workdir that is a file and a stray word: one
  line, exit 2. One case for each of selfattn.main's three routes to that
  line (the config file before absl, the workdir in main, absl's own
  parsing through parse_flags); test_cli_checks.py makes every refusal of
  each route in process (a missing or get_config-less file, an unwritable
  workdir, the flag errors), a subprocess each costing 2-3 s."""
  (tmp_path / 'broken.py').write_text('def get_config(:\n')
  (tmp_path / 'afile').write_text('')
  cases = [
      (dict(config=str(tmp_path / 'broken.py')), 'syntax error on line 1'),
      (dict(workdir=tmp_path / 'afile'), 'is a file, not a directory'),
      # absl's own errors (an unknown flag, a value of the wrong type) and a
      # stray word exited 1, on two lines or after 100 lines of usage.
      (dict(overrides=['--config.eval.lengths=8', '16']),
       'error: unexpected arguments 16: every setting'),
  ]
  for kwargs, message in cases:
    result = cli(kwargs.get('workdir', tmp_path / 'run'),
                 *kwargs.get('overrides', ()),
                 config=kwargs.get('config', 'configs/tiny.py'))
    assert result.returncode == 2, (kwargs, result.stderr[-1500:])
    assert 'Traceback' not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_cli_reports_bad_config_in_one_line(tmp_path):
  result = cli(tmp_path / 'run', '--config.model.position=xpos')
  assert result.returncode == 2
  lines = result.stderr.strip().splitlines()
  assert lines[-1].startswith("error: config.model.position='xpos' is unknown")
  assert 'Traceback' not in result.stderr
  assert not (tmp_path / 'run').exists()


# Extended: a learning outcome; the autoregressive layout's training step,
# evaluation and free-running accuracies stay in the commit tier in
# test_free_running.py::test_evaluation_through_the_cache_reports_the_same_accuracies
# and ::test_evaluation_reports_free_running_accuracy_for_the_autoregressive_layout
# (with the results table's free-running columns),
# causal attention in test_robustness.py::test_an_encoder_built_causal_attends_causally_by_default
# (tests/README.md).
@EXTENDED
@pytest.mark.slow
def test_autoregressive_layout_trains_a_causal_model(tiny_config, tmp_path):
  """--config.task.layout=autoregressive: the model attends causally (the
  logits at a position ignore every later token) and learns teacher-forced
  reverse far beyond chance."""
  from selfattn.training import build as build_lib
  from selfattn import tasks as tasks_lib
  from flax import nnx
  config = tiny_config
  config.task.layout = 'autoregressive'
  config.model.position = 'rope'
  config.model.num_hiddens, config.model.ffn_num_hiddens = 32, 64
  config.train.num_steps = config.eval.every = 300
  config.train.learning_rate = 3e-3
  task = tasks_lib.get_task('reverse', 8, layout='autoregressive')
  m = build_lib.build_model(config, task, nnx.Rngs(0))
  batch = tasks_lib.make_eval_batch(task, 0, 6, jnp.arange(2))
  x = batch.inputs
  later = x.at[:, 8:].set(task.input_symbols + 2)
  np.testing.assert_allclose(m(x)[:, :8], m(later)[:, :8], atol=1e-6)
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary['layout'] == 'autoregressive'
  assert summary['eval']['4']['token_accuracy'] > 0.5     # chance 1/8
  # Free-running accuracy (own outputs fed back) is reported beside it; a
  # wholly right example is wholly right either way.
  at4 = summary['eval']['4']
  assert at4['free_running_sequence_accuracy'] == at4['sequence_accuracy']
  assert 'free-running token acc' in report.results_table(summary)


# In the commit tier: the one training run with randomized positions (the
# training batches' draw, steps.make_train_batches with max_random_len).
def test_suite_task_trains_under_reference_layout_with_randomized_positions(
    tmp_path):
  """configs/chomsky.py: the one command of the README, at the quick scale:
  it trains, scores the lengths above training, and learns even_pairs
  (label = first bit != last bit) beyond chance."""
  from configs import chomsky
  config = chomsky.get_config('quick')
  config.task.name = 'even_pairs'
  config.model.randomize_positions = True
  config.train.num_steps = 300
  config.eval.every = 300
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary['layout'] == 'placeholders' and summary['randomize_positions']
  above = [summary['eval'][n]['token_accuracy'] for n in ('9', '12')]
  assert summary['score'] == pytest.approx(sum(above) / 2)
  assert summary['eval']['8']['token_accuracy'] > 0.75
  # A rerun of the finished run changes nothing and says so.
  again = train.train_and_evaluate(config, str(tmp_path))
  assert again == summary


# Extended: the resume claim on another config variant;
# test_killed_run_resumes_to_the_same_parameters makes it, scanned stacks'
# outputs and gradients are checked against the loop in tests/nn
# (test_encoder.py::test_scanned_layers_equal_the_loop_with_the_same_parameters),
# and their weight decay in test_schedule.py::test_weight_decay_skips_norm_scales_and_biases_with_scan_layers_too
# (tests/README.md).
@EXTENDED
@pytest.mark.slow
def test_scanned_layers_train_and_resume_exactly(tiny_config, tmp_path):
  """config.model.scan_layers: a run trains, writes its summary, and a
  resume from its step-10 checkpoint ends with the same parameters."""
  tiny_config.model.scan_layers = True
  tiny_config.model.num_layers = 2
  tiny_config.model.position = 'shaw'
  straight = tmp_path / 'straight'
  summary = train.train_and_evaluate(tiny_config, str(straight))
  assert summary['step'] == 20
  assert all(np.isfinite(m['loss']) for m in summary['eval'].values())
  resumed = crashed_copy(straight, tmp_path / 'resumed', 10)
  train.train_and_evaluate(tiny_config, str(resumed))
  for a, b in zip(saved_params(straight), saved_params(resumed), strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
  # Stacked: one array per parameter with a leading layer axis of 2.
  assert any(p.ndim >= 2 and p.shape[0] == 2 for p in saved_params(straight))


def test_a_stop_during_the_final_evaluation_is_not_lost(tiny_config, tmp_path,
                                                        monkeypatch):
  """SIGTERM after the last step (while the run evaluates and writes its
  summary) used to be dropped: the run returned normally and a study went
  on to train its next run. Now the run finishes and publishes, then says
  it was stopped."""
  from selfattn.errors import TrainingInterrupted
  run_loop = train._TrainingLoop.run

  def run_then_stop(loop):
    run_loop(loop)
    os.kill(os.getpid(), signal.SIGTERM)   # the loop is past its last step
  monkeypatch.setattr(train._TrainingLoop, 'run', run_then_stop)
  tiny_config.train.num_steps = 20
  tiny_config.train.checkpoint_every = tiny_config.eval.every = 20
  workdir = tmp_path / 'run'
  with pytest.raises(TrainingInterrupted, match='SIGTERM received: the run '
                     'in .* finished first'):
    train.train_and_evaluate(tiny_config, str(workdir))
  assert json.loads((workdir / 'summary.json').read_text())['step'] == 20

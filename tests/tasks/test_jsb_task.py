"""The jsb_chorales training task: crops of real pieces, next-token targets."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data import REQUIRES_JSB
from selfattn import tasks
from selfattn.training import config_checks
from selfattn.tasks.music import jsb
from selfattn.tasks.music.task import corpus
from selfattn.tasks.music.task import training_corpus

pytestmark = REQUIRES_JSB


def _batch(window=64, n=32, seed=0, step=0, transpose=0, crop_align=1):
  task = tasks.get_task('jsb_chorales', transpose=transpose,
                        crop_align=crop_align)
  return task, tasks.make_batch(task, seed, step, jnp.arange(n), window,
                                window)


def _find(crop, sequences):
  """(piece, start) of every place the crop occurs in a training sequence
  (tokens < 256, so a byte search finds them)."""
  needle = np.asarray(crop, np.uint8).tobytes()
  hits = []
  for i, seq in enumerate(sequences):
    haystack = np.asarray(seq, np.uint8).tobytes()
    at = haystack.find(needle)
    while at >= 0:
      hits.append((i, at))
      at = haystack.find(needle, at + 1)
  return hits


def test_crops_are_aligned_pieces_of_the_training_split_with_next_token_targets():
  task, batch = _batch()
  table, lengths = training_corpus()
  sequences = [table[i, :n] for i, n in enumerate(lengths)]
  assert task.causal and task.num_classes == 89 and task.pad == jsb.PAD
  assert task.input_vocab_size == jsb.VOCAB_SIZE
  for x, y, w in zip(np.asarray(batch.inputs), np.asarray(batch.targets),
                     np.asarray(batch.weights)):
    n = int(w.sum())
    assert np.all(w[:n] == 1) and np.all(w[n:] == 0)
    np.testing.assert_array_equal(y[:n - 1], x[1:n])      # next tokens
    hits = _find(np.append(x[:n], y[n - 1]), sequences)
    assert hits and any(s % 4 == 0 for _, s in hits)      # on a time step
    assert np.all(y[:n] < jsb.NUM_TARGETS)                # never START/PAD


def test_bar_aligned_crops_start_on_a_bar_line():
  """crop_align=16: every crop starts at a multiple of 64 tokens of its
  [START] + piece sequence (a 4/4 bar of sixteenths), where the default
  crops start on any time step."""
  table, lengths = training_corpus()
  sequences = [table[i, :n] for i, n in enumerate(lengths)]
  starts = {}
  for align in (1, 16):
    _, batch = _batch(window=96, n=48, seed=3, crop_align=align)
    found = []
    for x, y, w in zip(np.asarray(batch.inputs), np.asarray(batch.targets),
                       np.asarray(batch.weights)):
      n = int(w.sum())
      if n < 96:
        continue                     # a short piece comes whole, from 0
      hits = _find(np.append(x[:n], y[n - 1]), sequences)
      found.append(min(s for _, s in hits if s % 4 == 0))
    starts[align] = found
  assert len(starts[16]) > 30 and all(s % 64 == 0 for s in starts[16])
  assert any(s % 64 for s in starts[1])


def test_config_rejects_a_bad_crop_alignment_or_meter():
  from configs import music
  for field, value, match in (('task.crop_align', 0, 'crop_align'),
                              ('model.meter_period', -1, 'meter_period'),
                              ('model.meter_step_tokens', 0, 'meter_step')):
    config = music.get_config('quick')
    section, name = field.split('.')
    config[section][name] = value
    with pytest.raises(config_checks.ConfigError, match=match):
      config_checks.validate_config(config)


def test_crops_are_a_function_of_seed_and_step():
  _, a = _batch(seed=1, step=3)
  _, b = _batch(seed=1, step=3)
  _, c = _batch(seed=1, step=4)
  np.testing.assert_array_equal(a.inputs, b.inputs)
  assert np.any(np.asarray(a.inputs) != np.asarray(c.inputs))


def test_transposition_shifts_whole_crops_within_the_range():
  _, plain = _batch(window=128, seed=2)
  _, moved = _batch(window=128, seed=2, transpose=3)
  shifts = set()
  for x0, x1 in zip(np.asarray(plain.inputs), np.asarray(moved.inputs)):
    pitch = x0 < jsb.NUM_PITCHES
    np.testing.assert_array_equal(x1[~pitch], x0[~pitch])   # silence, START
    delta = set((x1[pitch] - x0[pitch]).tolist())
    assert len(delta) == 1                                  # one shift a crop
    shifts |= delta
  assert shifts <= set(range(-3, 4)) and len(shifts) > 3


def test_pieces_shorter_than_the_window_come_whole_and_padded():
  _, batch = _batch(window=2600, n=8)
  counts = np.asarray(batch.weights).sum(1)
  _, lengths = training_corpus()
  assert set(counts.astype(int)) <= set((lengths - 1).tolist())
  x = np.asarray(batch.inputs)
  assert np.all(x[:, 0] == jsb.START)


def test_config_rejects_a_bad_transposition(tiny_config):
  from configs import music
  config = music.get_config('quick')
  config_checks.validate_config(config)
  config.task.transpose = 13
  with pytest.raises(config_checks.ConfigError, match='transpose'):
    config_checks.validate_config(config)


def _eval_crops(eval_split, transpose=0, n=24, window=96):
  """(task, the loop's evaluation batch at length `window`)."""
  task = tasks.get_task('jsb_chorales', transpose=transpose,
                        eval_split=eval_split)
  return task, tasks.make_eval_batch(task, 0, window, jnp.arange(n))


def _sequences(split):
  table, lengths = corpus(split)
  return [table[i, :n] for i, n in enumerate(lengths)]


def test_held_out_evaluation_crops_validation_pieces_untransposed():
  """eval_split='valid': every evaluation crop is a piece of a validation
  sequence as it is (no transposition, though training transposes), and
  the training examples still come from the training split."""
  task, batch = _eval_crops('valid', transpose=3)
  valid, train = _sequences('valid'), _sequences('train')
  found_in_train = 0
  for x, y, w in zip(np.asarray(batch.inputs), np.asarray(batch.targets),
                     np.asarray(batch.weights)):
    n = int(w.sum())
    crop = np.append(x[:n], y[n - 1])
    assert _find(crop, valid), 'an evaluation crop not in the validation split'
    found_in_train += bool(_find(crop, train))
  assert found_in_train == 0          # 96-token crops: none shared by chance
  training = tasks.make_batch(task, 0, 0, jnp.arange(8), 96, 96)
  for x, w in zip(np.asarray(training.inputs), np.asarray(training.weights)):
    assert not _find(x[:int(w.sum())], valid)


def test_the_default_evaluation_is_the_training_crops_as_before():
  """eval_split='train' (the default, what every committed music run
  evaluated on): the evaluation batch is the training sampler's examples
  under the evaluation keys, transposition included."""
  task, batch = _eval_crops('train', transpose=3)
  keys = tasks.example_keys(0, tasks.registry._EVAL_STREAM, 96, jnp.arange(24))
  expected = jax.vmap(lambda k: task.sample(k, 96, 96))(keys)
  np.testing.assert_array_equal(batch.inputs, expected[0])
  np.testing.assert_array_equal(batch.targets, expected[1])
  assert tasks.DEFAULT_OPTIONS['eval_split'] == 'train'


def test_config_names_the_evaluation_splits():
  from configs import music
  from configs import tiny
  config = music.get_config('quick')
  config.task.eval_split = 'test'
  with pytest.raises(config_checks.ConfigError,
                     match=r"config.task.eval_split='test' .*valid: train, valid"):
    config_checks.validate_config(config)
  config = tiny.get_config()           # reverse: not its option
  config.task.eval_split = 'valid'
  with pytest.raises(config_checks.ConfigError,
                     match='config.task.eval_split.*jsb_chorales'):
    config_checks.validate_config(config)

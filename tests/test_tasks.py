"""Synthetic tasks: targets against NumPy definitions, determinism, sharding."""

import jax.numpy as jnp
import numpy as np
import pytest

from selfattn import tasks


def _examples(name, V=5, min_len=2, max_len=9, step=7, n=16, **opts):
  task = tasks.get_task(name, V, **opts)
  b = tasks.make_batch(task, 3, jnp.int32(step), jnp.arange(n), min_len, max_len)
  return task, [np.asarray(a) for a in b]


def _expected(name, x, k=1, w=1, V=5):
  n = len(x)
  if name == 'reverse':
    return x[::-1], np.ones(n, bool)
  if name == 'sort':
    return np.sort(x), np.ones(n, bool)
  if name == 'shift':
    return np.concatenate([np.zeros(k, int), x[:-k]])[:n], np.arange(n) >= k
  if name == 'window_sum':
    return np.array([sum(x[j] for j in range(i - w, i + w + 1) if 0 <= j < n) % V
                     for i in range(n)]), np.ones(n, bool)
  if name == 'odds_first':
    return np.concatenate([x[0::2], x[1::2]]), np.ones(n, bool)
  raise KeyError(name)


@pytest.mark.parametrize('name', ['reverse', 'sort', 'shift', 'window_sum',
                                  'odds_first'])
def test_token_task_targets_match_numpy_definition(name):
  task, (inputs, targets, weights, lens) = _examples(name, shift=2, window=1)
  assert task.chance == pytest.approx(1 / 5)
  for i in range(len(lens)):
    n = lens[i]
    x = inputs[i, :n]
    assert np.all(inputs[i, n:] == task.pad) and np.all(x < 5)
    want, counted = _expected(name, x, k=2, w=1)
    np.testing.assert_array_equal(weights[i, :n] > 0, counted)
    np.testing.assert_array_equal(targets[i, :n][counted], want[counted])
    assert np.all(weights[i, n:] == 0)


def test_classification_tasks_match_numpy_definitions():
  for name, V in [('parity_check', 2), ('even_pairs', 2), ('precedes', 5),
                  ('missing_duplicate_string', 5)]:
    task, (inputs, targets, weights, lens) = _examples(name, V=V, n=32)
    assert task.classification and task.chance == pytest.approx(
        0.5 if task.num_classes == 2 else 1 / V)
    assert np.all(weights[:, 0] == 1) and np.all(weights[:, 1:] == 0)
    cls = V + 1
    assert np.all(inputs[:, 0] == cls)
    for i in range(len(lens)):
      body = inputs[i, 1:lens[i]]
      label = targets[i, 0]
      if name == 'parity_check':
        assert label == np.sum(body == 1) % 2
      elif name == 'even_pairs':
        pairs = sum(body[j] != body[j + 1] for j in range(len(body) - 1))
        assert label == int(pairs % 2 == 0)
      elif name == 'precedes':
        a, b = np.flatnonzero(body == V + 2), np.flatnonzero(body == V + 3)
        assert len(a) == len(b) == 1 and label == int(a[0] < b[0])
      else:
        half = len(body) // 2
        hole = np.flatnonzero(body == V + 2)
        assert len(hole) == 1 and len(body) % 2 == 0
        partner = hole[0] + half if hole[0] < half else hole[0] - half
        assert label == body[partner]
  labels = _examples('precedes', n=256)[1][1][:, 0]
  assert 0.35 < labels.mean() < 0.65       # balanced classes


def test_aliases_and_errors():
  assert tasks.get_task('reverse_string', 3).sample is not None
  with pytest.raises(ValueError, match='valid: reverse, sort'):
    tasks.get_task('copy', 4)
  with pytest.raises(ValueError, match='must be 2'):
    tasks.get_task('parity_check', 4)


def test_batches_are_a_function_of_seed_step_and_example_index():
  task = tasks.get_task('sort', 6)
  a = tasks.make_batch(task, 0, jnp.int32(5), jnp.arange(8), 1, 10)
  b = tasks.make_batch(task, 0, jnp.int32(5), jnp.arange(8), 1, 10)
  c = tasks.make_batch(task, 0, jnp.int32(6), jnp.arange(8), 1, 10)
  d = tasks.make_batch(task, 1, jnp.int32(5), jnp.arange(8), 1, 10)
  np.testing.assert_array_equal(a.inputs, b.inputs)
  assert not np.array_equal(a.inputs, c.inputs)
  assert not np.array_equal(a.inputs, d.inputs)
  # A process generating examples 4..7 gets exactly those rows of the batch.
  shard = tasks.make_batch(task, 0, jnp.int32(5), jnp.arange(4, 8), 1, 10)
  for x, y in zip(shard, a):
    np.testing.assert_array_equal(x, np.asarray(y)[4:])
  lens = np.asarray(tasks.make_batch(task, 0, jnp.int32(1), jnp.arange(512),
                                     1, 10).valid_lens)
  assert lens.min() == 1 and lens.max() == 10


def test_eval_batches_have_exact_length_and_differ_from_training():
  task = tasks.get_task('precedes', 4)
  ev = tasks.make_eval_batch(task, 0, 11, jnp.arange(6))
  assert ev.inputs.shape == (6, 12) and np.all(np.asarray(ev.valid_lens) == 12)
  assert np.all(np.asarray(ev.inputs) != task.pad)
  train = tasks.make_batch(task, 0, jnp.int32(11), jnp.arange(6), 11, 11)
  assert not np.array_equal(ev.inputs, train.inputs)

"""Free-running evaluation of the autoregressive layout against a
step-by-step greedy decoding written out in NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import tiny
from selfattn.training import report
from selfattn.training import steps
from selfattn import tasks as tasks_lib
from selfattn.training.free_running import cached_free_running_logits
from selfattn.training.free_running import free_running_logits
from selfattn.training.build import build_model
from tiers import EXTENDED


def _model_and_batch(length=6, padded=8, examples=2, position='rope',
                     max_random_len=None):
  config = tiny.get_config()
  config.task.layout = 'autoregressive'
  config.model.position = position
  task = tasks_lib.get_task('reverse', 8, layout='autoregressive')
  model = build_model(config, task, nnx.Rngs(3))
  batch = tasks_lib.make_eval_batch(task, 0, length, jnp.arange(examples),
                                    padded_length=padded,
                                    max_random_len=max_random_len)
  return task, model, batch


def _ragged_batch(task, max_random_len=None):
  """Examples of lengths 3 and 6 in one batch padded to 8: their fed-back
  outputs start at different positions."""
  parts = [tasks_lib.make_eval_batch(task, 0, n, jnp.arange(2), padded_length=8,
                                     max_random_len=max_random_len)
           for n in (3, 6)]
  return jax.tree.map(lambda *xs: jnp.concatenate(xs), *parts)


def _greedy_reference(model, task, batch):
  """Decode one slot at a time: the token after output position t is the
  model's argmax at t, fed back as first_output_token + class."""
  inputs = np.array(batch.inputs)
  first = task.first_output_token
  # One compiled pass, reused for every slot (one example) and at the end
  # (the batch): it compiles once per shape.
  run = nnx.jit(lambda m, x, lens, positions: m(x, lens, positions=positions))
  for b in range(inputs.shape[0]):
    slots = np.flatnonzero(inputs[b] >= first)          # fed-back positions
    for t in slots:                                      # in order
      logits = np.asarray(run(model, jnp.asarray(inputs[b:b + 1]),
                              batch.valid_lens[b:b + 1],
                              None if batch.positions is None
                              else batch.positions[b:b + 1]))
      inputs[b, t] = first + int(np.argmax(logits[0, t - 1]))
  return inputs, run(model, jnp.asarray(inputs), batch.valid_lens,
                     batch.positions)


def test_free_running_equals_greedy_decoding_one_slot_at_a_time():
  """An untrained causal model (its predictions are mostly wrong, so what it
  feeds back differs from the teacher's tokens): the fixed-point rounds give
  the logits of the sequence that one-slot-at-a-time greedy decoding builds,
  padding included."""
  task, model, batch = _model_and_batch()
  decoded, want = _greedy_reference(model, task, batch)
  assert (decoded != np.asarray(batch.inputs)).sum() > 3   # the test can tell
  logits_of = lambda b: model(b.inputs, b.valid_lens)
  got = jax.jit(lambda b: free_running_logits(
      logits_of, b, first_output_token=task.first_output_token,
      max_rounds=task.spec.output_length(8) - 1))(batch)
  np.testing.assert_allclose(got, want, atol=1e-5)


# rope (positions 0..T-1) and learned (randomized positions, stored in the
# cache as for every encoding) in the commit tier. Extended: huang and shaw,
# the same cached_free_running_logits path; their caches against the full
# causal pass are
# tests/nn/test_decoder.py::test_cached_decoding_equals_the_full_causal_pass[huang]
# and [shaw] (tests/README.md).
@pytest.mark.parametrize('position, randomized', [
    ('rope', False), pytest.param('huang', False, marks=EXTENDED),
    pytest.param('shaw', True, marks=EXTENDED), ('learned', True)])
def test_cached_free_running_equals_greedy_decoding(position, randomized):
  """Through the key/value caches, one token at a time, on a batch whose
  examples start their outputs at different positions (and with randomized
  positions): the logits of one-slot-at-a-time greedy decoding, at every
  valid position. Padding positions are not compared: the full pass masks
  padded keys, the cached steps never see a later token at all."""
  random_len = 24 if randomized else None
  task, model, _ = _model_and_batch(position=position,
                                    max_random_len=random_len)
  batch = _ragged_batch(task, random_len)
  decoded, want = _greedy_reference(model, task, batch)
  assert (decoded != np.asarray(batch.inputs)).sum() > 3
  got = nnx.jit(lambda m, b: cached_free_running_logits(
      m, b, first_output_token=task.first_output_token))(model, batch)
  valid = (np.arange(batch.inputs.shape[1])
           < np.asarray(batch.valid_lens)[:, None])
  np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(want)[valid],
                             atol=1e-5)
  fixed = nnx.jit(lambda m, batch: free_running_logits(
      lambda b: m(b.inputs, b.valid_lens, positions=b.positions), batch,
      first_output_token=task.first_output_token,
      max_rounds=task.spec.output_length(8) - 1))(model, batch)
  np.testing.assert_allclose(np.asarray(got)[valid], np.asarray(fixed)[valid],
                             atol=1e-5)


def test_a_model_that_is_always_right_scores_the_same_either_way():
  """An oracle (logits that put all mass on the target) feeds back exactly
  the teacher's tokens: free-running and teacher-forced logits are equal."""
  task, _, batch = _model_and_batch()
  oracle = lambda b: 10.0 * jax.nn.one_hot(b.targets, task.num_classes)
  got = jax.jit(lambda batch: free_running_logits(
      oracle, batch, first_output_token=task.first_output_token,
      max_rounds=task.spec.output_length(8) - 1))(batch)
  np.testing.assert_array_equal(got, oracle(batch))


def test_evaluation_reports_free_running_accuracy_for_the_autoregressive_layout():
  """Trainer.evaluate adds the free-running accuracies for the causal layout
  (and only there). Every output of reverse is counted, so an example is
  wholly right free-running exactly when it is wholly right teacher-forced:
  the two sequence accuracies agree; the token accuracies need not."""
  config = tiny.get_config()
  config.task.layout = 'autoregressive'
  trainer = steps.Trainer(config)
  params = trainer.init_state()['params']
  results = trainer.evaluate(params, lengths=[6])[6]
  assert set(results) >= {'free_running_token_accuracy',
                          'free_running_sequence_accuracy'}
  assert (results['free_running_sequence_accuracy']
          == results['sequence_accuracy'])
  # The run's results table gives them their own columns.
  table = report.results_table({
      'position': 'sinusoidal', 'task': 'reverse', 'step': 0, 'chance': 0.1,
      'train_lengths': [1, 5], 'eval': {'6': results}}).splitlines()
  assert 'free-running token acc | free-running sequence acc |' in table[2]
  assert table[-1].endswith(
      f'| {results["free_running_token_accuracy"]:.4f} | '
      f'{results["free_running_sequence_accuracy"]:.4f} |')
  config.task.layout = 'placeholders'
  placeholders = steps.Trainer(config)
  plain = placeholders.evaluate(placeholders.init_state()['params'],
                                lengths=[6])[6]
  assert 'free_running_token_accuracy' not in plain


def test_evaluation_through_the_cache_reports_the_same_accuracies():
  """config.eval.free_running='cache' and 'fixed_point' score the same
  free-running accuracies (a model trained a few steps, whose fed-back
  outputs differ from the teacher's, so the two paths have work to do)."""
  results = {}
  for impl in ('fixed_point', 'cache'):
    config = tiny.get_config()
    config.task.layout = 'autoregressive'
    config.eval.free_running = impl
    trainer = steps.Trainer(config)
    state = trainer.init_state()
    for _ in range(15):
      state, _ = trainer.advance(state)
    results[impl] = trainer.evaluate(state['params'], lengths=[6])[6]
  fixed, cached = results['fixed_point'], results['cache']
  assert fixed['free_running_token_accuracy'] != fixed['token_accuracy']
  for name in ('free_running_token_accuracy', 'free_running_sequence_accuracy'):
    assert cached[name] == fixed[name]

"""The train step alone (steps.train_step, a module-level pure function),
pinned like nanodo's train_test: a silent change to the loss, the optimiser,
the schedule or the initialisation fails here."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from selfattn.training import steps

# configs/tiny.py, seed 0, three steps from initialisation on the batches of
# steps 0, 1, 2: (loss, gradient norm, learning rate). Recorded with the pinned
# requirements on CPU (float32); a change here must be explained in its commit.
GOLDEN = [
    (2.502582311630249, 1.6683714389801025, 0.0),
    (2.394794464111328, 1.1568492650985718, 0.001500000013038516),
    (2.7319633960723877, 1.528252363204956, 0.003000000026077032),
]


def _pieces(config):
  trainer = steps.Trainer(config)
  step = jax.jit(lambda state, batch: steps.train_step(
      state, batch, graphdef=trainer.graphdef, rest=trainer.rest, tx=trainer.tx,
      schedule=steps.learning_rate_schedule(config.train),
      dropout_key=steps.dropout_key_for(config.seed)))
  return trainer, step


def test_golden_first_steps(tiny_config):
  trainer, step = _pieces(tiny_config)
  state = trainer.init_state()
  for i, (loss, grad_norm, lr) in enumerate(GOLDEN):
    state, metrics = step(state, trainer.train_batch(i))
    assert float(metrics['loss']) == pytest.approx(loss, rel=1e-5)
    assert float(metrics['grad_norm']) == pytest.approx(grad_norm, rel=1e-5)
    assert float(metrics['learning_rate']) == pytest.approx(lr, rel=1e-6, abs=1e-12)
  assert int(state['step']) == 3


def test_dropout_masks_change_with_the_step(tiny_config):
  """Mutation caught: removing the per-step dropout reseed in steps.forward
  (every step would reuse one mask: the model's rng state is not carried)."""
  tiny_config.model.dropout = 0.3
  trainer, step = _pieces(tiny_config)
  state = trainer.init_state()
  batch = trainer.train_batch(0)
  at = lambda s: float(step({**state, 'step': jnp.int32(s)}, batch)[1]['loss'])
  assert at(0) == at(0)                      # a function of the step
  assert abs(at(0) - at(7)) > 1e-4           # another step, another mask
  # Evaluation applies no dropout: the same parameters give what the model
  # built without dropout gives (comparing two evaluations with each other
  # would pass with one fixed mask).
  logits = steps.forward(trainer.graphdef, trainer.rest, state['params'], batch)
  tiny_config.model.dropout = 0.0
  plain = steps.Trainer(tiny_config)
  np.testing.assert_allclose(
      logits, steps.forward(plain.graphdef, plain.rest, state['params'], batch),
      atol=1e-6)


def test_scanned_layers_train_with_dropout(tiny_config):
  """model.scan_layers with dropout crashed on its first step: the per-layer
  dropout keys of the scanned blocks refused nnx.reseed's default policy.
  Now each layer's key is split from the step's: the loss is a function of
  the step, and the scanned layers draw masks of their own."""
  tiny_config.model.dropout = 0.3
  tiny_config.model.scan_layers = True
  tiny_config.model.num_layers = 2
  trainer, step = _pieces(tiny_config)
  state = trainer.init_state()
  batch = trainer.train_batch(0)
  at = lambda s: float(step({**state, 'step': jnp.int32(s)}, batch)[1]['loss'])
  assert np.isfinite(at(0)) and at(0) == at(0)
  assert abs(at(0) - at(7)) > 1e-4
  model = nnx.merge(trainer.graphdef, state['params'], trainer.rest,
                    copy=True)
  nnx.reseed(model, policy='match_shape', dropout=jax.random.key(1))
  keys = [np.asarray(jax.random.key_data(v.key.get_value()))
          for _, v in nnx.iter_graph(model)
          if isinstance(v, nnx.RngStream) and v.key.tag == 'dropout']
  per_layer = [k for k in keys if k.ndim == 2]    # (layers, key words)
  assert per_layer and all(len(np.unique(k, axis=0)) == 2 for k in per_layer)


def test_step_timer_leaves_compilation_out_of_the_warm_rate(monkeypatch):
  from selfattn.training import timing
  clock = iter([0.0, 10.0, 10.0, 11.0, 11.0, 12.0])
  monkeypatch.setattr(timing.time, 'perf_counter', lambda: next(clock))
  timer = timing.StepTimer()                 # t = 0
  assert timer.seconds_left(100) is None     # nothing warm yet
  timer.stop(5)                              # 5 steps in 10 s: compiling
  timer.start()
  timer.stop(10)                             # 10 steps in 1 s
  assert timer.report_rate() == pytest.approx(15 / 11)
  timer.start()
  timer.stop(10)
  assert timer.report_rate() == pytest.approx(10.0)   # a new window
  assert timer.warm_rate == pytest.approx(10.0)       # 20 steps in 2 s
  assert timer.seconds_left(100) == pytest.approx(10.0)
  assert timer.train_seconds == pytest.approx(12.0)


def test_evaluation_splits_long_lengths_by_tokens_and_sums_exactly(
    tiny_config, monkeypatch):
  """Long evaluation lengths get proportionally fewer examples per chunk
  (about a training batch of tokens), and the metrics do not depend on the
  chunking: sums over chunks equal one pass over all examples."""
  tiny_config.eval.num_examples = 24
  trainer = steps.Trainer(tiny_config)
  max_len = tiny_config.task.max_len
  short, long_ = trainer.eval_chunk_size(max_len), trainer.eval_chunk_size(
      8 * max_len)
  assert long_ * trainer.task.seq_len(8 * max_len) <= (
      tiny_config.train.batch_size * trainer.task.seq_len(max_len))
  assert long_ < short
  params = trainer.init_state()['params']
  length = 4 * max_len
  chunked = trainer.evaluate(params, [length])[length]
  assert trainer.eval_chunk_size(steps.eval_padded_length(length)) < 24
  monkeypatch.setattr(trainer, 'eval_chunk_size', lambda padded: 24)
  whole = trainer.evaluate(params, [length])[length]
  for key in whole:
    assert chunked[key] == pytest.approx(whole[key], rel=1e-5), key

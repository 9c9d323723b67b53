"""steps.learning_rate_schedule and steps.make_optimizer alone, against
hand-computed values (as nanodo's optimizer test does): the schedule at 0, at
the warmup boundary, at num_steps - 1 and at num_steps for both schedules,
and the optimiser chain's order (global-norm clipping before AdamW)."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from selfattn.training import steps

PEAK = 0.01


def _train(**overrides):
  train = ml_collections.ConfigDict(dict(
      learning_rate=PEAK, num_steps=100, warmup_steps=10, schedule='cosine',
      final_lr_fraction=0.0, b2=0.999, weight_decay=0.01, grad_clip=1.0))
  train.update(overrides)
  return train


def _cosine(t, *, warmup, num_steps, end):
  """The cosine leg by hand: from PEAK at `warmup` to `end` at num_steps
  (the horizon counts the warmup steps)."""
  progress = (t - warmup) / (num_steps - warmup)
  return end + (PEAK - end) * 0.5 * (1 + math.cos(math.pi * progress))


@pytest.mark.parametrize('final', [0.0, 0.1])
def test_cosine_schedule_at_its_landmarks(final):
  schedule = steps.learning_rate_schedule(_train(final_lr_fraction=final))
  end = PEAK * final
  want = {
      0: 0.0,                                  # warmup starts from zero
      5: PEAK * 5 / 10,                        # linear warmup
      9: PEAK * 9 / 10,
      10: PEAK,                                # the warmup boundary: the peak
      11: _cosine(11, warmup=10, num_steps=100, end=end),
      55: end + (PEAK - end) / 2,              # half-way through the decay
      99: _cosine(99, warmup=10, num_steps=100, end=end),
      100: end,                                # num_steps: final_lr_fraction
      150: end,                                # and it stays there
  }
  for step, value in want.items():
    assert float(schedule(step)) == pytest.approx(value, rel=1e-5, abs=1e-9), step
  # num_steps - 1 is still above the end: a horizon that excluded the warmup
  # (decay_steps = num_steps - warmup) would already be at `end` at step 90.
  assert float(schedule(99)) > end + 1e-7
  assert float(schedule(90)) == pytest.approx(
      _cosine(90, warmup=10, num_steps=100, end=end), rel=1e-5)
  assert float(schedule(90)) > end + 1e-6


def test_constant_schedule_at_its_landmarks():
  schedule = steps.learning_rate_schedule(
      _train(schedule='constant', final_lr_fraction=0.1))
  want = {0: 0.0, 5: PEAK / 2, 9: PEAK * 0.9, 10: PEAK, 11: PEAK, 99: PEAK,
          100: PEAK}
  for step, value in want.items():
    assert float(schedule(step)) == pytest.approx(value, rel=1e-6, abs=1e-9), step


@pytest.mark.parametrize('name', ['cosine', 'constant'])
def test_without_warmup_the_schedule_starts_at_the_peak(name):
  schedule = steps.learning_rate_schedule(_train(schedule=name, warmup_steps=0))
  assert float(schedule(0)) == pytest.approx(PEAK, rel=1e-6)
  want_end = 0.0 if name == 'cosine' else PEAK
  assert float(schedule(100)) == pytest.approx(want_end, abs=1e-9)
  assert float(schedule(99)) == pytest.approx(
      _cosine(99, warmup=0, num_steps=100, end=0.0) if name == 'cosine'
      else PEAK, rel=1e-5, abs=1e-9)


def test_warmup_longer_than_the_run_is_cut_to_num_steps_minus_one():
  """warmup_steps >= num_steps: the peak is reached at num_steps - 1."""
  schedule = steps.learning_rate_schedule(
      _train(schedule='constant', num_steps=5, warmup_steps=50))
  assert float(schedule(2)) == pytest.approx(PEAK * 2 / 4, rel=1e-6)
  assert float(schedule(4)) == pytest.approx(PEAK, rel=1e-6)


def _clip_then_adamw(params, grads_seq, *, lr, clip, b1=0.9, b2=0.999,
                     eps=1e-8, weight_decay=0.01):
  """NumPy reference: global-norm clipping of the gradient, then AdamW with
  bias correction and decoupled weight decay on matrices (ndim > 1) only."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in params.items()}
  v = {k: np.zeros_like(p) for k, p in params.items()}
  for t, grads in enumerate(grads_seq, start=1):
    norm = math.sqrt(sum(float(np.sum(np.square(g))) for g in grads.values()))
    scale = min(1.0, clip / norm)
    for k in params:
      g = np.asarray(grads[k], np.float64) * scale
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      m_hat = m[k] / (1 - b1 ** t)
      v_hat = v[k] / (1 - b2 ** t)
      update = m_hat / (np.sqrt(v_hat) + eps)
      if params[k].ndim > 1:
        update = update + weight_decay * params[k]
      params[k] = params[k] - lr * update
  return params


def test_optimizer_clips_the_gradient_before_the_adamw_update():
  """Two steps: the first gradient (norm 50) is clipped to norm 0.5, the
  second (norm 0.1) is not. Adam's first step is nearly scale-free, but its
  second is not: the parameters after two steps follow clip-then-AdamW, and
  differ from both AdamW without clipping and AdamW with its update clipped
  (the chain in the other order)."""
  train = _train(schedule='constant', warmup_steps=0, learning_rate=1.0,
                 grad_clip=0.5, weight_decay=0.01)
  params = {'w': jnp.array([[1.0, -2.0], [0.5, 3.0]]),
            'b': jnp.array([0.25, -0.75])}
  g1 = {'w': jnp.array([[30.0, -20.0], [10.0, 5.0]]),
        'b': jnp.array([-25.0, 20.0])}
  g2 = {'w': jnp.array([[0.05, 0.03], [-0.04, 0.01]]),
        'b': jnp.array([0.06, -0.02])}
  assert float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in g1.values()))) > 10
  assert float(jnp.sqrt(sum(jnp.sum(g ** 2) for g in g2.values()))) < 0.5

  tx = steps.make_optimizer(train)
  state = tx.init(params)
  got = params
  for grads in (g1, g2):
    updates, state = tx.update(grads, state, got)
    got = jax.tree.map(lambda p, u: p + u, got, updates)

  want = _clip_then_adamw(params, [g1, g2], lr=1.0, clip=0.5)
  unclipped = _clip_then_adamw(params, [g1, g2], lr=1.0, clip=1e9)
  for k in params:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-4, atol=1e-5)  # float32 bias correction
    # The test can tell: without the clip the second step moves differently.
  assert max(float(np.abs(unclipped[k] - want[k]).max()) for k in params) > 1e-3

  # The other order (AdamW, then clipping its update to norm 0.5) moves the
  # parameters by at most 0.5 per step in global norm: far from ours.
  import optax
  reversed_tx = optax.chain(
      optax.adamw(1.0, weight_decay=0.01,
                  mask=lambda p: jax.tree.map(lambda x: x.ndim > 1, p)),
      optax.clip_by_global_norm(0.5))
  state = reversed_tx.init(params)
  other = params
  for grads in (g1, g2):
    updates, state = reversed_tx.update(grads, state, other)
    other = jax.tree.map(lambda p, u: p + u, other, updates)
  assert max(float(np.abs(np.asarray(other[k]) - want[k]).max())
             for k in params) > 1e-2


def test_weight_decay_skips_norm_scales_and_biases_with_scan_layers_too():
  """The decay mask of a scanned stack is the loop stack's, layer by layer:
  the layer axis that nnx.scan adds does not turn a (layers, D) norm scale
  or bias into a decayed 'matrix'."""
  from flax import nnx

  from configs import tiny
  from selfattn.training import build as build_lib

  masks = {}
  for scan in (False, True):
    config = tiny.get_config()
    config.model.num_layers, config.model.scan_layers = 2, scan
    config.model.position = 't5'          # a per-layer relative table too
    task = build_lib.task_from_config(config)
    model = build_lib.build_model(config, task, nnx.Rngs(0))
    mask = steps.decay_mask(nnx.state(model, nnx.Param), scan_layers=scan)
    masks[scan] = {
        tuple(getattr(k, 'key', getattr(k, 'idx', None)) for k in path
              if not hasattr(k, 'name')): bool(d)
        for path, d in jax.tree_util.tree_leaves_with_path(mask)}
  loop, scanned = masks[False], masks[True]
  # Norm scales and biases, and the projections' biases, are vectors per
  # layer (T5's (buckets, heads) table, also named `bias`, is decayed).
  vectors = [path for path in scanned
             if path[-1] in ('scale', 'bias') and 'relative' not in path]
  assert len(vectors) > 4 and not any(scanned[path] for path in vectors)
  assert {path[-1] for path, d in scanned.items() if d} >= {'kernel',
                                                            'embedding'}
  for path, d in scanned.items():
    if 'blks' in path:
      i = path.index('blks')
      for layer in range(2):
        assert loop[path[:i + 1] + (layer,) + path[i + 1:]] == d, path
    else:
      assert loop[path] == d, path

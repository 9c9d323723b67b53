"""PoPE (Gopalakrishnan et al. 2025) against a NumPy transcription of the
paper's equations, through every attention path, and its bounded phase bias."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import selfattn
from selfattn.nn import attention
from selfattn.nn import bounded
from selfattn.nn import chunked
from selfattn.nn import positions
from selfattn.training import steps
from compiled import compiled
from tiers import EXTENDED


def _pope(delta_init='uniform', num_heads=2, head_dim=6, seed=0):
  kind, options = positions.get_position('pope',
                                         {'pope_delta_init': delta_init})
  return kind.build(num_heads=num_heads, head_dim=head_dim, max_len=64,
                    param_dtype=jnp.float32, rngs=nnx.Rngs(seed), **options)


def _softplus(x):
  return np.log1p(np.exp(x))


def numpy_logits(q, k, q_pos, k_pos, delta, base=10000.0):
  """Equations 3-6 of the paper, term by term in float64:
  a_ts = sum_c softplus(q_tc) softplus(k_sc) cos((s - t) theta_c + delta_c),
  theta_c = base^(-(c-1)/d), c = 1..d. q (H, Lq, d), k (H, Lk, d), delta
  (H, d) -> (H, Lq, Lk), unscaled."""
  q, k, delta = (np.asarray(a, np.float64) for a in (q, k, delta))
  d = q.shape[-1]
  theta = base ** (-np.arange(d) / d)
  out = np.zeros(q.shape[:2] + (k.shape[1],))
  for h in range(q.shape[0]):
    for t in range(q.shape[1]):
      for s in range(k.shape[1]):
        phase = (k_pos[s] - q_pos[t]) * theta + delta[h]
        out[h, t, s] = np.sum(_softplus(q[h, t]) * _softplus(k[h, s])
                              * np.cos(phase))
  return out


def _qkv(lq=5, lk=7, d=6, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (1, 2, lq, d)),
          jax.random.normal(keys[1], (1, 2, lk, d)),
          jax.random.normal(keys[2], (1, 2, lk, d)))


def test_logits_equal_the_papers_equations_at_given_positions():
  """Equation 10 (the real dot product over 2d polar features that `rotate`
  returns) equals equations 3-6 (magnitudes and phases) for arbitrary
  query and key positions and a non-zero phase bias."""
  pope = _pope('uniform')
  q, k, _ = _qkv()
  q_pos = np.array([[0, 2, 3, 9, 11]])
  k_pos = np.array([[1, 2, 4, 5, 8, 13, 20]])
  qp, kp = compiled(lambda pope: pope.rotate(q, k, jnp.asarray(q_pos),
                                             jnp.asarray(k_pos)), pope)
  assert qp.shape == (1, 2, 5, 12) and kp.shape == (1, 2, 7, 12)
  ours = np.asarray(jnp.einsum('bhqd,bhkd->bhqk', qp, kp))[0]
  want = numpy_logits(q[0], k[0], q_pos[0], k_pos[0], pope.delta[...])
  np.testing.assert_allclose(ours, want, rtol=1e-5, atol=1e-5)


def test_attention_output_and_gradients_equal_the_numpy_transcription():
  """The attention output with the softmax scale 1/sqrt(d) of the projected
  head, and the gradients of a weighted sum of logits with respect to q, k
  and delta, derived by hand from equation 6:
    d a_ts / d q_tc     = sigmoid(q_tc) softplus(k_sc) cos(phase)
    d a_ts / d delta_hc = -softplus(q_tc) softplus(k_sc) sin(phase)."""
  pope = _pope('uniform')
  q, k, v = _qkv()
  d = q.shape[-1]
  logits = numpy_logits(q[0], k[0], np.arange(5), np.arange(7),
                        pope.delta[...]) / math.sqrt(d)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  want = weights @ np.asarray(v[0], np.float64)
  out, _ = compiled(lambda pope: attention.dot_product_attention(
      q, k, v, relative=pope), pope)
  np.testing.assert_allclose(out[0], want, rtol=1e-5, atol=1e-6)

  w = np.asarray(jax.random.normal(jax.random.key(9), (2, 5, 7)), np.float64)

  def loss(q, k, module):
    qp, kp = module.rotate(q, k)
    return jnp.sum(jnp.einsum('bhqd,bhkd->bhqk', qp, kp)[0] * w)

  gq, gk, gmod = nnx.jit(nnx.grad(loss, argnums=(0, 1, 2)))(q, k, pope)
  qn, kn = np.asarray(q[0], np.float64), np.asarray(k[0], np.float64)
  delta = np.asarray(pope.delta[...], np.float64)
  theta = 10000.0 ** (-np.arange(d) / d)
  phase = ((np.arange(7)[None, :, None] - np.arange(5)[:, None, None]) * theta
           )[None] + delta[:, None, None, :]                  # (H, Lq, Lk, d)
  sq, sk = _softplus(qn)[:, :, None], _softplus(kn)[:, None]   # (H, Lq|1, 1|Lk, d)
  sig = lambda x: 1 / (1 + np.exp(-x))
  want_q = np.sum(w[..., None] * sig(qn)[:, :, None] * sk * np.cos(phase), 2)
  want_k = np.sum(w[..., None] * sq * sig(kn)[:, None] * np.cos(phase), 1)
  want_delta = np.sum(-w[..., None] * sq * sk * np.sin(phase), (1, 2))
  np.testing.assert_allclose(gq[0], want_q, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gk[0], want_k, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(gmod.delta[...], want_delta, rtol=1e-4, atol=1e-4)


def test_no_what_where_entanglement_a_query_prefers_its_own_position():
  """What PoPE removes from RoPE: with delta = 0 every term of equation 5 is
  a non-negative magnitude times cos((s - t) theta_c), so for any content the
  logit is largest at offset 0, which RoPE does not guarantee."""
  pope = _pope('zero', num_heads=1, head_dim=8)
  rope = positions.RotaryEncoding(8)
  q, k, _ = _qkv(lq=1, lk=1, d=8, seed=3)
  k_pos = jnp.arange(-20, 21)[None]
  keys = jnp.broadcast_to(k[:, :1], (1, 2, 41, 8))[:, :1]

  def logits(enc):
    qp, kp = compiled(lambda enc: enc.rotate(
        q[:, :1], keys, jnp.zeros((1, 1), jnp.int32), k_pos), enc)
    return np.asarray(jnp.einsum('bhqd,bhkd->bhqk', qp, kp))[0, 0, 0]

  assert int(np.argmax(logits(pope))) == 20          # offset 0
  assert int(np.argmax(logits(rope))) != 20          # content rotates RoPE's peak


# --extended (tiers.py): PoPE's fused path against the plain one, outputs and
# gradients (delta's included), padded and causal, is test_attention.py's
# test_fused_path_equals_the_plain_path[pope]; its chunked path is
# test_chunked.py's test_chunked_equals_plain_forward_and_gradients (PoPE's
# case) and test_chunked_equals_plain_with_explicit_positions_and_cross_...
@EXTENDED
@pytest.mark.parametrize('causal', [False, True])
def test_plain_fused_and_chunked_agree_in_outputs_and_gradients(causal):
  pope = _pope('uniform')
  q, k, v = _qkv(lq=11, lk=11)
  keep = (jnp.arange(11) < jnp.array([11])[:, None])[:, None, None, :]

  def run(impl, q, k, v, module):
    kwargs = dict(mask=keep, causal=causal, relative=module)
    if impl == 'plain':
      return attention.dot_product_attention(q, k, v, **kwargs)[0]
    if impl == 'fused':
      return attention.fused_attention(q, k, v, **kwargs)
    return chunked.chunked_attention(q, k, v, query_chunk=4, key_chunk=3,
                                     **kwargs)

  loss = lambda impl, *a: (run(impl, *a) ** 2).sum()
  plain = run('plain', q, k, v, pope)
  want = jax.tree.leaves(nnx.grad(loss, argnums=(1, 2, 3, 4))(
      'plain', q, k, v, pope))
  for impl in ('fused', 'chunked'):
    np.testing.assert_allclose(run(impl, q, k, v, pope), plain, atol=2e-6)
    got = jax.tree.leaves(nnx.grad(loss, argnums=(1, 2, 3, 4))(
        impl, q, k, v, pope))
    for g, w in zip(got, want):
      np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


# --extended (tiers.py): PoPE's cached decoding against the full causal pass
# is test_decoder.py's test_cached_decoding_equals_the_full_causal_pass[pope],
# shifted positions test_positions.py's
# test_relative_encodings_see_only_offsets_between_positions[pope], and a
# non-zero delta at arbitrary positions
# test_logits_equal_the_papers_equations_at_given_positions.
@EXTENDED
def test_decoder_cached_decoding_and_shifted_positions():
  """Cached decoding equals the full causal pass, and shifting every
  position (randomized-position decoding) changes nothing."""
  dec = selfattn.TransformerDecoder(11, 16, 32, 4, 2, position='pope',
                                    max_len=32, rngs=nnx.Rngs(0),
                                    pope_delta_init='uniform')
  x = jax.random.randint(jax.random.key(1), (2, 7), 0, 11)
  full = dec(x)
  dec.init_cache(2, 8)
  parts = [dec(x[:, :3], decode=True)]
  parts += [dec(x[:, t:t + 1], decode=True) for t in range(3, 7)]
  np.testing.assert_allclose(jnp.concatenate(parts, axis=1), full, atol=1e-5)
  pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
  np.testing.assert_allclose(dec(x, positions=pos + 123), full, atol=2e-5)


def test_delta_stays_in_its_interval_after_an_optimiser_step():
  """A gradient step that would push delta far outside [-2 pi, 0] leaves it
  on the bounds: steps.train_step projects BoundedParams after the update.
  Both inits start inside the interval."""
  for init in ('zero', 'uniform'):
    d = _pope(init).delta[...]
    assert np.all((d >= -2 * math.pi) & (d <= 0))
  model = selfattn.TransformerEncoder(12, 16, 32, 2, 1, position='pope',
                                      max_len=16, rngs=nnx.Rngs(0),
                                      pope_delta_init='uniform')
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.sgd(1e3)
  delta_path = [p for p, _ in nnx.to_flat_state(params) if p[-1] == 'delta']
  assert len(delta_path) == 1
  # A fake gradient of +-1 on every parameter moves delta by +-1000.
  @jax.jit                      # the step and the projection: one program
  def step(params):
    sign = jax.tree.map(lambda x: jnp.sign(jax.random.normal(
        jax.random.key(0), x.shape)), params)
    updates, _ = tx.update(sign, tx.init(params), params)
    moved = optax.apply_updates(params, updates)
    return moved, bounded.project_bounded_params(moved)

  moved, projected_state = step(params)
  raw = dict(nnx.to_flat_state(moved))[delta_path[0]][...]
  assert np.abs(np.asarray(raw)).max() > 100          # the step alone leaves
  projected = dict(nnx.to_flat_state(projected_state))[delta_path[0]][...]
  assert np.all((projected >= -2 * math.pi) & (projected <= 0))
  assert set(np.unique(np.asarray(projected))) <= {-2 * np.float32(math.pi), 0}
  # Other parameters are left as the optimiser moved them.
  for (p, a), (_, b) in zip(nnx.to_flat_state(moved),
                            nnx.to_flat_state(projected_state)):
    if p[-1] != 'delta':
      np.testing.assert_array_equal(a[...], b[...])


def test_the_training_step_projects_delta(tiny_config):
  tiny_config.model.position = 'pope'
  tiny_config.model.pope_delta_init = 'uniform'
  tiny_config.train.learning_rate = 50.0        # far past any sane rate
  tiny_config.train.warmup_steps = 0
  tiny_config.train.grad_clip = 1e9
  trainer = steps.Trainer(tiny_config)
  step = jax.jit(lambda state, batch: steps.train_step(
      state, batch, graphdef=trainer.graphdef, rest=trainer.rest,
      tx=trainer.tx, schedule=steps.learning_rate_schedule(tiny_config.train),
      dropout_key=steps.dropout_key_for(0)))
  state = trainer.init_state()
  for i in range(3):
    state, _ = step(state, trainer.train_batch(i))
  deltas = [v[...] for p, v in nnx.to_flat_state(state['params'])
            if p[-1] == 'delta']
  assert deltas
  for d in deltas:
    assert np.all((np.asarray(d) >= -2 * math.pi) & (np.asarray(d) <= 0))
  # Adam at this rate moves each delta entry by about 50 per step: some
  # entries must have hit a bound, so the projection was exercised.
  assert any(np.any(np.isclose(np.asarray(d), 0) | np.isclose(
      np.asarray(d), -2 * math.pi)) for d in deltas)


def test_an_own_loop_keeps_delta_learning_with_project_bounded():
  """A Flax user's loop (nnx.Optimizer under nnx.jit, no selfattn training):
  Adam pushes zero-initialised deltas out of [-2 pi, 0], where their
  gradient is zero for good; `selfattn.project_bounded(model)` after each
  update keeps every entry inside, with a gradient."""
  t = jax.random.randint(jax.random.key(0), (4, 6), 0, 7)

  def train(project: bool):
    model = selfattn.TransformerEncoder(7, 8, 16, 2, 1, position='pope',
                                        max_len=8, rngs=nnx.Rngs(0))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    def loss(model):
      return jnp.mean((model(t) - 1.0) ** 2)

    @nnx.jit
    def step(model, optimizer):
      optimizer.update(model, nnx.grad(loss)(model))
      if project:
        selfattn.project_bounded(model)

    for _ in range(5):
      step(model, optimizer)
    delta = np.asarray(model.blks[0].attention.relative.delta[...])
    grad = np.asarray(nnx.grad(loss)(model).blks[0].attention.relative
                      .delta[...])
    return model, delta, grad

  _, free, free_grad = train(False)
  outside = (free > 0) | (free < -2 * math.pi)
  assert outside.mean() > 0.3              # the failure being guarded
  assert np.all(free_grad[outside] == 0)   # ... is permanent
  _, kept, kept_grad = train(True)
  assert np.all((kept >= -2 * math.pi) & (kept <= 0))
  assert np.any(kept < 0)                  # it moved, inside
  assert np.any(kept_grad[kept == 0] != 0)  # entries on the bound still learn


def test_a_linen_model_trains_and_projects_delta_through_the_bridge():
  """Inside a Linen model (nnx.bridge), delta sits in 'params' (a Param
  subclass would be filed in a collection of its own, which a Linen loop
  over 'params' never trains); `selfattn.project_bounded_params` on the
  Linen params after each update keeps it in [-2 pi, 0]."""
  from flax import linen as nn
  from flax.nnx import bridge

  class Regressor(nn.Module):
    @nn.compact
    def __call__(self, tokens):
      return bridge.to_linen(selfattn.TransformerEncoder, 7, 8, 16, 2, 1,
                             position='pope', max_len=8)(tokens)

  t = jax.random.randint(jax.random.key(0), (4, 6), 0, 7)
  variables = Regressor().init(jax.random.key(1), t)
  assert set(variables) == {'params'}
  params = variables['params']

  def loss(params):
    return jnp.mean((Regressor().apply({'params': params}, t) - 1.0) ** 2)

  def delta_of(params):
    boxes = jax.tree.leaves(params, is_leaf=lambda x: isinstance(
        x, bridge.NNXMeta))
    deltas = [box.unbox() for box in boxes if bounded.bounds_of(box)]
    assert len(deltas) == 1                  # the one layer's delta
    return np.asarray(deltas[0])

  tx = optax.adam(1e-2)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state):
    updates, opt_state = tx.update(jax.grad(loss)(params), opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, selfattn.project_bounded_params(params), opt_state

  for _ in range(5):
    moved, params, opt_state = step(params, opt_state)
  raw, kept = delta_of(moved), delta_of(params)
  assert np.any((raw > 0) | (raw < -2 * math.pi))   # Adam pushed some out
  assert np.all((kept >= -2 * math.pi) & (kept <= 0))
  assert np.any(kept < 0)                              # and it learned

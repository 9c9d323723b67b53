"""selfattn modules inside other people's code: JAX and NNX transforms over
closures, rng streams, train/eval modes, feature inputs, the Linen bridge."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge

import selfattn
from compiled import compiled


def make(position='shaw', dropout=0.0, rngs=None, **kwargs):
  return selfattn.TransformerEncoder(
      10, 16, 32, 2, 2, dropout, position=position, max_len=16,
      rngs=rngs or nnx.Rngs(0), **kwargs)


def toks(shape=(3, 6), seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 0, 10)


def test_jax_jit_grad_and_vmap_over_a_closure():
  """These failed while every call sowed the attention weights on the module
  (TraceContextError: cannot mutate from a different trace level)."""
  enc = make()
  x = toks()
  eager = enc(x)
  np.testing.assert_allclose(jax.jit(lambda t: enc(t))(x), eager, atol=1e-5)
  features = enc.embed(x)
  grad = jax.grad(lambda f: enc(f).sum())(features)
  assert grad.shape == features.shape and np.all(np.isfinite(grad))
  assert np.abs(np.asarray(grad)).max() > 0
  per_example = jax.vmap(lambda t: enc(t[None])[0])(x)
  np.testing.assert_allclose(per_example, eager, atol=1e-5)


def test_nnx_vmap_over_examples_with_a_shared_module():
  enc = make('t5')
  x, lens = toks(), jnp.array([6, 2, 4])
  f = nnx.vmap(lambda m, t, n: m(t[None], n[None])[0], in_axes=(None, 0, 0))
  np.testing.assert_allclose(f(enc, x, lens),
                             compiled(lambda m: m(x, lens), enc), atol=1e-5)


def test_nnx_jit_train_step_traces_once():
  """It traced twice while the first call added Intermediate variables."""
  model = make('rope')
  optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
  traces = []

  @nnx.jit
  def step(model, optimizer, x):
    traces.append(1)
    loss, grads = nnx.value_and_grad(lambda m: (m(x) ** 2).mean())(model)
    optimizer.update(model, grads)
    return loss

  x = toks()
  losses = [float(step(model, optimizer, x)) for _ in range(3)]
  assert len(traces) == 1
  assert losses[-1] < losses[0]
  assert not nnx.state(model, nnx.Intermediate)


@pytest.mark.parametrize('dropout', [0.0, 0.2])
def test_params_stream_alone_builds_the_model(dropout):
  """A model built from a 'params' stream only evaluates (no dropout
  stream is needed in eval mode), and its parameters come from that stream:
  the same seed gives the same model whatever the dropout rate."""
  enc = make(dropout=dropout, rngs=nnx.Rngs(params=0))
  reference = make(dropout=0.0, rngs=nnx.Rngs(params=0))
  np.testing.assert_allclose(enc(toks()), reference(toks()), atol=1e-6)
  other = make(dropout=dropout, rngs=nnx.Rngs(params=1))
  assert np.abs(np.asarray(enc(toks()) - other(toks()))).max() > 1e-3


def test_train_and_eval_modes_are_respected():
  enc = make(dropout=0.5, rngs=nnx.Rngs(0))
  x = toks()
  evaluated = enc(x)                                   # modules start in eval
  np.testing.assert_allclose(evaluated, enc(x, deterministic=True), atol=0)
  enc.train()
  a, b = enc(x), enc(x)
  assert np.abs(np.asarray(a - b)).max() > 1e-3        # dropout is on
  enc.eval()
  np.testing.assert_allclose(enc(x), evaluated, atol=0)


def test_features_instead_of_tokens_and_separate_kv_features():
  enc = selfattn.TransformerEncoder(None, 16, 32, 2, 1, position='alibi',
                                    rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(0), (2, 5, 16))
  assert compiled(lambda m: m(X), enc).shape == (2, 5, 16)
  with pytest.raises(ValueError, match='vocab_size=None'):
    enc(toks((2, 5)))
  with pytest.raises(ValueError, match='num_hiddens=16'):
    enc(jnp.ones((2, 5, 8)))
  # Token ids and their embedding give the same output.
  tok_enc = make('alibi')
  x = toks()
  np.testing.assert_allclose(
      compiled(lambda m: m(m.embedding(x) * 4.0), tok_enc),
      compiled(lambda m: m(x), tok_enc), atol=1e-5)
  cross = selfattn.MultiHeadAttention(16, 2, in_features=8, kv_features=12,
                                      out_features=4, rngs=nnx.Rngs(0))
  q_in = jax.random.normal(jax.random.key(1), (2, 3, 8))
  kv_in = jax.random.normal(jax.random.key(2), (2, 7, 12))
  out = compiled(lambda m: m(q_in, kv_in), cross)
  assert out.shape == (2, 3, 4)
  # NumPy from the module's own kernels: queries from the 8-wide input,
  # keys and values from the 12-wide one, two heads of 8.
  w = {name: np.asarray(getattr(cross, name).kernel[...], np.float64)
       for name in ('W_q', 'W_k', 'W_v', 'W_o')}
  heads = lambda x: x.reshape(2, -1, 2, 8).transpose(0, 2, 1, 3)
  q = heads(np.asarray(q_in, np.float64) @ w['W_q'])
  k = heads(np.asarray(kv_in, np.float64) @ w['W_k'])
  v = heads(np.asarray(kv_in, np.float64) @ w['W_v'])
  logits = q @ k.transpose(0, 1, 3, 2) / np.sqrt(8)
  weights = np.exp(logits - logits.max(-1, keepdims=True))
  weights /= weights.sum(-1, keepdims=True)
  want = (weights @ v).transpose(0, 2, 1, 3).reshape(2, 3, 16) @ w['W_o']
  np.testing.assert_allclose(out, want, atol=1e-5)


def test_unknown_keyword_is_a_type_error_naming_it():
  with pytest.raises(TypeError, match="unexpected keyword argument 'num_head'"):
    make('sinusoidal', num_head=4)
  with pytest.raises(ValueError, match='takes no option'):
    make('sinusoidal', clip_distance=4)         # an option of shaw, not a typo


class _LinenClassifier(nn.Module):
  """A Linen model with a selfattn encoder inside, through nnx.bridge."""
  dropout: float = 0.3

  @nn.compact
  def __call__(self, x, train: bool = False):
    h = bridge.to_linen(selfattn.TransformerEncoder, 10, 16, 32, 2, 1,
                        self.dropout,
                        position='shaw', clip_distance=4)(
                            x, deterministic=not train)
    return nn.Dense(2)(h.mean(axis=1))


# In the commit tier: the only test that trains through the Linen bridge
# and feeds it Linen's dropout stream (docs/library.md says it does).
def test_linen_bridge_inits_with_one_key_trains_and_uses_dropout():
  model = _LinenClassifier()
  x = toks((8, 6))
  y = (x[:, 0] > x[:, -1]).astype(jnp.int32)      # depends on order
  # No 'dropout' stream needed.
  variables = jax.jit(model.init)(jax.random.key(0), x)
  params = variables['params']
  tx = optax.adam(3e-3)
  opt_state = tx.init(params)

  @jax.jit
  def step(params, opt_state, key):
    def loss_fn(p):
      logits = model.apply({'params': p}, x, train=True, rngs={'dropout': key})
      return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = tx.update(grads, opt_state)
    return optax.apply_updates(params, updates), opt_state, loss

  losses = []
  for i in range(30):
    params, opt_state, loss = step(params, opt_state, jax.random.key(i))
    losses.append(float(loss))
  assert np.mean(losses[-5:]) < np.mean(losses[:5])
  apply = jax.jit(lambda key: model.apply({'params': params}, x, train=True,
                                          rngs={'dropout': key}))
  assert np.abs(np.asarray(apply(jax.random.key(1)) - apply(jax.random.key(2)))
                ).max() > 1e-4
  evaluate = jax.jit(lambda params: model.apply({'params': params}, x))
  # Evaluation applies no dropout: what the same module without dropout
  # gives with the same parameters (not merely the same twice).
  np.testing.assert_allclose(
      evaluate(params),
      _LinenClassifier(dropout=0.0).apply({'params': params}, x), atol=1e-5)
  # The hazard docs/library.md warns of: training without a 'dropout' key
  # raises nothing and applies dropout, from the bridge's fixed default
  # stream (with no key given, nothing can vary from call to call).
  no_key = model.apply({'params': params}, x, train=True)
  assert np.abs(np.asarray(no_key - evaluate(params))).max() > 1e-4

"""masked_softmax and MultiHeadAttention against NumPy and Flax references."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from compiled import compiled
from reference import assert_encoders_agree, softmax_rows
from tiers import EXTENDED


def test_masked_softmax_matches_numpy_for_1d_and_2d_valid_lens():
  X = np.random.default_rng(0).normal(size=(2, 3, 5)).astype(np.float32)
  lens_1d = np.array([2, 4])
  keep = np.arange(5)[None, None, :] < lens_1d[:, None, None]
  np.testing.assert_allclose(selfattn.masked_softmax(X, lens_1d),
                             softmax_rows(X, keep), atol=1e-6)
  lens_2d = np.array([[1, 3, 5], [2, 2, 4]])
  keep = np.arange(5)[None, None, :] < lens_2d[:, :, None]
  out = np.asarray(selfattn.masked_softmax(X, lens_2d))
  np.testing.assert_allclose(out, softmax_rows(X, keep), atol=1e-6)
  assert np.all(out[~keep] == 0)
  np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-6)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
def test_masked_softmax_returns_the_input_dtype(dtype):
  """Mutation caught: removing `.astype(X.dtype)` in masked_softmax (the
  softmax runs in float32 and would leak float32 out)."""
  X = jnp.zeros((2, 3, 4), dtype)
  assert selfattn.masked_softmax(X, jnp.array([2, 4])).dtype == dtype
  assert selfattn.masked_softmax(X).dtype == dtype


def test_masked_softmax_broadcasts_over_head_axis():
  X = np.random.default_rng(1).normal(size=(2, 4, 3, 6)).astype(np.float32)
  lens = np.array([3, 6])
  keep = np.arange(6)[None, None, None, :] < lens[:, None, None, None]
  np.testing.assert_allclose(selfattn.masked_softmax(X, lens),
                             softmax_rows(X, keep), atol=1e-6)


@pytest.mark.parametrize('dtype', [jnp.float32, jnp.bfloat16, jnp.float16])
def test_masked_softmax_is_finite_in_low_precision(dtype):
  # Logits near the dtype's range, and a row with no valid key at all.
  X = jnp.array([[[60000.0, -60000.0, 3.0, 1.0]] * 2] * 3, dtype=dtype)
  lens = jnp.array([2, 1, 0])
  out = np.asarray(selfattn.masked_softmax(X, lens).astype(jnp.float32))
  assert np.all(np.isfinite(out))
  assert out.dtype == np.float32 and X.dtype == dtype
  np.testing.assert_allclose(out[0, 0], [1, 0, 0, 0], atol=1e-3)
  np.testing.assert_allclose(out[1, 0], [1, 0, 0, 0], atol=1e-3)
  np.testing.assert_array_equal(out[2], 0.0)   # nothing valid -> zeros, not NaN
  # Ordinary logits: masked entries exactly 0, rows sum to 1 within dtype eps.
  Y = jax.random.normal(jax.random.key(0), (2, 3, 7)).astype(dtype)
  out = np.asarray(selfattn.masked_softmax(Y, jnp.array([3, 5])), np.float32)
  assert np.all(out[0, :, 3:] == 0) and np.all(out[1, :, 5:] == 0)
  np.testing.assert_allclose(out.sum(-1), 1.0, atol=1e-2)


def test_chapter_multihead_shape_demonstration():
  attn = selfattn.MultiHeadAttention(100, 5, 0.5, rngs=nnx.Rngs(0))
  X = jnp.ones((2, 4, 100))
  Y = jnp.ones((2, 6, 100))
  valid_lens = jnp.array([3, 2])
  out, weights = compiled(
      lambda attn: selfattn.attention_weights(attn, X, Y, Y, valid_lens), attn)
  assert out.shape == (2, 4, 100) and weights[0].shape == (2, 5, 4, 6)
  # Every key is the same vector, so each query spreads its weight evenly
  # over the valid keys (3, then 2) and gives the padded ones none.
  want = np.zeros((2, 6))
  want[0, :3], want[1, :2] = 1 / 3, 1 / 2
  np.testing.assert_allclose(
      weights[0], np.broadcast_to(want[:, None, None], (2, 5, 4, 6)),
      atol=1e-6)


def _copy_into_flax(ours, theirs, num_heads):
  f = ours.num_hiddens
  for mine, name in [(ours.W_q, 'query'), (ours.W_k, 'key'),
                     (ours.W_v, 'value')]:
    getattr(theirs, name).kernel[...] = mine.kernel[...].reshape(
        f, num_heads, f // num_heads)
  theirs.out.kernel[...] = ours.W_o.kernel[...].reshape(
      num_heads, f // num_heads, f)


def test_equals_flax_multihead_attention_with_same_weights():
  heads, f = 4, 32
  ours = selfattn.MultiHeadAttention(f, heads, 0.0, rngs=nnx.Rngs(0))
  theirs = nnx.MultiHeadAttention(heads, f, f, f, use_bias=False, decode=False,
                                  rngs=nnx.Rngs(1))
  _copy_into_flax(ours, theirs, heads)
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(3, 5, f)), jnp.float32)
  kv = jnp.asarray(rng.normal(size=(3, 7, f)), jnp.float32)
  lens = jnp.array([7, 3, 5])
  flax_mask = (jnp.arange(7)[None, :] < lens[:, None])[:, None, None, :]
  (a, b), (masked_a, masked_b) = compiled(lambda ours, theirs: (
      (ours(q, kv, kv), theirs(q, kv, kv, deterministic=True)),
      (ours(q, kv, kv, lens),
       theirs(q, kv, kv, mask=flax_mask, deterministic=True))), ours, theirs)
  np.testing.assert_allclose(a, b, atol=1e-5)
  np.testing.assert_allclose(masked_a, masked_b, atol=1e-5)


def test_mask_argument_equals_valid_lens_and_supports_left_padding():
  attn = selfattn.MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(0), (2, 6, 16))
  lens = jnp.array([4, 6])
  mask = selfattn.make_padding_mask(jnp.arange(6)[None, :] < lens[:, None])
  # Left padding: valid keys are the last 4; padded keys get zero weight.
  left = jnp.arange(6)[None, :] >= 2
  by_lens, by_mask, (_, (weights,)) = compiled(lambda attn: (
      attn(X, X, X, lens), attn(X, X, X, mask=mask),
      selfattn.attention_weights(
          attn, X, X, X,
          mask=selfattn.make_padding_mask(jnp.repeat(left, 2, 0)))), attn)
  np.testing.assert_allclose(by_lens, by_mask, atol=1e-6)
  weights = np.asarray(weights)
  assert np.all(weights[..., :2] == 0)
  np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)


def test_dropout_acts_on_attention_weights_only_when_not_deterministic():
  attn = selfattn.MultiHeadAttention(16, 2, 0.5, rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(0), (2, 5, 16))
  a, again, b = compiled(lambda attn: (
      attn(X, X, X), attn(X, X, X), attn(X, X, X, deterministic=False)), attn)
  np.testing.assert_allclose(a, again, atol=0)
  assert np.max(np.abs(np.asarray(a - b))) > 1e-3


def test_dot_product_attention_without_relative_matches_jax_nn():
  rng = np.random.default_rng(2)
  q, k, v = (jnp.asarray(rng.normal(size=(2, 3, 5, 8)), jnp.float32)
             for _ in range(3))
  keep = jnp.asarray(rng.random((2, 1, 1, 5)) > 0.3).at[..., 0].set(True)
  (ours, _), theirs = compiled(lambda q, k, v: (
      selfattn.dot_product_attention(q, k, v, mask=keep),
      jax.nn.dot_product_attention(q.transpose(0, 2, 1, 3),
                                   k.transpose(0, 2, 1, 3),
                                   v.transpose(0, 2, 1, 3), mask=keep)),
                               q, k, v)
  np.testing.assert_allclose(ours, theirs.transpose(0, 2, 1, 3), atol=1e-5)


# Huang, XL and T5 --extended (tiers.py): their term reaches the fused path
# as a logit bias, as ALiBi's does (the alibi case); each one's forward and
# gradients against the plain path stay in the commit tier in test_chunked.py
# (Huang's and T5's in test_chunked_equals_plain_forward_and_gradients, XL's
# in test_xl_is_unbounded_in_blocks_as_on_the_plain_path[False]), its
# encoder's parameter gradients in test_positions.py's
# test_every_parameter_receives_a_gradient.
FUSED_REPEATS = ('huang', 'xl', 't5')


@pytest.mark.parametrize('position', [
    pytest.param(p, marks=EXTENDED) if p in FUSED_REPEATS else p
    for p in selfattn.POSITION_NAMES])
def test_fused_path_equals_the_plain_path(position, monkeypatch):
  """attention_impl='fused' (jax.nn.dot_product_attention; XLA on this CPU)
  gives the plain path's outputs and gradients for every encoding, with
  padding; Shaw's value term falls back to the plain path. The fused calls
  are counted: on this CPU both paths give the same numbers, so equality
  alone would pass with the switch never reaching the blocks."""
  def build(impl):
    return selfattn.TransformerEncoder(12, 16, 32, 2, 2, position=position,
                                       max_len=16, attention_impl=impl,
                                       rngs=nnx.Rngs(0))
  calls = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention',
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  x = jax.random.randint(jax.random.key(0), (2, 9), 0, 12)
  fused = build('fused')
  fusable = selfattn.nn.attention.can_fuse(fused.blks[0].attention.relative)
  assert_encoders_agree(fused, build('plain'), x, jnp.array([9, 5]))
  # Each traced pass (padded, causal, the gradient's forward) through both
  # layers is fused, or none is.
  assert len(calls) == (6 if fusable else 0)
  assert fusable == (position != 'shaw')


def test_fused_path_asks_for_cudnn_where_it_applies(monkeypatch):
  """jax.nn's default implementation is XLA everywhere, so 'fused' names
  one: cuDNN for bfloat16/float16 heads of width <= 128 (a multiple of 8)
  and, with a bias or mask, even lengths (its backward refuses odd ones),
  on the 'cuda' platform only; XLA otherwise. A causal mask alone on a
  square matrix goes to cuDNN as is_causal, not as an (L, L) mask. A call
  cuDNN refuses while tracing runs on XLA instead, with the same numbers.
  cuDNN is simulated (a host that can trace it, a stand-in for jax.nn):
  this checks the choice, not cuDNN (scripts/bench_gpu.py does, on a
  GPU)."""
  from selfattn.nn import attention
  bf16, f32 = jnp.bfloat16, jnp.float32
  assert attention.cudnn_takes(bf16, 64)
  assert attention.cudnn_takes(jnp.float16, 128)
  assert not attention.cudnn_takes(f32, 64)
  assert not attention.cudnn_takes(bf16, 12)
  assert not attention.cudnn_takes(bf16, 256)
  assert attention.cudnn_takes(bf16, 64, lq=5, lk=6)
  assert not attention.cudnn_takes(bf16, 64, lq=5, lk=6, has_bias=True)
  assert attention.cudnn_takes(bf16, 64, lq=6, lk=6, has_bias=True)
  # No CUDA device in CI: jax.nn could not trace cuDNN here.
  assert not attention.cudnn_traceable()
  monkeypatch.setattr(attention, 'cudnn_traceable', lambda: True)

  asked = []
  real = jax.nn.dot_product_attention
  MARK = 4096.0   # added by the stand-in's cuDNN only (exact in bfloat16)

  def fake_cudnn(*args, implementation=None, refuse=False, **kwargs):
    asked.append((implementation, kwargs['mask'] is None,
                  kwargs['is_causal']))
    if implementation == 'cudnn' and refuse:
      raise NotImplementedError('stand-in for a call cuDNN cannot take')
    out = real(*args, implementation='xla', **kwargs)
    return out + MARK if implementation == 'cudnn' else out

  q, k, v = (jax.random.normal(jax.random.key(i), (2, 2, 6, 8), bf16)
             for i in range(3))
  keep = jnp.array([6, 3])[:, None, None, None] > jnp.arange(6)
  for refuse in (True, False):
    asked.clear()
    monkeypatch.setattr(jax.nn, 'dot_product_attention',
                        functools.partial(fake_cudnn, refuse=refuse))
    # Under jit both branches are traced; the CPU runs the default (XLA)
    # one.
    out = jax.jit(functools.partial(attention.fused_attention, mask=keep,
                                    causal=True))(q, k, v)
    # A padding mask: cuDNN gets it (as a bias), not is_causal.
    want_asked = [('cudnn', False, False), ('xla', False, False)]
    if refuse:
      want_asked.append(('xla', False, False))
    assert sorted(asked) == sorted(want_asked)
    want, _ = attention.dot_product_attention(q, k, v, mask=keep,
                                              causal=True)
    np.testing.assert_allclose(np.asarray(out, np.float32),
                               np.asarray(want, np.float32), atol=2e-2)
  asked.clear()
  out = jax.jit(functools.partial(attention.fused_attention, causal=True))(
      q, k, v)
  assert sorted(asked) == [('cudnn', True, True), ('xla', False, False)]
  want, _ = attention.dot_product_attention(q, k, v, causal=True)
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             np.asarray(want, np.float32), atol=2e-2)
  # The branch is chosen by the platform lowered for, not by this host:
  # lowered for 'cuda' the step holds the (stand-in) cuDNN call, for 'cpu'
  # it does not.
  from selfattn.nn.lowering import lowered_text
  fused = functools.partial(attention.fused_attention, causal=True)
  lowered = {p: lowered_text(fused, q, k, v, platform=p)
             for p in ('cuda', 'cpu')}
  assert '4.096' in lowered['cuda'] and '4.096' not in lowered['cpu']
  # Shapes cuDNN does not take never ask for it, on any platform.
  asked.clear()
  attention.fused_attention(q.astype(f32), k.astype(f32), v.astype(f32))
  assert asked == [('xla', True, False)]


def test_fused_module_reaches_cudnns_own_causal_mask(monkeypatch):
  """MultiHeadAttention(attention_impl='fused') called with causal=True and
  nothing else hands cuDNN is_causal, not an (L, L) mask (it used to fold
  causal into the mask first, so cuDNN's causal kernel was never reached
  from a module). cuDNN is simulated as in the test above."""
  from selfattn.nn import attention
  monkeypatch.setattr(attention, 'cudnn_traceable', lambda: True)
  asked = []
  real = jax.nn.dot_product_attention

  def fake(*args, implementation=None, **kwargs):
    asked.append((implementation, kwargs['mask'] is None, kwargs['is_causal']))
    return real(*args, implementation='xla', **kwargs)

  monkeypatch.setattr(jax.nn, 'dot_product_attention', fake)
  attn = selfattn.MultiHeadAttention(32, 2, attention_impl='fused',
                                     dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 6, 32))
  out = nnx.jit(lambda m, x: m(x, causal=True))(attn, x)
  assert ('cudnn', True, True) in asked
  attn.attention_impl = 'plain'
  np.testing.assert_allclose(np.asarray(out, np.float32),
                             np.asarray(compiled(lambda m: m(x, causal=True),
                                                 attn), np.float32),
                             atol=3e-2)


def test_fused_path_is_really_taken_and_refuses_unknown_names(monkeypatch):
  attn = selfattn.MultiHeadAttention(16, 2, attention_impl='fused',
                                     rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(0), (1, 3, 16))
  calls = []
  real = jax.nn.dot_product_attention
  monkeypatch.setattr(jax.nn, 'dot_product_attention',
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  fused_out = compiled(lambda attn: attn(X), attn)
  assert len(calls) == 1
  # No weights exist on the fused path; capture falls back to plain and
  # returns them, with the same output.
  out, (weights,) = compiled(lambda attn: selfattn.attention_weights(attn, X),
                             attn)
  assert len(calls) == 1 and weights.shape == (1, 2, 3, 3)
  np.testing.assert_allclose(out, fused_out, atol=1e-6)
  with pytest.raises(ValueError, match="attention_impl='flash'.*valid: plain"):
    selfattn.MultiHeadAttention(16, 2, attention_impl='flash', rngs=nnx.Rngs(0))

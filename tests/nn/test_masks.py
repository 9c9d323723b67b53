"""The mask convention (selfattn/nn/masks.py): every mask means one thing, and
anything that could be misread raises."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from compiled import compiled


def _attn(f=16, heads=2):
  return selfattn.MultiHeadAttention(f, heads, rngs=nnx.Rngs(0))


def _weights(module, *args, **kwargs):
  _, (weights,) = compiled(
      lambda m: selfattn.attention_weights(m, *args, **kwargs), module)
  return np.asarray(weights)


def test_causal_mask_square_and_end_aligned():
  np.testing.assert_array_equal(selfattn.make_causal_mask(3)[0, 0],
                                np.tril(np.ones((3, 3), bool)))
  # 2 queries that are the last 2 of 4 positions.
  np.testing.assert_array_equal(selfattn.make_causal_mask(2, 4)[0, 0],
                                [[1, 1, 1, 0], [1, 1, 1, 1]])


def test_causal_mask_refuses_sizes_that_are_not_counts():
  """jnp.arange took them: -1 gave an empty (1, 1, 0, 0) mask and 2.5 a
  (1, 1, 3, 3) one, silently."""
  with pytest.raises(ValueError, match='num_queries=-1 must be an integer '
                     '>= 0'):
    selfattn.make_causal_mask(-1)
  with pytest.raises(TypeError, match=r'num_queries=2\.5 must be an integer'):
    selfattn.make_causal_mask(2.5)
  with pytest.raises(ValueError, match='num_keys=-2 must be an integer >= 0'):
    selfattn.make_causal_mask(3, -2)
  np.testing.assert_array_equal(
      selfattn.make_causal_mask(np.int64(2), np.int32(3))[0, 0],
      [[1, 1, 0], [1, 1, 1]])
  # A traced size is an integer, but no shape can be built from it.
  with pytest.raises(TypeError, match='num_queries must be an integer >= 0 '
                     'known when tracing; got a traced value'):
    jax.jit(selfattn.make_causal_mask)(3)


def test_square_causal_mask_is_not_read_as_key_padding_when_batch_equals_length():
  """The old silent bug: an (L, L) mask with B == L was read as (B, Lk)."""
  attn = _attn()
  X = jax.random.normal(jax.random.key(0), (4, 4, 16))
  tri = jnp.tril(jnp.ones((4, 4), bool))
  with pytest.raises(ValueError, match='4 axes'):
    attn(X, mask=tri)
  w = _weights(attn, X, mask=tri[None, None])
  assert np.all(w[..., np.triu_indices(4, 1)[0], np.triu_indices(4, 1)[1]] == 0)
  np.testing.assert_allclose(w, _weights(attn, X, causal=True), atol=0)


def test_float_masks_and_wrong_shapes_raise():
  attn = _attn()
  X = jnp.ones((2, 5, 16))
  with pytest.raises(TypeError, match='boolean'):
    attn(X, mask=jnp.zeros((2, 1, 1, 5)))           # additive mask in mask=
  with pytest.raises(ValueError, match='keys axis is 4'):
    attn(X, mask=jnp.ones((2, 1, 1, 4), bool))
  with pytest.raises(TypeError, match='float'):
    attn(X, bias=jnp.ones((2, 1, 1, 5), bool))
  with pytest.raises(ValueError, match=r'\(B,\) or \(B, Lq\)'):
    attn(X, valid_lens=jnp.ones((2, 5, 5), jnp.int32))
  with pytest.raises(ValueError, match='one row per example'):
    attn(X, valid_lens=jnp.array([3]))          # not silently broadcast
  with pytest.raises(ValueError, match='num_heads=0 must be an integer >= 1'):
    selfattn.MultiHeadAttention(16, 0, rngs=nnx.Rngs(0))


def test_inputs_that_do_not_fit_together_are_refused_by_name():
  """Shapes that used to fail deep inside an einsum, or to give a number
  anyway (one length spread over a batch, a narrower k read as zero-padded
  by the Pallas kernel, a 2-D X), are refused before any work, naming the
  argument."""
  from selfattn.nn import pallas_attention as pa
  from selfattn.nn.positions import t5_bucket
  attn, X = _attn(), jnp.ones((2, 5, 16))
  for args, match in [((jnp.ones((2, 5, 12)),), r'queries must be \(B, L, 16\)'),
                      ((jnp.ones((5, 16)),), r'queries must be \(B, L, 16\)'),
                      ((X, jnp.ones((3, 5, 16))), 'share the batch'),
                      ((X, X, jnp.ones((2, 6, 16))), 'their length')]:
    with pytest.raises(ValueError, match=match):
      attn(*args)
  with pytest.raises(ValueError, match=r'positions must be \(B, L\)'):
    attn(X, positions=jnp.arange(5))
  pallas = selfattn.MultiHeadAttention(16, 2, attention_impl='pallas',
                                       rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='one row per example'):
    pallas(X, valid_lens=jnp.array([3]))
  with pytest.raises(ValueError, match='one row per example'):
    selfattn.masked_softmax(jnp.ones((2, 2, 5, 5)), jnp.array([3]))
  with pytest.raises(ValueError, match='with valid_lens, X must be'):
    selfattn.masked_softmax(jnp.ones((5, 5)), jnp.arange(5))
  q, k = jnp.ones((2, 2, 5, 8)), jnp.ones((2, 2, 5, 4))
  for attend in (selfattn.dot_product_attention,
                 lambda q, k, v: pa.pallas_attention(q, k, v, interpret=True)):
    with pytest.raises(ValueError, match='same head width D'):
      attend(q, k, k)
    with pytest.raises(ValueError, match='one row per key'):
      attend(q, q, q[:, :, :4])
    with pytest.raises(ValueError, match=r'share \(B, H\)'):
      attend(q, jnp.ones((3, 2, 5, 8)), jnp.ones((3, 2, 5, 8)))
  # What the einsum broadcasts stays allowed: one key set for every example,
  # multi-query attention's one head of keys and values.
  kv = jax.random.normal(jax.random.key(0), (1, 1, 5, 8))
  attend = jax.jit(lambda q, kv: selfattn.dot_product_attention(q, kv, kv)[0])
  want = attend(q, jnp.broadcast_to(kv, q.shape))
  for shared in (kv, jnp.broadcast_to(kv, (2, 1, 5, 8)),
                 jnp.broadcast_to(kv, (1, 2, 5, 8))):
    got = attend(q, shared)
    np.testing.assert_allclose(got, want, atol=1e-6)
  # And a module's keys for every example, on every path (the kernels take
  # no batch broadcast: the module spreads them after projecting once).
  keys = jax.random.normal(jax.random.key(1), (1, 6, 16))
  for impl in ('plain', 'fused', 'chunked', 'pallas'):
    module = selfattn.MultiHeadAttention(16, 2, attention_impl=impl,
                                         rngs=nnx.Rngs(0))
    np.testing.assert_allclose(*compiled(lambda m: (
        m(X, keys), m(X, jnp.broadcast_to(keys, (2, 6, 16)))), module),
        atol=1e-6)
  with pytest.raises(ValueError, match=r'dropout must be in \[0, 1\)'):
    selfattn.MultiHeadAttention(16, 2, dropout=1.5, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='ffn_num_hiddens=0'):
    selfattn.TransformerEncoder(11, 16, 0, 2, 1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='max_distance must be >'):
    t5_bucket(jnp.arange(-5, 5), 32, max_distance=4)   # buckets went negative
  dec = selfattn.TransformerDecoder(11, 16, 32, 2, 1, cross_attention=True,
                                    rngs=nnx.Rngs(0))
  tokens = jnp.ones((2, 3), jnp.int32)
  with pytest.raises(ValueError, match='enc_valid_lens must have one row'):
    dec(tokens, jnp.ones((2, 4, 16)), jnp.array([3]))
  with pytest.raises(ValueError, match='enc_outputs must be'):
    dec(tokens, jnp.ones((3, 4, 16)), jnp.array([3, 3, 3]))
  # Another width was reported as the cross-attention's 'keys'.
  with pytest.raises(ValueError, match='enc_outputs must be .* num_hiddens = 16'):
    dec(tokens, jnp.ones((2, 4, 8)))


def test_per_query_valid_lens_are_respected_by_the_encoder():
  """The old silent bug: the encoder used row 0 of (B, Lq) lengths."""
  enc = selfattn.TransformerEncoder(10, 16, 32, 2, 2, position='rope',
                                    rngs=nnx.Rngs(0))
  x = jax.random.randint(jax.random.key(1), (2, 6), 0, 10)
  causal_lens = jnp.broadcast_to(jnp.arange(1, 7), (2, 6))
  (out, weights), causal = compiled(lambda enc: (
      selfattn.attention_weights(enc, x, causal_lens), enc(x, causal=True)),
                                    enc)
  for w in weights:
    w = np.asarray(w)
    np.testing.assert_allclose(w, np.tril(w), atol=0)
    np.testing.assert_allclose(w.sum(-1), 1.0, atol=1e-6)
  np.testing.assert_allclose(out, causal, atol=1e-6)


def test_bias_is_added_to_the_logits():
  """A bias of -inf on a key is the same as masking it; a finite bias equals
  a NumPy softmax of logits + bias."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.normal(size=(1, 2, 3, 4)), jnp.float32)
             for _ in range(3))
  bias = jnp.asarray(rng.normal(size=(1, 2, 3, 3)), jnp.float32)
  neg = jnp.zeros((1, 1, 1, 3)).at[..., 2].set(-jnp.inf)
  keep = jnp.ones((1, 1, 1, 3), bool).at[..., 2].set(False)
  (out, w), (by_bias, _), (by_mask, _) = compiled(lambda q, k, v: (
      selfattn.dot_product_attention(q, k, v, bias=bias),
      selfattn.dot_product_attention(q, k, v, bias=neg),
      selfattn.dot_product_attention(q, k, v, mask=keep)), q, k, v)
  logits = np.einsum('bhqd,bhkd->bhqk', q, k) / 2.0 + np.asarray(bias)
  want = np.exp(logits - logits.max(-1, keepdims=True))
  want /= want.sum(-1, keepdims=True)
  np.testing.assert_allclose(w, want, atol=1e-6)
  np.testing.assert_allclose(out, want @ np.asarray(v), atol=1e-5)
  np.testing.assert_allclose(by_bias, by_mask, atol=1e-6)


def test_masks_combine_with_and():
  attn = _attn()
  X = jax.random.normal(jax.random.key(2), (2, 5, 16))
  lens = jnp.array([3, 5])
  pad = selfattn.make_padding_mask(jnp.arange(5)[None, :] >= jnp.array([[1], [0]]))
  w = _weights(attn, X, valid_lens=lens, mask=pad, causal=True)
  allowed = (np.tril(np.ones((5, 5), bool))[None]
             & (np.arange(5) < np.array([3, 5])[:, None])[:, None, :]
             & (np.arange(5) >= np.array([1, 0])[:, None])[:, None, :])
  assert np.all(w[~np.broadcast_to(allowed[:, None], w.shape)] == 0)
  # Query 0 of example 0 has no allowed key: a zero row, never NaN.
  np.testing.assert_array_equal(w[0, :, 0], 0.0)
  # The three together are exactly their AND given as one mask (an all-False
  # combination would pass the zero checks above).
  np.testing.assert_allclose(
      w, _weights(attn, X, mask=jnp.asarray(allowed)[:, None]), atol=1e-6)
  rows = allowed.any(-1)
  np.testing.assert_allclose(w.sum(-1)[np.broadcast_to(rows[:, None],
                                                       w.shape[:-1])], 1.0,
                             atol=1e-5)


def test_masked_softmax_mask_needs_all_axes_of_x():
  X = jnp.zeros((2, 3, 4))
  with pytest.raises(ValueError, match='axes'):
    selfattn.masked_softmax(X, mask=jnp.ones((2, 4), bool))
  out = selfattn.masked_softmax(X, mask=jnp.ones((2, 1, 4), bool).at[..., 3].set(False))
  np.testing.assert_allclose(out[..., :3], 1 / 3, atol=1e-6)


def test_empty_batches_and_sequences_raise_a_clear_error():
  """B = 0 or L = 0 used to surface as ZeroDivisionError from a reshape."""
  enc = selfattn.TransformerEncoder(10, 16, 32, 2, 1, position='sinusoidal',
                                    max_len=16, rngs=nnx.Rngs(0))
  for shape in [(2, 0), (0, 4)]:
    with pytest.raises(ValueError, match='at least one example and one position'):
      enc(jnp.zeros(shape, jnp.int32))


def test_out_of_range_lengths_keep_no_key_or_every_key():
  """The documented contract for data the library cannot check under jit."""
  X = jnp.asarray(np.random.default_rng(0).normal(size=(3, 2, 4)), jnp.float32)
  weights = selfattn.masked_softmax(X, jnp.array([-1, 9, 4]))
  np.testing.assert_array_equal(weights[0], 0.0)
  np.testing.assert_allclose(weights[1], selfattn.masked_softmax(X[1:2])[0],
                             atol=1e-7)
  np.testing.assert_allclose(weights[2], selfattn.masked_softmax(X[2:3])[0],
                             atol=1e-7)

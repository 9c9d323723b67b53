"""No silent wrong answers from the library (issue 25, section 1): each case
gave wrong numbers or a deep error without a word, and now either raises a
ValueError naming the argument, or (under jit, where a data-dependent check
cannot raise) gives NaN that a caller cannot miss, or the right numbers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from compiled import compiled
from compiled import decode_step
from compiled import forward
from selfattn.nn import attention
from selfattn.nn import chunked
from selfattn.nn import positions
from tiers import EXTENDED
from tiers import each_choice
from tiers import product


def make_decoder(position='rope', **kwargs):
  return selfattn.TransformerDecoder(11, 16, 32, 4, 2, position=position,
                                     max_len=32, rngs=nnx.Rngs(0), **kwargs)


def toks(shape, seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 0, 11)


# --------------------------------------------------------------------------
# Decoding past the cache.
# --------------------------------------------------------------------------

@pytest.mark.parametrize('scan_layers', [False, True], ids=['loop', 'scan'])
def test_decoding_past_the_cache_raises_eagerly(scan_layers):
  dec = make_decoder(scan_layers=scan_layers)
  x = toks((2, 8))
  full = forward(dec, x)
  dec.init_cache(2, 4)
  # The first steps compiled; the step that exactly fills the cache and the
  # calls past it stay eager (the eager check must pass the first, refuse
  # the others).
  steps = [decode_step(dec, x[:, t:t + 1]) for t in range(3)]
  steps.append(dec(x[:, 3:4], decode=True))
  np.testing.assert_allclose(jnp.concatenate(steps, 1), full[:, :4],
                             atol=1e-5)
  with pytest.raises(ValueError, match='max_length=4'):
    dec(x[:, 4:5], decode=True)
  dec.init_cache(2, 4)
  decode_step(dec, x[:, :3])
  with pytest.raises(ValueError, match='past the end of the cache'):
    dec(x[:, 3:5], decode=True)          # 3 + 2 > 4


def test_a_prompt_longer_than_the_cache_raises():
  dec = make_decoder()
  dec.init_cache(2, 4)
  with pytest.raises(ValueError, match='max_length=4'):
    dec(toks((2, 5)), decode=True)
  attn = selfattn.MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
  attn.init_cache(2, 4)
  with pytest.raises(ValueError, match='max_length=4'):
    attn(jnp.ones((2, 5, 16)), decode=True)


@pytest.mark.parametrize('scan_layers', [False, True], ids=['loop', 'scan'])
def test_decoding_past_the_cache_under_jit_gives_nan(scan_layers):
  """Under nnx.jit the fill index is traced: steps within the cache equal the
  full causal pass, and every step from the first that does not fit is NaN
  (before the fix they were finite and 0.6-1.2 off)."""
  dec = make_decoder(scan_layers=scan_layers)
  x = toks((2, 8))
  full = forward(dec, x)
  dec.init_cache(2, 4)
  outs = [decode_step(dec, x[:, t:t + 1]) for t in range(8)]
  np.testing.assert_allclose(jnp.concatenate(outs[:4], 1), full[:, :4],
                             atol=1e-5)
  for out in outs[4:]:
    assert np.all(np.isnan(np.asarray(out)))


def test_attention_decoding_past_the_cache_raises_or_gives_nan():
  attn = selfattn.MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (1, 6, 16))
  full = compiled(lambda m, x: m(x, causal=True), attn, x)
  attn.init_cache(1, 3)
  # Compiled within the cache, but the step that fills it and the one past
  # it eager (the eager check must pass the first and refuse the second).
  for t in range(3):
    call = decode_step if t < 2 else (
        lambda attn, tok: attn(tok, decode=True))
    np.testing.assert_allclose(call(attn, x[:, t:t + 1]),
                               full[:, t:t + 1], atol=1e-5)
  with pytest.raises(ValueError, match='past the end of the cache'):
    attn(x[:, 3:4], decode=True)
  attn.init_cache(1, 3)
  outs = [decode_step(attn, x[:, t:t + 1]) for t in range(5)]
  np.testing.assert_allclose(jnp.concatenate(outs[:3], 1), full[:, :3],
                             atol=1e-5)
  assert np.all(np.isnan(np.asarray(outs[3])))
  assert np.all(np.isnan(np.asarray(outs[4])))


def test_init_cache_with_the_wrong_batch_size_names_it():
  dec = make_decoder()
  dec.init_cache(3, 8)
  with pytest.raises(ValueError, match='batch_size=3'):
    dec(toks((2, 1)), decode=True)
  attn = selfattn.MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
  attn.init_cache(3, 8)
  with pytest.raises(ValueError, match='batch_size=3'):
    attn(jnp.ones((2, 1, 16)), decode=True)


# --------------------------------------------------------------------------
# Encoder outputs given to a decoder without cross-attention.
# --------------------------------------------------------------------------

def test_encoder_outputs_to_a_decoder_without_cross_attention_raise():
  dec = make_decoder()
  y = toks((2, 4))
  enc_out = jax.random.normal(jax.random.key(2), (2, 5, 16))
  with pytest.raises(ValueError, match='enc_outputs.*cross_attention=True'):
    dec(y, enc_out)
  with pytest.raises(ValueError, match='enc_outputs'):
    dec(y, enc_out, jnp.array([5, 3]))
  with pytest.raises(ValueError, match='enc_valid_lens'):
    dec(y, None, jnp.array([5, 3]))
  blk = selfattn.TransformerDecoderBlock(16, 32, 4, 0.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='enc_outputs'):
    blk(jnp.ones((2, 4, 16)), enc_out)
  # The block names what was given (enc_lens alone was called enc_mask).
  with pytest.raises(ValueError, match='^enc_lens passed, but'):
    blk(jnp.ones((2, 4, 16)), enc_lens=jnp.array([5, 3]))
  # A decoder with cross-attention still takes them.
  assert forward(make_decoder(cross_attention=True), y,
                 enc_out).shape == (2, 4, 11)


# --------------------------------------------------------------------------
# TransformerEncoder(causal=True).
# --------------------------------------------------------------------------

def test_an_encoder_built_causal_attends_causally_by_default():
  """Huang's causal skew is only right below the diagonal: a causal-built
  encoder called without causal= must not let early positions see later
  tokens (before the fix it did, with wrong logits for the future keys)."""
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 2, position='huang',
                                    max_len=16, causal=True,
                                    rngs=nnx.Rngs(0))
  x = toks((2, 7))
  changed = x.at[:, 4:].set((x[:, 4:] + 1) % 11)
  causally = nnx.jit(lambda m, x: m(x, causal=True))
  out = forward(enc, x)
  out_changed = forward(enc, changed)
  np.testing.assert_allclose(out[:, :4], out_changed[:, :4], atol=1e-6)
  assert float(jnp.abs(out[:, 4:] - out_changed[:, 4:]).max()) > 1e-4
  np.testing.assert_allclose(out, causally(enc, x), atol=0)
  # The same model with the causal mask built by hand (an independent route).
  tri = selfattn.make_causal_mask(7)
  np.testing.assert_allclose(out, forward(enc, x, mask=tri), atol=1e-6)
  with pytest.raises(ValueError, match='causal=False'):
    enc(x, causal=False)
  # A bidirectional encoder can still be called causally.
  bi = selfattn.TransformerEncoder(11, 16, 32, 2, 1, position='rope',
                                   rngs=nnx.Rngs(0))
  np.testing.assert_allclose(causally(bi, x)[:, :4],
                             causally(bi, changed)[:, :4], atol=1e-6)
  assert float(jnp.abs(forward(bi, x)[:, :4]
                       - forward(bi, changed)[:, :4]).max()) > 1e-4


# --------------------------------------------------------------------------
# The three attention paths agree on rows with no allowed key.
# --------------------------------------------------------------------------

def _qkv(lq=6, lk=6, b=2, h=2, d=8, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (b, h, lq, d)),
          jax.random.normal(keys[1], (b, h, lk, d)),
          jax.random.normal(keys[2], (b, h, lk, d)))


def _three_paths(q, k, v, **kwargs):
  plain, _ = attention.dot_product_attention(q, k, v, **kwargs)
  fused = attention.fused_attention(q, k, v, **kwargs)
  blocks = chunked.chunked_attention(q, k, v, query_chunk=4, key_chunk=4,
                                     **kwargs)
  return plain, fused, blocks


def test_rows_with_no_allowed_key_are_zero_on_every_path():
  q, k, v = _qkv()
  keep = jnp.ones((2, 1, 6, 6), bool).at[0, :, 2, :].set(False)
  keep = keep.at[1, :, 5, :].set(False)
  plain, fused, blocks = jax.jit(
      lambda q, k, v, keep: _three_paths(q, k, v, mask=keep))(q, k, v, keep)
  assert np.all(np.asarray(fused[0, :, 2]) == 0)
  assert np.all(np.asarray(fused[1, :, 5]) == 0)
  np.testing.assert_allclose(fused, plain, atol=2e-6)
  np.testing.assert_allclose(blocks, plain, atol=2e-6)
  # Through the module: valid_lens of 0 keeps no key for that example.
  x = jax.random.normal(jax.random.key(1), (2, 5, 16))
  outs = {}
  for impl in ('plain', 'fused', 'chunked'):
    attn = selfattn.MultiHeadAttention(16, 2, attention_impl=impl,
                                       rngs=nnx.Rngs(0))
    outs[impl] = compiled(lambda m, x: m(x, valid_lens=jnp.array([0, 3])),
                          attn, x)
  for impl in ('fused', 'chunked'):
    np.testing.assert_allclose(outs[impl], outs['plain'], atol=2e-6)


# --------------------------------------------------------------------------
# NaN or inf in padding never reaches valid outputs or gradients.
# --------------------------------------------------------------------------

# NaN in the commit tier. Extended: inf and -inf take the same masking on
# every path (0 * inf is NaN too), the [nan] case's (tests/README.md).
@pytest.mark.parametrize('bad', [
    np.nan, pytest.param(np.inf, marks=EXTENDED),
    pytest.param(-np.inf, marks=EXTENDED)])
def test_nan_or_inf_in_padded_keys_and_values_changes_nothing(bad):
  """Keys and values past valid_lens hold `bad` (or zeros): the valid
  outputs, and the gradients for q, k, v, are the same finite numbers on
  every path (0 * NaN = NaN used to reach them on plain and chunked)."""
  q, k, v = _qkv(lq=6, lk=7)
  lens = jnp.array([4, 7])
  keep = (jnp.arange(7)[None, :] < lens[:, None])[:, None, None, :]
  pad = ~keep[:, :, 0, :, None]                        # (B, 1, Lk, 1)
  clean_k, clean_v = jnp.where(pad, 0.0, k), jnp.where(pad, 0.0, v)
  dirty_k, dirty_v = jnp.where(pad, bad, k), jnp.where(pad, bad, v)

  def loss(fn, q, k, v):
    return (fn(q, k, v) ** 2).sum()

  paths = {
      'plain': lambda q, k, v: attention.dot_product_attention(
          q, k, v, mask=keep)[0],
      'fused': lambda q, k, v: attention.fused_attention(q, k, v, mask=keep),
      'chunked': lambda q, k, v: chunked.chunked_attention(
          q, k, v, mask=keep, query_chunk=4, key_chunk=3),
      'chunked causal': lambda q, k, v: chunked.chunked_attention(
          q, k, v, mask=keep, causal=True, query_chunk=4, key_chunk=3),
  }
  for name, fn in paths.items():
    # One compiled program per path, run on the clean and the dirty inputs.
    run = jax.jit(fn)
    want = run(q, clean_k, clean_v)
    got = run(q, dirty_k, dirty_v)
    assert np.isfinite(np.asarray(got)).all(), name
    np.testing.assert_allclose(got, want, atol=2e-6, err_msg=name)
    grad = jax.jit(jax.grad(lambda *a: loss(fn, *a), argnums=(0, 1, 2)))
    grads = grad(q, dirty_k, dirty_v)
    clean = grad(q, clean_k, clean_v)
    for g, c in zip(grads, clean):
      assert np.isfinite(np.asarray(g)).all(), name
      np.testing.assert_allclose(g, c, atol=2e-5, err_msg=name)


# Each encoding and path once in the commit tier, and Shaw's terms through
# the chunked path's online softmax (where a NaN could leak through a
# masked block); every pair with --extended.
@pytest.mark.parametrize('position,impl', each_choice(product(
    ['none', 'shaw', 'rope', 'xl'], ['plain', 'fused', 'chunked']),
    always=[('shaw', 'chunked')]))
def test_nan_in_padded_inputs_to_attention_changes_no_valid_output(impl,
                                                                  position):
  """Through MultiHeadAttention with valid_lens and a relative encoding:
  NaN keys/values at padded positions give the outputs of zero padding, and
  the gradients for the inputs stay finite."""
  relative = None
  if position != 'none':
    kind, options = positions.get_position(position, {})
    relative = kind.build(num_heads=2, head_dim=8, max_len=16,
                          param_dtype=jnp.float32, rngs=nnx.Rngs(1),
                          **options)
  attn = selfattn.MultiHeadAttention(16, 2, relative=relative,
                                     attention_impl=impl, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(1), (2, 5, 16))
  mem = jax.random.normal(jax.random.key(2), (2, 6, 16))
  lens = jnp.array([3, 6])
  pad = (jnp.arange(6)[None, :] >= lens[:, None])[..., None]
  clean, dirty = jnp.where(pad, 0.0, mem), jnp.where(pad, jnp.nan, mem)
  want = forward(attn, x, clean, valid_lens=lens)
  got = forward(attn, x, dirty, valid_lens=lens)
  assert np.isfinite(np.asarray(got)).all()
  np.testing.assert_allclose(got, want, atol=2e-6)
  # Gradients for the inputs are finite (the padded ones exactly zero). The
  # projections' own gradients hold x^T dk, where 0 * NaN is NaN again: no
  # attention can help that; padding that feeds a trained projection must be
  # finite (selfattn's batches pad with token 0).
  def input_grads(attn, x, mem):
    loss = lambda x, mem: (attn(x, mem, valid_lens=lens) ** 2).sum()
    return jax.grad(loss, argnums=(0, 1))(x, mem)
  input_grads = nnx.jit(input_grads)
  g_x, g_mem = input_grads(attn, x, dirty)
  assert np.isfinite(np.asarray(g_x)).all()
  assert np.isfinite(np.asarray(g_mem)).all()
  assert np.all(np.asarray(g_mem)[np.asarray(pad[..., 0])] == 0)
  np.testing.assert_allclose(g_x, input_grads(attn, x, clean)[0], atol=2e-5)


# --------------------------------------------------------------------------
# ALiBi slopes.
# --------------------------------------------------------------------------

def _reference_slopes(n):
  """A transcription of `get_slopes` in Press et al.'s ALiBi code (and of
  `_get_alibi_slopes` in the randomized-positional-encodings code)."""
  def get_slopes_power_of_2(n):
    start = 2 ** (-2 ** -(math.log2(n) - 3))
    ratio = start
    return [start * ratio ** i for i in range(n)]

  if math.log2(n).is_integer():
    return get_slopes_power_of_2(n)
  closest_power_of_2 = 2 ** math.floor(math.log2(n))
  return (get_slopes_power_of_2(closest_power_of_2)
          + _reference_slopes(2 * closest_power_of_2)[0::2][
              :n - closest_power_of_2])


@pytest.mark.parametrize('num_heads', range(1, 17))
def test_alibi_slopes_follow_the_reference_rule(num_heads):
  np.testing.assert_allclose(positions.alibi_slopes(num_heads),
                             _reference_slopes(num_heads), rtol=1e-12)


def test_alibi_slopes_for_three_heads_and_powers_of_two():
  np.testing.assert_allclose(positions.alibi_slopes(3),
                             [1 / 16, 1 / 256, 1 / 4], rtol=1e-12)
  for h in (1, 2, 4, 8, 16):    # unchanged: 2^(-8i/H)
    np.testing.assert_allclose(positions.alibi_slopes(h),
                               2.0 ** (-8.0 * np.arange(1, h + 1) / h))
  # The module uses them.
  alibi = positions.ALiBi(3, symmetric=True)
  q = jnp.zeros((1, 3, 4, 2))
  bias = alibi.logits(q, q)
  np.testing.assert_allclose(bias[0, :, 0, 1], -np.array([1 / 16, 1 / 256,
                                                          1 / 4]), rtol=1e-6)


# --------------------------------------------------------------------------
# Clear errors for user mistakes.
# --------------------------------------------------------------------------

def test_learned_positions_outside_the_table_name_positions():
  enc = positions.LearnedEncoding(8, max_len=10, rngs=nnx.Rngs(0))
  X = jnp.zeros((1, 3, 8))
  with pytest.raises(ValueError, match='positions'):
    enc(X, positions=jnp.array([[-1, 0, 1]]))
  with pytest.raises(ValueError, match='positions'):
    enc(X, positions=jnp.array([[0, 5, 10]]))
  np.testing.assert_allclose(enc(X, positions=jnp.array([[0, 9, 2]]))[0],
                             enc.P[0][jnp.array([0, 9, 2])])
  model = selfattn.TransformerEncoder(11, 8, 16, 2, 1, position='learned',
                                      max_len=10, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='positions'):
    model(toks((1, 3)), positions=jnp.array([[-2, 0, 1]]))


def test_greedy_decode_with_zero_steps_returns_the_prompt():
  dec = make_decoder()
  prompt = toks((2, 3))
  out = selfattn.greedy_decode(dec, prompt, 0)
  assert out.shape == (2, 3)
  np.testing.assert_array_equal(out, prompt)
  assert compiled(lambda m, p: selfattn.greedy_decode(m, p, 2),
                  dec, prompt).shape == (2, 5)
  with pytest.raises(ValueError, match='num_steps'):
    selfattn.greedy_decode(dec, prompt, -1)
  with pytest.raises(ValueError, match='prompt'):
    selfattn.greedy_decode(dec, prompt[0], 2)


def test_rank_one_token_arrays_name_the_argument():
  dec = make_decoder()
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='tokens must be .B, L. int'):
    dec(toks((5,)))
  with pytest.raises(ValueError, match='inputs must be .B, L. int'):
    enc(toks((5,)))
  with pytest.raises(ValueError, match=r'inputs must be \(B, L\) int .* or '
                     r'\(B, L, num_hiddens\) float .*inputs\[None\]'):
    enc(jnp.ones((5, 16)))
  with pytest.raises(ValueError, match='inputs must be .B, L, num_hiddens. '
                     'features; got shape .5,.'):
    enc(jnp.ones((5,)))


def test_float_or_bool_token_ids_are_named_as_such():
  """Float ids were taken for features and refused for their width, with
  a hint (add a batch axis) that led to another error."""
  dec = make_decoder()
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 1, rngs=nnx.Rngs(0))
  for module, name in ((enc, 'inputs'), (dec, 'tokens')):
    with pytest.raises(ValueError, match=rf'{name}.astype\(jnp.int32\)'):
      module(jnp.array([[1., 2., 3.]]))
    with pytest.raises(TypeError, match=f'{name} must be .* got dtype bool'):
      module(jnp.array([[True, False]]))


# --------------------------------------------------------------------------
# Inputs a Flax user could pass by mistake (a helper's probe of the public
# API, 2026-11-30): each gave a silent wrong answer or a deep JAX error.
# --------------------------------------------------------------------------

def _heads(shape=(2, 2, 4, 8), seed=0, dtype=jnp.float32):
  return jax.random.normal(jax.random.key(seed), shape, dtype)


def test_an_additive_float_mask_is_refused_not_read_as_truth_values():
  # [0, -inf] meant "keep, drop"; as truth values it reads "drop, keep".
  with pytest.raises(TypeError, match='boolean'):
    selfattn.make_padding_mask(jnp.array([[0.0, -jnp.inf]]))
  for valid in (jnp.array([[True, False]]), jnp.array([[1, 0]])):
    np.testing.assert_array_equal(
        selfattn.make_padding_mask(valid), [[[[True, False]]]])


def test_integer_queries_and_logits_are_refused():
  # An int q took the 1/sqrt(D) scale as 0: uniform weights, silently.
  q = jnp.ones((2, 2, 4, 8), jnp.int32)
  with pytest.raises(TypeError, match='q must be float'):
    selfattn.dot_product_attention(q, q, _heads())
  with pytest.raises(TypeError, match='X must be float'):
    selfattn.masked_softmax(jnp.ones((2, 3, 4), jnp.int32))
  # A 1-D row of logits is a softmax over its one axis.
  np.testing.assert_allclose(selfattn.masked_softmax(jnp.zeros(4)),
                             jnp.full(4, 0.25))


def test_dot_product_attention_checks_positions_and_the_encoding_s_heads():
  q = _heads()
  alibi = positions.ALiBi(4)       # built for 4 heads; q has 2
  with pytest.raises(ValueError, match='built for 4 heads'):
    selfattn.dot_product_attention(q, q, q, relative=alibi)
  rope = positions.RotaryEncoding(8)
  with pytest.raises(ValueError, match='q_positions must be'):
    selfattn.dot_product_attention(q, q, q, relative=rope,
                                   q_positions=jnp.zeros((2, 5), jnp.int32))
  with pytest.raises(TypeError, match='k_positions must be integers'):
    selfattn.dot_product_attention(
        q, q, q, relative=rope, k_positions=jnp.zeros((2, 4), jnp.float32))
  # Shared positions, (1, L), still pass: 0..L-1 shared is the default.
  out, _ = selfattn.dot_product_attention(
      q, q, q, relative=rope, q_positions=jnp.arange(4)[None],
      k_positions=jnp.arange(4)[None])
  np.testing.assert_allclose(
      out, selfattn.dot_product_attention(q, q, q, relative=rope)[0],
      atol=1e-6)


def test_float_positions_are_refused_not_truncated():
  # ALiBi, T5 and Shaw read 0.5 as 0; a learned table failed deep inside;
  # decoding cast them to int before the model saw them; a meter failed
  # first, deep inside.
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 1, position='alibi',
                                    rngs=nnx.Rngs(0))
  floats = jnp.array([[0.0, 0.5, 1.0]])
  with pytest.raises(TypeError, match='positions must be integers'):
    enc(toks((1, 3)), positions=floats)
  metered = selfattn.TransformerEncoder(11, 16, 32, 2, 1, meter_period=4,
                                        rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match='positions must be integers'):
    metered(toks((1, 3)), positions=floats)
  from selfattn.nn import decoding
  with pytest.raises(TypeError, match='positions must be integers'):
    decoding.greedy_search(make_decoder('alibi'), toks((1, 2)), 1,
                           positions=floats)
  # Integer positions as a Python list still work, as the same array does.
  listed = enc(toks((1, 3)), positions=[[0, 2, 4]])
  np.testing.assert_allclose(
      listed, enc(toks((1, 3)), positions=jnp.array([[0, 2, 4]])), atol=1e-6)
  assert np.abs(np.asarray(listed - enc(toks((1, 3))))).max() > 1e-4


def test_a_decode_step_s_mask_is_checked_against_the_whole_cache():
  # ... before the step writes the cache or moves its counter: a refused
  # call changes nothing.
  dec = make_decoder()
  dec.init_cache(2, 6)
  with pytest.raises(ValueError, match='does not broadcast'):
    dec(toks((2, 2)), mask=jnp.ones((2, 1, 1, 2), bool), decode=True)
  assert int(dec.next_position[...]) == 0
  attn = selfattn.MultiHeadAttention(8, 2, rngs=nnx.Rngs(0))
  attn.init_cache(1, 6)
  with pytest.raises(ValueError, match='does not broadcast'):
    attn(jnp.ones((1, 2, 8)), mask=jnp.ones((1, 1, 2, 2), bool), decode=True)
  assert int(attn.cache['index'][...]) == 0


def test_constructions_that_failed_on_their_first_call_fail_at_once():
  with pytest.raises(ValueError, match='even model width'):
    selfattn.TransformerEncoder(11, 15, 32, 3, 1, position='xl',
                                rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='needs a vocab_size'):
    selfattn.TransformerDecoder(None, 16, 32, 2, 1, rngs=nnx.Rngs(0))


def test_layers_name_a_wrong_input_width():
  ffn = selfattn.PositionWiseFFN(8, 16, 8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='num_inputs = 8'):
    ffn(jnp.ones((2, 3, 6)))
  add_norm = selfattn.AddNorm(8, 0.0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='num_hiddens = 8'):
    add_norm(jnp.ones((2, 3, 6)), lambda x: x)
  with pytest.raises(ValueError, match='keep X.s shape'):
    add_norm(jnp.ones((2, 3, 8)), lambda x: x[..., :4])
  none = selfattn.NoEncoding(8, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r'X must be \(B, L, 8\)'):
    none(jnp.ones((2, 3, 5)))


def test_greedy_decode_refuses_a_model_whose_outputs_are_not_logits():
  # A causal encoder decodes too, but the argmax of its features is no token.
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 1, causal=True,
                                    rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match='needs a TransformerDecoder'):
    selfattn.greedy_decode(enc, toks((2, 3)), 2)


def test_huang_s_causal_skew_is_refused_in_bidirectional_attention():
  # Above the diagonal the causal skew reads leftover entries that only a
  # causal mask hides: a bidirectional call got numbers from them.
  huang = positions.HuangRelative(2, 8, max_len=16, causal=True,
                                  rngs=nnx.Rngs(0))
  attn = selfattn.MultiHeadAttention(16, 2, relative=huang, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.key(0), (2, 5, 16))
  with pytest.raises(ValueError, match=r'causal skew: call with causal=True'):
    attn(x)
  causal = attn(x, causal=True)
  # A causal mask, or explicit positions (Huang then gathers per offset),
  # give the same numbers and are left alone.
  np.testing.assert_allclose(
      attn(x, mask=selfattn.make_causal_mask(5)), causal, atol=1e-6)
  attn(x, positions=jnp.arange(5)[None])
  q = x.reshape(2, 5, 2, 8).transpose(0, 2, 1, 3)
  with pytest.raises(ValueError, match=r'causal skew'):
    selfattn.dot_product_attention(q, q, q, relative=huang)


def test_shaw_s_value_term_names_a_value_width_it_cannot_add_to():
  shaw = positions.ShawRelative(2, 4, relative_values=True, rngs=nnx.Rngs(0))
  q = _heads((2, 2, 4, 4))
  with pytest.raises(ValueError, match='a\\^V is 4 wide; v has width 3'):
    selfattn.dot_product_attention(q, q, _heads((2, 2, 4, 3)), relative=shaw)


# --------------------------------------------------------------------------
# A second probe of the public API as a Flax user would call it
# (2026-12-01): each failed late, with a message that did not name the
# mistake, or was taken silently.
# --------------------------------------------------------------------------

def test_a_relative_that_is_no_encoding_is_refused_when_built():
  # 'rope' (the encoder's position=) failed on the first call with
  # AttributeError: 'str' object has no attribute 'rotate'.
  with pytest.raises(TypeError, match="got str, .*position='rope'"):
    selfattn.MultiHeadAttention(16, 2, relative='rope', rngs=nnx.Rngs(0))
  absolute = selfattn.SinusoidalEncoding(16, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match='got SinusoidalEncoding, without '
                     'rotate, logits, values'):
    selfattn.MultiHeadAttention(16, 2, relative=absolute, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match='relative must be'):
    selfattn.dot_product_attention(*[_heads()] * 3, relative='alibi')
  # build_encoding makes one by name; it equals the class built directly.
  built = positions.build_encoding('alibi', num_hiddens=16, num_heads=2,
                                   max_len=8, rngs=nnx.Rngs(0))
  x = _heads()
  np.testing.assert_array_equal(
      selfattn.dot_product_attention(x, x, x, relative=built)[0],
      selfattn.dot_product_attention(x, x, x,
                                     relative=positions.ALiBi(2))[0])


def test_dropout_without_a_dropout_stream_says_how_to_give_one():
  # Flax's message said no rngs were given, to a user who had passed some.
  x = jnp.ones((2, 3, 16))
  attn = selfattn.MultiHeadAttention(16, 2, 0.1, rngs=nnx.Rngs(params=0))
  enc = selfattn.TransformerEncoder(11, 16, 32, 2, 1, 0.1,
                                    rngs=nnx.Rngs(params=0))
  chunked = selfattn.MultiHeadAttention(16, 2, 0.1, attention_impl='chunked',
                                       rngs=nnx.Rngs(params=0))
  for call in (lambda: attn(x, deterministic=False),
               lambda: chunked(x, deterministic=False),
               lambda: enc(toks((2, 3)), deterministic=False)):
    with pytest.raises(ValueError, match="without a 'dropout' rng stream"):
      call()
  # Evaluation needs no stream; with one, training-mode calls draw masks.
  np.testing.assert_array_equal(attn(x), attn(x, deterministic=True))
  with_stream = selfattn.MultiHeadAttention(16, 2, 0.1,
                                            rngs=nnx.Rngs(params=0, dropout=1))
  assert not np.array_equal(with_stream(x, deterministic=False),
                            with_stream(x, deterministic=True))


@pytest.mark.parametrize('build', [
    lambda: selfattn.TransformerEncoder(11, 16, 32, 2, 1, position='alibi',
                                        alibi_symmetric='False',
                                        rngs=nnx.Rngs(0)),
    lambda: selfattn.TransformerEncoder(11, 16, 32, 2, 1, position='shaw',
                                        shared_heads='False',
                                        rngs=nnx.Rngs(0)),
    lambda: positions.ShawRelative(2, 8, relative_values=1,
                                   rngs=nnx.Rngs(0)),
    lambda: positions.ALiBi(2, symmetric='yes'),
    lambda: selfattn.TransformerEncoder(11, 16, 32, 2, 1, residual='False',
                                        rngs=nnx.Rngs(0)),
    lambda: selfattn.TransformerDecoder(11, 16, 32, 2, 1, tie_output=1,
                                        rngs=nnx.Rngs(0)),
    lambda: selfattn.TransformerDecoderBlock(16, 32, 2, cross_attention='False',
                                             rngs=nnx.Rngs(0)),
    lambda: selfattn.MultiHeadAttention(16, 2, use_bias='False',
                                        rngs=nnx.Rngs(0)),
    lambda: selfattn.AddNorm(16, residual='False', rngs=nnx.Rngs(0)),
    lambda: selfattn.TransformerEncoder(11, 16, 32, 2, 1,
                                        causal=jnp.array(True),
                                        rngs=nnx.Rngs(0)),
], ids=['alibi_symmetric', 'shared_heads', 'relative_values', 'symmetric',
        'residual', 'tie_output', 'cross_attention', 'use_bias',
        'addnorm_residual', 'jax_array'])
def test_switches_take_only_booleans(build):
  # The string 'False' is truthy: it built the other variant silently.
  with pytest.raises(TypeError, match='must be True or False'):
    build()


def test_cache_sizes_are_checked_when_the_cache_is_made():
  dec = make_decoder()
  attn = selfattn.MultiHeadAttention(16, 2, rngs=nnx.Rngs(0))
  for module in (dec, attn):
    with pytest.raises(TypeError, match='max_length=4.0 must be an integer'):
      module.init_cache(2, 4.0)
    with pytest.raises(ValueError, match='max_length=0 must be an integer'):
      module.init_cache(2, 0)
    with pytest.raises(ValueError, match='batch_size=-1 must be an integer'):
      module.init_cache(-1, 4)


def test_lengths_given_as_a_block_s_mask_point_to_valid_lens():
  # A block's second positional argument is its mask, the encoder's its
  # lengths.
  block = selfattn.TransformerEncoderBlock(16, 32, 2, rngs=nnx.Rngs(0))
  with pytest.raises(TypeError, match=r'mask.astype\(bool\); lengths go in '
                     'valid_lens='):
    block(jnp.ones((2, 3, 16)), jnp.array([3, 2]))
  # A features-only encoder's hint speaks of features, not token ids.
  features = selfattn.TransformerEncoder(None, 16, 32, 2, 1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match=r'must be \(B, L, num_hiddens\) '
                     r'features; got shape \(5, 16\)'):
    features(jnp.ones((5, 16)))

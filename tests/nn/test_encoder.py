"""Properties of the stacked encoder, for every positional encoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn
from flax import nnx
from flax.nnx import bridge
from flax.traverse_util import flatten_dict

import selfattn
from compiled import compiled, decode_step, grads
import reference
from reference import assert_scanned_grads_match
from reference import stack_loop_into_scan
from tiers import EXTENDED

ALL = selfattn.POSITION_NAMES
ABSOLUTE = ('sinusoidal', 'learned')
VOCAB = 11


def make(position, *, norm='post', residual=True, layers=2, dtype=None, seed=0):
  return selfattn.TransformerEncoder(
      VOCAB, 16, 32, 4, layers, 0.0, position=position, max_len=32, norm=norm,
      residual=residual, dtype=dtype, rngs=nnx.Rngs(seed),
      **({'clip_distance': 3} if position == 'shaw' else {}))


def tokens(shape, seed=0):
  return jax.random.randint(jax.random.key(seed), shape, 0, VOCAB)


@pytest.mark.parametrize('position', ALL)
def test_padded_tokens_never_change_valid_outputs(position):
  enc = make(position)
  x = tokens((2, 9))
  lens = jnp.array([5, 9])
  other = x.at[0, 5:].set((x[0, 5:] + 3) % VOCAB)
  a, b = enc(x, lens), enc(other, lens)
  np.testing.assert_allclose(a[0, :5], b[0, :5], atol=1e-5)
  np.testing.assert_allclose(a[1], b[1], atol=1e-5)
  assert np.abs(np.asarray(a[0, 5:] - b[0, 5:])).max() > 1e-4  # padding itself did change


@pytest.mark.parametrize('position', ALL)
def test_only_no_encoding_is_permutation_equivariant(position):
  enc = make(position)
  x = tokens((2, 8), seed=1)
  perm = np.random.default_rng(0).permutation(8)
  gap = np.abs(np.asarray(enc(x[:, perm]) - enc(x)[:, perm])).max()
  if position == 'none':
    assert gap < 1e-5
  else:
    assert gap > 1e-3


# none, the absolute encodings and RoPE in the commit tier; the other relative
# encodings --extended (tiers.py): that they see only offsets is
# test_positions.py's test_relative_encodings_see_only_offsets_between_positions
# for each, and that masked keys change nothing is
# test_padded_tokens_never_change_valid_outputs for each.
LEFT_PADDING_COMMIT_TIER = ('none', 'sinusoidal', 'learned', 'rope')


@pytest.mark.parametrize('position', [
    p if p in LEFT_PADDING_COMMIT_TIER else pytest.param(p, marks=EXTENDED)
    for p in ALL])
def test_left_padding_changes_only_absolute_encodings(position):
  enc = make(position)
  x = tokens((2, 6), seed=2)
  pad = 3
  padded = jnp.concatenate([jnp.zeros((2, pad), x.dtype), x], axis=1)
  mask = jnp.arange(6 + pad)[None, :] >= pad
  mask = jnp.broadcast_to(mask, padded.shape)
  gap = np.abs(np.asarray(
      enc(padded, mask=selfattn.make_padding_mask(mask))[:, pad:] - enc(x))).max()
  if position in ABSOLUTE:
    assert gap > 1e-3
  else:
    assert gap < 1e-4


# 'none' in the commit tier; the other encodings --extended (tiers.py): each
# one's encoder, with padding, is differentiated in the commit tier by
# test_attention.py's test_fused_path_equals_the_plain_path (outputs and
# gradients against the plain path) or test_positions.py's
# test_every_parameter_receives_a_gradient.
@pytest.mark.parametrize('position', [
    p if p == 'none' else pytest.param(p, marks=EXTENDED) for p in ALL])
def test_jit_matches_eager_and_gradients_are_finite(position):
  enc = make(position)
  x = tokens((2, 7), seed=3)
  lens = jnp.array([7, 4])

  @nnx.jit
  def forward(model, x, lens):
    return model(x, lens)

  np.testing.assert_allclose(forward(enc, x, lens), enc(x, lens), atol=1e-5)

  def loss(model):
    return jnp.sum(model(x, lens) ** 2)

  leaves = jax.tree.leaves(grads(loss, enc))
  assert leaves and all(np.all(np.isfinite(g)) for g in leaves)
  assert any(np.abs(np.asarray(g)).max() > 0 for g in leaves)


def test_post_norm_outputs_are_layer_normalised_and_pre_norm_has_final_norm():
  x = tokens((2, 5), seed=4)
  for norm in ('post', 'pre'):
    out = np.asarray(make('sinusoidal', norm=norm)(x))
    np.testing.assert_allclose(out.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(out.std(-1), 1.0, atol=1e-2)
  out = np.asarray(make('sinusoidal', norm='none')(x))
  assert np.abs(out.mean(-1)).max() > 1e-2


def test_rmsnorm_blocks_match_a_numpy_rms_norm_and_close_with_one():
  """norm_type='rmsnorm' puts RMSNorm in every AddNorm and the final norm;
  the final norm checked against NumPy's X / sqrt(mean(X^2) + eps) * scale
  (no centring); a decoder built the same way."""
  x = tokens((2, 5), seed=4)
  enc = selfattn.TransformerEncoder(
      VOCAB, 16, 32, 4, 2, 0.0, position='rope', norm='pre',
      norm_type='rmsnorm', rngs=nnx.Rngs(0))
  assert isinstance(enc.final_ln, nnx.RMSNorm)
  assert all(isinstance(b.addnorm1.ln, nnx.RMSNorm)
             and isinstance(b.addnorm2.ln, nnx.RMSNorm) for b in enc.blks)
  enc.final_ln.scale[...] = jnp.linspace(0.5, 2.0, 16)
  _, hidden = enc(x, return_hidden=True)
  last = np.asarray(hidden[-1], np.float64)
  want = (last / np.sqrt((last ** 2).mean(-1, keepdims=True) + 1e-6)
          * np.linspace(0.5, 2.0, 16))
  np.testing.assert_allclose(enc(x), want, rtol=1e-5, atol=1e-5)
  # An RMS-normalised vector has mean square 1 but, unlike LayerNorm's, not
  # mean 0: the two norms differ on the same parameters.
  assert np.abs(last.mean(-1)).max() > 1e-2
  dec = selfattn.TransformerDecoder(VOCAB, 16, 32, 4, 1, norm_type='rmsnorm',
                                    rngs=nnx.Rngs(0))
  assert isinstance(dec.blks[0].addnorm3.ln, nnx.RMSNorm)
  with pytest.raises(ValueError, match=r"norm_type='batchnorm'; valid: "
                     r"layernorm, rmsnorm"):
    selfattn.TransformerEncoder(VOCAB, 16, 32, 4, 1, norm_type='batchnorm',
                                rngs=nnx.Rngs(0))


def test_addnorm_places_its_norm_as_the_chapter_and_pre_ln_do():
  """AddNorm against NumPy with a non-trivial LayerNorm (scale, bias):
  post LN(X + f(X)), the chapter's; pre X + f(LN(X)); none X + f(X). The
  statistics checks above pass a pre-LN block whose residual adds LN(X)
  instead of X (a mutation audit's survivor, caught only by golden values)."""
  d = 8
  X = np.asarray(jax.random.normal(jax.random.key(1), (2, 3, d))) * 3 + 1
  W = np.asarray(jax.random.normal(jax.random.key(2), (d, d))) / np.sqrt(d)
  scale, bias = np.linspace(0.5, 2.0, d), np.linspace(-1.0, 1.0, d)

  def ln(x):
    return ((x - x.mean(-1, keepdims=True))
            / np.sqrt(x.var(-1, keepdims=True) + 1e-6) * scale + bias)

  f = lambda x: np.tanh(x @ W)
  want = {'post': ln(X + f(X)), 'pre': X + f(ln(X)), 'none': X + f(X)}
  for norm, expected in want.items():
    addnorm = selfattn.AddNorm(d, 0.0, norm=norm, rngs=nnx.Rngs(0))
    if addnorm.ln is not None:
      addnorm.ln.scale[...] = jnp.asarray(scale, jnp.float32)
      addnorm.ln.bias[...] = jnp.asarray(bias, jnp.float32)
    got = compiled(lambda x: addnorm(x, lambda y: jnp.tanh(y @ W)),
                   jnp.asarray(X, jnp.float32))
    np.testing.assert_allclose(got, expected, atol=2e-5, err_msg=norm)


def test_tokens_are_embedded_scaled_by_root_width_then_given_p():
  """The chapter's encoder input: embedding * sqrt(num_hiddens) + P, from
  the embedding table and NumPy's P (the layers see it as hidden[0])."""
  enc = make('sinusoidal')
  x = tokens((2, 5), seed=4)
  _, hidden = enc(x, return_hidden=True)
  E = np.asarray(enc.embedding.embedding[...])
  np.testing.assert_allclose(
      hidden[0], E[np.asarray(x)] * 4.0 + reference.sinusoid(5, 16), atol=1e-5)


def test_block_without_residual_or_norm_is_plain_composition():
  blk = selfattn.TransformerEncoderBlock(16, 32, 4, 0.0, norm='none',
                                         residual=False, rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(0), (2, 5, 16))
  want = blk.ffn(blk.attention(X, X, X))
  np.testing.assert_allclose(blk(X), want, atol=1e-5)
  res = selfattn.TransformerEncoderBlock(16, 32, 4, 0.0, norm='none',
                                         residual=True, rngs=nnx.Rngs(0))
  Y = X + res.attention(X, X, X)
  np.testing.assert_allclose(res(X), Y + res.ffn(Y), atol=1e-5)


def test_per_layer_attention_weights_on_request_only():
  enc = make('t5', layers=3)
  x = tokens((2, 6))
  (_, captured), (out, weights), plain = compiled(lambda enc: (
      nnx.capture(enc, nnx.Intermediate)(x, jnp.array([6, 3])),
      selfattn.attention_weights(enc, x, jnp.array([6, 3])),
      enc(x, jnp.array([6, 3]))), enc)
  assert len(weights) == 3 and weights[0].shape == (2, 4, 6, 6)
  np.testing.assert_allclose(
      captured['blks'][2]['attention']['attention_weights'][...], weights[2])
  assert np.all(np.asarray(weights[1])[1, :, :, 3:] == 0)
  np.testing.assert_allclose(out, plain)
  # A plain call leaves nothing on the module (transforms over closures rely
  # on it: tests/nn/test_transforms.py).
  assert not nnx.state(enc, nnx.Intermediate)


# float16 --extended (tiers.py): the bfloat16 case takes the same dtype path
# through the encoder; float16's masked softmax is
# test_attention.py's test_masked_softmax_is_finite_in_low_precision[float16].
@pytest.mark.parametrize('dtype', [jnp.bfloat16,
                                   pytest.param(jnp.float16, marks=EXTENDED)])
def test_low_precision_forward_is_finite_and_close_to_float32(dtype):
  x = tokens((2, 10), seed=5)
  lens = jnp.array([10, 0])   # one sequence with nothing valid at all
  low = compiled(lambda m: m(x, lens), make('shaw', dtype=dtype))
  assert low.dtype == dtype
  full = compiled(lambda m: m(x, lens), make('shaw'))
  assert np.all(np.isfinite(np.asarray(low, np.float32)))
  np.testing.assert_allclose(np.asarray(low, np.float32)[0], full[0], atol=0.15)


def test_usable_inside_linen_through_bridge():
  kwargs = dict(position='shaw', max_len=16, clip_distance=4)

  class Classifier(nn.Module):
    @nn.compact
    def __call__(self, x):
      h = bridge.to_linen(selfattn.TransformerEncoder, VOCAB, 16, 32, 4, 2,
                          name='encoder', **kwargs)(x)
      return nn.Dense(3)(h.mean(axis=1)), h

  x = tokens((2, 7), seed=6)
  variables = Classifier().init(
      {'params': jax.random.key(0), 'dropout': jax.random.key(1)}, x)
  (_, hidden) = Classifier().apply(variables, x)
  direct = selfattn.TransformerEncoder(VOCAB, 16, 32, 4, 2, rngs=nnx.Rngs(9),
                                       **kwargs)
  linen_params = flatten_dict(variables['params']['encoder'])
  for path, param in nnx.to_flat_state(nnx.state(direct, nnx.Param)):
    param[...] = linen_params[path]
  assert len(linen_params) == len(list(nnx.to_flat_state(nnx.state(direct, nnx.Param))))
  np.testing.assert_allclose(hidden, direct(x), atol=1e-5)


def test_invalid_arguments_raise_clear_errors():
  with pytest.raises(ValueError, match='not divisible'):
    selfattn.TransformerEncoder(5, 10, 8, 3, 1, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match="valid: post, pre, none"):
    selfattn.TransformerEncoder(5, 8, 8, 2, 1, norm='sandwich', rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='unknown position encoding'):
    selfattn.TransformerEncoder(5, 8, 8, 2, 1, position='xpos', rngs=nnx.Rngs(0))


def test_sizes_must_be_integers_and_the_error_names_them():
  """Float sizes failed deep inside JAX (a shape of floats, a list times a
  float) or ran: num_heads=2.0 gave float head widths, max_len=100.0 a
  sinusoidal table. Python and NumPy integers are sizes; bools are not."""
  rngs = nnx.Rngs(0)
  encoder = lambda *sizes, **kw: selfattn.TransformerEncoder(
      *sizes, rngs=rngs, **kw)
  for name, build in (
      ('num_hiddens=16.0', lambda: selfattn.MultiHeadAttention(16.0, 2,
                                                               rngs=rngs)),
      ('num_heads=2.0', lambda: selfattn.MultiHeadAttention(16, 2.0,
                                                            rngs=rngs)),
      ('num_heads=True', lambda: selfattn.MultiHeadAttention(16, True,
                                                             rngs=rngs)),
      ('kv_features=8.0', lambda: selfattn.MultiHeadAttention(
          16, 2, kv_features=8.0, rngs=rngs)),
      ('ffn_num_hiddens=16.5', lambda: selfattn.PositionWiseFFN(8, 16.5, 8,
                                                                rngs=rngs)),
      ('num_hiddens=8.0', lambda: selfattn.AddNorm(8.0, 0.0, rngs=rngs)),
      ('vocab_size=10.0', lambda: encoder(10.0, 32, 64, 2, 1)),
      ('num_hiddens=32.5', lambda: encoder(10, 32.5, 64, 2, 1)),
      ('ffn_num_hiddens=64.0', lambda: encoder(10, 32, 64.0, 2, 1)),
      ('num_layers=2.5', lambda: encoder(10, 32, 64, 2, 2.5)),
      ('max_len=100.0', lambda: encoder(10, 32, 64, 2, 1, max_len=100.0)),
      ('meter_period=4.0', lambda: encoder(10, 32, 64, 2, 1,
                                           meter_period=4.0)),
      ('num_classes=3.0', lambda: selfattn.nn.SequenceModel(
          encoder(10, 16, 32, 2, 0), 3.0, rngs=rngs))):
    with pytest.raises(TypeError, match=f'^{name} must be an integer >= '):
      build()
  with pytest.raises(ValueError, match='num_layers=-1 must be an integer '
                     '>= 0'):
    encoder(10, 16, 32, 2, -1)
  attn = selfattn.MultiHeadAttention(np.int64(16), np.int32(2), rngs=rngs)
  assert (attn.num_hiddens, attn.num_heads) == (16, 2)


def test_token_ids_as_nested_lists_are_taken_as_arrays():
  """[[1, 2, 3]] failed deep inside JAX ('Cannot determine dtype')."""
  enc = selfattn.TransformerEncoder(VOCAB, 16, 32, 2, 1, rngs=nnx.Rngs(0))
  from_list, from_array = compiled(lambda m: (
      m([[1, 2, 3]], [2]), m(jnp.array([[1, 2, 3]]), jnp.array([2]))), enc)
  np.testing.assert_array_equal(from_list, from_array)
  with pytest.raises(ValueError, match=r'inputs must be \(B, L\) int token '
                     r'ids; got shape \(3,\)'):
    enc([1, 2, 3])


# Shaw --extended (tiers.py): the learned case takes the same remat path
# (stack.run_blocks wraps every block alike); Shaw's gradients stay in the
# commit tier in test_fused_path_equals_the_plain_path[shaw] and
# test_every_parameter_receives_a_gradient[shaw].
@pytest.mark.parametrize('position', [pytest.param('shaw', marks=EXTENDED),
                                      'learned'])
def test_remat_gives_the_same_outputs_and_gradients(position):
  def build(remat):
    return selfattn.TransformerEncoder(12, 16, 32, 2, 2, 0.0, position=position,
                                       max_len=16, remat=remat, rngs=nnx.Rngs(0))
  plain, remat = build(False), build(True)
  x, lens = tokens((2, 7)), jnp.array([7, 4])
  loss = lambda m: (m(x, lens) ** 2).sum()

  def outputs_and_grads(m):     # one compiled program per model
    return m(x, lens), nnx.grad(loss)(m)

  (out_remat, g_remat), (out_plain, g_plain) = (
      compiled(outputs_and_grads, remat), compiled(outputs_and_grads, plain))
  np.testing.assert_allclose(out_remat, out_plain, atol=1e-6)
  both = [jax.tree.leaves(g) for g in (g_remat, g_plain)]
  for a, b in zip(*both, strict=True):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-5)
  # The backward pass really recomputes: remat appears in the program.
  graphdef, state = nnx.split(remat)
  pure = lambda state: loss(nnx.merge(graphdef, state))
  jaxpr = str(jax.make_jaxpr(jax.grad(pure))(state))
  assert 'remat' in jaxpr or 'checkpoint' in jaxpr
  graphdef, state = nnx.split(plain)
  jaxpr = str(jax.make_jaxpr(jax.grad(pure))(state))
  assert 'remat' not in jaxpr and 'checkpoint' not in jaxpr


def test_nnx_tabulate_describes_an_encoder_and_leaves_its_classes_working():
  """nnx.tabulate jits every method: built_for() returned traced sizes that
  the attention compared in Python, and a block handed its feed-forward
  module as an argument, which tabulate cannot describe. Both failed, and
  Flax left its wrappers on the classes, so a fresh module failed after."""
  enc = selfattn.TransformerEncoder(12, 16, 32, 2, 1, position='alibi',
                                    rngs=nnx.Rngs(0))
  table = nnx.tabulate(enc, jnp.ones((2, 8), jnp.int32), jnp.array([8, 5]),
                       console_kwargs=dict(width=250))
  for name in ('MultiHeadAttention', 'ALiBi', 'PositionWiseFFN', 'W_q'):
    assert name in table
  fresh = selfattn.MultiHeadAttention(16, 2, relative=selfattn.ALiBi(2),
                                      rngs=nnx.Rngs(0))
  assert fresh(jnp.ones((2, 8, 16))).shape == (2, 8, 16)


# Shaw in the commit tier; the others --extended (tiers.py): the same scan
# (stack.build_blocks, run_blocks) with another encoding, each layer's
# relative module stacked as Shaw's is (T5 scanned is also the [t5-2-True]
# case of test_a_causal_encoder_decodes_through_its_caches_like_the_full_pass).
@pytest.mark.parametrize('position', [
    pytest.param('sinusoidal', marks=EXTENDED), 'shaw',
    pytest.param('t5', marks=EXTENDED), pytest.param('rope', marks=EXTENDED)])
def test_scanned_layers_equal_the_loop_with_the_same_parameters(position):
  def build(scan):
    return selfattn.TransformerEncoder(12, 16, 32, 2, 3, position=position,
                                       max_len=16, norm='pre',
                                       scan_layers=scan, rngs=nnx.Rngs(0))
  loop, scanned = build(False), build(True)
  stack_loop_into_scan(loop, scanned)
  x, lens = tokens((2, 7)), jnp.array([7, 4])
  np.testing.assert_allclose(scanned(x, lens), loop(x, lens), atol=1e-5)
  _, hidden = scanned(x, lens, return_hidden=True)
  _, want = loop(x, lens, return_hidden=True)
  assert len(hidden) == len(want) == 4
  np.testing.assert_allclose(hidden[2], want[2], atol=1e-5)
  assert_scanned_grads_match(lambda m: (m(x, lens) ** 2).sum(), loop, scanned)


# Sinusoidal (positions continued from the cache into an absolute table) and
# T5 with two scanned layers (a relative module per layer) in the commit tier;
# the other encodings --extended (tiers.py): the encoder's decode step is the
# same for every encoding, and each one's attention through the caches is
# test_decoder.py's test_cached_decoding_equals_the_full_causal_pass.
CAUSAL_ENCODER_COMMIT_TIER = (('sinusoidal', 1, False), ('t5', 2, True))


@pytest.mark.parametrize('position, layers, scan', [
    case if case in CAUSAL_ENCODER_COMMIT_TIER
    else pytest.param(*case, marks=EXTENDED)
    for case in [*[(p, 1, False) for p in ALL], ('t5', 2, True)]])
def test_a_causal_encoder_decodes_through_its_caches_like_the_full_pass(
    position, layers, scan):
  """A prompt of 4 then one token at a time: the outputs of one causal pass
  (what cached free-running evaluation relies on, free_running.py); with
  scan_layers each layer keeps its own cache."""
  enc = selfattn.TransformerEncoder(
      VOCAB, 16, 32, 4, layers, position=position, max_len=32, norm='pre',
      causal=True, scan_layers=scan, rngs=nnx.Rngs(0),
      **({'clip_distance': 3} if position == 'shaw' else {}))
  x = tokens((2, 6), seed=2)
  enc.init_cache(2, 8)
  steps = [decode_step(enc, x[:, :4])]
  steps += [decode_step(enc, x[:, t:t + 1]) for t in range(4, 6)]
  np.testing.assert_allclose(jnp.concatenate(steps, 1),
                             compiled(lambda m: m(x), enc), atol=1e-5)


def test_cached_encoder_decoding_refuses_what_it_cannot_honour():
  x = tokens((2, 3))
  bidirectional = make('rope')
  bidirectional.init_cache(2, 8)
  with pytest.raises(ValueError, match='encoder built with causal=True'):
    bidirectional(x, decode=True)
  causal = selfattn.TransformerEncoder(VOCAB, 16, 32, 4, 1, position='rope',
                                       causal=True, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='call init_cache first'):
    causal(x, decode=True)
  causal.init_cache(2, 4)
  with pytest.raises(ValueError, match='valid_lens cannot be used with '
                     'decode=True'):
    causal(x, jnp.array([3, 2]), decode=True)
  causal(x, decode=True)
  with pytest.raises(ValueError, match='past the end of the cache'):
    causal(x[:, :2], decode=True)


def test_inputs_that_would_change_the_answer_silently_are_refused():
  """Issue 50: ids past the table (the lookup clamps them) and float
  lengths (2.5 keeps 3 keys) used to run."""
  enc = selfattn.TransformerEncoder(10, 16, 32, 2, 1, 0.0, position='shaw',
                                    rngs=nnx.Rngs(0))
  tokens = jnp.array([[1, 2, 3, 9]])
  enc(tokens, jnp.array([3]), deterministic=True)               # in range
  with pytest.raises(ValueError, match=r'token ids must lie in \[0, '
                     r'vocab_size=10\); got values from 1 to 10'):
    enc(tokens.at[0, 3].set(10), jnp.array([3]), deterministic=True)
  with pytest.raises(ValueError, match='from -1 to'):
    enc(tokens.at[0, 0].set(-1), deterministic=True)
  with pytest.raises(TypeError, match='valid_lens must be integer token '
                     'counts; got dtype float32'):
    enc(tokens, jnp.array([2.5]), deterministic=True)
  with pytest.raises(TypeError, match='valid_lens must be integer'):
    selfattn.masked_softmax(jnp.ones((1, 2, 4)), jnp.array([2.0]))
  # Under jit ids are traced: the documented check runs on the host first.
  with pytest.raises(ValueError, match='vocab_size=10'):
    selfattn.nn.check_token_ids(np.array([[0, 10]]), 10)
  selfattn.nn.check_token_ids(np.array([[0, 9]]), 10)

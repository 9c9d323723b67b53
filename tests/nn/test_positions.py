"""Positional encodings against the chapter's formulas and the papers' equations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from selfattn.nn.positions import alibi_slopes, relative_to_absolute
import reference
from compiled import compiled, grads
from tiers import EXTENDED


def test_chapter_table_P_matches_numpy_formula():
  # The chapter's demonstration: encoding_dim=32, num_steps=60.
  enc = selfattn.SinusoidalEncoding(32, 0.0, max_len=60, rngs=nnx.Rngs(0))
  assert enc.P.shape == (1, 60, 32)
  np.testing.assert_allclose(enc.P[0], reference.sinusoid(60, 32), atol=1e-5)
  X = jnp.zeros((1, 60, 32))
  np.testing.assert_allclose(enc(X)[0], reference.sinusoid(60, 32), atol=1e-5)


def test_chapter_rotation_maps_position_i_to_i_plus_delta():
  d, steps = 32, 60
  P = np.asarray(selfattn.sinusoidal_table(steps, d), np.float64)
  worst = 0.0
  for j in range(d // 2):
    w = 1.0 / 10000 ** (2 * j / d)
    for delta in range(1, 20):
      rot = np.array([[np.cos(delta * w), np.sin(delta * w)],
                      [-np.sin(delta * w), np.cos(delta * w)]])
      pairs = P[:steps - delta, 2 * j:2 * j + 2]          # rows (p_{i,2j}, p_{i,2j+1})
      moved = pairs @ rot.T
      worst = max(worst, np.abs(moved - P[delta:, 2 * j:2 * j + 2]).max())
  assert worst < 1e-4


def test_sinusoidal_handles_odd_width_and_lengths_past_max_len():
  enc = selfattn.SinusoidalEncoding(7, 0.0, max_len=10, rngs=nnx.Rngs(0))
  out = enc(jnp.zeros((2, 25, 7)))
  np.testing.assert_allclose(out[0], reference.sinusoid(25, 7), atol=1e-5)


def test_learned_encoding_adds_its_table_and_rejects_long_sequences():
  enc = selfattn.LearnedEncoding(8, 0.0, max_len=12, rngs=nnx.Rngs(0))
  X = jax.random.normal(jax.random.key(1), (2, 12, 8))
  np.testing.assert_allclose(enc(X), X + enc.P[...][:, :12], atol=1e-6)
  with pytest.raises(ValueError, match=r'13.*max_len=12'):
    enc(jnp.zeros((1, 13, 8)))
  sin_init = selfattn.LearnedEncoding(8, 0.0, max_len=12, init='sinusoidal',
                                      rngs=nnx.Rngs(0))
  np.testing.assert_allclose(sin_init.P[...][0], reference.sinusoid(12, 8),
                             atol=1e-5)


def test_encodings_refuse_inputs_and_options_that_do_not_fit_by_name():
  """Each failed deep inside JAX before (an add of incompatible shapes, an
  MLIR type error, a comparison of a string)."""
  for enc in (selfattn.SinusoidalEncoding(8, rngs=nnx.Rngs(0)),
              selfattn.LearnedEncoding(8, max_len=12, rngs=nnx.Rngs(0))):
    with pytest.raises(ValueError, match=r'X must be \(B, L, 8\)'):
      enc(jnp.zeros((2, 5, 6)))
    with pytest.raises(ValueError, match=r'positions must be \(B, L\)'):
      enc(jnp.zeros((2, 5, 8)), positions=jnp.arange(5))
  for clip in (2.5, '8'):
    with pytest.raises(TypeError, match='clip_distance=.* must be an integer'):
      selfattn.ShawRelative(2, 8, clip_distance=clip, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='max_len=0 must be an integer >= 1'):
    selfattn.HuangRelative(2, 8, max_len=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='max_len=0 must be an integer >= 1'):
    selfattn.TransformerXLRelative(2, 8, max_len=0, rngs=nnx.Rngs(0))
  with pytest.raises(ValueError, match='num_steps=-1 must be an integer >= 0'):
    selfattn.sinusoidal_table(-1, 16)        # was an empty (0, 16) table


def test_sinusoidal_table_takes_integer_sizes_only():
  """jnp.arange rounded a float size up: (4, 4.5) gave a (4, 5) table and
  (4.5, 4) five rows, silently. An odd width stays valid (the last column
  is a sine), and so do NumPy integers and zero steps."""
  with pytest.raises(TypeError, match=r'num_hiddens=4\.5 must be an integer '
                     r'>= 1'):
    selfattn.sinusoidal_table(4, 4.5)
  with pytest.raises(TypeError, match=r'num_steps=4\.5 must be an integer'):
    selfattn.sinusoidal_table(4.5, 4)
  with pytest.raises(TypeError, match='num_hiddens=True'):
    selfattn.sinusoidal_table(4, True)       # a bool is no width
  assert selfattn.sinusoidal_table(4, 3).shape == (4, 3)
  assert selfattn.sinusoidal_table(np.int64(2), np.int32(5)).shape == (2, 5)
  assert selfattn.sinusoidal_table(0, 4).shape == (0, 4)
  with pytest.raises(TypeError, match=r'max_len=100\.0 must be an integer'):
    selfattn.SinusoidalEncoding(8, max_len=100.0, rngs=nnx.Rngs(0))


def test_encodings_refuse_sizes_that_are_not_integers_by_name():
  """Float sizes failed deep inside JAX (a shape of floats) or were kept:
  ALiBi's head count then failed at the first call, RoPE's width never."""
  rngs = nnx.Rngs(0)
  for name, build in (
      ('num_hiddens=8.0', lambda: selfattn.NoEncoding(8.0, rngs=rngs)),
      ('max_len=12.0', lambda: selfattn.LearnedEncoding(8, max_len=12.0,
                                                        rngs=rngs)),
      ('head_dim=8.0', lambda: selfattn.ShawRelative(2, 8.0, rngs=rngs)),
      ('max_len=8.5', lambda: selfattn.HuangRelative(2, 8, max_len=8.5,
                                                     rngs=rngs)),
      ('num_heads=2.0', lambda: selfattn.TransformerXLRelative(2.0, 4,
                                                               rngs=rngs)),
      ('num_buckets=32.0', lambda: selfattn.T5RelativeBias(
          2, num_buckets=32.0, rngs=rngs)),
      ('num_heads=2.0', lambda: selfattn.ALiBi(2.0)),
      ('head_dim=8.0', lambda: selfattn.RotaryEncoding(8.0)),
      ('head_dim=4.0', lambda: selfattn.PolarEncoding(2, 4.0, rngs=rngs))):
    with pytest.raises(TypeError, match=f'^{name} must be an integer'):
      build()


def test_an_encoding_built_for_other_heads_is_refused_by_the_attention():
  """A table made for another head count or width failed later, inside an
  einsum or an add; MultiHeadAttention now says which shape it was built
  for. An encoding that takes any shape (RoPE) is accepted."""
  rngs = nnx.Rngs(0)
  wrong = {'ALiBi': selfattn.ALiBi(4),
           'T5RelativeBias': selfattn.T5RelativeBias(4, rngs=rngs),
           'ShawRelative': selfattn.ShawRelative(2, 4, rngs=rngs),
           'HuangRelative': selfattn.HuangRelative(4, 8, max_len=8, rngs=rngs),
           'PolarEncoding': selfattn.PolarEncoding(4, 8, rngs=rngs),
           'TransformerXLRelative': selfattn.TransformerXLRelative(2, 4,
                                                                   rngs=rngs)}
  for name, relative in wrong.items():
    with pytest.raises(ValueError, match=rf'relative={name} was built for .*'
                                         r'this attention has 2 heads of '
                                         r'width 8'):
      selfattn.MultiHeadAttention(16, 2, relative=relative, rngs=rngs)
  for relative in (selfattn.ShawRelative(2, 8, rngs=rngs),
                   selfattn.RotaryEncoding(64)):
    selfattn.MultiHeadAttention(16, 2, relative=relative, rngs=rngs)


def test_lookup_names_valid_choices_and_options():
  with pytest.raises(ValueError, match='valid: none, sinusoidal, learned, shaw'):
    selfattn.get_position('absolute')
  with pytest.raises(ValueError, match='clip_distance'):
    selfattn.get_position('shaw', {'clip': 3})
  kind, opts = selfattn.get_position('t5', {'num_buckets': 8})
  assert kind.relative and opts == {'num_buckets': 8, 'max_distance': 128}


def _qkv(B=2, H=3, L=7, D=4, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.normal(size=(B, H, L, D)).astype(np.float32) for _ in range(3)]


@pytest.mark.parametrize('shared_heads', [True, False])
@pytest.mark.parametrize('relative_values', [True, False])
def test_shaw_equals_direct_transcription_of_the_paper(shared_heads,
                                                       relative_values):
  q, k, v = _qkv()
  clip = 2
  shaw = selfattn.ShawRelative(3, 4, clip_distance=clip, shared_heads=shared_heads,
                               relative_values=relative_values,
                               rngs=nnx.Rngs(0))
  keep = np.ones((2, 7), bool)
  keep[1, 4:] = False                                   # padding in row 1
  ours, _ = compiled(lambda shaw: selfattn.dot_product_attention(
      q, k, v, mask=jnp.asarray(keep)[:, None, None, :], relative=shaw), shaw)
  aV = np.asarray(shaw.a_V[...]) if relative_values else None
  want = reference.shaw_attention(q, k, v, np.asarray(shaw.a_K[...]), aV,
                                  clip, keep)
  np.testing.assert_allclose(ours, want, atol=2e-5)


def test_shaw_weight_folding_preserves_mass_per_bucket():
  shaw = selfattn.ShawRelative(1, 2, clip_distance=3, rngs=nnx.Rngs(0))
  w = jax.random.uniform(jax.random.key(0), (1, 1, 9, 9))
  folded = np.asarray(compiled(lambda shaw: shaw.fold_weights(w), shaw))
  rel = np.clip(np.arange(9)[None] - np.arange(9)[:, None], -3, 3) + 3
  want = np.zeros((9, 7))
  for i in range(9):
    for j in range(9):
      want[i, rel[i, j]] += np.asarray(w)[0, 0, i, j]
  np.testing.assert_allclose(folded[0, 0], want, atol=1e-6)


def test_skew_equals_direct_indexing():
  L = 6
  x = np.random.default_rng(0).normal(size=(2, L, 2 * L - 1))
  want = np.empty((2, L, L))
  for i in range(L):
    for j in range(L):
      want[:, i, j] = x[:, i, j - i + L - 1]
  np.testing.assert_allclose(relative_to_absolute(jnp.asarray(x)), want)
  np.testing.assert_allclose(relative_to_absolute(jnp.ones((1, 1))), [[1.0]])


@pytest.mark.parametrize('shared_heads', [True, False])
def test_huang_equals_unclipped_reference(shared_heads):
  q, k, v = _qkv(L=6)
  huang = selfattn.HuangRelative(3, 4, max_len=10, shared_heads=shared_heads,
                                 rngs=nnx.Rngs(0))
  qs = q / 2.0     # dot_product_attention hands relative terms scaled queries
  want_rel = reference.huang_logits(qs, np.asarray(huang.E[...]), 10)
  logits, (ours, _) = compiled(lambda huang: (
      huang.logits(jnp.asarray(qs), k),
      selfattn.dot_product_attention(q, k, v, relative=huang)), huang)
  np.testing.assert_allclose(logits, want_rel, atol=1e-5)
  content = np.einsum('bhqd,bhkd->bhqk', qs, k)
  alpha = reference.softmax_rows(content + want_rel, np.ones((1, 1, 6, 6), bool))
  np.testing.assert_allclose(ours, np.einsum('bhqk,bhkd->bhqd', alpha, v),
                             atol=2e-5)


def test_huang_beyond_max_len_uses_the_edge_rows():
  """Mutation caught: the beyond-max_len branch indexing row 0 (or any row
  but the clipped offset's)."""
  q, k, _ = _qkv(L=9)
  huang = selfattn.HuangRelative(3, 4, max_len=4, rngs=nnx.Rngs(0))
  want = reference.huang_logits(np.asarray(q), np.asarray(huang.E[...]), 4)
  np.testing.assert_allclose(compiled(lambda h: h.logits(q, k), huang), want,
                             atol=1e-5)


# The encodings without parameters of their own --extended (tiers.py): the
# model's other parameters are checked by every other case, and these
# encodings' encoders are differentiated against the plain path in
# test_attention.py's test_fused_path_equals_the_plain_path.
NO_PARAMETERS = ('none', 'sinusoidal', 'rope', 'alibi')


@pytest.mark.parametrize('position', [
    pytest.param(p, marks=EXTENDED) if p in NO_PARAMETERS else p
    for p in selfattn.POSITION_NAMES])
def test_every_parameter_receives_a_gradient(position):
  """Mutation caught: wrapping any table (a_K, a_V, E, the T5 bias, learned P,
  XL's W_r, u, v) in stop_gradient, or any parameter left out of the loss."""
  options = {'shaw': {'clip_distance': 2}, 't5': {'num_buckets': 8}}.get(
      position, {})
  enc = selfattn.TransformerEncoder(12, 16, 32, 2, 2, position=position,
                                    max_len=16, norm='pre', rngs=nnx.Rngs(0),
                                    **options)
  x = jax.random.randint(jax.random.key(0), (2, 10), 0, 12)
  target = jax.random.normal(jax.random.key(1), (2, 10, 16))
  for path, g in nnx.to_flat_state(
      grads(lambda m: ((m(x) - target) ** 2).sum(), enc)):
    assert np.abs(np.asarray(g[...])).max() > 0, f'no gradient for {path}'


@pytest.mark.parametrize('position', selfattn.POSITION_NAMES)
def test_every_encoding_describes_its_own_picture(position):
  """What TensorBoard's positions/table shows comes from the encoding
  (picture(), trainable), not from train.py probing attribute names."""
  enc = selfattn.TransformerEncoder(12, 16, 32, 2, 1, position=position,
                                    max_len=16, rngs=nnx.Rngs(0))
  module = enc.blks[0].attention.relative or enc.pos_encoding
  picture = module.picture()
  if position in ('none', 'rope', 'alibi'):
    assert picture is None
  else:
    assert picture.ndim == 2 and np.all(np.isfinite(np.asarray(picture)))
  assert module.trainable == (position in ('learned', 'shaw', 'huang', 'xl',
                                           't5', 'pope'))


def test_t5_buckets_match_hand_computed_ids():
  # num_buckets=32, max_distance=128: 16 per direction, 8 exact, then log.
  offsets = jnp.array([0, -1, 1, -7, -8, -16, 20, -127, -128, -1000, 1000])
  want = [0, 1, 17, 7, 8, 10, 26, 15, 15, 15, 31]
  np.testing.assert_array_equal(selfattn.t5_bucket(offsets), want)


def test_symmetric_alibi_bias_uses_slopes_and_absolute_distance():
  np.testing.assert_allclose(alibi_slopes(8), [2.0 ** -(h + 1) for h in range(8)])
  alibi = selfattn.ALiBi(4, symmetric=True)
  bias = np.asarray(alibi.logits(jnp.zeros((1, 4, 3, 2)), jnp.zeros((1, 4, 3, 2))))
  slopes = 2.0 ** (-8.0 * np.arange(1, 5) / 4)
  dist = np.abs(np.arange(3)[None] - np.arange(3)[:, None])
  np.testing.assert_allclose(bias[0], -slopes[:, None, None] * dist, atol=1e-6)


def test_rotary_dot_products_depend_only_on_offset():
  rope = selfattn.RotaryEncoding(6)
  x = jnp.broadcast_to(jax.random.normal(jax.random.key(0), (6,)), (1, 1, 12, 6))
  y = jnp.broadcast_to(jax.random.normal(jax.random.key(1), (6,)), (1, 1, 12, 6))
  q, k = compiled(lambda x, y: rope.rotate(x, y), x, y)
  dots = np.asarray(jnp.einsum('bhqd,bhkd->qk', q, k))
  for offset in range(-5, 6):
    diagonal = np.diagonal(dots, offset)
    np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-4)
  # The rotation preserves norms and is not the identity.
  np.testing.assert_allclose(jnp.linalg.norm(q, axis=-1),
                             jnp.linalg.norm(x, axis=-1), atol=1e-5)
  assert np.abs(np.asarray(q - x)).max() > 1e-2


def test_sinusoidal_dropout_falls_on_x_plus_p():
  """d2l's order: X + P, then dropout, so in training every entry of
  zeros + P is 0 or P / (1 - rate), P from the chapter's formula in NumPy
  (dropout before the sum, a mutation audit's survivor, leaves P whole)."""
  d, length, rate = 8, 6, 0.5
  encoding = selfattn.SinusoidalEncoding(d, dropout=rate,
                                         rngs=nnx.Rngs(dropout=0))
  out = np.asarray(encoding(jnp.zeros((1, length, d)), deterministic=False))[0]
  P = reference.sinusoid(length, d)
  kept = np.abs(out) > 0
  np.testing.assert_allclose(out[kept], P[kept] / (1 - rate), rtol=1e-5)
  assert 0.2 < kept.mean() < 0.8      # some dropped, some kept


def test_rotary_equals_the_rotation_formula():
  """RoPE against NumPy: pair j at position p turns by p * 10000^(-2j/D),
  (x0 cos - x1 sin, x0 sin + x1 cos); with odd D the last column stays.
  The properties above hold for any frequency ladder and either direction
  of turn (a mutation audit shifted the one and flipped the other unseen);
  this pins both."""
  d, length = 5, 7
  x = np.asarray(jax.random.normal(jax.random.key(2), (1, 1, length, d)))
  q, _ = compiled(lambda x: selfattn.RotaryEncoding(d).rotate(x, x),
                  jnp.asarray(x))
  want = x.copy()
  for p in range(length):
    for j in range(d // 2):
      angle = p * 10000.0 ** (-2 * j / d)
      x0, x1 = x[0, 0, p, 2 * j], x[0, 0, p, 2 * j + 1]
      want[0, 0, p, 2 * j] = x0 * np.cos(angle) - x1 * np.sin(angle)
      want[0, 0, p, 2 * j + 1] = x0 * np.sin(angle) + x1 * np.cos(angle)
  np.testing.assert_allclose(q, want, atol=1e-5)
  # By hand: [1, 0, 1, 0] at position 1 of a 4-wide head turns by 1 and
  # by 10000^(-1/2) = 0.01 radians.
  ones = jnp.broadcast_to(jnp.array([1.0, 0.0, 1.0, 0.0]), (1, 1, 2, 4))
  r, _ = compiled(lambda x: selfattn.RotaryEncoding(4).rotate(x, x), ones)
  np.testing.assert_allclose(
      r[0, 0, 1], [np.cos(1), np.sin(1), np.cos(0.01), np.sin(0.01)],
      atol=1e-6)


def test_alibi_slopes_for_head_counts_that_are_not_powers_of_two():
  """Press et al.'s rule past a power of two: the docstring's H = 3 by
  hand, and other counts against the reference suite's port of get_slopes
  (another formula: start ** (i + 1))."""
  import chomsky_reference as ref
  np.testing.assert_allclose(alibi_slopes(3), [1 / 16, 1 / 256, 1 / 4])
  for heads in (5, 6, 7, 12):
    np.testing.assert_allclose(alibi_slopes(heads), ref.alibi_slopes(heads),
                               err_msg=f'{heads} heads')


# --------------------------------------------------------------------------
# The reference suite's encodings (tests/support/chomsky_reference.py ports its code).
# --------------------------------------------------------------------------

def test_xl_logits_equal_the_reference_transcription():
  import chomsky_reference as ref
  B, H, L, d = 2, 8, 9, 8
  xl = selfattn.TransformerXLRelative(H, d, max_len=32, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  q, k = (rng.normal(size=(B, L, H, d)).astype(np.float32) for _ in range(2))
  want = ref.xl_logits(q, k, np.asarray(xl.W_r.kernel[...]),
                       np.asarray(xl.u[...]), np.asarray(xl.v[...]))
  qs, kh = jnp.swapaxes(q, 1, 2) / np.sqrt(d), jnp.swapaxes(k, 1, 2)
  pos = jnp.broadcast_to(jnp.arange(L), (B, L))

  def logits(xl):
    content = jnp.einsum('bhqd,bhkd->bhqk', qs, kh)
    return content + xl.logits(qs, kh), content + xl.logits(qs, kh, pos, pos)

  default, positioned = compiled(logits, xl)
  np.testing.assert_allclose(default, want, atol=2e-5)
  # The explicit-positions path (gather, not skew) agrees.
  np.testing.assert_allclose(positioned, want, atol=2e-5)


def test_alibi_is_the_reference_asymmetric_form_by_default():
  import chomsky_reference as ref
  q = jnp.zeros((1, 8, 6, 4))
  bias = np.asarray(selfattn.ALiBi(8).logits(q, q))[0]
  np.testing.assert_allclose(bias, ref.alibi_bias(8, 6, 6), atol=1e-6)
  assert bias[0, 3, 2] != bias[0, 3, 4]                 # left != right
  sym = np.asarray(selfattn.ALiBi(8, symmetric=True).logits(q, q))[0]
  np.testing.assert_allclose(sym, np.swapaxes(sym, -1, -2))


def _encoder(position, **options):
  return selfattn.TransformerEncoder(
      11, 16, 32, 4, 2, position=position, max_len=64, norm='pre',
      rngs=nnx.Rngs(0), **options)


# Shaw (gathered logit and value terms) and learned (an absolute table) in
# the commit tier; the others --extended (tiers.py): each encoding's terms at
# explicit positions are also what cached decoding uses, checked against the
# default full pass in test_decoder.py's
# test_cached_decoding_equals_the_full_causal_pass, and the tables at given
# positions in test_absolute_encodings_read_the_table_at_the_given_positions.
EXPLICIT_POSITIONS_COMMIT_TIER = ('shaw', 'learned')


@pytest.mark.parametrize('position', [
    p if p in EXPLICIT_POSITIONS_COMMIT_TIER
    else pytest.param(p, marks=EXTENDED) for p in selfattn.POSITION_NAMES])
def test_explicit_positions_0_to_L_equal_the_default_path(position):
  enc = _encoder(position)
  tokens = jax.random.randint(jax.random.key(0), (2, 9), 0, 11)
  pos = jnp.broadcast_to(jnp.arange(9), (2, 9))
  given, default = compiled(lambda m: (m(tokens, positions=pos), m(tokens)),
                            enc)
  np.testing.assert_allclose(given, default, atol=2e-5)


@pytest.mark.parametrize('position', selfattn.RELATIVE_NAMES)
def test_relative_encodings_see_only_offsets_between_positions(position):
  """Randomized positions reach a relative encoding only as differences:
  shifting every position by a constant changes nothing, while moving one
  position does change the output."""
  enc = _encoder(position)
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, 11)
  pos = jnp.array([[0, 3, 4, 9, 10, 20, 31], [1, 2, 5, 6, 8, 13, 21]])
  forward = nnx.jit(lambda m, pos: m(tokens, positions=pos))  # one program
  base = forward(enc, pos)
  np.testing.assert_allclose(forward(enc, pos + 17), base, atol=2e-5)
  moved = forward(enc, pos.at[:, 3].add(1))
  assert np.abs(np.asarray(moved - base)).max() > 1e-3


@pytest.mark.parametrize('position', ['sinusoidal', 'learned'])
def test_absolute_encodings_read_the_table_at_the_given_positions(position):
  enc = _encoder(position)
  X = jnp.zeros((1, 4, 16))
  pos = jnp.array([[2, 5, 11, 40]])
  table = np.asarray(enc.pos_encoding.table(41))
  np.testing.assert_allclose(enc.pos_encoding(X, positions=pos)[0],
                             table[[2, 5, 11, 40]], atol=1e-6)


# --extended (tiers.py): Shaw's value term with explicit positions against
# the gather-free path, through the encoder, is
# test_explicit_positions_0_to_L_equal_the_default_path[shaw].
@EXTENDED
def test_shaw_value_term_with_positions_folds_like_the_gather_free_path():
  shaw = selfattn.ShawRelative(2, 4, clip_distance=2, rngs=nnx.Rngs(0))
  w = jax.nn.softmax(jax.random.normal(jax.random.key(0), (3, 2, 6, 6)))
  v = jnp.zeros((3, 2, 6, 4))
  pos = jnp.broadcast_to(jnp.arange(6), (3, 6))
  np.testing.assert_allclose(shaw.values(w, v, pos, pos), shaw.values(w, v),
                             atol=1e-6)

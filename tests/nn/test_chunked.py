"""Memory-efficient (chunked) attention against the plain path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from selfattn.nn import attention
from selfattn.nn import chunked
from selfattn.nn import masks
from selfattn.nn import positions
from compiled import compiled
from reference import assert_encoders_agree
from tiers import EXTENDED
from tiers import also_extended
from tiers import each_choice
from tiers import keep_in_commit_tier
from tiers import product


def _relative(name, num_heads=2, head_dim=8, max_len=64):
  if name == 'none':
    return None
  options = {'clip_distance': 3} if name == 'shaw' else {}
  kind, options = positions.get_position(name, options)
  return kind.build(num_heads=num_heads, head_dim=head_dim, max_len=max_len,
                    param_dtype=jnp.float32, rngs=nnx.Rngs(1), **options)


def _qkv(lq=19, lk=19, b=2, h=2, d=8, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return (jax.random.normal(keys[0], (b, h, lq, d)),
          jax.random.normal(keys[1], (b, h, lk, d)),
          jax.random.normal(keys[2], (b, h, lk, d)))


# Each encoding once in the commit tier, causal and not alternating; every
# pair with --extended (tiers.py). Two of the cover's cases are extended
# too, their encoding's chunked outputs and gradients being checked against
# the plain path elsewhere in the commit tier: XL's (not causal) by
# test_xl_is_unbounded_in_blocks_as_on_the_plain_path[False] (the same
# per-block term, 4 x 5 blocks at length 19); Shaw's (causal) in pieces:
# its causal outputs in test_encoder_with_chunked_attention_equals_plain,
# its value term's gradients on far blocks in
# test_blocks_beyond_the_reach_use_the_edge_term_exactly[False-shaw-options0],
# and a causal encoding with a reach, gradients included, in this test's
# [True-t5]. The mask, bias and key padding stay with the other six.
@pytest.mark.parametrize('causal,name', also_extended(each_choice(product(
    [False, True], ('none',) + positions.RELATIVE_NAMES)),
    (False, 'xl'), (True, 'shaw')))
def test_chunked_equals_plain_forward_and_gradients(name, causal):
  """Blocks of 4 queries x 5 keys over lengths 19 (neither a multiple), with
  key padding, a random mask, a float bias and, for every encoding, its
  terms: outputs and gradients for q, k, v, the bias and the encoding's own
  parameters agree with dot_product_attention."""
  relative = _relative(name)
  q, k, v = _qkv()
  rng = np.random.default_rng(0)
  keep = jnp.asarray(rng.random((2, 1, 19, 19)) > 0.2)
  keep &= (jnp.arange(19) < jnp.array([19, 12])[:, None])[:, None, None, :]
  bias = jnp.asarray(rng.normal(size=(1, 2, 19, 19)), jnp.float32)

  def outputs(impl, q, k, v, bias, relative):
    if impl == 'plain':
      return attention.dot_product_attention(q, k, v, mask=keep, bias=bias,
                                             causal=causal, relative=relative)[0]
    return chunked.chunked_attention(q, k, v, mask=keep, bias=bias,
                                     causal=causal, relative=relative,
                                     query_chunk=4, key_chunk=5)

  def loss(impl, q, k, v, bias, relative):
    out = outputs(impl, q, k, v, bias, relative)
    return (out ** 2).sum(), out

  # One compiled program per path: its outputs and gradients.
  grad = nnx.jit(nnx.grad(loss, argnums=(1, 2, 3, 4, 5), has_aux=True),
                 static_argnums=0)
  g_got, ours = grad('chunked', q, k, v, bias, relative)
  g_want, plain = grad('plain', q, k, v, bias, relative)
  np.testing.assert_allclose(ours, plain, atol=2e-6)
  for got, want in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('name', [
    # Extended: the chunked path hands Shaw's term per-block positions in
    # every call (test_blocks_beyond_the_reach_use_the_edge_term_exactly
    # [False-shaw-options0]), and the other encodings' cases here take its
    # explicit positions and Lq != Lk; the plain path's Shaw with positions
    # is test_positions.py's.
    pytest.param(name, marks=EXTENDED) if name == 'shaw' else name
    for name in positions.RELATIVE_NAMES])
def test_chunked_equals_plain_with_explicit_positions_and_cross_lengths(name):
  """Randomized positions (sorted draws from a wider range) and Lq != Lk, as
  cached decoding and randomized encodings use them."""
  relative = _relative(name)
  q, k, v = _qkv(lq=7, lk=13)
  draw = lambda key, n: jnp.sort(jax.random.choice(
      key, 40, (2, n), replace=False), axis=-1)
  q_pos = draw(jax.random.key(3), 7)
  k_pos = draw(jax.random.key(4), 13)
  plain, _ = compiled(lambda relative: attention.dot_product_attention(
      q, k, v, relative=relative, q_positions=q_pos, k_positions=k_pos),
                       relative)
  ours = compiled(lambda relative: chunked.chunked_attention(
      q, k, v, relative=relative, q_positions=q_pos, k_positions=k_pos,
      query_chunk=3, key_chunk=4), relative)
  np.testing.assert_allclose(ours, plain, atol=2e-6)


@pytest.mark.parametrize('causal', [
    False,
    # Extended: [False] checks the same unbounded per-block term; causal XL
    # on the chunked path runs in
    # test_causal_with_different_query_and_key_lengths_aligns_at_the_end
    # [xl-7-13].
    pytest.param(True, marks=EXTENDED)])
def test_xl_is_unbounded_in_blocks_as_on_the_plain_path(causal):
  """Transformer-XL's default path (no positions) uses every offset of the
  sequence, unclipped; its positions path clips at +-(max_len - 1). With
  max_len 4 at length 19 the two differ, and the chunked path (blocks of 4
  queries x 5 keys, both lengths padded) must follow the default path:
  outputs and gradients, the XL projection and biases included."""
  relative = _relative('xl', max_len=4)
  q, k, v = _qkv()

  def loss(impl, q, k, v, relative):
    if impl == 'plain':
      out = attention.dot_product_attention(q, k, v, causal=causal,
                                            relative=relative)[0]
    else:
      out = chunked.chunked_attention(q, k, v, causal=causal,
                                      relative=relative, query_chunk=4,
                                      key_chunk=5)
    return (out ** 2).sum(), out

  clipped = compiled(lambda relative: attention.dot_product_attention(
      q, k, v, causal=causal, relative=relative,
      q_positions=jnp.arange(19)[None], k_positions=jnp.arange(19)[None])[0],
                     relative)
  # One compiled program per path: its outputs and gradients.
  grad = nnx.jit(nnx.grad(loss, argnums=(1, 2, 3, 4), has_aux=True),
                 static_argnums=0)
  (want, plain), (got, ours) = (grad('plain', q, k, v, relative),
                                grad('chunked', q, k, v, relative))
  assert float(jnp.abs(clipped - plain).max()) > 1e-3   # the test can tell
  np.testing.assert_allclose(ours, plain, atol=2e-6)
  for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-5)


def test_a_query_with_no_allowed_key_gets_zeros_and_finite_gradients():
  q, k, v = _qkv(lq=6, lk=6)
  keep = jnp.ones((2, 1, 6, 6), bool).at[0, :, 2, :].set(False)
  out = compiled(lambda q, k, v: chunked.chunked_attention(
      q, k, v, mask=keep, query_chunk=4, key_chunk=4), q, k, v)
  assert np.all(np.asarray(out[0, :, 2]) == 0)
  grads = jax.jit(jax.grad(lambda q, k, v: chunked.chunked_attention(
      q, k, v, mask=keep, query_chunk=4, key_chunk=4).sum(),
                           argnums=(0, 1, 2)))(q, k, v)
  assert all(np.isfinite(np.asarray(g)).all() for g in grads)
  plain, _ = compiled(lambda q, k, v: attention.dot_product_attention(
      q, k, v, mask=keep), q, k, v)
  np.testing.assert_allclose(out, plain, atol=2e-6)


def test_dropout_on_blocks_is_unbiased_and_normalised_before_dropping():
  """Averaged over many dropout keys, the output approaches the undropped
  one (inverted dropout on the weights, the normaliser from all weights); a
  single draw differs from it."""
  q, k, v = _qkv(lq=5, lk=9, b=1, h=1, d=4)
  exact = compiled(lambda q, k, v: chunked.chunked_attention(
      q, k, v, key_chunk=4), q, k, v)
  draws = jax.jit(jax.vmap(lambda key: chunked.chunked_attention(
      q, k, v, key_chunk=4, dropout_rate=0.3, dropout_rng=key)))(
          jax.random.split(jax.random.key(0), 4000))
  assert float(jnp.abs(draws[0] - exact).max()) > 0.1
  stderr = draws.std(0) / np.sqrt(draws.shape[0])
  assert np.all(np.abs(draws.mean(0) - exact) < 5 * stderr + 1e-6)


@pytest.mark.parametrize('stack', [
    # Extended: [scan+remat] takes the same attention_impl='chunked' switch
    # and the same blocks, scanned; the loop of layers around the chunked
    # path also runs in
    # test_causal_encoder_calls_build_no_length_squared_array.
    pytest.param({}, marks=EXTENDED),
    {'scan_layers': True, 'remat': True}], ids=['loop', 'scan+remat'])
def test_encoder_with_chunked_attention_equals_plain(monkeypatch, stack):
  """The switch through the whole model: TransformerEncoder with
  attention_impl='chunked' (blocks of 4) gives plain's outputs and
  gradients with padding and causally, also with scanned, rematerialised
  layers."""
  monkeypatch.setattr(chunked, 'QUERY_CHUNK', 4)
  monkeypatch.setattr(chunked, 'KEY_CHUNK', 4)

  def build(impl):
    return selfattn.TransformerEncoder(12, 16, 32, 2, 2 if stack else 1,
                                       position='shaw', max_len=16,
                                       attention_impl=impl, rngs=nnx.Rngs(0),
                                       **stack)
  calls = []
  real = chunked.chunked_attention
  monkeypatch.setattr(chunked, 'chunked_attention',
                      lambda *a, **k: calls.append(1) or real(*a, **k))
  x = jax.random.randint(jax.random.key(0), (2, 11), 0, 12)
  assert_encoders_agree(build('chunked'), build('plain'), x,
                        jnp.array([11, 6]))
  # The switch reached the blocks (equal numbers alone would not say so):
  # each traced pass (padded, causal, the gradient's forward) calls it, once
  # per layer in the loop, once for the scanned body.
  assert len(calls) >= 3


def test_auto_chunks_only_long_sequences(monkeypatch):
  calls = []
  real = chunked.chunked_attention
  monkeypatch.setattr(chunked, 'chunked_attention',
                      lambda *a, **k: calls.append(a[1].shape[2]) or real(*a, **k))
  monkeypatch.setattr(attention, 'AUTO_CHUNKED_FROM', 8)
  attn = selfattn.MultiHeadAttention(16, 2, attention_impl='auto',
                                     rngs=nnx.Rngs(0))
  compiled(lambda attn: attn(jnp.ones((1, 7, 16))), attn)
  compiled(lambda attn: attn(jnp.ones((1, 8, 16))), attn)
  assert calls == [8]
  # Weights are asked for: the plain path runs and returns them.
  _, (weights,) = compiled(lambda attn: selfattn.attention_weights(
      attn, jnp.ones((1, 8, 16))), attn)
  assert calls == [8] and weights.shape == (1, 2, 8, 8)


@pytest.mark.parametrize('causal', [
    False,
    # Extended: a causal chunked forward+backward holding no (L, L) array is
    # test_causal_encoder_calls_build_no_length_squared_array's check.
    pytest.param(True, marks=EXTENDED)])
def test_chunked_backward_keeps_no_quadratic_temporaries(causal):
  """XLA's own accounting of the compiled forward+backward: at L = 1024 the
  chunked path's temporaries are a small fraction of plain attention's (which
  holds (B, H, L, L) weights), causal too. Compile-time numbers, not a
  timing."""
  q, k, v = _qkv(lq=1024, lk=1024, b=1, h=2, d=16)
  relative = _relative('shaw', num_heads=2, head_dim=16)

  def temp_bytes(fn):
    loss = lambda q, k, v: (fn(q, k, v) ** 2).sum()
    compiled = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).lower(
        q, k, v).compile()
    return compiled.memory_analysis().temp_size_in_bytes

  plain = temp_bytes(lambda q, k, v: attention.dot_product_attention(
      q, k, v, relative=relative, causal=causal)[0])
  ours = temp_bytes(lambda q, k, v: chunked.chunked_attention(
      q, k, v, relative=relative, causal=causal, query_chunk=128,
      key_chunk=128))
  assert plain > 2 * 1024 * 1024 * 4        # at least two (H, L, L) floats
  assert ours < 0.25 * plain, (ours, plain)


REACHES = [('shaw', {'clip_distance': 2}),
           ('shaw', {'clip_distance': 2, 'relative_values': False}),
           ('huang', {}),
           ('t5', {'num_buckets': 8, 'max_distance': 4})]


# Two cases in the commit tier: Shaw with value tables on 0..L-1, whose far
# blocks take both edge terms (logits and values), and T5 on randomized
# (gapped) positions, a reach of its own and no value term. The far-block
# code is the same for every encoding with a reach (the encoding's logits
# at one edge offset); Huang's reach and Shaw without value tables are
# extended.
@pytest.mark.parametrize('randomized,name,options', keep_in_commit_tier(
    [(randomized, *reach) for randomized in (False, True)
     for reach in REACHES], (False, *REACHES[0]), (True, *REACHES[3])))
def test_blocks_beyond_the_reach_use_the_edge_term_exactly(name, options,
                                                          randomized):
  """With short reaches (clip 2, a Huang table of 3 positions, T5 buckets up
  to distance 4) most 4x4 blocks of a length-24 sequence lie wholly beyond
  the reach and take the one-edge-key shortcut; outputs and gradients still
  equal the plain path, for 0..L-1 and for randomized positions."""
  kind, options = positions.get_position(name, options)
  relative = kind.build(num_heads=2, head_dim=8, max_len=3,
                        param_dtype=jnp.float32, rngs=nnx.Rngs(1), **options)
  assert relative.reach <= 4
  q, k, v = _qkv(lq=24, lk=24)
  pos = None
  if randomized:
    pos = jnp.sort(jax.random.choice(jax.random.key(5), 60, (2, 24),
                                     replace=False), axis=-1)

  def loss(impl, q, k, v, relative):
    if impl == 'plain':
      out = attention.dot_product_attention(q, k, v, relative=relative,
                                            q_positions=pos,
                                            k_positions=pos)[0]
    else:
      out = chunked.chunked_attention(q, k, v, relative=relative,
                                      q_positions=pos, k_positions=pos,
                                      query_chunk=4, key_chunk=4)
    return (out ** 2).sum(), out

  # One compiled program per path: its outputs and gradients.
  value_and_grad = nnx.jit(nnx.value_and_grad(loss, argnums=(1, 2, 3, 4),
                                              has_aux=True), static_argnums=0)
  (_, got), g_got = value_and_grad('chunked', q, k, v, relative)
  (_, want), g_want = value_and_grad('plain', q, k, v, relative)
  np.testing.assert_allclose(got, want, atol=2e-6)
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


def _largest_intermediate(fn, *args) -> int:
  """The most elements of any value in fn's jaxpr, sub-jaxprs included
  (scan, map, cond, checkpoint bodies)."""
  largest = 0

  def walk(jaxpr):
    nonlocal largest
    for eqn in jaxpr.eqns:
      for var in eqn.outvars:
        shape = getattr(var.aval, 'shape', ())
        largest = max(largest, int(np.prod(shape)) if shape else 1)
      for param in eqn.params.values():
        for sub in (param if isinstance(param, (list, tuple)) else [param]):
          if isinstance(sub, jax.extend.core.ClosedJaxpr):
            walk(sub.jaxpr)
          elif isinstance(sub, jax.extend.core.Jaxpr):
            walk(sub)

  walk(jax.make_jaxpr(fn)(*args).jaxpr)
  return largest


def test_causal_encoder_calls_build_no_length_squared_array(monkeypatch):
  """Issue 26: TransformerEncoder turned causal=True into a dense (1, 1, L, L)
  mask, so the chunked path paid L^2 memory. The causal flag now reaches the
  attention: nothing in the forward+backward program of a causal chunked
  encoder has L^2 / 4 elements (the largest is a (B, H, 64, 64) block).

  Not with scan_layers=True: there the backward of nnx.scan stacks the
  blocks' residuals (nq, nk, H, 64, 64) whether causal or not (a separate
  problem, measured in the report of this change)."""
  stack = {}
  monkeypatch.setattr(chunked, 'QUERY_CHUNK', 64)
  monkeypatch.setattr(chunked, 'KEY_CHUNK', 64)
  length = 512
  x = jax.random.normal(jax.random.key(0), (1, length, 16))

  def largest(causal_built, **call):
    enc = selfattn.TransformerEncoder(None, 16, 32, 2, 2, position='shaw',
                                      attention_impl='chunked',
                                      causal=causal_built, rngs=nnx.Rngs(0),
                                      **stack)
    graphdef, state = nnx.split(enc)
    loss = lambda state, x: (nnx.merge(graphdef, state)(x, **call) ** 2).sum()
    return _largest_intermediate(jax.grad(loss), state, x)

  limit = length * length // 4
  assert largest(False, causal=True) < limit
  assert largest(True) < limit                 # causal by construction
  # The test can tell: a causal mask given by hand is (L, L).
  assert largest(False, mask=masks.make_causal_mask(length)) >= length ** 2


# One case in the commit tier: XL with Lq < Lk, where XL's per-block term
# declines (Lq != Lk) and the chunked path takes XL's positions path
# instead (the default path clips there too). The alignment (the causal
# offset lk - lq in the block skip and the mask) is the same code for every
# encoding and either sign of lk - lq; Lq > Lk also runs in
# test_causal_skips_key_blocks_above_the_diagonal_and_stays_exact[16-8-3].
@pytest.mark.parametrize('name,lq,lk', keep_in_commit_tier(
    [(name, lq, lk) for name in ('none', 'shaw', 'rope', 'xl')
     for lq, lk in ((7, 13), (13, 7), (6, 20))], ('xl', 7, 13)))
def test_causal_with_different_query_and_key_lengths_aligns_at_the_end(
    name, lq, lk):
  """Causal attention with Lq != Lk (the queries are the last Lq of the Lk
  positions, masks.py): chunked equals dot_product_attention, outputs and
  gradients, with blocks of 3 queries x 4 keys (so whole key blocks lie above
  the diagonal and are skipped). A chunked path aligning the triangle at the
  start instead of the end fails here."""
  relative = _relative(name)
  q, k, v = _qkv(lq=lq, lk=lk)
  tri = masks.make_causal_mask(lq, lk)
  assert bool(tri[0, 0, -1, -1]) and not bool(tri[0, 0, 0, -1])

  def loss(impl, q, k, v, relative):
    if impl == 'plain':
      out = attention.dot_product_attention(q, k, v, causal=True,
                                            relative=relative)[0]
    else:
      out = chunked.chunked_attention(q, k, v, causal=True, relative=relative,
                                      query_chunk=3, key_chunk=4)
    return (out ** 2).sum(), out

  grad = nnx.jit(nnx.grad(loss, argnums=(1, 2, 3, 4), has_aux=True),
                 static_argnums=0)
  (g_want, want), (g_got, got) = (grad('plain', q, k, v, relative),
                                  grad('chunked', q, k, v, relative))
  np.testing.assert_allclose(got, want, atol=2e-6)
  for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want)):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
  # Independent of the library's causal flag: the hand-made triangle.
  by_mask, _ = attention.dot_product_attention(q, k, v, mask=tri,
                                               relative=relative)
  np.testing.assert_allclose(got, by_mask, atol=2e-6)


class _CountingTerms:
  """A relative encoding with no terms that counts the key blocks whose
  logits are computed (a debug callback runs only in the branch taken)."""

  def __init__(self):
    self.blocks = 0

  def _count(self):
    self.blocks += 1

  def rotate(self, q, k, q_pos=None, k_pos=None):
    return q, k

  def logits(self, q, k, q_pos=None, k_pos=None):
    jax.debug.callback(self._count)
    return None

  def values(self, weights, v, q_pos=None, k_pos=None):
    return None

  def blockwise_logits(self, *args):
    return None


@pytest.mark.parametrize('lq,lk,computed', [
    # Extended: [16-8-3] takes the same skip (and queries seeing no key);
    # Lq <= Lk is aligned in
    # test_causal_with_different_query_and_key_lengths_aligns_at_the_end
    # [xl-7-13].
    # 4 x 4 blocks: the 10 on or below the diagonal
    pytest.param(16, 16, 10, marks=EXTENDED),
    # queries are the last 8: blocks (0, 0..2), (1, 0..3)
    pytest.param(8, 16, 7, marks=EXTENDED),
    (16, 8, 3),        # queries 0..7 see no key; blocks (2, 0), (3, 0..1)
])
def test_causal_skips_key_blocks_above_the_diagonal_and_stays_exact(
    lq, lk, computed):
  """Key blocks wholly above the causal diagonal are not computed, and the
  result is exactly (bit for bit) the causal mask's without skipping."""
  q, k, v = _qkv(lq=lq, lk=lk)
  counting = _CountingTerms()
  skipped = chunked.chunked_attention(q, k, v, causal=True, relative=counting,
                                      query_chunk=4, key_chunk=4)
  jax.block_until_ready(skipped)
  jax.effects_barrier()
  assert counting.blocks == computed
  counting.blocks = 0
  tri = masks.make_causal_mask(lq, lk)
  full = chunked.chunked_attention(q, k, v, mask=tri, relative=counting,
                                   query_chunk=4, key_chunk=4)
  jax.effects_barrier()
  assert counting.blocks == (lq // 4) * (lk // 4)
  np.testing.assert_array_equal(skipped, full)
  grads = [jax.grad(lambda q, k, v: (chunked.chunked_attention(
      q, k, v, query_chunk=4, key_chunk=4, **kw) ** 2).sum(),
                    argnums=(0, 1, 2))(q, k, v)
           for kw in ({'causal': True}, {'mask': tri})]
  for a, b in zip(*grads):
    np.testing.assert_array_equal(a, b)

"""Causal attention, the decoder, Huang's causal skew and cached decoding."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from compiled import compiled
from compiled import decode_step
from compiled import forward
from reference import assert_scanned_grads_match
from reference import stack_loop_into_scan
from selfattn.nn import positions as P
from tiers import EXTENDED

ALL = selfattn.POSITION_NAMES


def make_decoder(position, **kwargs):
  return selfattn.TransformerDecoder(11, 16, 32, 4, 2, position=position,
                                     max_len=32, rngs=nnx.Rngs(0), **kwargs)


def toks(shape, seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 0, 11)


# 'none' in the commit tier; the other encodings --extended (tiers.py): each
# one's full causal pass is checked against decoding through its caches,
# which see no later token, in test_cached_decoding_equals_the_full_causal_pass
# (Huang's causal skew also in test_huang_causal_skew_equals_...).
@pytest.mark.parametrize('position', [
    p if p == 'none' else pytest.param(p, marks=EXTENDED) for p in ALL])
def test_causal_outputs_ignore_the_future(position):
  dec = make_decoder(position)
  x = toks((2, 7))
  changed = x.at[:, 4:].set((x[:, 4:] + 1) % 11)
  out, out_changed = forward(dec, x), forward(dec, changed)
  np.testing.assert_allclose(out[:, :4], out_changed[:, :4], atol=1e-6)
  assert np.abs(np.asarray(out[:, 4:] - out_changed[:, 4:])).max() > 1e-4


@pytest.mark.parametrize('position', ALL)
def test_cached_decoding_equals_the_full_causal_pass(position):
  """Prompt of 3 in one call, then 4 single tokens against the cache."""
  dec = make_decoder(position)
  x = toks((2, 7))
  full = dec(x)
  dec.init_cache(2, 10)
  steps = [decode_step(dec, x[:, :3])]
  steps += [decode_step(dec, x[:, t:t + 1]) for t in range(3, 7)]
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


# Shaw --extended (tiers.py): the huang case takes the same scan, remat,
# stacked-cache and cross-attention path through the decoder; Shaw's own
# cached path is test_cached_decoding_equals_the_full_causal_pass[shaw].
@pytest.mark.parametrize('position', [pytest.param('shaw', marks=EXTENDED),
                                      'huang'])
def test_scanned_decoder_equals_the_loop_and_decodes_from_stacked_caches(
    position):
  """scan_layers (with remat) on the decoder, cross-attention included: the
  loop's outputs and gradients with the same parameters, and cached decoding
  through nnx.scan (each layer's cache on the stacked axis) reproduces the
  full causal pass."""
  loop = make_decoder(position, cross_attention=True)
  scanned = make_decoder(position, cross_attention=True, scan_layers=True,
                         remat=True)
  stack_loop_into_scan(loop, scanned)
  x = toks((2, 7))
  enc = jax.random.normal(jax.random.key(2), (2, 5, 16))
  enc_lens = jnp.array([5, 3])
  full = forward(loop, x, enc, enc_lens)
  np.testing.assert_allclose(forward(scanned, x, enc, enc_lens), full,
                             atol=1e-5)
  loss = lambda m: (m(x, enc, enc_lens) ** 2).sum()
  assert_scanned_grads_match(loss, loop, scanned)
  graphdef, state = nnx.split(scanned)
  jaxpr = str(jax.make_jaxpr(jax.grad(
      lambda state: loss(nnx.merge(graphdef, state))))(state))
  assert 'remat' in jaxpr or 'checkpoint' in jaxpr
  scanned.init_cache(2, 10)
  assert scanned.blks.self_attention.cache['key'].shape[0] == 2   # layers
  steps = [decode_step(scanned, x[:, :5], enc, enc_lens)]
  steps += [decode_step(scanned, x[:, t:t + 1], enc, enc_lens)
            for t in range(5, 7)]
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_attention_weights_of_scanned_layers_come_per_layer_as_the_loops():
  """A scanned stack sows each attention module's weights once, stacked on
  a layer axis: attention_weights returned one (layers, B, H, Lq, Lk) array
  per module where the loop gives a list per layer. Now the same list."""
  loop = make_decoder('t5', cross_attention=True)
  scanned = make_decoder('t5', cross_attention=True, scan_layers=True)
  stack_loop_into_scan(loop, scanned)
  x = toks((2, 7))
  enc = jax.random.normal(jax.random.key(2), (2, 5, 16))
  enc_lens = jnp.array([5, 3])
  _, want = selfattn.attention_weights(loop, x, enc, enc_lens)
  _, got = selfattn.attention_weights(scanned, x, enc, enc_lens)
  assert len(want) == 2 * len(loop.blks) and len(got) == len(want)
  for w, g in zip(want, got):
    np.testing.assert_allclose(g, w, atol=1e-6)


def test_nnx_tabulate_describes_a_decoder_with_cross_attention():
  """As the encoder's (test_encoder.py): its blocks handed their FFN module
  to AddNorm, which nnx.tabulate cannot describe, and a fresh decoder then
  failed too (Flax leaves its wrappers on the classes)."""
  dec = make_decoder('t5', cross_attention=True)
  enc = jnp.ones((2, 5, 16))
  table = nnx.tabulate(dec, toks((2, 7)), enc, jnp.array([5, 3]),
                       console_kwargs=dict(width=250))
  assert 'cross_attention' in table and 'PositionWiseFFN' in table
  fresh = make_decoder('t5', cross_attention=True)
  assert fresh(toks((2, 7)), enc, jnp.array([5, 3])).shape[:2] == (2, 7)


# RoPE in the commit tier; Shaw and ALiBi --extended (tiers.py): the cache
# stores given positions the same way for every encoding (the rope case), and
# their terms at explicit positions are checked in test_positions.py
# (test_explicit_positions_0_to_L_equal_the_default_path[shaw],
# test_relative_encodings_see_only_offsets_between_positions[alibi]).
@pytest.mark.parametrize('position', [
    'rope', pytest.param('shaw', marks=EXTENDED),
    pytest.param('alibi', marks=EXTENDED)])
def test_cached_decoding_with_explicit_randomized_positions(position):
  dec = make_decoder(position)
  x = toks((1, 5))
  pos = jnp.array([[0, 3, 4, 9, 20]])
  full = forward(dec, x, positions=pos)
  dec.init_cache(1, 5)
  steps = [decode_step(dec, x[:, t:t + 1], positions=pos[:, t:t + 1])
           for t in range(5)]
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)


def test_huang_causal_skew_equals_the_bidirectional_skew_below_the_diagonal():
  rng = np.random.default_rng(0)
  L = 6
  x = rng.normal(size=(2, 3, L, L)).astype(np.float32)   # offsets -(L-1)..0
  out = np.asarray(P.causal_relative_to_absolute(jnp.asarray(x)))
  for i in range(L):
    for j in range(i + 1):
      assert out[0, 1, i, j] == x[0, 1, i, j - i + L - 1]
  # The same logits as HuangRelative's bidirectional path where j <= i.
  huang = P.HuangRelative(2, 4, max_len=8, rngs=nnx.Rngs(0))
  q = jnp.asarray(rng.normal(size=(1, 2, L, 4)), jnp.float32)
  both = np.asarray(huang.logits(q, q))
  huang.causal = True
  causal = np.asarray(huang.logits(q, q))
  lower = np.tril(np.ones((L, L), bool))
  np.testing.assert_allclose(causal[..., lower], both[..., lower], atol=1e-6)


def test_greedy_decode_extends_the_prompt_with_argmax_tokens():
  dec = make_decoder('rope')
  prompt = toks((2, 3))
  out = selfattn.greedy_decode(dec, prompt, 4)
  assert out.shape == (2, 7)
  np.testing.assert_array_equal(out[:, :3], prompt)
  # Each generated token is the argmax of the full causal pass over the prefix.
  logits = forward(dec, out[:, :-1])
  np.testing.assert_array_equal(out[:, 3:], jnp.argmax(logits[:, 2:], -1))
  jitted = nnx.jit(selfattn.greedy_decode, static_argnums=2)
  np.testing.assert_array_equal(jitted(dec, prompt, 4), out)


def test_cross_attention_sees_only_valid_encoder_positions():
  enc = selfattn.TransformerEncoder(11, 16, 32, 4, 1, rngs=nnx.Rngs(1))
  dec = make_decoder('t5', cross_attention=True)
  src = toks((2, 5), seed=3)
  enc_out = forward(enc, src)
  lens = jnp.array([3, 5])
  y = toks((2, 4))
  a = forward(dec, y, enc_out, lens)
  b = forward(dec, y, enc_out.at[0, 3:].set(7.0), lens)  # change padded positions
  np.testing.assert_allclose(a, b, atol=1e-6)
  with pytest.raises(ValueError, match='enc_outputs'):
    dec(y)


def test_enc_valid_lens_errors_name_enc_valid_lens():
  """Per-query lengths for the cross-attention: their shape and dtype
  errors said `valid_lens`, an argument the decoder does not have."""
  dec = make_decoder('none', cross_attention=True)
  y, enc_out = toks((2, 3)), jnp.zeros((2, 5, 16))
  with pytest.raises(ValueError, match=r'^enc_valid_lens of shape \(2, 2\) '
                     r'does not match 3 queries'):
    dec(y, enc_out, jnp.full((2, 2), 4))
  with pytest.raises(TypeError, match='^enc_valid_lens must be integer'):
    dec(y, enc_out, jnp.array([4.0, 4.0]))


def test_decoder_sizes_must_be_integers_and_token_lists_are_taken():
  """Float sizes failed deep inside JAX; greedy_decode took num_steps=True
  as one step; [[1, 2, 3]] failed with 'Cannot determine dtype'."""
  rngs = nnx.Rngs(0)
  with pytest.raises(TypeError, match='^ffn_num_hiddens=32.0 must be an '
                     'integer >= 1'):
    selfattn.TransformerDecoder(11, 16, 32.0, 4, 1, rngs=rngs)
  dec = selfattn.TransformerDecoder(11, 16, 32, 2, 1, rngs=rngs)
  with pytest.raises(TypeError, match='^num_classes=5.0 must be an integer'):
    selfattn.nn.LanguageModel(dec, 5.0)
  for steps in (2.5, True):
    with pytest.raises(TypeError, match=f'^num_steps={steps} must be an '
                       f'integer >= 0'):
      selfattn.greedy_decode(dec, toks((1, 2)), steps)
  from_list, from_array = compiled(lambda m: (
      m([[1, 2, 3]]), m(jnp.array([[1, 2, 3]]))), dec)
  np.testing.assert_array_equal(from_list, from_array)


def test_decode_without_a_cache_says_so():
  with pytest.raises(ValueError, match='init_cache'):
    make_decoder('rope')(toks((1, 2)), decode=True)


def test_meter_adds_one_learned_vector_per_step_phase():
  """meter_period=4, 2 tokens a step: the inputs gain table[(i // 2) % 4],
  so positions with the same phase gain the same vector and nothing else
  changes; the table starts at zero (same outputs as without a meter, the
  other parameters drawn identically), and cached decoding, whose positions
  continue from the cache, equals the full pass."""
  plain = make_decoder('rope')
  dec = make_decoder('rope', meter_period=4, meter_step_tokens=2)
  x = toks((2, 12))
  np.testing.assert_allclose(forward(dec, x), forward(plain, x),
                             atol=1e-6)                      # zero at start
  table = jax.random.normal(jax.random.key(5), (4, 16))
  dec.meter.embedding[...] = table
  phase = (np.arange(12) // 2) % 4
  embed = lambda m, x: m.embed(x)
  added = compiled(embed, dec, x) - compiled(embed, plain, x)
  np.testing.assert_allclose(added, np.broadcast_to(table[phase], added.shape),
                             atol=1e-5)
  full = forward(dec, x)
  assert np.abs(np.asarray(full - forward(plain, x))).max() > 1e-3
  dec.init_cache(2, 12)
  steps = [decode_step(dec, x[:, :5])]
  steps += [decode_step(dec, x[:, t:t + 1]) for t in range(5, 12)]
  np.testing.assert_allclose(jnp.concatenate(steps, axis=1), full, atol=1e-5)
  with pytest.raises(ValueError, match='meter_period'):
    make_decoder('rope', meter_period=-1)


def test_the_stack_is_the_one_owner_of_its_caches():
  """One fill counter per stack, not one per layer as well: the layers
  write where the stack says (cache_start), and the stack checks the fit
  and poisons its output once. A standalone attention module still keeps
  its own counter."""
  dec = make_decoder('rope')
  dec.init_cache(2, 6)
  x = toks((2, 6))
  decode_step(dec, x[:, :4])
  decode_step(dec, x[:, 4:5])
  assert int(dec.next_position[...]) == 5
  for blk in dec.blks:
    assert int(blk.self_attention.cache['index'][...]) == 0
  attn = selfattn.MultiHeadAttention(16, 4, rngs=nnx.Rngs(0))
  attn.init_cache(2, 6)
  decode_step(attn, jnp.ones((2, 3, 16)))
  assert int(attn.cache['index'][...]) == 3

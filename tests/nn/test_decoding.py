"""decoding.generate, the one decode loop: beam search against greedy and
against exhaustive search, end-of-sentence handling, beams over scanned
layers and cross-attention, and teacher forcing through the caches against
one full causal pass."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import selfattn
from compiled import compiled
from selfattn.nn import decoding
from tiers import EXTENDED


def _decoder(vocab=11, position='rope', **kwargs):
  return selfattn.TransformerDecoder(vocab, 16, 32, 4, 2, position=position,
                                     max_len=32, rngs=nnx.Rngs(0), **kwargs)


def _tokens(shape, vocab=11, seed=1):
  return jax.random.randint(jax.random.key(seed), shape, 0, vocab)


def test_a_beam_of_one_is_greedy():
  dec = _decoder()
  prompt = _tokens((3, 3))
  greedy = compiled(
      lambda m, p: decoding.generate(m, p, 6, method='greedy'), dec, prompt)
  beam = compiled(lambda m, p: decoding.generate(
      m, p, 6, method='beam', beam_size=1, alpha=0.0), dec, prompt)
  np.testing.assert_array_equal(beam.tokens, greedy.tokens)
  np.testing.assert_allclose(beam.scores, greedy.scores, rtol=1e-5)
  np.testing.assert_array_equal(greedy.tokens, compiled(
      lambda m, p: selfattn.greedy_decode(m, p, 6), dec, prompt))


# --extended (tiers.py): test_a_full_beam_with_eos_is_exhaustive_search makes
# the same comparison against exhaustive search (its eos-free hypotheses
# included), and beam search without eos stays in the commit tier in
# test_a_beam_of_one_is_greedy and test_beams_over_scanned_layers_....
@EXTENDED
@pytest.mark.parametrize('alpha', [0.0, 0.6])
def test_a_full_beam_is_exhaustive_search(alpha):
  """Vocabulary 3, 3 steps: a beam of 27 keeps every continuation, so it
  returns the argmax over all 27 of their summed log-probabilities (each
  scored by one full causal pass here) under the same length penalty."""
  vocab, steps = 3, 3
  dec = _decoder(vocab=vocab)
  prompt = jnp.array([[0], [2]])
  beam = compiled(lambda m, p: decoding.generate(
      m, p, steps, method='beam', beam_size=vocab ** steps, alpha=alpha),
                  dec, prompt)
  penalty = float(decoding.length_penalty(jnp.float32(steps), alpha))
  # One compiled pass, reused for every hypothesis (all of one length).
  log_probs = nnx.jit(lambda m, t: jax.nn.log_softmax(m(t)[0, :-1], axis=-1))
  for row in range(2):
    best = None
    for seq in itertools.product(range(vocab), repeat=steps):
      tokens = jnp.array([[int(prompt[row, 0]), *seq]])
      logp = np.asarray(log_probs(dec, tokens))
      score = sum(float(logp[i, t]) for i, t in enumerate(seq)) / penalty
      if best is None or score > best[0]:
        best = (score, seq)
    np.testing.assert_array_equal(beam.tokens[row, 1:], best[1])
    assert float(beam.scores[row]) == pytest.approx(best[0], rel=1e-5)


# alpha 0.6 (generate's default) in the commit tier; 0 and 2 --extended
# (tiers.py): the same search and penalty code, another exponent (at 0 the
# penalty is 1 and would hide a wrong length).
@pytest.mark.parametrize('alpha', [pytest.param(0.0, marks=EXTENDED), 0.6,
                                   pytest.param(2.0, marks=EXTENDED)])
def test_a_full_beam_with_eos_is_exhaustive_search(alpha):
  """Vocabulary 3 with eos = 2, 3 steps: the hypotheses are every sequence
  that ends at its first eos, plus the eos-free ones cut at 3 tokens, each
  scored by its summed log-probability over the length penalty of its own
  length (eos counted). A beam of 8 holds every live one (2^3) and every
  finished one (1 + 2 + 4), so it must return their argmax; a search whose
  finished hypotheses took live ones' places would not (it favours short
  outputs)."""
  vocab, steps, eos, pad = 3, 3, 2, 0
  dec = _decoder(vocab=vocab)
  prompt = jnp.array([[0], [1], [2]])
  beam = compiled(lambda m, p: decoding.generate(
      m, p, steps, method='beam', beam_size=8, alpha=alpha, eos=eos, pad=pad),
                  dec, prompt)
  hypotheses = [seq for n in range(1, steps + 1)
                for seq in itertools.product(range(vocab), repeat=n)
                if eos not in seq[:-1] and (seq[-1] == eos or n == steps)]
  assert len(hypotheses) == 7 + 8
  # One compiled pass, reused (it compiles once per hypothesis length).
  log_probs = nnx.jit(lambda m, t: jax.nn.log_softmax(m(t)[0], axis=-1))
  for row in range(prompt.shape[0]):
    best = None
    for seq in hypotheses:
      tokens = jnp.array([[int(prompt[row, 0]), *seq]])
      logp = np.asarray(log_probs(dec, tokens))
      total = sum(float(logp[i, t]) for i, t in enumerate(seq))
      score = total / float(decoding.length_penalty(jnp.float32(len(seq)),
                                                    alpha))
      if best is None or score > best[0]:
        best = (score, seq)
    padded = list(best[1]) + [pad] * (steps - len(best[1]))
    np.testing.assert_array_equal(beam.tokens[row, 1:], padded)
    assert float(beam.scores[row]) == pytest.approx(best[0], rel=1e-5)


class _Bigram(nnx.Module):
  """A causal 'model' whose next-token log-probabilities depend only on the
  last token (a table), so a search's answer can be worked out by hand; it
  has no caches to make or reorder."""

  def __init__(self, probs):
    self.table = nnx.Variable(jnp.log(jnp.asarray(probs, jnp.float32)))

  def init_cache(self, rows, total):
    del rows, total

  def reorder_cache(self, rows_from):
    del rows_from

  def __call__(self, tokens, positions=None, deterministic=True, decode=True):
    return self.table[...][tokens]


# A beam of 1 (the case where a finished hypothesis could take the only
# slot) in the commit tier; 2 --extended (tiers.py), a second beam setting.
@pytest.mark.parametrize('beam_size', [1, pytest.param(2, marks=EXTENDED)])
def test_an_early_eos_does_not_take_a_live_hypothesis_place(beam_size):
  """Eos = 2. After the prompt, eos has p 0.55 and token 1 p 0.45; after 1,
  eos has p 0.999. With alpha 2: [eos] scores log 0.55 / 1 = -0.598 and
  [1, eos] scores (log 0.45 + log 0.999) / (7/6)^2 = -0.587, so [1, eos]
  is the best output. Greedy stops at [eos]; a beam of one whose finished
  hypothesis kept the only slot would too."""
  tiny = 1e-4
  model = _Bigram([[tiny, 0.45 - tiny, 0.55],
                   [tiny, tiny, 1 - 2 * tiny],
                   [1 / 3, 1 / 3, 1 / 3]])
  prompt = jnp.zeros((1, 1), jnp.int32)
  beam = compiled(lambda m, p: decoding.generate(
      m, p, 4, method='beam', beam_size=beam_size, alpha=2.0, eos=2, pad=0),
                  model, prompt)
  np.testing.assert_array_equal(beam.tokens[0], [0, 1, 2, 0, 0])
  expected = (np.log(0.45 - tiny) + np.log(1 - 2 * tiny)) / (7 / 6) ** 2
  assert float(beam.scores[0]) == pytest.approx(expected, rel=1e-5)
  greedy = compiled(lambda m, p: decoding.generate(
      m, p, 4, method='greedy', eos=2, pad=0), model, prompt)
  np.testing.assert_array_equal(greedy.tokens[0], [0, 2, 0, 0, 0])


def test_a_settled_search_returns_a_finished_hypothesis_even_for_negative_alpha():
  """Eos = 2. After the prompt, token 1 has p 0.5 and eos 0.4999; after 1,
  token 1 again has p ~1. Beam 1 and alpha -1, so the penalty shrinks with
  length and longer outputs score worse: step 1 finishes [eos] at
  log 0.4999 = -0.6933 and keeps [1] live at -0.6931, whose every ending
  (length 2 or more) scores at most -0.6931 x 7/6 = -0.809, so the search
  settles. The answer is [eos], not the prefix [1], cut off without eos,
  which would score -0.6931 at length 1."""
  tiny = 1e-6
  model = _Bigram([[tiny, 0.5, 0.5 - tiny],
                   [tiny, 1 - 2 * tiny, tiny],
                   [1 / 3, 1 / 3, 1 / 3]])
  prompt = jnp.zeros((1, 1), jnp.int32)
  beam = compiled(lambda m, p: decoding.generate(
      m, p, 4, method='beam', beam_size=1, alpha=-1.0, eos=2, pad=0),
                  model, prompt)
  assert int(beam.tokens[0, 1]) == 2
  assert float(beam.scores[0]) == pytest.approx(np.log(0.5 - tiny), rel=1e-5)


# --extended (tiers.py): the same eos handling, greedy and beam, is checked in
# the commit tier by test_an_early_eos_does_not_take_a_live_hypothesis_place[1]
# (pad after eos, eos counted in the length penalty, greedy stops at eos) and
# test_a_full_beam_with_eos_is_exhaustive_search[0.6] (pad after eos on a
# real decoder).
@EXTENDED
def test_end_of_sentence_pads_and_stops():
  """After eos a sequence holds pad; the length penalty counts the tokens
  up to and including eos; the loop stops once every sequence is done."""
  dec = _decoder()
  prompt = _tokens((2, 2))
  free = np.asarray(compiled(lambda m, p: decoding.generate(
      m, p, 8, method='greedy'), dec, prompt).tokens)
  eos = int(free[1, 4])                # row 1's third new token
  out = np.asarray(compiled(lambda m, p: decoding.generate(
      m, p, 8, method='greedy', eos=eos, pad=10), dec, prompt).tokens)
  for row in range(2):
    new = free[row, 2:]
    hits = np.flatnonzero(new == eos)
    end = 2 + (hits[0] + 1 if hits.size else 8)
    np.testing.assert_array_equal(out[row, :end], free[row, :end])
    assert (out[row, end:] == 10).all()
  beam = compiled(lambda m, p: decoding.generate(
      m, p, 8, method='beam', beam_size=3, eos=eos, pad=10), dec, prompt)
  for seq in np.asarray(beam.tokens)[:, 2:]:
    ends = np.flatnonzero(seq == eos)
    if ends.size:
      assert (seq[ends[0] + 1:] == 10).all()


def test_beams_over_scanned_layers_and_cross_attention():
  """The caches follow the surviving hypotheses with stacked (scanned)
  layers too, and a translation decoder's encoder outputs are repeated
  per hypothesis: beam 1 equals greedy decoding with them."""
  from reference import stack_loop_into_scan
  loop = _decoder(position='shaw')
  scanned = _decoder(position='shaw', scan_layers=True)
  stack_loop_into_scan(loop, scanned)
  prompt = _tokens((2, 3))
  # Beam search only: greedy decoding over stacked caches is
  # test_decoder.py::test_scanned_decoder_equals_the_loop_and_decodes_from_stacked_caches.
  run = lambda m, p: decoding.generate(m, p, 5, method='beam', beam_size=3)
  a = compiled(run, loop, prompt)
  b = compiled(run, scanned, prompt)
  np.testing.assert_array_equal(a.tokens, b.tokens)

  cross = _decoder(cross_attention=True)
  enc = jax.random.normal(jax.random.key(3), (2, 6, 16))
  lens = jnp.array([6, 4])
  greedy = compiled(lambda m, p, e, n: selfattn.greedy_decode(
      m, p, 5, enc_outputs=e, enc_valid_lens=n), cross, prompt, enc, lens)
  beam = compiled(lambda m, p, e, n: decoding.generate(
      m, p, 5, method='beam', beam_size=1, call_args=(e, n)),
                  cross, prompt, enc, lens)
  np.testing.assert_array_equal(beam.tokens, greedy)


# RoPE in the commit tier; Shaw and Huang --extended (tiers.py): the forced
# loop is the same for every encoding (the rope case), and their cached paths
# are checked against the full causal pass in test_decoder.py
# (test_cached_decoding_equals_the_full_causal_pass[shaw], [huang]).
@pytest.mark.parametrize('position', [
    'rope', pytest.param('shaw', marks=EXTENDED),
    pytest.param('huang', marks=EXTENDED)])
def test_teacher_forcing_through_the_cache_equals_the_full_pass(position):
  dec = _decoder(position=position)
  tokens = _tokens((2, 9))
  np.testing.assert_allclose(
      compiled(decoding.teacher_forced_logits, dec, tokens),
      compiled(lambda m, t: m(t), dec, tokens), atol=1e-5)


def test_positions_for_every_example_equal_the_full_array():
  """(1, T) positions hold for every example and beam, as the (B, T) array
  with the same rows does; a longer array is read up to what the run needs.
  Beam search only: greedy decoding reads positions through the same
  decoding._start, as one beam (k = 1)."""
  dec = _decoder()
  prompt = _tokens((2, 2))
  full = jnp.broadcast_to(jnp.arange(5) + 3, (2, 5))
  run = lambda m, p, positions: decoding.generate(
      m, p, 3, method='beam', beam_size=2, positions=positions)
  want = compiled(run, dec, prompt, full).tokens
  # (1, 10): spread over every example and beam, and read up to P + 3.
  both = jnp.concatenate([full, full], axis=1)[:1]
  np.testing.assert_array_equal(compiled(run, dec, prompt, both).tokens, want)


def test_bad_requests_say_what_is_wrong():
  dec = _decoder()
  prompt = _tokens((1, 2))
  with pytest.raises(ValueError, match="method='topk'; valid: greedy"):
    decoding.generate(dec, prompt, 2, method='topk')
  with pytest.raises(ValueError, match='needs a key'):
    decoding.generate(dec, prompt, 2, method='sample')
  with pytest.raises(ValueError, match='num_steps=0 must be an integer >= 1'):
    decoding.generate(dec, prompt, 0)
  with pytest.raises(TypeError, match=r'num_steps=2\.5 must be an integer'):
    decoding.generate(dec, prompt, 2.5)
  with pytest.raises(TypeError, match=r'beam_size=2\.5 must be an integer'):
    decoding.generate(dec, prompt, 2, method='beam', beam_size=2.5)
  with pytest.raises(TypeError, match='prompt must be integer token ids'):
    decoding.generate(dec, prompt + 0.7, 2)      # was cast to the ids below
  with pytest.raises(ValueError, match=r'positions must be \(B, P \+ num_steps\)'):
    decoding.generate(dec, prompt, 2, positions=jnp.zeros((1, 2), jnp.int32))
  with pytest.raises(ValueError, match='beam search takes no forced'):
    decoding.generate(dec, prompt, 2, method='beam', return_logits=True)
  # Issue 50: answers that should have been refusals.
  with pytest.raises(ValueError, match='alpha must be a finite number; got nan'):
    decoding.generate(dec, prompt, 2, method='beam', alpha=float('nan'))
  with pytest.raises(ValueError, match='temperature must be > 0'):
    decoding.generate(dec, prompt, 2, method='sample', temperature=0.0,
                      key=jax.random.key(0))
  # Its neighbour: a top_k outside 1..V failed deep in lax.top_k (0, or
  # more than the vocabulary) or broadcast an empty row (negative).
  vocab = compiled(lambda m, p: m(p, deterministic=True),
                   dec, prompt).shape[-1]
  for top_k in (0, -3, vocab + 1):
    with pytest.raises(ValueError, match=rf'top_k must be between 1 and the '
                       rf'{vocab} logits of a step, or None; got {top_k}'):
      decoding.generate(dec, prompt, 2, method='sample', top_k=top_k,
                        key=jax.random.key(0))
  # top_k = V keeps every logit: the draws of top_k=None with the same key
  # (an off-by-one at the edge would drop the lowest logit or fail).
  draw = lambda m, p, key, top_k: decoding.generate(
      m, p, 6, method='sample', top_k=top_k, key=key).tokens
  every = compiled(functools.partial(draw, top_k=vocab), dec, prompt,
                   jax.random.key(0))
  assert every.shape == (1, 8)
  np.testing.assert_array_equal(every, compiled(
      functools.partial(draw, top_k=None), dec, prompt, jax.random.key(0)))


@pytest.mark.parametrize('position,owner,scan', [
    ('learned', 'LearnedEncoding', False),
    ('xl', 'TransformerXLRelative', False),
    ('xl', 'TransformerXLRelative', True)])
def test_generating_past_the_encodings_max_len_is_refused(position, owner,
                                                          scan):
  """Past max_len = 4, cached decoding would not be the full pass: a
  learned table's later positions all read its last row (where a full pass
  refuses), and XL's cached steps clip offsets at max_len - 1 where its
  full pass does not (a probe: 0.14 in a logit at L = 8). Within max_len
  the two agree."""
  dec = selfattn.TransformerDecoder(11, 16, 32, 4, 1, position=position,
                                    max_len=4, scan_layers=scan,
                                    rngs=nnx.Rngs(0))
  prompt = _tokens((1, 1))
  if position == 'learned':
    with pytest.raises(ValueError, match='exceeds the learned encoding max_len=4'):
      dec(_tokens((1, 8)), deterministic=True)
  with pytest.raises(ValueError, match=rf'a decoding cache of 8 positions '
                     rf"exceeds the {owner}'s max_len=4: generate at most 4 "
                     rf'tokens'):
    decoding.generate(dec, prompt, 7)
  out = compiled(lambda m, p: decoding.generate(m, p, 3, return_logits=True),
                 dec, prompt)
  full = compiled(lambda m, t: m(t, deterministic=True), dec, out.tokens)
  np.testing.assert_allclose(out.logits[:, :3], full[:, :3], atol=1e-5)


@pytest.mark.parametrize('scan', [False, True], ids=['loop', 'scan'])
def test_decoding_leaves_the_model_state_as_it_found_it(scan):
  """The caches a decode loop makes stayed on the model: a checkpoint of
  its state no longer restored into a fresh model, and a jitted training
  step retraced and carried them. Greedy and beam search, eager and under
  nnx.jit, now remove them when they return; drop_cache after decoding by
  hand."""
  dec = _decoder(position='alibi', scan_layers=scan)
  before = jax.tree.structure(nnx.state(dec))
  prompt = _tokens((2, 3))
  decoding.generate(dec, prompt, 4, method='greedy')
  assert jax.tree.structure(nnx.state(dec)) == before
  nnx.jit(lambda m, p: decoding.generate(m, p, 4, method='beam',
                                         beam_size=2).tokens)(dec, prompt)
  assert jax.tree.structure(nnx.state(dec)) == before
  # Also when the loop raises after making them (an id past the vocabulary).
  with pytest.raises(ValueError, match='token ids'):
    decoding.generate(dec, jnp.full((2, 3), 20), 4, method='greedy')
  assert jax.tree.structure(nnx.state(dec)) == before
  dec.init_cache(2, 8)
  dec(prompt, decode=True)
  assert jax.tree.structure(nnx.state(dec)) != before
  dec.drop_cache()
  assert jax.tree.structure(nnx.state(dec)) == before


def test_a_draw_follows_the_softmax_at_its_temperature_among_the_top_k():
  """draw's frequencies against NumPy's softmax(logits / T), over 4,000
  rows with one key (a fixed draw, so not flaky): T = 0.5 sharpens
  [0, 1, 2] to softmax([0, 2, 4]); top_k = 2 renormalises over the two
  largest. Every other sampling test compares two paths that share draw
  (a temperature multiplied, not divided, passed them all)."""
  logits = jnp.tile(jnp.array([[0.0, 1.0, 2.0]]), (4000, 1))
  key = jax.random.key(0)
  for top_k, scaled in ((None, np.array([0.0, 2.0, 4.0])),
                        (2, np.array([-np.inf, 2.0, 4.0]))):
    want = np.exp(scaled - scaled.max())
    want /= want.sum()
    tokens = np.asarray(decoding.draw(logits, key, 0.5, top_k))
    got = np.bincount(tokens, minlength=3) / len(tokens)
    np.testing.assert_allclose(got, want, atol=0.03, err_msg=f'top_k={top_k}')

"""Whole-sequence scoring and sampling of a causal language model
(selfattn/tasks/music/lm_eval.py) against direct NumPy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from selfattn.nn import decoding
from selfattn.tasks.music import jsb
from selfattn.tasks.music import lm_eval
from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.models import LanguageModel
from tiers import EXTENDED


def _model(position='rope', seed=0):
  decoder = TransformerDecoder(jsb.VOCAB_SIZE, 16, 32, 2, 2, position=position,
                               max_len=128, rngs=nnx.Rngs(seed))
  return LanguageModel(decoder, jsb.NUM_TARGETS)


def _sequences(lengths, seed=0):
  rng = np.random.default_rng(seed)
  return [np.concatenate([[jsb.START], rng.integers(0, jsb.NUM_TARGETS, n)])
          for n in lengths]


def _numpy_nll(model, seq):
  """-log p(seq[j+1] | seq[:j+1]) for every j, from one full pass."""
  logits = np.asarray(model(jnp.asarray(seq[None, :-1])), np.float64)[0]
  logits -= logits.max(-1, keepdims=True)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -logp[np.arange(len(seq) - 1), seq[1:]]


def test_score_is_the_mean_of_minus_log_p_over_every_target():
  """A window at least as long as each sequence: one full pass each, and the
  summed NLL equals NumPy's over every target (padding in the batch and
  uneven lengths change nothing)."""
  model = _model()
  seqs = _sequences([11, 30, 5])
  total, count = lm_eval.score(model, seqs, window=32, batch_size=2)
  want = np.concatenate([_numpy_nll(model, s) for s in seqs])
  assert count == len(want) == 46
  np.testing.assert_allclose(total, want.sum(), rtol=1e-5)


@pytest.mark.parametrize('window,stride', [
    # Extended: [12-8] takes the same window plan and scoring, with windows
    # overlapping and a last one cut short; a single window per sequence is
    # test_score_is_the_mean_of_minus_log_p_over_every_target.
    pytest.param(8, 4, marks=EXTENDED),
    (12, 8),
    pytest.param(16, 16, marks=EXTENDED)])
def test_windows_score_each_target_once_with_its_own_context(window, stride):
  """Longer sequences in strided windows: every target is scored once, and
  each from exactly the context the plan gives it (recomputed directly)."""
  model = _model('sinusoidal')
  seqs = _sequences([37, 21])
  total, count = lm_eval.score(model, seqs, window=window, stride=stride)
  want = 0.0
  for seq in seqs:
    for start, end, first in jsb.window_plan(len(seq) - 1, window, stride):
      nll = _numpy_nll(model, seq[start:end + 1])
      want += nll[first - start:].sum()
  assert count == 37 + 21
  np.testing.assert_allclose(total, want, rtol=1e-5)
  # A window shorter than the sequence loses context: not one full pass.
  full = sum(_numpy_nll(model, s).sum() for s in seqs)
  assert abs(total - full) > 1e-3


def test_nll_by_position_reads_one_pass_per_sequence():
  model = _model()
  seqs = _sequences([20, 9])
  totals, counts = lm_eval.nll_by_position(model, seqs, max_length=16)
  a, b = _numpy_nll(model, seqs[0][:17]), _numpy_nll(model, seqs[1])
  np.testing.assert_array_equal(counts, [2] * 9 + [1] * 7)
  want = np.zeros(16)
  want[:16] += a
  want[:9] += b
  np.testing.assert_allclose(totals, want, rtol=1e-5)


def test_cached_sampling_equals_uncached_sampling_for_a_fixed_key():
  model = _model()
  prompt = jnp.asarray(np.stack(_sequences([6, 6], seed=3)))[:, :5]
  key = jax.random.key(7)
  for temperature, top_k in ((1.0, None), (0.8, 5)):
    cached = lm_eval.sample(model, prompt, 12, key, temperature=temperature,
                            top_k=top_k)
    uncached = lm_eval.sample(model, prompt, 12, key,
                              temperature=temperature, top_k=top_k,
                              use_cache=False)
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_array_equal(cached[:, :5], prompt)
    assert np.all(np.asarray(cached[:, 5:]) < jsb.NUM_TARGETS)
  # Another key gives another continuation; top_k=1 is greedy.
  other = lm_eval.sample(model, prompt, 12, jax.random.key(8))
  assert np.any(np.asarray(other) != np.asarray(cached))
  greedy = lm_eval.sample(model, prompt, 12, key, temperature=0.0)
  np.testing.assert_array_equal(
      lm_eval.sample(model, prompt, 12, key, top_k=1), greedy)
  # The greedy continuation is the argmax of a full pass at every step.
  logits = np.asarray(model(greedy[:, :-1]))
  np.testing.assert_array_equal(np.argmax(logits[:, 4:], -1), greedy[:, 5:])


def test_top_k_draws_only_among_the_k_largest():
  logits = jnp.asarray(np.random.default_rng(0).normal(size=(1, 30)))
  keys = jax.random.split(jax.random.key(0), 400)
  draws = {int(decoding.draw(logits, k, 1.0, 3)[0]) for k in keys}
  assert draws == set(np.argsort(-np.asarray(logits[0]))[:3].tolist())

"""experiments.music_baselines: unigram and voice-aware Kneser-Ney n-grams."""

import collections
import math

import numpy as np
import pytest

from data import REQUIRES_JSB
from experiments import music_baselines as mb
from selfattn.tasks.music import jsb

V = jsb.NUM_TARGETS


def reference_kn(train, lags, discount, period=1):
  """The same model written plainly with dicts: p(w, slot, history tuple),
  slot = (voice, step phase) = (i % 4, (i // 4) % period)."""
  m = max(lags, default=0)
  K = len(lags)
  counts = [collections.defaultdict(collections.Counter) for _ in range(K + 1)]
  for piece in train:
    seq = [jsb.START] * m + list(piece)
    for i, w in enumerate(piece):
      slot = (i % 4, (i // 4) % period)
      counts[K][(slot,) + tuple(seq[m + i - lag] for lag in lags)][w] += 1
  for k in range(K, 0, -1):   # continuation counts: distinct extensions
    for context, ws in counts[k].items():
      for w in ws:
        counts[k - 1][context[:-1]][w] += 1

  def prob(w, voice, history):
    seq = [jsb.START] * m + list(history)
    slot = (voice, (len(history) // 4) % period)
    context = (slot,) + tuple(seq[len(seq) - lag] for lag in lags)
    p = 1 / V
    for k in range(K + 1):
      ws = counts[k].get(context[:k + 1])
      if ws:
        p = (max(ws[w] - discount, 0) + discount * len(ws) * p) / sum(ws.values())
    return p
  return prob


def _toy_corpus(seed, pieces, steps):
  """Pieces with structure (a random walk per voice over a few pitches)."""
  rng = np.random.default_rng(seed)
  out = []
  for _ in range(pieces):
    walk = np.cumsum(rng.integers(-1, 2, (steps, 4)), 0) % 5 + [40, 30, 20, 10]
    walk[rng.random((steps, 4)) < 0.05] = jsb.SILENCE
    out.append(walk.reshape(-1))
  return out


def test_unigram_by_hand():
  train = [np.array([0, 0, 1, 88]), np.array([1, 1, 1, 1])]
  p = mb.unigram(train)
  assert p.shape == (jsb.VOCAB_SIZE,) and p[jsb.START] == p[jsb.PAD] == 0
  assert p.sum() == pytest.approx(1)
  # counts 0: 2, 1: 5, 88: 1 of N = 8; add-one over 89 targets.
  np.testing.assert_allclose(p[[0, 1, 50, 88]], [3 / 97, 6 / 97, 1 / 97, 2 / 97])
  piece = np.array([1, 0, 2, 88])
  expected = -(math.log(6 / 97) + math.log(3 / 97) + math.log(1 / 97) + math.log(2 / 97)) / 4
  assert mb.nll(p[piece]) == pytest.approx(expected)


def test_per_voice_model_by_hand():
  """n = 1 (no history): per-voice counts interpolated with uniform."""
  model = mb.NGram([np.array([0, 0, 1, 88]), np.array([0, 1, 1, 1])], lags=(), discount=0.5)
  voice0 = model.distribution(np.array([], np.int64), voice=0)   # saw 0, 0
  assert voice0[0] == pytest.approx((2 - 0.5 + 0.5 * 1 / V) / 2)
  assert voice0[5] == pytest.approx(0.5 * 1 / V / 2)
  voice1 = model.distribution(np.array([0]), voice=1)   # saw 0, 1
  assert voice1[0] == pytest.approx((1 - 0.5 + 0.5 * 2 / V) / 2)


@pytest.mark.parametrize('lags, discount, period', [
    ((1,), 0.8, 1), ((1, 2, 3), 0.8, 1), ((4, 1, 2), 0.5, 1),
    (mb.SKIP_LAGS, 0.9, 1), ((4, 1, 2), 0.7, 4), (mb.METER_LAGS, 0.9, 4),
    (mb.SKIP_LAGS[:8], 0.9, 16)])
def test_ngram_matches_plain_reference(lags, discount, period):
  """Including the meter-aware model (period > 1: the step phase joins the
  voice in every context)."""
  train, test = _toy_corpus(0, 6, 30), _toy_corpus(1, 2, 12)
  test[1][5] = 3   # a token never seen in training: unseen contexts follow it
  model = mb.NGram(train, lags, discount, period=period)
  reference = reference_kn(train, lags, discount, period)
  got = model.prob(test)
  want = [reference(w, i % 4, piece[:i]) for piece in test for i, w in enumerate(piece)]
  np.testing.assert_allclose(got, want, rtol=1e-12)
  # distribution() agrees with prob() at every position of a piece.
  piece = test[1]
  rows = [model.distribution(piece[:i], i % 4)[w] for i, w in enumerate(piece)]
  np.testing.assert_allclose(rows, got[len(test[0]):], rtol=1e-12)


@pytest.mark.parametrize('lags', [mb.RECENCY_LAGS, mb.SKIP_LAGS])
def test_ngram_distributions_sum_to_one(lags):
  train = _toy_corpus(2, 5, 40)
  model = mb.NGram(train, lags, 0.8)
  histories = [np.array([], np.int64), train[0][:7], train[1][:20], np.array([3, 3, 3, 3, 3])]
  for history in histories:       # start of a piece, seen contexts, unseen ones
    for voice in range(4):
      dist = model.distribution(history, voice)
      assert dist.shape == (jsb.VOCAB_SIZE,) and (dist[:V] > 0).all()
      assert dist[jsb.START] == dist[jsb.PAD] == 0
      assert dist.sum() == pytest.approx(1, abs=1e-12)


def test_ngram_rejects_bad_settings():
  with pytest.raises(ValueError, match='int64'):
    mb.NGram([np.arange(8)], lags=tuple(range(1, 11)))
  with pytest.raises(ValueError, match='int64'):
    mb.NGram([np.arange(8)], lags=mb.SKIP_LAGS, period=16)
  with pytest.raises(ValueError, match='period'):
    mb.NGram([np.arange(8)], period=0)
  with pytest.raises(ValueError, match='discount'):
    mb.NGram([np.arange(8)], discount=1.5)


@REQUIRES_JSB
def test_baselines_on_real_data():
  got = mb.baselines(jsb.load())
  # The data README: unigram about 3.39 valid, a voice-aware n-gram about
  # 0.86 valid / 0.91 test. Bands around those:
  assert abs(got['unigram']['valid'] - 3.39) < 0.01
  assert abs(got['ngram']['test'] - 0.91) < 0.02
  assert 0.85 < got['ngram']['valid'] < 0.93
  assert got['ngram_skip']['test'] < got['ngram']['test'] - 0.2
  # Pinned (module docstring), so a change of behaviour is seen.
  pinned = {'unigram': (3.3907, 3.4028), 'ngram': (0.9025, 0.9143),
            'ngram_skip': (0.6585, 0.6685), 'ngram_meter': (0.5264, 0.5372)}
  for name, (valid, test) in pinned.items():
    assert got[name]['valid'] == pytest.approx(valid, abs=1e-4)
    assert got[name]['test'] == pytest.approx(test, abs=1e-4)


def test_a_row_against_the_floor_by_hand():
  """experiments.music.against_floor: per-seed differences from a constant
  floor, their mean and t-interval (t(0.975, 2) = 4.303), and the seeds
  below it on both splits."""
  from experiments import music as music_study
  by = {'valid_nll': {'x': {0: 0.50, 1: 0.52, 2: 0.54}},
        'test_nll': {'x': {0: 0.52, 1: 0.53, 2: 0.55}}}
  line = music_study.against_floor(by, 'x', 'meter', {'valid': 0.53,
                                                      'test': 0.54})
  # valid diffs -0.03, -0.01, +0.01: mean -0.01, std 0.02, half 4.303 * 0.02 / sqrt 3.
  half = 4.302653 * 0.02 / math.sqrt(3)
  assert f'valid -0.0100 [{-0.01 - half:+.4f}, {-0.01 + half:+.4f}]' in line
  assert 'test -0.0067' in line
  assert 'below it on valid and test on 2 of 3 seeds' in line
  assert 'fewer than two seeds' in music_study.against_floor(
      {'valid_nll': {'x': {0: 0.5}}, 'test_nll': {'x': {0: 0.5}}}, 'x', 'm',
      {'valid': 0.6, 'test': 0.6})

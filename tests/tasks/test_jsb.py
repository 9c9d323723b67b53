"""selfattn.tasks.music.jsb: locating and validating the data, serialization, crops, scoring plan."""

import hashlib
import io
import json
import pathlib
import urllib.error
import urllib.request

import numpy as np
import pytest

from data import REQUIRES_JSB
from data import jsb_file
from selfattn.tasks.music import jsb

REAL_FILE = jsb_file()
needs_data = REQUIRES_JSB


@pytest.fixture(scope='module')
def data():
  if REAL_FILE is None:
    pytest.skip(REQUIRES_JSB.kwargs['reason'])
  return jsb.load()


@pytest.fixture
def offline(monkeypatch, tmp_path):
  """No network and an empty user cache: any download attempt fails loudly."""
  calls = []
  def urlopen(*args, **kwargs):
    calls.append(args)
    raise urllib.error.URLError('network disabled in tests')
  monkeypatch.setattr(urllib.request, 'urlopen', urlopen)
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  monkeypatch.delenv('SELFATTN_DATA_DIR', raising=False)
  return calls


def _write(root: pathlib.Path, payload: bytes, monkeypatch=None) -> pathlib.Path:
  """Puts payload at root/jsb/FILENAME; with monkeypatch, makes it the
  expected checksum so that the parser, not the checksum, sees it."""
  (root / 'jsb').mkdir(parents=True, exist_ok=True)
  (root / 'jsb' / jsb.FILENAME).write_bytes(payload)
  if monkeypatch:
    monkeypatch.setattr(jsb, 'SHA256', hashlib.sha256(payload).hexdigest())
  return root / 'jsb' / jsb.FILENAME


# ---------------------------------------------------------------- real data

def test_split_sizes_and_token_counts(data):
  raw = json.loads(REAL_FILE.read_text())   # independent count from the JSON
  stats = jsb.statistics(data)
  assert {s: v['pieces'] for s, v in stats.items()} == {'train': 229, 'valid': 76, 'test': 77}
  assert {s: v['tokens'] for s, v in stats.items()} == {
      'train': 220912, 'valid': 73632, 'test': 75600}
  for split in jsb.SPLITS:
    assert stats[split]['tokens'] == 4 * sum(len(p) for p in raw[split])
  assert min(v['min_steps'] for v in stats.values()) == 100
  assert max(v['max_steps'] for v in stats.values()) == 640
  pitches = np.concatenate([np.concatenate(g) for g in data.values()])
  assert pitches[pitches >= 0].min() == 36 and pitches.max() == 81


def test_round_trip_every_piece(data):
  for grids in data.values():
    for grid in grids:
      tokens = jsb.serialize(grid)
      assert tokens.shape == (4 * len(grid),) and tokens.dtype == np.int32
      np.testing.assert_array_equal(jsb.deserialize(tokens), grid)


# ---------------------------------------------------------------- locating

@needs_data
def test_checksum_mismatch_is_one_line_error_without_download(tmp_path, offline):
  payload = bytearray(REAL_FILE.read_bytes())
  payload[1000] ^= 1   # one bit of one byte
  path = _write(tmp_path, bytes(payload))
  with pytest.raises(jsb.DataError) as e:
    jsb.load(tmp_path)
  message = str(e.value)
  assert '\n' not in message and str(path) in message
  assert jsb.SHA256 in message and hashlib.sha256(payload).hexdigest() in message
  assert 'delete' in message
  assert offline == []


def test_missing_file_and_failed_download(tmp_path, offline):
  (tmp_path / 'empty').mkdir()
  with pytest.raises(jsb.DataError) as e:
    jsb.locate(tmp_path / 'empty')
  message = str(e.value)
  assert '\n' not in message and str(tmp_path / 'empty' / 'jsb' / jsb.FILENAME) in message
  assert jsb.URL in message and 'network disabled' in message
  assert len(offline) == 1
  leftovers = list((tmp_path / 'cache').rglob('*'))   # no partial download left
  assert all(p.is_dir() for p in leftovers)


def test_download_goes_to_cache_atomically_and_is_verified(tmp_path, monkeypatch):
  monkeypatch.setenv('XDG_CACHE_HOME', str(tmp_path / 'cache'))
  monkeypatch.delenv('SELFATTN_DATA_DIR', raising=False)
  payload = b'{"train": [], "valid": [], "test": []}'
  monkeypatch.setattr(urllib.request, 'urlopen', lambda url, timeout: io.BytesIO(b'corrupt'))
  with pytest.raises(jsb.DataError, match='expected'):
    jsb.locate()
  assert not any(p.is_file() for p in (tmp_path / 'cache').rglob('*'))
  monkeypatch.setattr(jsb, 'SHA256', hashlib.sha256(payload).hexdigest())
  urls = []
  def urlopen(url, timeout):
    urls.append(url)
    return io.BytesIO(payload)
  monkeypatch.setattr(urllib.request, 'urlopen', urlopen)
  path = jsb.locate()
  assert path == tmp_path / 'cache' / 'selfattn' / 'jsb' / jsb.FILENAME
  assert path.read_bytes() == payload and urls == [jsb.URL] and jsb.COMMIT in jsb.URL
  assert sorted(p.name for p in path.parent.iterdir()) == [jsb.FILENAME]
  assert jsb.locate() == path and len(urls) == 1   # found in the cache now


def test_data_dir_argument_wins_over_environment(tmp_path, monkeypatch, offline):
  good = b'{"train": [[[60, 55, 52, 48]]], "valid": [], "test": []}'
  _write(tmp_path / 'a', good, monkeypatch)
  _write(tmp_path / 'b', b'other')
  monkeypatch.setenv('SELFATTN_DATA_DIR', str(tmp_path / 'b'))
  assert jsb.load(tmp_path / 'a')['train'][0].tolist() == [[60, 55, 52, 48]]
  with pytest.raises(jsb.DataError, match='checksum'):
    jsb.load()


@pytest.mark.parametrize('payload, words', [
    (b'{"train": [', 'not valid JSON'),
    (b'{"train": [], "valid": []}', "split 'test' missing"),
    (b'{"train": [[[60, 55, 52]]], "valid": [], "test": []}', 'step 0 does not hold exactly 4'),
    (b'{"train": [[[60, 55, 52, 48], [60, 55, 52, 12]]], "valid": [], "test": []}',
     'step 1: pitch out of range'),
    (b'{"train": [], "valid": [[[60, 55.5, 52, 48]]], "test": []}', 'non-integer'),
    (b'{"train": [[]], "valid": [], "test": []}', 'not a non-empty list'),
])
def test_malformed_files(tmp_path, monkeypatch, offline, payload, words):
  path = _write(tmp_path, payload, monkeypatch)
  with pytest.raises(jsb.DataError) as e:
    jsb.load(tmp_path)
  assert words in str(e.value) and str(path) in str(e.value) and '\n' not in str(e.value)


# ---------------------------------------------------------------- tokens

def test_serialization_order_and_vocabulary():
  grid = np.array([[72, 67, 64, 48], [-1, 67, 62, 21], [108, -1, -1, -1]])
  tokens = jsb.serialize(grid)
  # S A T B of step 0, then step 1, ...: pitch p -> p - 21, silence -> 88.
  assert tokens.tolist() == [51, 46, 43, 27, 88, 46, 41, 0, 87, 88, 88, 88]
  assert (jsb.SILENCE, jsb.START, jsb.PAD, jsb.VOCAB_SIZE) == (88, 89, 90, 91)
  np.testing.assert_array_equal(jsb.deserialize(tokens), grid)
  with pytest.raises(ValueError, match='multiple of 4'):
    jsb.deserialize(tokens[:6])
  for special in (jsb.START, jsb.PAD):
    with pytest.raises(ValueError, match='special'):
      jsb.deserialize(np.concatenate([tokens[:4], [special, 1, 2, 3]]))
  with pytest.raises(ValueError):
    jsb.serialize(np.array([[20, 60, 60, 60]]))


def test_transpose():
  grid = np.array([[72, -1, 64, 48], [107, 67, -1, 21]])
  np.testing.assert_array_equal(jsb.transpose(grid, 1), [[73, -1, 65, 49], [108, 68, -1, 22]])
  np.testing.assert_array_equal(jsb.transpose(grid, 0), grid)
  with pytest.raises(ValueError, match='piano range'):
    jsb.transpose(grid, 2)
  with pytest.raises(ValueError, match='piano range'):
    jsb.transpose(grid, -1)


# ---------------------------------------------------------------- crops

def _aligned_source(row, pieces):
  """(piece, start) of every aligned start whose [START]+tokens crop is row."""
  found = []
  for k, p in enumerate(pieces):
    seq = np.concatenate([[jsb.START], p])
    for s in range(0, len(seq), 4):
      if np.array_equal(seq[s:s + len(row)], row):
        found.append((k, s))
  return found


def test_crop_batch_is_a_function_of_seed_and_step():
  rng = np.random.default_rng(0)
  pieces = [rng.integers(0, 89, 4 * n) for n in (30, 45, 60)]
  a = jsb.crop_batch(pieces, seed=3, step=7, batch_size=8, window=32)
  b = jsb.crop_batch(pieces, seed=3, step=7, batch_size=8, window=32)
  c = jsb.crop_batch(pieces, seed=3, step=8, batch_size=8, window=32)
  d = jsb.crop_batch(pieces, seed=4, step=7, batch_size=8, window=32)
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert not np.array_equal(a[0], c[0]) and not np.array_equal(a[0], d[0])
  inputs, targets, weights = a
  assert inputs.dtype == targets.dtype == np.int32 and weights.dtype == np.float32
  assert inputs.shape == targets.shape == weights.shape == (8, 32)
  np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])
  assert (weights == 1).all()
  for row in inputs:   # random tokens: each crop has exactly one source, aligned
    assert len(_aligned_source(row, pieces)) == 1


def test_crops_start_at_start_and_pad_short_pieces():
  short, exact = np.arange(8), np.arange(16) + 20
  inputs, targets, weights = jsb.crop_batch([short], 0, 0, batch_size=2, window=12)
  assert inputs[0].tolist() == [jsb.START] + list(range(8)) + [jsb.PAD] * 3
  assert targets[0].tolist() == list(range(8)) + [jsb.PAD] * 4
  assert weights[0].tolist() == [1] * 8 + [0] * 4
  inputs, targets, _ = jsb.crop_batch([exact], 0, 0, batch_size=2, window=16)
  assert (inputs[:, 0] == jsb.START).all() and (targets == exact).all()


def test_crops_choose_pieces_in_proportion_to_length():
  pieces = [np.zeros(4, np.int64), np.ones(400, np.int64)]
  targets = jsb.crop_batch(pieces, 0, 0, batch_size=4000, window=4)[1]
  short = (targets[:, 0] == 0).sum()
  assert 20 < short < 60   # expected 4000 / 101 = 40; 3 sigma is about 19


def test_crop_transposition():
  rng = np.random.default_rng(1)
  pieces = [np.where(rng.random(200) < 0.1, jsb.SILENCE, rng.integers(30, 60, 200))]
  plain = jsb.crop_batch(pieces, 5, 2, batch_size=64, window=20)
  moved = jsb.crop_batch(pieces, 5, 2, batch_size=64, window=20, transpose_range=3)
  special = plain[0] >= jsb.SILENCE
  np.testing.assert_array_equal(moved[0][special], plain[0][special])
  shifts = moved[0].astype(int) - plain[0]
  for b in range(64):   # one shift per example, same crop position
    assert len(set(shifts[b][~special[b]])) == 1
    target_shift = (moved[1] - plain[1])[b][plain[1][b] < jsb.SILENCE]
    np.testing.assert_array_equal(target_shift, shifts[b][~special[b]][0])
  assert set(shifts[~special]) == set(range(-3, 4))
  top = [np.full(40, 87)]   # the top key (MIDI 108): only downward shifts fit
  x = jsb.crop_batch(top, 0, 0, batch_size=64, window=8, transpose_range=3)[0]
  assert x[:, 1:].max() == 87 and set(x[:, 1]) == {84, 85, 86, 87}


# ---------------------------------------------------------------- scoring plan

@pytest.mark.parametrize('length, window, stride', [
    (1, 8, 4), (8, 8, 4), (9, 8, 4), (100, 16, 8), (101, 16, 4), (37, 10, 10), (2560, 2048, 1024)])
def test_window_plan(length, window, stride):
  plan = jsb.window_plan(length, window, stride)
  scored = np.zeros(length, int)
  for n, (start, end, first) in enumerate(plan):
    assert 0 <= start <= first < end <= length and end - start <= window
    scored[first:end] += 1
    if n == 0:
      assert start == first == 0
    else:
      assert start == plan[n - 1][0] + stride and first == plan[n - 1][1]
      assert first - start + 1 >= window - stride + 1   # context of the first scored
  assert (scored == 1).all()
  if length <= window:
    assert plan == [(0, length, 0)]
  with pytest.raises(ValueError):
    jsb.window_plan(length, window, window + 1)


def test_the_training_sampler_shifts_inputs_and_targets_alike_and_counts_no_padding(
    monkeypatch):
  """The JAX sampler training uses, on three made-up pieces (every other
  test of it needs the data set, so none ran in CI): with transposition,
  each target is the next input, both shifted by one k, every target a
  class; with a window longer than every piece, a crop is the whole piece
  and counts its n - 1 next-token targets, never the padding after it. A
  mutation audit's targets left untransposed, and a count of one PAD
  target, passed every commit-tier test."""
  import jax
  from selfattn.tasks.music import task as music_task
  rng = np.random.default_rng(0)
  lengths = [121, 181, 241]
  table = np.full((3, max(lengths)), jsb.PAD, np.int32)
  for i, n in enumerate(lengths):
    table[i, 0] = jsb.START
    table[i, 1:n] = rng.integers(20, 60, n - 1)
  monkeypatch.setattr(music_task, 'training_corpus',
                      lambda *args: (table, np.array(lengths, np.int32)))
  sample = music_task._make_sampler(jsb.NUM_TARGETS,
                                    {'transpose': 3, 'crop_align': 1})
  draw = jax.jit(jax.vmap(lambda key: sample(key, 256, 256)))
  x, count, y, _, _ = map(np.asarray, draw(jax.random.split(
      jax.random.key(0), 32)))
  assert set(count) <= {n - 1 for n in lengths} and len(set(count)) > 1
  shifts = set()
  for row_x, row_y, n in zip(x, y, count):
    np.testing.assert_array_equal(row_y[:n - 1], row_x[1:n])
    assert row_y[:n].max() < jsb.NUM_TARGETS
    piece = lengths.index(n + 1)
    shifts.add(int(row_y[0]) - int(table[piece, 1]))
  assert len(shifts) > 1 and max(map(abs, shifts)) <= 3

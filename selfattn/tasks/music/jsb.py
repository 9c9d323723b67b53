"""JSB Chorales (16th-note grid, SATB) in the Music Transformer's serialization.

The data: `Jsb16thSeparated.json` of the public repository
czhuang/JSB-Chorales-dataset (the Coconet / Music Transformer / PoPE copy):
{"train": 229, "valid": 76, "test": 77} pieces, the Boulanger-Lewandowski
(2012) split. A piece is a (T, 4) grid of MIDI pitches, soprano, alto, tenor,
bass, one row per sixteenth note, -1 where a voice is silent. Held and
re-struck notes are not distinguished and fermatas are not encoded.

The file has no licence, so it is never part of this repository: `locate`
finds it under $SELFATTN_DATA_DIR or the user cache, or downloads it once from
a pinned commit, and checks its SHA-256 every time (as tfds and torchvision
do). Problems raise `DataError` with a one-line message; command-line callers
catch it, print `error: <message>` and exit with status 2.

Serialization (Huang et al. 2019, Music Transformer, JSB section): all four
voices of a time step, then the next step: S0 A0 T0 B0 S1 A1 T1 B1 ... so the
voice of token i is i % 4. Vocabulary (VOCAB_SIZE = 91): one token per piano
pitch, MIDI 21..108 -> 0..87 (the whole keyboard, so every transposition the
data allows stays in the vocabulary), then SILENCE = 88, START = 89, PAD = 90.
PoPE (arXiv 2509.10534) reports a vocabulary of 90 on this data; it has no
separate padding token. PAD never is a target (weight 0) and START only an
input, so the per-token NLL is comparable.
"""

from __future__ import annotations

import json
import os
import pathlib

import numpy as np

from selfattn.tasks import data_files
from selfattn.errors import DataError  # noqa: F401  (jsb.DataError)

FILENAME = 'Jsb16thSeparated.json'
SUBDIR = 'jsb'   # <data dir>/jsb/Jsb16thSeparated.json, as in /work/shared/data
COMMIT = '9a7f733ddb4ed91f48da64ac7f0f621c34aadd4d'   # master, 2021-02-12
URL = ('https://raw.githubusercontent.com/czhuang/JSB-Chorales-dataset/'
       f'{COMMIT}/{FILENAME}')
SHA256 = '79294cc374f9252e95ef4b703161524c1c53dc1f712c236f00f1c1f5d54af5a7'
SPLITS = ('train', 'valid', 'test')
VOICES = ('soprano', 'alto', 'tenor', 'bass')
NUM_VOICES = 4

LOWEST, HIGHEST = 21, 108           # piano keyboard, MIDI pitch
NUM_PITCHES = HIGHEST - LOWEST + 1  # 88
SILENCE = NUM_PITCHES               # 88
START = NUM_PITCHES + 1             # 89
PAD = NUM_PITCHES + 2               # 90
VOCAB_SIZE = NUM_PITCHES + 3        # 91
NUM_TARGETS = NUM_PITCHES + 1       # 89: what can follow (pitches, SILENCE)


# ---------------------------------------------------------------- locating

def locate(data_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Path of a verified Jsb16thSeparated.json (data_files.locate: under
  <data_dir>/jsb/, data_dir defaulting to $SELFATTN_DATA_DIR, then the user
  cache, else downloaded into the cache; checksum-verified)."""
  return data_files.locate(SUBDIR, FILENAME, SHA256, URL, data_dir)


# ---------------------------------------------------------------- loading

def load(data_dir: str | os.PathLike | None = None) -> dict[str, list[np.ndarray]]:
  """Split name -> list of (T, 4) int32 grids (S, A, T, B; -1 silence), validated."""
  path = locate(data_dir)
  try:
    raw = json.loads(path.read_text(encoding='utf-8'))
  except (ValueError, UnicodeDecodeError) as e:
    raise DataError(f'{path}: not valid JSON ({e}); delete it and download again') from e
  if not isinstance(raw, dict):
    raise DataError(f'{path}: expected a JSON object of splits')
  data = {}
  for split in SPLITS:
    if not isinstance(raw.get(split), list):
      raise DataError(f'{path}: split {split!r} missing or not a list')
    data[split] = [_grid(path, split, i, piece) for i, piece in enumerate(raw[split])]
  return data


def _grid(path: pathlib.Path, split: str, index: int, piece) -> np.ndarray:
  where = f'{path}: {split} piece {index}'
  if not isinstance(piece, list) or not piece:
    raise DataError(f'{where} is not a non-empty list of time steps')
  for t, step in enumerate(piece):
    if not isinstance(step, list) or len(step) != NUM_VOICES:
      raise DataError(f'{where} step {t} does not hold exactly {NUM_VOICES} voices')
    # bool is an int in Python, and 60.0 would be a float: both are malformed.
    if any(type(p) is not int for p in step):
      raise DataError(f'{where} step {t} holds a non-integer pitch: {step}')
  grid = np.asarray(piece, np.int32)
  bad = (grid != -1) & ((grid < LOWEST) | (grid > HIGHEST))
  if bad.any():
    t = int(np.argwhere(bad)[0, 0])
    raise DataError(f'{where} step {t}: pitch out of range {LOWEST}-{HIGHEST} '
                    f'(or -1 for silence): {piece[t]}')
  return grid


def statistics(data: dict[str, list[np.ndarray]]) -> dict[str, dict[str, int]]:
  """Per split: pieces, time steps, tokens (4 per step, START not counted),
  shortest / median / longest piece in steps."""
  out = {}
  for split, grids in data.items():
    lengths = np.array([len(g) for g in grids])
    out[split] = {'pieces': len(grids), 'steps': int(lengths.sum()),
                  'tokens': int(NUM_VOICES * lengths.sum()),
                  'min_steps': int(lengths.min()),
                  'median_steps': int(np.median(lengths)),
                  'max_steps': int(lengths.max())}
  return out


# ---------------------------------------------------------------- tokens

def serialize(grid: np.ndarray) -> np.ndarray:
  """(T, 4) grid -> (4T,) int32 tokens, voices within a step, then time."""
  grid = np.asarray(grid)
  if grid.ndim != 2 or grid.shape[1] != NUM_VOICES:
    raise ValueError(f'expected a (T, {NUM_VOICES}) grid, got shape {grid.shape}')
  silent = grid == -1
  if ((grid < LOWEST) | (grid > HIGHEST))[~silent].any():
    raise ValueError(f'pitches must be -1 or in {LOWEST}..{HIGHEST}')
  return np.where(silent, SILENCE, grid - LOWEST).astype(np.int32).reshape(-1)


def deserialize(tokens: np.ndarray) -> np.ndarray:
  """(4T,) tokens -> (T, 4) int32 grid; raises on a partial step or on
  START / PAD / unknown tokens inside."""
  tokens = np.asarray(tokens)
  if tokens.ndim != 1 or tokens.size % NUM_VOICES:
    raise ValueError(f'expected a 1-d token array of a multiple of {NUM_VOICES} '
                     f'tokens, got shape {tokens.shape}')
  if ((tokens < 0) | (tokens > SILENCE)).any():
    raise ValueError('special or unknown tokens inside the piece (only pitch '
                     f'tokens 0..{NUM_PITCHES - 1} and SILENCE={SILENCE} allowed)')
  grid = np.where(tokens == SILENCE, -1, tokens + LOWEST).astype(np.int32)
  return grid.reshape(-1, NUM_VOICES)


def transpose(grid: np.ndarray, semitones: int) -> np.ndarray:
  """Shifts every sounding pitch of a (T, 4) grid; silence (-1) stays.
  Raises ValueError if a pitch would leave the piano range."""
  grid = np.asarray(grid)
  out = np.where(grid == -1, -1, grid + semitones).astype(np.int32)
  sounding = out[grid != -1]
  if sounding.size and (sounding.min() < LOWEST or sounding.max() > HIGHEST):
    raise ValueError(f'transposing by {semitones} leaves the piano range '
                     f'{LOWEST}..{HIGHEST}')
  return out


# ---------------------------------------------------------------- batches

def crop_batch(pieces_tokens: list[np.ndarray], seed: int, step: int,
               batch_size: int, window: int, transpose_range: int = 0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Training crops, a pure function of (seed, step).

  pieces_tokens: serialized pieces, each (4T,) without START. The model reads
  [START] + tokens. Returns inputs, targets (B, window) int32 and weights
  (B, window) float32: inputs = seq[s:s+window], targets = seq[s+1:s+window+1],
  s a multiple of 4 so that target slot i always holds voice i % 4 (and
  input slot 0 is START exactly when s = 0). A piece no longer than the window
  is taken whole and padded with PAD at weight 0.

  Pieces are drawn with probability proportional to their length in tokens,
  so every token of the training set is about equally likely to be trained on,
  as the corpus NLL weighs them (uniform choice would oversample the short
  pieces). transpose_range r > 0 shifts each example by a uniform number of
  semitones in -r..r, restricted to the shifts that keep the crop on the piano.
  """
  lengths = np.array([len(p) for p in pieces_tokens], np.float64)
  rng = np.random.default_rng([seed, step])
  which = rng.choice(len(pieces_tokens), size=batch_size, p=lengths / lengths.sum())
  offsets = rng.random(batch_size)   # drawn always, so r does not change crops
  shifts = rng.random(batch_size)
  inputs = np.full((batch_size, window), PAD, np.int32)
  targets = np.full((batch_size, window), PAD, np.int32)
  weights = np.zeros((batch_size, window), np.float32)
  for b, k in enumerate(which):
    seq = np.concatenate([[START], pieces_tokens[k]]).astype(np.int32)
    num_starts = max(len(seq) - 1 - window, 0) // NUM_VOICES + 1
    s = NUM_VOICES * int(offsets[b] * num_starts)
    x, y = seq[s:s + window], seq[s + 1:s + window + 1]
    if transpose_range:
      x, y = _shift(x, y, shifts[b], transpose_range)
    inputs[b, :len(x)], targets[b, :len(y)], weights[b, :len(y)] = x, y, 1.0
  return inputs, targets, weights


def _shift(x: np.ndarray, y: np.ndarray, u: float, r: int):
  """Transposes the pitch tokens of x and y by a shift drawn with u in [0, 1)
  uniformly from the shifts in -r..r that keep them on the keyboard."""
  pitches = np.concatenate([x, y])
  pitches = pitches[pitches < NUM_PITCHES]
  if not pitches.size:
    return x, y
  lo, hi = max(-r, -int(pitches.min())), min(r, NUM_PITCHES - 1 - int(pitches.max()))
  k = lo + int(u * (hi - lo + 1))
  move = lambda a: np.where(a < NUM_PITCHES, a + k, a).astype(np.int32)
  return move(x), move(y)


def window_plan(length: int, window: int, stride: int) -> list[tuple[int, int, int]]:
  """How to score a piece longer than the trained window (the "strided
  perplexity" of HuggingFace's perplexity guide).

  Target j (0 <= j < length) is token j, predicted from seq[:j + 1] where
  seq = [START] + tokens. Each (start, end, first_scored): feed seq[start:end]
  (end - start <= window tokens), score targets first_scored..end-1. Every
  target is scored exactly once; the first window scores all its targets, a
  later one (start advanced by stride) only those not yet scored, each with at
  least window - stride + 1 tokens of context. Use a stride that is a multiple
  of 4 so that every window starts on a time step, as the training crops do.
  """
  if not 0 < stride <= window:
    raise ValueError(f'need 0 < stride <= window, got stride={stride}, window={window}')
  plan, start, scored = [], 0, 0
  while scored < length:
    end = min(start + window, length)
    plan.append((start, end, scored))
    scored, start = end, start + stride
  return plan

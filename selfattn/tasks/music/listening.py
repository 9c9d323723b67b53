"""Listening to and describing chorale grids: MIDI, piano rolls, audio, statistics.

Every function takes a (T, 4) grid of MIDI pitches (S, A, T, B; -1 silence;
one row per sixteenth note), as selfattn.tasks.music.jsb produces. numpy only, plus
pretty_midi (`pip install selfattn[music]`) for MIDI files and, when present,
for audio.

A grid does not tell a held note from a re-struck one (neither does the JSB
data), so a voice's run of equal pitches becomes one MIDI note; silence ends
a note. Each voice is its own MIDI instrument (track named after the voice),
so crossing voices and unisons survive the round trip.

The statistics need no listener and are pure functions of a grid. They are
descriptive: they catch a sample that wanders out of the voices' ranges,
forgets the key, writes parallel fifths or loops, but cannot say that a
sample is good music; compare each with its value on the real data.
"""

from __future__ import annotations

import os

import numpy as np

from selfattn.tasks.music import jsb

VOICE_COLOURS = np.array([[230, 60, 60],    # soprano: red
                          [60, 170, 60],    # alto: green
                          [60, 110, 230],   # tenor: blue
                          [230, 160, 30]],  # bass: orange
                         np.uint8)
PROGRAM = 52   # General MIDI "Choir Aahs": sung parts, held notes sustain


def _pretty_midi():
  try:
    import pretty_midi
  except ImportError as e:
    raise ImportError('MIDI export needs pretty_midi: pip install "selfattn[music]"') from e
  return pretty_midi


def notes(grid: np.ndarray) -> list[tuple[int, int, int, int]]:
  """(voice, pitch, start step, end step) of each note: maximal runs of one
  pitch in one voice, silence excluded; end is exclusive."""
  grid = np.asarray(grid)
  out = []
  for v in range(grid.shape[1]):
    col = grid[:, v]
    change = np.flatnonzero(np.diff(col)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(col)]])
    out += [(v, int(col[s]), int(s), int(e)) for s, e in zip(starts, ends) if col[s] != -1]
  return out


def to_pretty_midi(grid: np.ndarray, tempo_bpm: float = 60.0, program: int = PROGRAM):
  """A pretty_midi.PrettyMIDI of the grid; a step is a sixteenth note
  (0.25 beat, 0.25 s at the default 60 bpm). A text event "end" marks the
  grid's end, so trailing silence survives the round trip (and a silent
  voice, whose track pretty_midi drops on reading)."""
  pm_lib = _pretty_midi()
  step = 60.0 / tempo_bpm / 4
  pm = pm_lib.PrettyMIDI(initial_tempo=tempo_bpm)
  tracks = [pm_lib.Instrument(program=program, name=name) for name in jsb.VOICES]
  for v, pitch, s, e in notes(grid):
    tracks[v].notes.append(pm_lib.Note(velocity=80, pitch=pitch, start=s * step, end=e * step))
  pm.instruments.extend(tracks)
  pm.text_events.append(pm_lib.Text('end', len(grid) * step))
  return pm


def grid_to_midi(grid: np.ndarray, path: str | os.PathLike,
                 tempo_bpm: float = 60.0, program: int = PROGRAM) -> None:
  """Writes the grid as a four-track MIDI file (see to_pretty_midi)."""
  to_pretty_midi(grid, tempo_bpm, program).write(str(path))


def midi_to_grid(path: str | os.PathLike) -> np.ndarray:
  """Reads a file written by grid_to_midi back into a (T, 4) int32 grid (the
  tempo is read from the file; tracks are matched by voice name, and a voice
  without a track is silent)."""
  pm = _pretty_midi().PrettyMIDI(str(path))
  _, tempi = pm.get_tempo_changes()
  step = 60.0 / float(tempi[0]) / 4
  tracks = {t.name.lower(): t for t in pm.instruments}
  if not set(tracks) <= set(jsb.VOICES):
    raise ValueError(f'{path}: expected tracks named {jsb.VOICES}, got {sorted(tracks)}')
  grid = np.full((int(round(pm.get_end_time() / step)), jsb.NUM_VOICES), -1, np.int32)
  for v, name in enumerate(jsb.VOICES):
    for n in tracks[name].notes if name in tracks else []:
      grid[int(round(n.start / step)):int(round(n.end / step)), v] = n.pitch
  return grid


def piano_roll(grid: np.ndarray, low: int = jsb.LOWEST, high: int = jsb.HIGHEST) -> np.ndarray:
  """(high - low + 1, T) uint8 bit mask, row r = pitch low + r, bit v set
  where voice v sounds (so a unison shows both voices). Piano range by default."""
  grid = np.asarray(grid)
  roll = np.zeros((high - low + 1, len(grid)), np.uint8)
  for v in range(grid.shape[1]):
    t = np.flatnonzero((grid[:, v] >= low) & (grid[:, v] <= high))
    roll[grid[t, v] - low, t] |= np.uint8(1 << v)
  return roll


def piano_roll_image(grid: np.ndarray, low: int = jsb.LOWEST, high: int = jsb.HIGHEST,
                     scale: int = 2) -> np.ndarray:
  """(scale * (high - low + 1), scale * T, 3) uint8 RGB image, highest pitch on
  top, black background, each voice in VOICE_COLOURS (voices sharing a cell
  are averaged). For TensorBoard's image summaries (HWC)."""
  roll = piano_roll(grid, low, high)[::-1]
  bits = (roll[..., None] >> np.arange(jsb.NUM_VOICES)) & 1          # (P, T, 4)
  count = bits.sum(-1, keepdims=True)
  rgb = bits @ VOICE_COLOURS.astype(np.float64) / np.maximum(count, 1)
  img = np.round(rgb).astype(np.uint8)
  return img.repeat(scale, 0).repeat(scale, 1)


def synthesize(grid: np.ndarray, sample_rate: int = 16000, tempo_bpm: float = 60.0) -> np.ndarray:
  """Mono float32 audio in [-1, 1]: pretty_midi's sine synthesis when it is
  installed, else a plain sum of sines (one per sounding voice) with short
  fades. Meant for short clips in TensorBoard, not for listening tests."""
  try:
    audio = to_pretty_midi(grid, tempo_bpm).synthesize(fs=sample_rate)
  except ImportError:
    step = 60.0 / tempo_bpm / 4
    audio = np.zeros(int(np.ceil(len(grid) * step * sample_rate)))
    for _, pitch, s, e in notes(grid):
      i, j = int(s * step * sample_rate), int(e * step * sample_rate)
      t = np.arange(j - i) / sample_rate
      fade = np.minimum(1, np.minimum(t, t[::-1]) / 0.01)
      audio[i:j] += fade * np.sin(2 * np.pi * 440 * 2 ** ((pitch - 69) / 12) * t)
  peak = np.abs(audio).max(initial=0)
  return (audio / peak if peak > 0 else audio).astype(np.float32)


# ---------------------------------------------------------------- statistics

def voice_ranges(grids: list[np.ndarray]) -> np.ndarray:
  """(4, 2) lowest and highest sounding pitch of each voice over the grids
  (compute on the training set, pass to out_of_range)."""
  sounding = np.concatenate(grids)
  return np.array([[sounding[sounding[:, v] >= 0, v].min(), sounding[sounding[:, v] >= 0, v].max()]
                   for v in range(jsb.NUM_VOICES)])


def out_of_range(grid: np.ndarray, ranges: np.ndarray) -> np.ndarray:
  """(4,) fraction of each voice's notes outside its range (NaN for a voice
  without notes). Shows voices leaving their tessitura; says nothing about
  leaps or voice crossing inside the range."""
  total, outside = np.zeros(jsb.NUM_VOICES), np.zeros(jsb.NUM_VOICES)
  for v, pitch, _, _ in notes(grid):
    total[v] += 1
    outside[v] += not ranges[v, 0] <= pitch <= ranges[v, 1]
  with np.errstate(invalid='ignore', divide='ignore'):
    return outside / total


def pitch_class_histogram(grids: np.ndarray | list[np.ndarray]) -> np.ndarray:
  """(12,) distribution of pitch classes over sounding voice-steps
  (duration-weighted: a half note counts 8 sixteenths) of one grid or a list."""
  grids = [grids] if isinstance(grids, np.ndarray) else grids
  pitches = np.concatenate([np.asarray(g).reshape(-1) for g in grids])
  counts = np.bincount(pitches[pitches >= 0] % 12, minlength=12).astype(np.float64)
  return counts / max(counts.sum(), 1)


def pitch_class_distance(grid: np.ndarray, reference: np.ndarray) -> float:
  """Total variation distance (half the L1 norm, in [0, 1]: the probability
  mass that would have to move) between the grid's pitch-class histogram and
  a reference one. Key-blind: the data mixes keys, so one chorale in any key
  is some distance away; it catches chromatic noise, not wrong modulations."""
  return float(0.5 * np.abs(pitch_class_histogram(grid) - reference).sum())


def parallels(grid: np.ndarray) -> dict[str, float]:
  """Parallel fifths and octaves between consecutive grid steps.

  Over each of the 6 voice pairs and each step transition where both voices
  sound before and after and both move: a parallel fifth (octave) when both
  move in the same direction and the interval is 7 (0) mod 12 before and
  after (compound intervals and unisons included). Returns the counts, the
  number of such both-moving transitions, and rate = (fifths + octaves) /
  moves (NaN without moves). Misses parallels whose voices move on
  different sixteenths and those through a passing note.
  """
  g = np.asarray(grid)
  fifths = octaves = moves = 0
  for a in range(jsb.NUM_VOICES):
    for b in range(a + 1, jsb.NUM_VOICES):
      x0, x1, y0, y1 = g[:-1, a], g[1:, a], g[:-1, b], g[1:, b]
      both = (np.minimum.reduce([x0, x1, y0, y1]) >= 0) & (x0 != x1) & (y0 != y1)
      same_way = np.sign(x1 - x0) == np.sign(y1 - y0)
      before, after = np.abs(x0 - y0) % 12, np.abs(x1 - y1) % 12
      moves += int(both.sum())
      fifths += int((both & same_way & (before == 7) & (after == 7)).sum())
      octaves += int((both & same_way & (before == 0) & (after == 0)).sum())
  rate = (fifths + octaves) / moves if moves else float('nan')
  return {'fifths': fifths, 'octaves': octaves, 'moves': moves, 'rate': rate}


def repetition(grid: np.ndarray) -> dict[str, float]:
  """How much a grid repeats itself.

  repeat_fraction: fraction of steps equal to the previous step (the data's
  held notes make this high: a quarter note is four equal steps).
  longest_repeat: the longest sequence of chords (steps with consecutive
  duplicates merged) occurring twice without overlap, in chords, and as a
  fraction of the chord count. Chorales repeat phrases (bar form AAB), so
  judge a sample's value against the data's distribution; a sample stuck in a
  loop shows a longest_repeat fraction near 1/2.
  """
  g = np.asarray(grid)
  same = (g[1:] == g[:-1]).all(1)
  chords = g[np.concatenate([[True], ~same])]
  ids = np.unique(chords, axis=0, return_inverse=True)[1].reshape(-1)
  n, best = len(ids), 0
  for shift in range(1, n):   # runs of agreement along each diagonal, O(n^2)
    run = 0
    for x, y in zip(ids[:-shift], ids[shift:]):
      run = run + 1 if x == y else 0
      best = max(best, min(run, shift))  # min: the two copies must not overlap
  return {'repeat_fraction': float(same.mean()) if len(same) else float('nan'),
          'longest_repeat': best, 'longest_repeat_fraction': best / n}

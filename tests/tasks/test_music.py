"""selfattn.tasks.music.listening: MIDI round trip, piano rolls, audio and sample statistics."""

import os
import pathlib

import numpy as np
import pytest

from selfattn.tasks.music import jsb
from selfattn.tasks.music import listening as music

pytest.importorskip('pretty_midi', reason='pip install "selfattn[music]"')

DATA_DIR = os.environ.get('SELFATTN_DATA_DIR') or '/nonexistent'
REAL_FILE = pathlib.Path(DATA_DIR) / 'jsb' / jsb.FILENAME

# Soprano crosses below the alto, a unison, silence inside, at both ends and
# a voice that is silent throughout (pretty_midi drops its empty track).
HAND = np.array([[-1, 64, 60, -1],
                 [72, 64, 60, -1],
                 [72, 64, 60, -1],
                 [62, 64, 64, -1],
                 [-1, 64, 64, -1],
                 [-1, -1, -1, -1]])


def test_notes_are_runs_of_equal_pitch():
  assert sorted(music.notes(HAND)) == [
      (0, 62, 3, 4), (0, 72, 1, 3), (1, 64, 0, 5), (2, 60, 0, 3), (2, 64, 3, 5)]


@pytest.mark.parametrize('tempo', [60.0, 97.0])
def test_midi_round_trip_hand_grid(tmp_path, tempo):
  path = tmp_path / 'hand.mid'
  music.grid_to_midi(HAND, path, tempo_bpm=tempo)
  np.testing.assert_array_equal(music.midi_to_grid(path), HAND)
  import pretty_midi
  pm = pretty_midi.PrettyMIDI(str(path))
  alto = [t for t in pm.instruments if t.name == 'alto'][0]
  end = pytest.approx(5 * 15 / tempo, abs=1e-3)   # up to a MIDI tick
  assert [(n.pitch, n.start, n.end) for n in alto.notes] == [(64, 0.0, end)]
  assert alto.program == music.PROGRAM


def test_midi_round_trip_real_pieces(tmp_path):
  if not REAL_FILE.is_file():
    pytest.skip('JSB data not found: set SELFATTN_DATA_DIR')
  data = jsb.load()
  for grid in (data['train'][0], data['valid'][5], data['test'][-1]):
    music.grid_to_midi(grid, tmp_path / 'piece.mid')
    np.testing.assert_array_equal(music.midi_to_grid(tmp_path / 'piece.mid'), grid)
  silent = [g for g in data['valid'] if (g == -1).any()][0]   # a piece with rests
  music.grid_to_midi(silent, tmp_path / 'rests.mid')
  np.testing.assert_array_equal(music.midi_to_grid(tmp_path / 'rests.mid'), silent)


def test_piano_roll_and_image_colours():
  roll = music.piano_roll(HAND)
  assert roll.shape == (88, 6) and roll.dtype == np.uint8
  assert roll[72 - 21, 1] == 1 and roll[64 - 21, 3] == 0b110 and roll[64 - 21, 0] == 0b010
  assert roll.astype(bool).sum() == 13 - 2   # 13 sounding voice-steps, two in unison
  img = music.piano_roll_image(HAND, low=60, high=72, scale=2)
  assert img.shape == (26, 12, 3) and img.dtype == np.uint8
  row = lambda pitch: 2 * (72 - pitch)      # highest pitch on top
  np.testing.assert_array_equal(img[row(72), 2 * 1], music.VOICE_COLOURS[0])
  np.testing.assert_array_equal(img[row(60) + 1, 2 * 0 + 1], music.VOICE_COLOURS[2])
  unison = music.VOICE_COLOURS[1:3].astype(float).mean(0).round()
  np.testing.assert_array_equal(img[row(64), 2 * 3], unison)
  np.testing.assert_array_equal(img[row(70), 0], [0, 0, 0])
  assert (img.reshape(-1, 3).any(1)).sum() == 4 * 11   # 11 coloured cells, 2x2 each


def test_synthesize(monkeypatch):
  grid = np.array([[69, -1, -1, -1]] * 8)   # A4 for 2 s
  audio = music.synthesize(grid, sample_rate=8000)
  assert audio.dtype == np.float32 and np.abs(audio).max() == pytest.approx(1.0)
  assert len(audio) >= 2 * 8000
  def no_midi(*args, **kwargs):
    raise ImportError('pretty_midi missing')
  monkeypatch.setattr(music, 'to_pretty_midi', no_midi)
  audio = music.synthesize(grid, sample_rate=8000)
  assert audio.shape == (16000,) and np.abs(audio).max() <= 1.0
  spectrum = np.abs(np.fft.rfft(audio))
  assert np.fft.rfftfreq(len(audio), 1 / 8000)[spectrum.argmax()] == pytest.approx(440, abs=1)


def test_out_of_range_and_voice_ranges():
  ranges = music.voice_ranges([np.array([[70, 60, 50, 40], [72, 62, 52, -1]]),
                               np.array([[74, 61, -1, 38]])])
  np.testing.assert_array_equal(ranges, [[70, 74], [60, 62], [50, 52], [38, 40]])
  grid = np.array([[75, 60, -1, 40], [75, 61, -1, 41], [72, 63, -1, 41]])
  frac = music.out_of_range(grid, ranges)
  np.testing.assert_array_equal(frac[[0, 1, 3]], [1 / 2, 1 / 3, 1 / 2])   # notes, not steps
  assert np.isnan(frac[2])


def test_pitch_class_distance():
  all_c = np.array([[72, 60, 48, 36]] * 4)
  np.testing.assert_array_equal(music.pitch_class_histogram(all_c), np.eye(12)[0])
  assert music.pitch_class_distance(all_c, np.full(12, 1 / 12)) == pytest.approx(11 / 12)
  c_and_g = np.array([[67, 60, -1, -1]] * 3 + [[67, 67, 67, -1]])
  np.testing.assert_allclose(music.pitch_class_histogram(c_and_g)[[0, 7]], [3 / 9, 6 / 9])
  assert music.pitch_class_distance(c_and_g, np.eye(12)[0]) == pytest.approx(6 / 9)
  both = music.pitch_class_histogram([all_c, c_and_g])
  np.testing.assert_allclose(both[[0, 7]], [19 / 25, 6 / 25])


def test_parallels_counts_one_fifth_and_one_octave():
  grid = np.array([
      [67, 64, 52, 48],   # S-B a twelfth (7 mod 12), A-T an octave
      [69, 64, 52, 50],   # S, B up by 2: a parallel fifth; A, T hold (1 move)
      [71, 62, 50, 47],   # all move (6); A-T down by 2 in octaves: a parallel octave
      [72, 62, 50, 48],   # S, B up by 1 in double octaves (1 move): a parallel octave
      [67, 60, 47, 55],   # all move (6); S-B 24 -> 12 in contrary motion: not counted
      [67, 60, 47, -1],   # the bass rests, the others hold: no move
  ])
  p = music.parallels(grid)
  assert p['fifths'] == 1 and p['octaves'] == 2
  assert p['moves'] == 1 + 6 + 1 + 6
  assert p['rate'] == pytest.approx(3 / 14)
  assert np.isnan(music.parallels(np.array([[60, 55, 52, 48]]))['rate'])


def test_repetition():
  a, b, c, d = ([60 + i, 55, 52, 48] for i in range(4))
  grid = np.array([a, a, b, c, a, b, c, d])
  r = music.repetition(grid)
  assert r['repeat_fraction'] == pytest.approx(1 / 7)
  assert r['longest_repeat'] == 3 and r['longest_repeat_fraction'] == pytest.approx(3 / 7)
  # x y x y x: "x y x" occurs twice but overlapping; "x y" twice without.
  assert music.repetition(np.array([a, b, a, b, a]))['longest_repeat'] == 2
  assert music.repetition(np.array([a, b, c, d]))['longest_repeat'] == 0

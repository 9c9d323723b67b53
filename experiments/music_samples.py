"""Samples of a trained JSB model: continuations of test-piece prompts, drawn
through the key/value cache, saved as MIDI and piano-roll PNGs, logged to
TensorBoard (image and audio) and described by statistics that need no
listener (selfattn/tasks/music/listening.py says what each can and cannot show)."""

from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from selfattn.training import figures
from selfattn.tasks.music import jsb
from selfattn.tasks.music import lm_eval
from selfattn.tasks.music import listening as music

PROMPT_STEPS = 16        # one bar of sixteenths, all four voices
TEMPERATURE = 1.0
TOP_K = 20


def continue_pieces(model, grids: list[np.ndarray], num_steps: int, seed: int
                    ) -> list[np.ndarray]:
  """Each grid's first PROMPT_STEPS steps, then num_steps sampled steps:
  (PROMPT_STEPS + num_steps, 4) grids. A sampled START/PAD cannot occur (the
  model's classes are pitches and silence)."""
  prompt = np.stack([np.concatenate([[jsb.START], jsb.serialize(
      g[:PROMPT_STEPS])]) for g in grids]).astype(np.int32)
  out = lm_eval.sample(model, jnp.asarray(prompt), jsb.NUM_VOICES * num_steps,
                       jax.random.key(seed), temperature=TEMPERATURE,
                       top_k=TOP_K)
  return [jsb.deserialize(np.asarray(row[1:])) for row in out]


def describe(grids: list[np.ndarray], train: list[np.ndarray]
             ) -> dict[str, float]:
  """Mean statistics over sampled grids (the part after the prompt)."""
  ranges = music.voice_ranges(train)
  reference = music.pitch_class_histogram(train)
  tails = [g[PROMPT_STEPS:] for g in grids]
  return {
      'out_of_range': float(np.nanmean([np.nanmean(music.out_of_range(g, ranges))
                                        for g in tails])),
      'pitch_class_distance': float(np.mean(
          [music.pitch_class_distance(g, reference) for g in tails])),
      'parallels_rate': float(np.nanmean([music.parallels(g)['rate']
                                          for g in tails])),
      'repeat_fraction': float(np.mean([music.repetition(g)['repeat_fraction']
                                        for g in tails])),
  }


def data_statistics(grids: list[np.ndarray], train: list[np.ndarray],
                    num_steps: int) -> dict[str, float]:
  """The same statistics on real test excerpts of the samples' length: what
  a sample's numbers should be compared with."""
  excerpts = [g[:PROMPT_STEPS + num_steps] for g in grids]
  return describe(excerpts, train)


def sample_title(label: str, seed: int, index: int) -> str:
  """'shaw, seed 0, sample 1': what a piano roll and its audio are of."""
  return f'{label}, seed {seed}, sample {index}'


def _tag_part(text: str) -> str:
  """A TensorBoard tag component: letters, digits and . _ - only."""
  return ''.join(c if c.isalnum() or c in '._-' else '_' for c in text)


def piano_roll(grid: np.ndarray, title: str) -> np.ndarray:
  """The grid as a labelled piano-roll figure (figures.piano_roll_figure:
  pitch names, bars, the prompt's end, a voice key): (H, W, 3) uint8."""
  return figures.render(figures.piano_roll_figure(
      music.notes(grid), len(grid), PROMPT_STEPS, music.VOICE_COLOURS,
      f'{title}: test-piece prompt, then sampled (temperature '
      f'{TEMPERATURE}, top-k {TOP_K})'))


def save(grids: list[np.ndarray], directory: str, writer: Any = None,
         step: int = 0, tag: str = 'samples', label: str = 'model',
         seed: int = 0) -> list[str]:
  """MIDI and piano-roll PNG per grid under directory; with a tensorboardX
  writer, the piano rolls as images and 8 s of audio each, under tags that
  name the encoding (label), seed and sample:
  samples/<label>_seed<seed>/sample_<i>_{piano_roll,audio}. Returns paths."""
  import matplotlib.image
  os.makedirs(directory, exist_ok=True)
  paths = []
  prefix = f'{tag}/{_tag_part(label)}_seed{seed}'
  for i, grid in enumerate(grids):
    base = os.path.join(directory, f'sample_{i}')
    image = piano_roll(grid, sample_title(label, seed, i))
    matplotlib.image.imsave(base + '.png', image)
    paths.append(base + '.png')
    try:
      music.grid_to_midi(grid, base + '.mid')
      paths.append(base + '.mid')
    except ImportError:         # pretty_midi is the optional `music` extra
      pass
    if writer is not None:
      writer.add_image(f'{prefix}/sample_{i}_piano_roll', image, step,
                       dataformats='HWC')
      audio = music.synthesize(grid[:32], sample_rate=16000)   # 8 s at 60 bpm
      writer.add_audio(f'{prefix}/sample_{i}_audio', audio, step,
                       sample_rate=16000)
  return paths

"""selfattn/training/figures.py: every TensorBoard picture carries its own axes,
titles and a fixed colour scale (issue 36)."""

import math

import numpy as np
import pytest

from selfattn.training import figures


def _images(fig):
  return [im for ax in fig.axes for im in ax.get_images()]


def test_attention_figure_labels_each_head_on_one_fixed_scale():
  weights = np.full((3, 4, 5), 0.2)
  fig = figures.attention_figure(weights, 'rope on sort: layer 0')
  heads = [ax for ax in fig.axes if ax.get_images()]
  assert [ax.get_title() for ax in heads] == ['head 0', 'head 1', 'head 2']
  assert all(ax.get_xlabel() == 'key position' for ax in heads)
  assert heads[0].get_ylabel() == 'query position'
  assert fig.get_suptitle() == 'rope on sort: layer 0'
  # [0, 1] whatever the weights: the same colour means the same weight in
  # every head, layer and step.
  for image in _images(fig):
    assert image.get_clim() == (0.0, 1.0)
  colorbar = [ax for ax in fig.axes if ax.get_ylabel() == 'attention weight']
  assert len(colorbar) == 1
  rgb = figures.render(fig)
  assert rgb.dtype == np.uint8 and rgb.ndim == 3 and rgb.shape[2] == 3


@pytest.mark.parametrize('position', sorted(figures.TABLE_AXES))
def test_table_colour_scale_is_symmetric_and_independent_of_the_values(
    position):
  """Min-max scaling drew a near-zero PoPE table as strong structure; the
  scale is the encoding's own, centred on zero, whatever the table holds."""
  info = figures.TABLE_AXES[position]
  for scale in (1e-3, 10.0):
    table = scale * np.linspace(-1, 1, 6 * 4).reshape(6, 4)
    fig = figures.table_figure(table, position, {'shared_heads': True}, 2,
                               'title')
    lows_highs = {image.get_clim() for image in _images(fig)}
    assert lows_highs == {(-info.limit, info.limit)}
  panels = [ax for ax in fig.axes if ax.get_images()]
  assert panels[0].get_ylabel() == info.rows
  assert all(ax.get_xlabel() == info.columns for ax in panels)
  assert info.what in fig.get_suptitle()


def test_pope_table_is_scaled_to_its_bounds_and_others_to_their_init():
  assert figures.TABLE_AXES['pope'].limit == pytest.approx(2 * math.pi)
  assert figures.TABLE_AXES['sinusoidal'].limit == 1.0
  assert figures.TABLE_AXES['shaw'].limit == figures.LEARNED_TABLE_LIMIT


def test_offset_tables_are_drawn_per_head_with_offsets_centred_on_zero():
  """huang keeps one (2M-1, D) table per head, stacked in picture(): one
  panel per head, rows labelled -(M-1)..M-1, not one strip 2H(M-1) tall."""
  rows, dim, heads = 7, 3, 2
  table = np.zeros((heads * rows, dim))
  fig = figures.table_figure(table, 'huang', {'shared_heads': False}, heads,
                             'huang on reverse')
  panels = [ax for ax in fig.axes if ax.get_images()]
  assert [ax.get_title() for ax in panels] == ['head 0', 'head 1']
  bottom, top = panels[0].get_ylim()
  assert (top, bottom) == (-3.5, 3.5)          # offset -3 on top, +3 below
  width, height = fig.get_size_inches()
  assert height < width                         # not a tall strip
  shared = figures.table_figure(np.zeros((rows, dim)), 'shaw',
                                {'shared_heads': True}, heads, 'shaw')
  assert len([ax for ax in shared.axes if ax.get_images()]) == 1


def test_every_encoding_with_a_picture_has_table_axes():
  """A new encoding with a picture() must say what its rows and columns are."""
  from flax import nnx
  import jax.numpy as jnp
  from selfattn.nn import positions
  for name, kind in positions.POSITIONS.items():
    shared = dict(max_len=8, param_dtype=jnp.float32, rngs=nnx.Rngs(0),
                  **kind.options)
    if kind.relative:
      encoding = kind.build(num_heads=2, head_dim=4, **shared)
    else:
      encoding = kind.build(num_hiddens=8, dropout=0.0, **shared)
    if encoding.picture() is not None:
      assert name in figures.TABLE_AXES, name


def test_an_encoding_without_table_axes_is_drawn_with_plain_ones():
  """An encoding a researcher registered, with a picture() and no
  TABLE_AXES entry: the first evaluation's figure raised KeyError after the
  whole training, and the run ended without a summary."""
  fig = figures.table_figure(np.ones((3, 4)), 'kerple', {}, 2, 'kerple on sort')
  ax = fig.axes[0]
  assert (ax.get_xlabel(), ax.get_ylabel()) == ('column', 'row')
  assert fig._suptitle.get_text() == 'kerple table of kerple on sort'


def test_pitch_names():
  assert [figures.pitch_name(p) for p in (21, 60, 61, 69, 108)] == [
      'A0', 'C4', 'C#4', 'A4', 'C8']


def test_piano_roll_names_pitches_bars_prompt_and_voices():
  notes = [(0, 72, 0, 8), (1, 67, 0, 32), (2, 60, 16, 48), (3, 48, 0, 48)]
  colours = np.array([[230, 60, 60], [60, 170, 60], [60, 110, 230],
                      [230, 160, 30]], np.uint8)
  fig = figures.piano_roll_figure(notes, 48, 16, colours, 'shaw, seed 0')
  ax = fig.axes[0]
  assert ax.get_title() == 'shaw, seed 0'
  assert {'C3', 'C4', 'C5'} <= {t.get_text() for t in ax.get_yticklabels()}
  assert [t.get_text() for t in ax.get_xticklabels()] == ['1', '2', '3', '4']
  assert 'bar' in ax.get_xlabel() and ax.get_ylabel() == 'pitch'
  prompt = [line for line in ax.get_lines()
            if tuple(line.get_xdata()) == (16, 16)]
  assert len(prompt) == 1
  legend = ax.get_legend()
  assert [t.get_text() for t in legend.get_texts()] == list(figures.VOICES)

"""Matplotlib figures for TensorBoard's Images tab that read without help text:
attention maps, positional tables and piano rolls, each with axes, tick
labels, a title and (for colour-coded values) a colour bar.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas, never
through pyplot: no global backend or figure registry is touched, so training
in a process that also plots (the study drivers) is unaffected, and nothing
needs a display. `render` turns a figure into the (H, W, 3) uint8 array that
summaries.Writer.image takes.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

if TYPE_CHECKING:
  from matplotlib.figure import Figure

# Matplotlib is imported where a figure is drawn, not with this module:
# training imports it, and Matplotlib was 0.6 s of the 2.5 s that
# `python -m selfattn.main` took to start, before a config error could be
# reported, and in runs that draw no figures (config.eval.figures=False).

DPI = 100
# Attention rows sum to 1, so [0, 1] is the one scale that is the same for
# every head, layer, step and run. A square-root norm keeps a head that
# spreads its weight (1/L per key) visible beside one that is one-hot.
ATTENTION_NORM_GAMMA = 0.5
TABLE_CMAP = 'RdBu_r'      # diverging: zero is white, sign is hue
# Learned tables start N(0, 0.5^2) (relative) or N(0, 1/2) (learned absolute;
# positions/offsets.py, absolute.py): +-2 covers them with room to grow, and
# values beyond saturate (the colour bar's arrows say so).
LEARNED_TABLE_LIMIT = 2.0


def render(fig: Figure) -> np.ndarray:
  """The figure drawn by Agg -> (H, W, 3) uint8 RGB."""
  from matplotlib.backends.backend_agg import FigureCanvasAgg
  canvas = FigureCanvasAgg(fig)
  canvas.draw()
  return np.asarray(canvas.buffer_rgba())[..., :3].copy()


def _position_ticks(n: int, most: int = 9) -> np.ndarray:
  """At most `most` integer tick positions in [0, n), always including 0."""
  step = max(1, math.ceil(n / most))
  return np.arange(0, n, step)


# ----------------------------------------------------------------- attention

def attention_figure(weights_HxQxK: np.ndarray, title: str) -> Figure:
  """One panel per head (query rows, key columns, position 0 top left) on a
  fixed [0, 1] scale with one colour bar. weights: (H, Lq, Lk)."""
  weights = np.asarray(weights_HxQxK, np.float64)
  heads, lq, lk = weights.shape
  panel = min(2.4, 16 / heads)     # inches a head; 8 heads stay 1700 px wide
  from matplotlib import colors
  from matplotlib.figure import Figure
  fig = Figure(figsize=(0.6 + panel * heads + 0.9, panel + 1.0), dpi=DPI,
               layout='constrained')
  axes = fig.subplots(1, heads, squeeze=False)[0]
  norm = colors.PowerNorm(ATTENTION_NORM_GAMMA, vmin=0.0, vmax=1.0)
  images = []
  for h, ax in enumerate(axes):
    images.append(ax.imshow(weights[h], cmap='viridis', norm=norm,
                            interpolation='nearest', aspect='equal'))
    ax.set_title(f'head {h}')
    ax.set_xticks(_position_ticks(lk))
    ax.set_yticks(_position_ticks(lq))
    ax.set_xlabel('key position')
    if h == 0:
      ax.set_ylabel('query position')
  # One norm for every panel: any panel's image stands for all in the bar.
  cbar = fig.colorbar(images[0], ax=list(axes), shrink=0.9)
  cbar.set_label('attention weight')
  fig.suptitle(title, fontsize=10)
  return fig


def alignment_figure(weights_TxS: np.ndarray, rows: Sequence[str],
                     columns: Sequence[str], title: str) -> Figure:
  """Translation's cross-attention, the alignment picture d2l shows: rows
  the decoder's input pieces (queries), columns the source pieces (keys),
  on a fixed [0, 1] scale with a colour bar. weights: (T, S)."""
  weights = np.asarray(weights_TxS, np.float64)
  t, s = weights.shape
  from matplotlib.figure import Figure
  fig = Figure(figsize=(2.0 + 0.26 * s, 1.6 + 0.24 * t), dpi=DPI,
               layout='constrained')
  ax = fig.subplots()
  image = ax.imshow(weights, cmap='viridis', vmin=0.0, vmax=1.0,
                    interpolation='nearest', aspect='auto')
  ax.set_xticks(range(s), list(columns), rotation=90, fontsize=7)
  ax.set_yticks(range(t), list(rows), fontsize=7)
  ax.set_xlabel('source piece (key)')
  ax.set_ylabel('decoder input piece (query)')
  fig.colorbar(image, ax=ax, shrink=0.9).set_label('attention weight')
  fig.suptitle(title, fontsize=9)
  return fig


# ------------------------------------------------------------ position table

@dataclasses.dataclass(frozen=True)
class TableAxes:
  """What an encoding's picture() holds: its rows and columns, and whether
  its rows are offsets (then labelled -k..k) and stack one block per head."""
  what: str                  # the table's name in the title
  rows: str
  columns: str
  offsets: bool = False      # rows are offsets centred on 0
  heads_in_rows: bool = False  # (H * rows, D): one panel per head
  heads_in_columns: bool = False  # (rows, H * D): one panel per head
  limit: float = LEARNED_TABLE_LIMIT  # the colour scale is [-limit, limit]
  bounded: bool = False      # values never leave [-limit, limit]


# Per encoding (positions/*.py, picture()). heads_in_rows applies only when
# the encoding keeps one table per head (its shared_heads option is False).
# An encoding with a picture() and no entry here is drawn with plain axes.
TABLE_AXES: dict[str, TableAxes] = {
    'sinusoidal': TableAxes('P (fixed)', 'position', 'feature', limit=1.0,
                            bounded=True),
    'learned': TableAxes('learned P', 'position', 'feature'),
    'shaw': TableAxes('key table a^K', 'offset (key - query), clipped',
                      'feature', offsets=True, heads_in_rows=True),
    'huang': TableAxes('table E', 'offset (key - query)', 'feature',
                       offsets=True, heads_in_rows=True),
    'xl': TableAxes('projected R', 'offset (key - query)', 'feature',
                    offsets=True, heads_in_columns=True),
    't5': TableAxes('bias per bucket', 'distance bucket', 'head'),
    # delta lies in [-2 pi, 0] (a bounded parameter); +-2 pi keeps 0 white,
    # so a table still near its zero start looks empty, as it is.
    'pope': TableAxes('phase bias delta (radians)', 'head',
                      'frequency c (theta_c = base^(-c/D))',
                      limit=2 * math.pi, bounded=True),
}


def _table_panels(table: np.ndarray, axes: TableAxes, num_heads: int,
                  shared_heads: bool) -> list[tuple[str | None, np.ndarray]]:
  """The table split into (panel title, 2-D block) per head where the
  encoding stacks heads, else the whole table."""
  if axes.heads_in_rows and not shared_heads and num_heads > 1:
    return [(f'head {h}', block)
            for h, block in enumerate(np.split(table, num_heads, axis=0))]
  if axes.heads_in_columns and num_heads > 1:
    return [(f'head {h}', block)
            for h, block in enumerate(np.split(table, num_heads, axis=1))]
  return [(None, table)]


def table_figure(table: np.ndarray, position: str, options: Mapping[str, Any],
                 num_heads: int, title: str) -> Figure:
  """An encoding's picture() (2-D, rows x columns as in TABLE_AXES) on the
  encoding's fixed symmetric scale [-limit, limit], one panel per head where
  the table stacks heads, labelled axes and a colour bar; titled
  '<what the table is> of <title>'."""
  # An encoding added without an entry gets plain axes: a figure must not
  # end a run at its first evaluation, after its training.
  axes_info = TABLE_AXES.get(position) or TableAxes(
      f'{position} table', 'row', 'column')
  table = np.asarray(table, np.float64)
  panels = _table_panels(table, axes_info, num_heads,
                         bool(options.get('shared_heads', True)))
  width = min(2.6 + 2.8 * len(panels), 14.0)
  from matplotlib import colors
  from matplotlib.figure import Figure
  fig = Figure(figsize=(width, 4.2), dpi=DPI, layout='constrained')
  axs = fig.subplots(1, len(panels), squeeze=False)[0]
  norm = colors.Normalize(-axes_info.limit, axes_info.limit)
  images = []
  for i, (ax, (name, block)) in enumerate(zip(axs, panels)):
    rows, cols = block.shape
    if axes_info.offsets:
      # Row r holds offset r - (rows - 1) / 2: -k at the top, +k at the bottom.
      half = (rows - 1) / 2
      extent = (-0.5, cols - 0.5, half + 0.5, -half - 0.5)
    else:
      extent = (-0.5, cols - 0.5, rows - 0.5, -0.5)
    # aspect='auto': a 2k+1 x D or 128 x 64 table fills a panel of fixed
    # size instead of a strip hundreds of pixels tall.
    images.append(ax.imshow(block, cmap=TABLE_CMAP, norm=norm, aspect='auto',
                            interpolation='nearest', extent=extent))
    if name:
      ax.set_title(name)
    ax.set_xlabel(axes_info.columns)
    if i == 0:
      ax.set_ylabel(axes_info.rows)
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.yaxis.get_major_locator().set_params(integer=True)
  cbar = fig.colorbar(images[0], ax=list(axs),
                      extend='neither' if axes_info.bounded else 'both')
  cbar.set_label(f'value (fixed scale +-{axes_info.limit:.3g})')
  fig.suptitle(f'{axes_info.what} of {title}', fontsize=10)
  return fig


# ---------------------------------------------------------------- piano roll

VOICES = ('soprano', 'alto', 'tenor', 'bass')
_PITCH_CLASSES = ('C', 'C#', 'D', 'D#', 'E', 'F', 'F#', 'G', 'G#', 'A', 'A#',
                  'B')


def pitch_name(midi: int) -> str:
  """MIDI pitch -> scientific pitch name: 60 -> 'C4', 69 -> 'A4'."""
  return f'{_PITCH_CLASSES[midi % 12]}{midi // 12 - 1}'


def piano_roll_figure(notes: Sequence[tuple[int, int, int, int]],
                      num_steps: int, prompt_steps: int,
                      voice_colours: np.ndarray, title: str,
                      steps_per_bar: int = 16) -> Figure:
  """Notes (voice, MIDI pitch, start step, end step exclusive; listening.notes)
  as bars on a pitch-by-time grid: pitch names on the y axis (every C), time
  in bars on the x axis, a line where the prompt ends, and a voice key.
  voice_colours: (voices, 3) uint8."""
  from matplotlib.figure import Figure
  from matplotlib.patches import Patch
  fig = Figure(figsize=(10, 4.2), dpi=DPI, layout='constrained')
  ax = fig.subplots()
  ax.set_axisbelow(True)       # grid lines behind the notes, not through them
  rgb = np.asarray(voice_colours, np.float64) / 255
  for voice, pitch, start, end in notes:
    ax.broken_barh([(start, end - start)], (pitch - 0.45, 0.9),
                   facecolors=rgb[voice], edgecolors='none')
  pitches = [p for _, p, _, _ in notes] or [60]
  low, high = min(pitches) - 2, max(pitches) + 2
  ax.set_ylim(low, high)
  ax.set_xlim(0, num_steps)
  c_pitches = [p for p in range(low, high + 1) if p % 12 == 0]
  ax.set_yticks(c_pitches, [pitch_name(p) for p in c_pitches])
  ax.set_yticks(range(low, high + 1), minor=True)
  ax.grid(axis='y', which='major', color='0.85', linewidth=0.8)
  bars = np.arange(0, num_steps + 1, steps_per_bar)
  ax.set_xticks(bars, [str(b // steps_per_bar + 1) for b in bars])
  ax.grid(axis='x', which='major', color='0.7', linewidth=0.8)
  ax.set_xlabel(f'bar (4/4, {steps_per_bar} sixteenths a bar)')
  ax.set_ylabel('pitch')
  ax.axvline(prompt_steps, color='black', linestyle='--', linewidth=1.2)
  ax.text(prompt_steps, high, ' prompt ends ', ha='right', va='top',
          fontsize=8)
  ax.legend(handles=[Patch(color=rgb[v], label=VOICES[v])
                     for v in range(len(rgb))],
            loc='upper left', bbox_to_anchor=(1.0, 1.0), title='voice')
  ax.set_title(title)
  return fig

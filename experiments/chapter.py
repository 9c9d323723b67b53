"""The chapter, reproduced and measured.

  python -m experiments.chapter --workdir=runs/chapter [--quick]

Figures of the sinusoidal table P (columns 6-9 against position, the heat
map), the binary representations of 0-7 beside the table's frequencies, the
relative-position rotation checked numerically, the multi-head shape
demonstration, and the chapter's CNN / RNN / self-attention comparison
measured rather than stated: wall time and FLOPs (XLA's cost analysis) against
sequence length at fixed width, and the maximum path length measured from
gradients (how many layers until output n depends on input 1, and how many
sequential operations lie on that path).
"""

import os
import statistics
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
from absl import app
from flax import nnx

import selfattn
from experiments import common
from experiments import skeleton
from selfattn.training.cli_checks import parse_flags

WIDTH, KERNEL = 64, 3


def figures_of_P(workdir):
  P = np.asarray(selfattn.SinusoidalEncoding(32, 0.0, max_len=60,
                                             rngs=nnx.Rngs(0)).P[0])
  fig, ax = plt.subplots(figsize=(6, 2.8))
  for col in range(6, 10):
    ax.plot(np.arange(60), P[:, col], label=f'Col {col}')
  ax.set_xlabel('Row (position)')
  ax.legend()
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, 'P_columns_6_to_9.png'), dpi=110)
  plt.close(fig)
  fig, ax = plt.subplots(figsize=(4, 5))
  im = ax.imshow(P, cmap='Blues', aspect='auto')
  ax.set_xlabel('Column (encoding dimension)')
  ax.set_ylabel('Row (position)')
  fig.colorbar(im, ax=ax)
  fig.tight_layout()
  fig.savefig(os.path.join(workdir, 'P_heatmap.png'), dpi=110)
  plt.close(fig)


def binary_beside_frequencies() -> str:
  d = 32
  freqs = [1 / 10000 ** (2 * j / d) for j in range(4)]
  rows = [[i, f'{i:>03b}'] for i in range(8)]
  table = common.markdown_table(['i', 'binary'], rows)
  return (f'{table}\n\nThe lowest bit flips every number, the next every two, '
          'the next every four: higher bits change more slowly. Likewise the '
          'columns of P oscillate at frequencies 1/10000^(2j/d) = '
          + ', '.join(f'{f:.3g}' for f in freqs) + ', ... for j = 0, 1, 2, 3 '
          '(d = 32), slower and slower across the row.')


def rotation_error() -> float:
  d, steps = 32, 60
  P = np.asarray(selfattn.sinusoidal_table(steps, d), np.float64)
  worst = 0.0
  for j in range(d // 2):
    w = 1 / 10000 ** (2 * j / d)
    for delta in range(1, steps):
      rot = np.array([[np.cos(delta * w), np.sin(delta * w)],
                      [-np.sin(delta * w), np.cos(delta * w)]])
      moved = P[:steps - delta, 2 * j:2 * j + 2] @ rot.T
      worst = max(worst, np.abs(moved - P[delta:, 2 * j:2 * j + 2]).max())
  return worst


def shape_demo() -> str:
  attn = selfattn.MultiHeadAttention(100, 5, 0.5, rngs=nnx.Rngs(0))
  X = jnp.ones((2, 4, 100))
  Y = jnp.ones((2, 6, 100))
  out, weights = selfattn.attention_weights(attn, X, Y, Y, jnp.array([3, 2]))
  return (f'MultiHeadAttention(num_hiddens=100, num_heads=5): X (2, 4, 100), '
          f'keys/values (2, 6, 100), valid_lens [3, 2] -> {tuple(out.shape)}; '
          f'attention weights {tuple(weights[0].shape)}.')


# --- The three layer types of the chapter's comparison, at width d. ---

def conv_layer(key):
  w = jax.random.normal(key, (KERNEL, WIDTH, WIDTH)) / np.sqrt(KERNEL * WIDTH)
  def apply(x):   # (n, d) -> (n, d), 'same' padding
    return jax.lax.conv_general_dilated(x[None], w, (1,), 'SAME',
                                        dimension_numbers=('NWC', 'WIO', 'NWC'))[0]
  return apply


def rnn_layer(key):
  k1, k2 = jax.random.split(key)
  W = jax.random.normal(k1, (WIDTH, WIDTH)) / np.sqrt(WIDTH)
  U = jax.random.normal(k2, (WIDTH, WIDTH)) / np.sqrt(WIDTH)
  def apply(x):
    def step(h, x_t):
      h = jnp.tanh(x_t @ W + h @ U)
      return h, h
    return jax.lax.scan(step, jnp.zeros(WIDTH), x)[1]
  return apply


def attention_layer(key):
  attn = selfattn.MultiHeadAttention(WIDTH, 4, rngs=nnx.Rngs(key))
  graphdef, state = nnx.split(attn)
  def apply(x):
    model = nnx.merge(graphdef, state)
    return model(x[None], x[None], x[None])[0]
  return apply


LAYERS = {'CNN (k=3)': conv_layer, 'RNN': rnn_layer, 'self-attention': attention_layer}


def cost_vs_length(lengths, repeats):
  rows = {name: [] for name in LAYERS}
  for n in lengths:
    x = jax.random.normal(jax.random.key(n), (n, WIDTH))
    for name, make in LAYERS.items():
      f = jax.jit(make(jax.random.key(0)))
      compiled = f.lower(x).compile()
      cost = compiled.cost_analysis()
      cost = cost[0] if isinstance(cost, list) else cost
      jax.block_until_ready(f(x))
      times = []
      for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(f(x))
        times.append(time.perf_counter() - start)
      flops = float(cost.get('flops', 0.0))
      if name == 'RNN':
        flops *= n    # XLA counts the scan's loop body once, not n times
      rows[name].append((n, statistics.median(times), flops))
  return rows


def path_lengths(lengths, max_layers):
  """Layers until output n-1 depends on input 0 (a jvp from input 0 through
  the stack), and the sequential operations on that path."""
  out = {name: [] for name in LAYERS}
  for n in lengths:
    x = jax.random.normal(jax.random.key(1), (n, WIDTH))
    tangent = jnp.zeros_like(x).at[0].set(1.0)
    for name, make in LAYERS.items():
      keys = jax.random.split(jax.random.key(2), max_layers)
      layers_needed = None
      primal, t = x, tangent
      for depth in range(1, max_layers + 1):
        primal, t = jax.jvp(make(keys[depth - 1]), (primal,), (t,))
        if float(jnp.abs(t[n - 1]).max()) > 0:
          layers_needed = depth
          break
      sequential = {'RNN': n - 1}.get(name, layers_needed)
      out[name].append((n, layers_needed, sequential))
  return out


def plot_costs(rows, path):
  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
  for name, values in rows.items():
    n = [v[0] for v in values]
    ax1.plot(n, [v[1] * 1e3 for v in values], marker='o', label=name)
    ax2.plot(n, [v[2] for v in values], marker='o', label=name)
  for ax, label in ((ax1, 'wall time (ms, forward)'), (ax2, 'FLOPs (XLA cost analysis)')):
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('sequence length n')
    ax.set_ylabel(label)
    ax.legend()
  fig.suptitle(f'One layer at width d={WIDTH}')
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def plot_paths(paths, path):
  fig, ax = plt.subplots(figsize=(6, 4))
  for name, values in paths.items():
    ax.plot([v[0] for v in values], [v[2] for v in values], marker='o', label=name)
  ax.set_xscale('log', base=2)
  ax.set_yscale('log', base=2)
  ax.set_xlabel('sequence length n')
  ax.set_ylabel('sequential operations from input 1 to output n')
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


# The report's title, the owner's mark on its workdir (skeleton.main_of).
TITLE = 'The chapter, reproduced'


def chapter(workdir: str, seeds: int, quick: bool) -> str:
  del seeds
  os.makedirs(workdir, exist_ok=True)
  figures_of_P(workdir)
  lengths = [16, 64, 256] if quick else [16, 32, 64, 128, 256, 512, 1024, 2048]
  costs = cost_vs_length(lengths, 3 if quick else 7)
  plot_costs(costs, os.path.join(workdir, 'cnn_rnn_attention_cost.png'))
  path_ns = [8, 16, 32] if quick else [8, 16, 32, 64, 128]
  paths = path_lengths(path_ns, max(path_ns))
  plot_paths(paths, os.path.join(workdir, 'path_length.png'))
  cost_rows = []
  for i, n in enumerate(lengths):
    cost_rows.append([n] + [f'{costs[name][i][1] * 1e3:.3g} ms / {costs[name][i][2]:.3g}'
                            for name in LAYERS])
  path_rows = [[n] + [f'{paths[name][i][1]} / {paths[name][i][2]}' for name in LAYERS]
               for i, n in enumerate(path_ns)]
  text = common.write_results(
      workdir, TITLE,
      [('The sinusoidal table P (encoding_dim=32, num_steps=60)',
        '![columns 6-9](P_columns_6_to_9.png) ![heat map](P_heatmap.png)'),
       ('Binary representations of 0-7', binary_beside_frequencies()),
       ('Relative positions: the rotation',
        f'For every offset delta in 1..59, position i and frequency pair j, '
        f'[[cos dw, sin dw], [-sin dw, cos dw]] maps (p_i,2j, p_i,2j+1) to '
        f'(p_i+d,2j, p_i+d,2j+1) with largest error {rotation_error():.2e} '
        f'(float32 table, float64 check).'),
       ('Multi-head attention shapes', shape_demo()),
       ('CNN, RNN and self-attention measured',
        f'One layer at width d={WIDTH} (forward, jitted, median wall time on '
        f'this machine / FLOPs from XLA\'s cost analysis, the RNN\'s loop body '
        f'counted n times):\n\n'
        + common.markdown_table(['n'] + list(LAYERS), cost_rows)
        + '\n\n![cost](cnn_rnn_attention_cost.png)\n\nMaximum path length, '
        'measured by pushing a tangent from input 1 through stacked layers '
        'until output n moves (layers needed / sequential operations on the '
        'path; the RNN needs one layer but n-1 recurrent steps):\n\n'
        + common.markdown_table(['n'] + list(LAYERS), path_rows)
        + '\n\n![path length](path_length.png)')],
      data={'costs': costs, 'paths': paths, 'rotation_error': rotation_error()})
  print(text)
  return text


if __name__ == '__main__':
  app.run(skeleton.main_of(chapter, TITLE), flags_parser=parse_flags)

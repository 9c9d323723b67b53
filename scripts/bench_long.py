"""Long sequences and deep stacks: the chunked path against plain attention,
and compilation time against depth, for scripts/bench.py.

Memory here is XLA's own accounting of a compiled function (memory_analysis),
so lengths far beyond what this machine could run are still measured:
  temporary   the working set beyond inputs and outputs (temp_size_in_bytes);
  total       temporary + arguments + outputs, what one step needs at least.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
from flax import nnx

import selfattn
from measure import compare_times, grad_fn, temp_bytes

WIDTH, HEADS = 256, 8
# Encodings whose chunked memory the issue targets, and the others.
ENCODINGS = ('none', 'rope', 'alibi', 't5', 'shaw', 'huang', 'xl')


def relative_for(name: str, max_len: int):
  if name == 'none':
    return None
  kind, options = selfattn.nn.positions.get_position(name)
  return kind.build(num_heads=HEADS, head_dim=WIDTH // HEADS, max_len=max_len,
                    param_dtype=jnp.float32, rngs=nnx.Rngs(0), **options)


def attention_step(name: str, impl: str, length: int):
  """jit(grad) of one width-256, 8-head attention layer with this encoding,
  batch 1, and its arguments."""
  module = selfattn.MultiHeadAttention(
      WIDTH, HEADS, relative=relative_for(name, max_len=min(length, 1024)),
      attention_impl=impl, rngs=nnx.Rngs(0))
  fn, params = grad_fn(module, lambda m, x: m(x))
  x = jax.random.normal(jax.random.key(0), (1, length, WIDTH), jnp.float32)
  return fn, (params, x)


def chunked_memory(lengths, encodings=ENCODINGS) -> dict:
  """Temporary MB of forward+backward, plain and chunked, per encoding and
  length (compile only)."""
  out = {}
  for name in encodings:
    for length in lengths:
      row = {}
      for impl in ('plain', 'chunked'):
        fn, args = attention_step(name, impl, length)
        row[f'{impl}_temp_mb'] = temp_bytes(fn, *args) / 2 ** 20
      row['ratio'] = row['chunked_temp_mb'] / row['plain_temp_mb']
      out.setdefault(name, {})[str(length)] = row
      print(f'  memory {name:6s} L={length:6d}: plain '
            f'{row["plain_temp_mb"]:9.1f} MB, chunked '
            f'{row["chunked_temp_mb"]:8.1f} MB, ratio {row["ratio"]:.3f}',
            flush=True)
  return out


def chunked_time(length: int, encodings, repeats: int) -> dict:
  """Chunked over plain time of forward+backward at one length, batch 1,
  measured in alternation."""
  out = {}
  for name in encodings:
    fns, args = {}, {}
    for impl in ('plain', 'chunked'):
      fns[impl], args[impl] = attention_step(name, impl, length)
    t = compare_times(fns, args, repeats, warmup=1)
    out[name] = {'plain_ms': 1e3 * t['plain'], 'chunked_ms': 1e3 * t['chunked'],
                 'ratio': t['chunked'] / t['plain']}
    print(f'  time   {name:6s} L={length:6d}: plain {1e3 * t["plain"]:9.1f} ms,'
          f' chunked {1e3 * t["chunked"]:9.1f} ms, ratio '
          f'{out[name]["ratio"]:.2f}', flush=True)
  return out


def train_step_bytes(impl: str, length: int, position: str = 'shaw') -> int:
  """Temporary + argument + output bytes of one training step (forward,
  backward, SGD update) of a 4-layer, width-256, 8-head encoder, batch 1."""
  model = selfattn.TransformerEncoder(
      16, WIDTH, 4 * WIDTH, HEADS, 4, position=position, max_len=length,
      attention_impl=impl, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def step(params, tokens):
    def loss(params):
      y = nnx.merge(graphdef, params, rest, copy=True)(tokens)
      return jnp.mean(jnp.square(y))
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads)

  tokens = jax.ShapeDtypeStruct((1, length), jnp.int32)
  shapes = jax.tree.map(lambda p: jax.ShapeDtypeStruct(p.shape, p.dtype), params)
  stats = step.lower(shapes, tokens).compile().memory_analysis()
  return (stats.temp_size_in_bytes + stats.argument_size_in_bytes
          + stats.output_size_in_bytes)


def max_train_length(budget_gib: float = 16.0, longest: int = 65536) -> dict:
  """The longest power of two (from 1024) whose training step fits the
  budget by XLA's accounting, for plain and chunked attention."""
  out = {}
  for impl in ('plain', 'chunked'):
    best, length, sizes = None, 1024, {}
    while length <= longest:
      size = train_step_bytes(impl, length)
      sizes[str(length)] = size / 2 ** 30
      print(f'  train step {impl:7s} L={length:6d}: {size / 2 ** 30:7.2f} GiB',
            flush=True)
      if size > budget_gib * 2 ** 30:
        break
      best, length = length, length * 2
    out[impl] = {'max_length': best, 'gib_by_length': sizes}
  return out


def compile_seconds(depths, position: str = 'shaw') -> dict:
  """First-step time (compilation) of configs/default.py's train step at
  each depth, loop vs scanned layers."""
  import compile_time
  out = {}
  for depth in depths:
    for scan in (False, True):
      key = f'{"scan" if scan else "loop"}_{depth}'
      out[key] = compile_time.first_step_seconds(depth, scan, position)
      print(f'  compile depth {depth:3d} {"scan" if scan else "loop"}: '
            f'{out[key]:.1f} s', flush=True)
  return out


def plot(memory: dict, times: dict, path: str) -> None:
  """Log-log temporary memory (left) and time (right) against length, plain
  dashed and chunked solid, one colour per encoding."""
  import matplotlib
  matplotlib.use('Agg')
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
  colours = dict(zip(ENCODINGS, plt.get_cmap('tab10').colors))
  for ax, results, unit in ((left, memory, 'temp_mb'), (right, times, 'ms')):
    for name, rows in results.items():
      lengths = sorted(map(int, rows))
      for impl, style in (('plain', '--'), ('chunked', '-')):
        ax.plot(lengths, [rows[str(n)][f'{impl}_{unit}'] for n in lengths],
                style, color=colours[name], marker='o', ms=3,
                label=f'{name} {impl}')
  for ax, what in ((left, 'temporary memory, MB'), (right, 'time, ms')):
    ax.set_xscale('log', base=2)
    ax.set_yscale('log')
    ax.set_xlabel('sequence length (batch 1)')
    ax.set_ylabel(what)
    ax.grid(True, which='both', alpha=0.3)
  left.set_title('forward+backward, one layer, width 256, 8 heads')
  right.set_title('same, time (dashed plain, solid chunked)')
  left.legend(fontsize=6, ncol=2)
  right.legend(fontsize=6, ncol=2)
  fig.tight_layout()
  os.makedirs(os.path.dirname(path) or '.', exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)

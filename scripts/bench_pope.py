"""PoPE against RoPE: one attention layer's forward+backward, time and memory.

  python scripts/bench_pope.py [--quick]

Both run through selfattn.MultiHeadAttention (width 256, 8 heads, head
width d = 32) on the plain path, measured in alternation in the same run.
PoPE turns every query and key into 2d real features (magnitudes and
phases over d frequencies), so its q.k^T contraction is twice RoPE's: the
paper counts 2 L^2 d extra FLOPs per head and layer for that product. The
table prints that count (from the shapes) beside the measured time and the
compiled temporary memory (XLA's memory_analysis) of both; scripts/bench.py
runs the same section.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from flax import nnx  # noqa: E402

import selfattn  # noqa: E402
from measure import compare_times, grad_fn, temp_bytes  # noqa: E402
from selfattn.nn.positions import PolarEncoding, RotaryEncoding  # noqa: E402

WIDTH, HEADS = 256, 8


def _attention(relative):
  return selfattn.MultiHeadAttention(WIDTH, HEADS, relative=relative,
                                     rngs=nnx.Rngs(0))


def _call(m, x):
  return m(x)


def qk_flops(batch: int, length: int, features: int) -> float:
  """Multiply-adds x 2 of q.k^T over every head: 2 B H L^2 features."""
  return 2.0 * batch * HEADS * length * length * features


def bench_pope(lengths, tokens: int, repeats: int) -> dict:
  """{length: {...}}: PoPE over RoPE, forward+backward of one layer."""
  head_dim = WIDTH // HEADS
  out = {}
  for length in lengths:
    batch = max(1, tokens // length)
    x = jax.random.normal(jax.random.key(0), (batch, length, WIDTH))
    fns, args, memory = {}, {}, {}
    for name, relative in (('rope', RotaryEncoding(head_dim)),
                           ('pope', PolarEncoding(HEADS, head_dim,
                                                  rngs=nnx.Rngs(0)))):
      fn, params = grad_fn(_attention(relative), _call)
      fns[name], args[name] = fn, (params, x)
      memory[name] = temp_bytes(fn, params, x)
    t = compare_times(fns, args, repeats)
    out[length] = {
        'batch': batch,
        'rope_ms': 1e3 * t['rope'], 'pope_ms': 1e3 * t['pope'],
        'pope_time_ratio': t['pope'] / t['rope'],
        'pope_memory_ratio': memory['pope'] / memory['rope'],
        # Forward q.k^T only; the backward pass repeats it twice.
        'extra_qk_gflop': (qk_flops(batch, length, 2 * head_dim)
                           - qk_flops(batch, length, head_dim)) / 1e9,
    }
  return out


def markdown(result: dict) -> str:
  rows = ['| length | batch | rope ms | pope ms | pope / rope time | '
          'pope / rope temp memory | extra q.k^T GFLOP (forward) |',
          '|---:|---:|---:|---:|---:|---:|---:|']
  for n, r in result.items():
    rows.append(f'| {n} | {r["batch"]} | {r["rope_ms"]:.2f} | '
                f'{r["pope_ms"]:.2f} | {r["pope_time_ratio"]:.2f} | '
                f'{r["pope_memory_ratio"]:.2f} | {r["extra_qk_gflop"]:.3f} |')
  return '\n'.join(rows)


def main() -> None:
  quick = '--quick' in sys.argv
  lengths = [128] if quick else [128, 512, 2048]
  result = bench_pope(lengths, 1024 if quick else 4096, 3 if quick else 7)
  print(f'# PoPE vs RoPE, one attention layer forward+backward, width '
        f'{WIDTH}, {HEADS} heads, on {jax.devices()[0].device_kind} '
        f'({jax.default_backend()}), {os.cpu_count()} CPU cores\n')
  print(markdown(result))


if __name__ == '__main__':
  main()

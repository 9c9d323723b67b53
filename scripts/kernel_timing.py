"""What the kernel tuners share (scripts/tune_hopper.py, tune_triton.py): the
flags of the problem's shape and the run's limits, an encoding's tables at
its defaults, a median timing, cuDNN's rows as the peer. Each tuner defines
its own --out, --smoke and --kind."""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from absl import flags
from flax import nnx

from selfattn.nn import positions

LENGTH = flags.DEFINE_integer('length', 8192, 'L (queries = keys).')
BATCH = flags.DEFINE_integer('batch', 2, 'B.')
HEADS = flags.DEFINE_integer('heads', 16, 'H.')
HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'D.')
REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs per row.')
BUDGET = flags.DEFINE_float('time_budget', 0.0, 'Seconds after which no '
                            'new row starts (0: none).')
CAUSAL = flags.DEFINE_list('causal', 'false,true', 'Masks to run.')


def encoding(kind: str, heads: int, head_dim: int, seed: int = 0
             ) -> tuple[dict, object]:
  """(HopperConfig fields, table) of `kind`'s position module at its
  defaults, randomly initialised: ALiBi's (H,) slopes, T5's (num_buckets,
  H) biases, Shaw's per-head (a^K, a^V), each (H, 2k + 1, D)."""
  rngs = nnx.Rngs(seed)
  if kind == 'alibi':
    return {}, jnp.asarray(positions.alibi_slopes(heads), jnp.float32)
  if kind == 't5':
    t5 = positions.T5RelativeBias(heads, rngs=rngs)
    return (dict(num_buckets=t5.num_buckets, max_distance=t5.max_distance),
            t5.bias[...])
  if kind == 'shaw':
    shaw = positions.ShawRelative(heads, head_dim, shared_heads=False,
                                  rngs=rngs)
    return (dict(clip=shaw.clip_distance, shaw_values=True),
            (shaw.a_K[...], shaw.a_V[...]))
  return {}, None


def module(kind: str, heads: int, head_dim: int, seed: int = 0):
  """`kind`'s position module at its defaults (None for 'none'), as
  pallas_attention takes it: ALiBi, T5's buckets, Shaw per head with keys
  and values."""
  rngs = nnx.Rngs(seed)
  return {'none': lambda: None,
          'alibi': lambda: positions.ALiBi(heads),
          't5': lambda: positions.T5RelativeBias(heads, rngs=rngs),
          'shaw': lambda: positions.ShawRelative(heads, head_dim,
                                                 shared_heads=False,
                                                 rngs=rngs)}[kind]()


def median_ms(fn, args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))
  samples = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    samples.append(time.perf_counter() - start)
  return 1e3 * statistics.median(samples)


def cudnn_rows(q, k, v, g, causal: bool, repeats: int) -> list[dict]:
  """cuDNN's forward and forward + backward in (B, L, H, D) layout."""
  blhd = [x.transpose(0, 2, 1, 3) for x in (q, k, v, g)]

  def attend(q, k, v):
    return jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                        implementation='cudnn')

  def train(q, k, v, g):
    out, vjp = jax.vjp(attend, q, k, v)
    return out, vjp(g)

  rows = []
  for name, fn, args in (('forward', attend, blhd[:3]),
                         ('forward+backward', train, blhd)):
    try:
      compiled = jax.jit(fn).lower(*args).compile()
      rows.append({'pass': name, 'kernel': 'cudnn',
                   'ms': median_ms(compiled, args, repeats)})
    except Exception as e:  # noqa: BLE001  (a row, not a stop)
      rows.append({'pass': name, 'kernel': 'cudnn',
                   'status': f'{type(e).__name__}: {str(e)[:200]}'})
  return rows


def causal_settings() -> list[bool]:
  return [c.strip().lower() == 'true' for c in CAUSAL.value]


def cudnn_peer(result: dict, q, k, v, g, causal: bool, repeats: int,
               smoke: bool) -> dict:
  """{pass: ms} of cuDNN's rows (none in smoke mode), also appended to
  result['rows']."""
  base = {} if smoke else {
      r['pass']: r.get('ms') for r in cudnn_rows(q, k, v, g, causal, repeats)}
  for name, ms in base.items():
    result['rows'].append({'causal': causal, 'pass': name, 'kernel': 'cudnn',
                           'ms': ms})
  return base


def write_outputs(out_dir: str | None, stem: str, kind: str, result: dict,
                  markdown: str) -> None:
  """STEM.json and STEM.md (STEM_KIND.* for a kind other than none) under
  out_dir, if one is given; rewritten after every row."""
  if not out_dir:
    return
  os.makedirs(out_dir, exist_ok=True)
  stem += '' if kind == 'none' else f'_{kind}'
  with open(os.path.join(out_dir, f'{stem}.json'), 'w') as f:
    json.dump(result, f, indent=2)
  with open(os.path.join(out_dir, f'{stem}.md'), 'w') as f:
    f.write(markdown)

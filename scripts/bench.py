"""Benchmarks: selfattn against its peers, measured in the same run.

  python scripts/bench.py [--quick | --smoke] [--json OUT.json]

Prints a markdown table per section and, with --json, the keys that
BENCHMARKS.md tracks. All timings are medians over repeats after warm-up,
with peers measured in alternation so machine drift hits both alike.
Memory is XLA's compiled temporary-buffer size (memory_analysis), the working
set a function needs beyond its inputs and outputs.

Sections:
  roofline   matmul_gflops, the machine's float32 matmul rate through JAX.
  mha        selfattn.MultiHeadAttention vs flax.nnx.MultiHeadAttention,
             forward+backward (grads w.r.t. parameters and input).
  relative   Shaw (k=16, keys and values) and a naive Shaw that builds the
             (L, L, d_head) tensors, over plain attention: time and memory;
             Huang (skew) and naive Huang memory; every encoding's time ratio.
  pope       PoPE vs RoPE: time, temporary memory and the extra q.k^T FLOPs
             of one attention layer (scripts/bench_pope.py).
  train      configs/default.py (tiny.py with --quick or --smoke): loop vs
             compiled step on pre-generated
             batches (overhead), tokens/s, bfloat16 vs float32, peak RSS.
  chunked    attention_impl='chunked' vs 'plain': temporary memory and time of
             one layer's forward+backward per encoding and length (a plot
             with --plot=PATH; committed as
             experiments/results/bench_chunked.png), the longest trainable length
             of a 4-layer shaw encoder within 16 GiB, compile time vs depth
             with and without scan_layers (scripts/bench_long.py); causal
             over bidirectional chunked attention (skipped key blocks).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from flax import nnx  # noqa: E402

import selfattn  # noqa: E402
import bench_long  # noqa: E402
import bench_pope  # noqa: E402
from measure import (compare_times, grad_fn, matmul_gflops, step_rates,  # noqa: E402
                     temp_bytes)
from selfattn.nn.positions import RelativePosition  # noqa: E402
from selfattn.nn.positions import relative_offsets  # noqa: E402

_QUICK = flags.DEFINE_bool('quick', False, 'Small shapes, few repeats (65 s on the 2-core CPU).')
_SMOKE = flags.DEFINE_bool(
    'smoke', False, "The test's level (tests/experiments/test_bench.py): "
    "--quick's sections at their smallest (one repeat, 20 training steps, "
    "compile time at depth 1, chunked timings at 256-512), to check that "
    "every key is written. Its numbers are not measurements.")
_JSON = flags.DEFINE_string('json', None, 'Write the results as JSON here.')
_PLOT = flags.DEFINE_string('plot', None, 'Write the memory/time vs length '
                            'plot of the chunked section here (PNG).')

WIDTH, HEADS = 256, 8


# --------------------------------------------------------------------------
# Attention forward+backward.
# --------------------------------------------------------------------------

def mha_flops(batch: int, length: int, width: int) -> float:
  """Forward+backward FLOPs: 4 projections and 2 attention matmuls, x3 for
  the backward pass (gradients w.r.t. inputs and weights)."""
  forward = 4 * 2 * batch * length * width ** 2 + 2 * 2 * batch * length ** 2 * width
  return 3 * forward


def ours(relative=None, dtype=None):
  return selfattn.MultiHeadAttention(WIDTH, HEADS, 0.0, relative=relative,
                                     dtype=dtype, rngs=nnx.Rngs(0))


def self_call(m, x):
  return m(x, x, x)


def flax_call(m, x):
  return m(x, x, x, deterministic=True)


class NaiveShaw(RelativePosition):
  """Shaw's equations as written: gathers a^K and a^V into (Lq, Lk, d_head)
  tensors, or (H, Lq, Lk, d_head) with one table per head."""

  def __init__(self, shaw: selfattn.ShawRelative):
    self.shaw = shaw

  def _expand(self, table, lq, lk):
    k = self.shaw.clip_distance
    return table[..., jnp.clip(relative_offsets(lq, lk), -k, k) + k, :]

  def _spec(self, spec):
    return spec if self.shaw.shared_heads else spec.replace('qkd', 'hqkd')

  def logits(self, q, k, q_pos=None, k_pos=None):
    a = self._expand(self.shaw.a_K[...], q.shape[2], k.shape[2]).astype(q.dtype)
    return jnp.einsum(self._spec('bhqd,qkd->bhqk'), q, a)

  def values(self, weights, v, q_pos=None, k_pos=None):
    if self.shaw.a_V is None:
      return None
    a = self._expand(self.shaw.a_V[...], weights.shape[2], weights.shape[3])
    return jnp.einsum(self._spec('bhqk,qkd->bhqd'), weights.astype(v.dtype),
                      a.astype(v.dtype))


def batch_for(length: int, tokens: int) -> int:
  return max(1, tokens // length)


def bench_mha(lengths, tokens, repeats, roofline):
  rows = {}
  for length in lengths:
    b = 32 if length == 128 else batch_for(length, tokens)
    x = jax.random.normal(jax.random.key(2), (b, length, WIDTH), jnp.float32)
    mine, p_mine = grad_fn(ours(), self_call)
    theirs, p_theirs = grad_fn(
        nnx.MultiHeadAttention(HEADS, WIDTH, WIDTH, WIDTH, use_bias=False,
                               decode=False, rngs=nnx.Rngs(0)), flax_call)
    t = compare_times({'selfattn': mine, 'flax': theirs},
                      {'selfattn': (p_mine, x), 'flax': (p_theirs, x)}, repeats)
    flops = mha_flops(b, length, WIDTH)
    rows[length] = {'batch': b, 'selfattn_ms': 1e3 * t['selfattn'],
                    'flax_ms': 1e3 * t['flax'],
                    'speedup_vs_flax': t['flax'] / t['selfattn'],
                    'fraction_of_roofline': flops / t['selfattn'] / 1e9 / roofline}
  return rows


def mha_breakdown(repeats, batch=32, length=128):
  """Where forward+backward time goes at length 128: the four projections
  alone vs the attention core alone (scores, softmax, weighted sum)."""
  k1, k2 = jax.random.split(jax.random.key(6))
  x = jax.random.normal(k1, (batch, length, WIDTH))
  ws = jax.random.normal(k2, (4, WIDTH, WIDTH)) / 16
  qkv = jax.random.normal(k2, (3, batch, HEADS, length, WIDTH // HEADS))

  def projections(ws, x):
    return sum(jnp.mean(jnp.square(x @ w)) for w in ws)

  def core(qkv):
    out, _ = selfattn.dot_product_attention(*qkv)
    return jnp.mean(jnp.square(out))

  fns = {'projections': jax.jit(jax.grad(projections, argnums=(0, 1))),
         'core': jax.jit(jax.grad(core))}
  t = compare_times(fns, {'projections': (ws, x), 'core': (qkv,)}, repeats)
  proj_flops = 3 * 4 * 2 * batch * length * WIDTH ** 2
  core_flops = 3 * 2 * 2 * batch * length ** 2 * WIDTH
  return {'projections_ms': 1e3 * t['projections'], 'core_ms': 1e3 * t['core'],
          'projections_gflops': proj_flops / t['projections'] / 1e9,
          'core_gflops': core_flops / t['core'] / 1e9}


def bench_relative(lengths, tokens, repeats, clip=16):
  rows = {}
  for length in lengths:
    b = 32 if length == 128 else batch_for(length, tokens)
    x = jax.random.normal(jax.random.key(3), (b, length, WIDTH), jnp.float32)
    shaw = selfattn.ShawRelative(HEADS, WIDTH // HEADS, clip_distance=clip,
                                 rngs=nnx.Rngs(0))
    fns, args, memory = {}, {}, {}
    for name, relative in [('plain', None), ('shaw', shaw),
                           ('naive_shaw', NaiveShaw(shaw))]:
      fn, params = grad_fn(ours(relative), self_call)
      fns[name], args[name] = fn, (params, x)
      memory[name] = temp_bytes(fn, params, x)
    t = compare_times(fns, args, repeats)
    rows[length] = {
        'batch': b,
        'shaw_time_ratio': t['shaw'] / t['plain'],
        'shaw_memory_ratio': memory['shaw'] / memory['plain'],
        'naive_shaw_time_ratio': t['naive_shaw'] / t['plain'],
        'naive_shaw_memory_ratio': memory['naive_shaw'] / memory['plain'],
        'plain_temp_mb': memory['plain'] / 2 ** 20,
    }
  return rows


def bench_huang_memory(length, tokens):
  """Huang's skew against the naive (L, L, d) form, both with one table per
  head (the Music Transformer's setting) and with one shared table."""
  b = batch_for(length, tokens)
  x = jax.random.normal(jax.random.key(4), (b, length, WIDTH))
  out = {'batch': b}
  plain_fn, plain_params = grad_fn(ours(), self_call)
  plain = temp_bytes(plain_fn, plain_params, x)
  for shared in (False, True):
    huang = selfattn.HuangRelative(HEADS, WIDTH // HEADS, max_len=length,
                                   shared_heads=shared, rngs=nnx.Rngs(0))
    # The naive form of Huang's logits is Shaw's keys-only term, unclipped.
    naive = selfattn.ShawRelative(HEADS, WIDTH // HEADS, clip_distance=length - 1,
                                  relative_values=False, shared_heads=shared,
                                  rngs=nnx.Rngs(0))
    suffix = '_shared_table' if shared else ''
    for name, relative in [('huang', huang), ('naive_huang', NaiveShaw(naive))]:
      fn, params = grad_fn(ours(relative), self_call)
      out[f'{name}_memory_ratio{suffix}'] = temp_bytes(fn, params, x) / plain
  return out


def bench_encodings(length, tokens, repeats):
  b = batch_for(length, tokens)
  x = jax.random.normal(jax.random.key(5), (b, length, WIDTH), jnp.float32)
  head_dim = WIDTH // HEADS
  relatives = {
      'plain': None,
      'shaw': selfattn.ShawRelative(HEADS, head_dim, rngs=nnx.Rngs(0)),
      'huang': selfattn.HuangRelative(HEADS, head_dim, max_len=length,
                                      rngs=nnx.Rngs(0)),
      'rope': selfattn.RotaryEncoding(head_dim),
      'alibi': selfattn.ALiBi(HEADS),
      't5': selfattn.T5RelativeBias(HEADS, rngs=nnx.Rngs(0)),
  }
  fns, args = {}, {}
  for name, relative in relatives.items():
    fn, params = grad_fn(ours(relative), self_call)
    fns[name], args[name] = fn, (params, x)
  t = compare_times(fns, args, repeats)
  return {name: t[name] / t['plain'] for name in relatives if name != 'plain'}


# --------------------------------------------------------------------------
# Training loop.
# --------------------------------------------------------------------------

def bench_training(config_name: str, steps: int, repeats: int, rounds: int):
  """The real loop (train_and_evaluate at the config's own logging,
  checkpoint and eval cadence; its warm steps/s excludes compilation, eval
  and checkpoint saving) against the same compiled step called back to back
  on pre-generated batches, measured before and after the loop."""
  from selfattn.training.steps import Trainer
  from selfattn.training.train import train_and_evaluate
  module = __import__(f'configs.{config_name}', fromlist=['get_config'])
  config = module.get_config()
  config.train.num_steps = steps
  config.eval.lengths = [config.task.max_len]

  def compiled_rate(dtype, count):
    config.model.dtype = dtype
    trainer = Trainer(config)
    state = trainer.init_state()
    batches = [trainer.train_batch(s) for s in range(count)]
    jax.block_until_ready(batches)
    return step_rates(trainer.train_step, state, batches, repeats)

  # This machine's speed drifts by 10-15% between minutes, so loop and
  # compiled step are measured in alternating rounds and compared by median.
  count, loops, compiled = min(steps, 300), [], []
  for _ in range(rounds):
    compiled += compiled_rate('float32', count)
    # The run's own results table and orbax's INFO lines are not part of
    # the benchmark's report.
    with tempfile.TemporaryDirectory() as workdir, \
        contextlib.redirect_stdout(io.StringIO()), _quiet_logging():
      loops.append(train_and_evaluate(config, workdir)['steps_per_sec'])
  loop_rate, f32 = statistics.median(loops), statistics.median(compiled)
  bf16 = statistics.median(compiled_rate('bfloat16', count))
  config.model.dtype = 'float32'
  tokens = config.train.batch_size * (config.task.min_len + config.task.max_len) / 2
  return {'train_steps_per_sec': loop_rate,
          'train_tokens_per_sec': loop_rate * tokens,
          'compiled_steps_per_sec': f32,
          'train_overhead_fraction': max(0.0, 1.0 - loop_rate / f32),
          'bfloat16_speedup': bf16 / f32}


@contextlib.contextmanager
def _quiet_logging():
  """absl and Python logging at WARNING for the duration."""
  import logging as std_logging
  from absl import logging as absl_logging
  before = (absl_logging.get_verbosity(), std_logging.getLogger().level)
  absl_logging.set_verbosity(absl_logging.WARNING)
  std_logging.getLogger().setLevel(std_logging.WARNING)
  try:
    yield
  finally:
    absl_logging.set_verbosity(before[0])
    std_logging.getLogger().setLevel(before[1])


def peak_rss_mb(config_name: str) -> float:
  """Peak resident memory of a real training run of the config (a child process).

  Call it before this process grows: the child is forked from it, and the
  fork's resident pages before exec count towards RUSAGE_CHILDREN's maximum.
  """
  with tempfile.TemporaryDirectory() as workdir:
    subprocess.run([sys.executable, '-m', 'selfattn.main',
                    f'--config=configs/{config_name}.py', f'--workdir={workdir}'],
                   cwd=ROOT, check=True, capture_output=True,
                   env={**os.environ, 'PYTHONPATH': ROOT})
  return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


# --------------------------------------------------------------------------
# Report.
# --------------------------------------------------------------------------

def table(header, rows):
  lines = ['| ' + ' | '.join(header) + ' |',
           '|' + '|'.join('---:' for _ in header) + '|']
  for row in rows:
    lines.append('| ' + ' | '.join(
        f'{v:.3g}' if isinstance(v, float) else str(v) for v in row) + ' |')
  return '\n'.join(lines)


def bench_causal_chunked(length: int, repeats: int) -> dict:
  """Causal over bidirectional chunked attention (selfattn.nn.chunked, blocks
  of 256), one call on (1, 8, L, 32) q, k, v, forward and forward+backward,
  measured in alternation. Key blocks wholly above the causal diagonal are
  skipped, so the ideal ratio tends to about one half as L grows."""
  from selfattn.nn import chunked
  keys = jax.random.split(jax.random.key(0), 3)
  q, k, v = (jax.random.normal(key, (1, 8, length, 32)) for key in keys)
  out = {}
  for what in ('forward', 'forward+backward'):
    fns = {}
    for causal in (False, True):
      call = lambda q, k, v, causal=causal: chunked.chunked_attention(
          q, k, v, causal=causal)
      if what == 'forward':
        fns[causal] = jax.jit(call)
      else:
        fns[causal] = jax.jit(jax.grad(
            lambda q, k, v, call=call: jnp.sum(call(q, k, v) ** 2),
            argnums=(0, 1, 2)))
    t = compare_times({'full': fns[False], 'causal': fns[True]},
                      {'full': (q, k, v), 'causal': (q, k, v)}, repeats)
    out[what] = {'full_ms': 1e3 * t['full'], 'causal_ms': 1e3 * t['causal'],
                 'ratio': t['causal'] / t['full']}
  return out


def bench_chunked(quick: bool, repeats: int, smoke: bool = False) -> dict:
  """The long-sequence section; returns its JSON keys."""
  target = 1024 if quick else 8192        # the memory target's length
  # the time target's shorter length
  mid = 256 if smoke else 512 if quick else 2048
  print(f'## Chunked attention vs plain, forward+backward, batch 1, width '
        f'{bench_long.WIDTH}, {bench_long.HEADS} heads\n', flush=True)
  memory_lengths = [1024] if quick else [512, 1024, 2048, 4096, 8192]
  memory = bench_long.chunked_memory(
      memory_lengths, ('none', 'shaw') if quick else bench_long.ENCODINGS)
  targeted = [n for n in ('none', 'rope', 'alibi', 't5', 'shaw') if n in memory]
  times_at = {mid: bench_long.chunked_time(
      mid, targeted if not quick else ['none'], repeats)}
  if not quick:
    for length in (512, 4096, 8192):
      times_at[length] = bench_long.chunked_time(length, ['none', 'shaw'], 2)
  times = {}
  for length, rows in times_at.items():
    for name, row in rows.items():
      times.setdefault(name, {})[str(length)] = row
  lengths = bench_long.max_train_length(longest=1024 if quick else 65536)
  depths = [1] if smoke else [2] if quick else [2, 12, 48]
  compiles = bench_long.compile_seconds(depths)
  if _PLOT.value:
    bench_long.plot(memory, times, _PLOT.value)

  rows = [[name, n, r['plain_temp_mb'], r['chunked_temp_mb'], r['ratio']]
          for name, by_length in memory.items() for n, r in by_length.items()]
  print('\n' + table(['encoding', 'length', 'plain temp MB', 'chunked temp MB',
                      'ratio'], rows) + '\n')
  rows = [[name, n, r['plain_ms'], r['chunked_ms'], r['ratio']]
          for name, by_length in times.items() for n, r in by_length.items()]
  print(table(['encoding', 'length', 'plain ms', 'chunked ms', 'ratio'],
              rows) + '\n')
  print(table(['attention', 'longest length within 16 GiB'],
              [[k, v['max_length']] for k, v in lengths.items()]) + '\n')
  print(table(list(compiles), [list(compiles.values())]) + '\n')
  causal_length = 512 if smoke else 1024 if quick else 4096
  causal = bench_causal_chunked(causal_length, repeats)
  print(f'Causal over bidirectional chunked attention at length '
        f'{causal_length} (blocks above the diagonal skipped):\n')
  print(table(['pass', 'full ms', 'causal ms', 'ratio'],
              [[k, r['full_ms'], r['causal_ms'], r['ratio']]
               for k, r in causal.items()]) + '\n')
  out = {
      'chunked_memory_ratio': max(memory[n][str(target)]['ratio']
                                  for n in targeted),
      'chunked_time_ratio': times_at[mid][targeted[0]]['ratio'],
      'chunked_time_ratio_by_encoding': {str(k): {n: r['ratio'] for n, r in v.items()}
                                         for k, v in times_at.items()},
      'chunked_memory': memory,
      'chunked_time': times,
      'max_train_length': float(lengths['chunked']['max_length']),
      'max_train_length_plain': float(lengths['plain']['max_length'] or 0),
      'train_step_gib': lengths,
      'compile_seconds': compiles,
      'scan_compile_ratio': (compiles[f'scan_{depths[-1]}']
                             / compiles[f'scan_{depths[0]}']),
      'chunked_causal_time_ratio': causal['forward+backward']['ratio'],
      'chunked_causal': causal,
  }
  if not quick:
    out['chunked_time_ratio_long'] = times_at[8192]['none']['ratio']
  return out


def main(argv):
  del argv
  smoke = _SMOKE.value
  quick = _QUICK.value or smoke
  repeats = 1 if smoke else 3 if quick else 7
  lengths = [128] if quick else [128, 512, 2048]
  tokens = 1024 if quick else 4096       # batch = tokens // length beyond 128
  started = time.perf_counter()
  machine = (f'{jax.devices()[0].device_kind} x{jax.device_count()} '
             f'({jax.default_backend()}), {os.cpu_count()} CPU cores')
  print(f'# selfattn benchmarks on {machine}'
        f'{" (smoke)" if smoke else " (quick)" if quick else ""}\n')

  config_name = 'tiny' if quick else 'default'
  rss = peak_rss_mb(config_name)     # first, while this process is small
  roofline = matmul_gflops(512 if quick else 2048, repeats)
  print(f'matmul_gflops (float32 {512 if quick else 2048}^2): {roofline:.1f}\n')

  mha = bench_mha(lengths, tokens, repeats, roofline)
  print('## MultiHeadAttention forward+backward, width 256, 8 heads\n')
  print(table(['length', 'batch', 'selfattn ms', 'flax ms', 'speedup vs flax',
               'fraction of roofline'],
              [[n, r['batch'], r['selfattn_ms'], r['flax_ms'],
                r['speedup_vs_flax'], r['fraction_of_roofline']]
               for n, r in mha.items()]) + '\n')

  breakdown = mha_breakdown(repeats)
  print('Where the time goes at length 128 (forward+backward, batch 32):\n')
  print(table(list(breakdown), [list(breakdown.values())]) + '\n')

  rel = bench_relative(lengths, tokens, repeats)
  print('## Shaw relative attention (k=16, keys and values) over plain attention\n')
  print(table(['length', 'batch', 'shaw time', 'shaw memory', 'naive time',
               'naive memory', 'plain temp MB'],
              [[n, r['batch'], r['shaw_time_ratio'], r['shaw_memory_ratio'],
                r['naive_shaw_time_ratio'], r['naive_shaw_memory_ratio'],
                r['plain_temp_mb']] for n, r in rel.items()]) + '\n')

  huang_length = 256 if quick else 2048
  huang = bench_huang_memory(huang_length, tokens)
  print(f'## Huang (skew) memory over plain attention at length {huang_length}\n')
  print(table(['tables', 'batch', 'huang (skew)', 'naive (L, L, d)'],
              [['one per head', huang['batch'], huang['huang_memory_ratio'],
                huang['naive_huang_memory_ratio']],
               ['shared', huang['batch'], huang['huang_memory_ratio_shared_table'],
                huang['naive_huang_memory_ratio_shared_table']]]) + '\n')

  enc_length = 128 if quick else 512
  encodings = bench_encodings(enc_length, tokens, repeats)
  print(f'## Time over plain attention at length {enc_length}\n')
  print(table(list(encodings), [list(encodings.values())]) + '\n')

  pope = bench_pope.bench_pope(lengths, tokens, repeats)
  print('## PoPE over RoPE, one layer forward+backward (scripts/bench_pope.py)\n')
  print(bench_pope.markdown(pope) + '\n')

  training = bench_training(config_name, 20 if smoke else 60 if quick else 500,
                            repeats, rounds=1 if quick else 3)
  training['peak_rss_mb'] = rss
  print(f'## Training loop, configs/{config_name}.py\n')
  print(table(list(training), [list(training.values())]) + '\n')

  long = bench_chunked(quick, repeats, smoke)

  results = {
      'machine': machine, 'quick': quick, 'smoke': smoke,
      'matmul_gflops': roofline,
      'mha_speedup_vs_flax': mha[128]['speedup_vs_flax'],
      'mha_fraction_of_roofline': mha[128]['fraction_of_roofline'],
      'mha': {str(n): r for n, r in mha.items()},
      'mha_breakdown': breakdown,
      'shaw_time_ratio': max(r['shaw_time_ratio'] for r in rel.values()),
      'shaw_memory_ratio': max(r['shaw_memory_ratio'] for r in rel.values()),
      'shaw': {str(n): r for n, r in rel.items()},
      'huang_memory_ratio': huang['huang_memory_ratio'],
      'huang': huang,
      'encoding_time_ratio': encodings,
      'pope_over_rope': {str(n): r for n, r in pope.items()},
      **training,
      **long,
      'seconds': time.perf_counter() - started,
  }
  print(f'total {results["seconds"]:.0f} s')
  if _JSON.value:
    with open(_JSON.value, 'w') as f:
      json.dump(results, f, indent=2)


if __name__ == '__main__':
  app.run(main)

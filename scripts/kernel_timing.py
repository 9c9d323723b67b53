"""What the kernel tuners share (scripts/tune_hopper.py, tune_triton.py): their
flags (the problem's shape, the run's limits, the encoding, the output
folder, the CPU dry run), an encoding's tables or module at its defaults, a
median timing, cuDNN's rows as the peer, and the output files."""

from __future__ import annotations

import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
from absl import app
from absl import flags
from flax import nnx

from scripts import measure
from scripts.measure import LOST_DEVICE
from scripts.measure import device_alive
from scripts.measure import time_calls
from selfattn.nn import positions

KINDS = ('none', 'alibi', 't5', 'shaw')

OUT = flags.DEFINE_string('out', os.environ.get('OUT'),
                          'Directory for the tuner\'s .json and .md (default '
                          '$OUT).')
SMOKE = flags.DEFINE_bool('smoke', False, 'The CPU dry run at tiny shapes '
                          '(tune_hopper: the Mosaic GPU interpreter; '
                          'tune_triton: lowered for cuda, launches checked): '
                          'checks the script, its numbers are not timings.')
KIND = flags.DEFINE_enum('kind', 'none', KINDS,
                         'The encoding the kernels compute.')
LENGTH = flags.DEFINE_integer('length', 8192, 'L (queries = keys).')
BATCH = flags.DEFINE_integer('batch', 2, 'B.')
HEADS = flags.DEFINE_integer('heads', 16, 'H.')
HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'D.')
REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs per row.')
BUDGET = flags.DEFINE_float('time_budget', 0.0, 'Seconds after which no '
                            'new row starts (0: none).')
CAUSAL = flags.DEFINE_list('causal', 'false,true', 'Masks to run.')
RESUME = flags.DEFINE_bool(
    'resume', False, "Continue --out's STEM(_KIND).json: the rows there are "
    "kept and their configurations not run again (cuDNN's are). A run whose "
    'device is lost after a row fails (a kernel fault leaves the CUDA context '
    'unusable) exits with status 75 (measure.LOST_DEVICE); '
    'scripts/gpu_session.sh then resumes it in a fresh process.')


def random_inputs(b: int, h: int, length: int, d: int):
  """(q, k, v, g): bf16 (B, H, L, D) inputs and output cotangent, the
  same for every row and every tuner."""
  keys = jax.random.split(jax.random.key(0), 4)
  return tuple(jax.random.normal(key, (b, h, length, d), jnp.bfloat16)
               for key in keys)


def forward_flops(b: int, h: int, length: int, d: int, causal: bool) -> float:
  """4 B H L^2 D (q k^T and p v), halved when causal."""
  return 4 * b * h * length * length * d / (2 if causal else 1)


def new_result(kind: str, b: int, h: int, length: int, d: int,
               smoke: bool) -> dict:
  """The header every tuner's JSON starts with; rows and best to fill."""
  return {'device': jax.devices()[0].device_kind, 'jax': jax.__version__,
          'kind': kind, 'batch': b, 'heads': h, 'length': length,
          'head_dim': d, 'smoke': smoke, 'rows': [], 'best': []}


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


def position_module(kind: str, heads: int, head_dim: int, seed: int = 0):
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


def pallas_training_step(kind: str, heads: int, head_dim: int, *,
                         causal: bool, **attention_kwargs):
  """(step, params): value_and_grad of bench_gpu.py's training loss,
  sum(pallas_attention(q, k, v) * g), in (q, k, v, params), called as
  step(q, k, v, params, g); params are `kind`'s position module's (None
  for 'none'). attention_kwargs go to pallas_attention (gpu_kernel,
  interpret, block_k, ...)."""
  from selfattn.nn import pallas_attention as pa
  module = position_module(kind, heads, head_dim)
  graphdef, params, rest = (nnx.split(module, nnx.Param, ...)
                            if module is not None else (None, None, None))

  def loss(q, k, v, params, g):
    relative = (None if graphdef is None
                else nnx.merge(graphdef, params, rest, copy=True))
    out = pa.pallas_attention(q, k, v, relative=relative, causal=causal,
                              **attention_kwargs)
    return jnp.sum(out.astype(jnp.float32) * g)

  return jax.value_and_grad(loss, argnums=(0, 1, 2, 3)), params


def median_ms(fn, args, repeats: int) -> float:
  return 1e3 * statistics.median(time_calls(fn, args, repeats))


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
      rows.append({'pass': name, 'kernel': 'cudnn', 'status': short_error(e)})
  return rows


def short_error(e: Exception) -> str:
  """An exception as one table cell: one line, no '|', 200 characters."""
  text = ' '.join(f'{type(e).__name__}: {e}'.split())[:200]
  return text.replace('|', '\\|')


def causal_settings() -> list[bool]:
  """--causal as booleans (app.UsageError for a value that is neither)."""
  settings = []
  for value in CAUSAL.value:
    value = value.strip().lower()
    if value not in ('true', 'false'):
      raise app.UsageError(f'--causal: {value!r}; give true and/or false')
    settings.append(value == 'true')
  return settings


def out_of_time_share(started: float, share: int, shares: int) -> bool:
  """Whether the first share + 1 of `shares` equal parts of --time_budget,
  counted from `started`, are spent (never, with no budget): each causal
  setting gets its part, so the last one still gets rows when the budget
  is short, and what one leaves unspent goes to the next."""
  return bool(BUDGET.value) and (time.perf_counter() - started
                                 > BUDGET.value * (share + 1) / shares)


def causal_rounds(result: dict, q, k, v, g, repeats: int, smoke: bool):
  """Yields (causal, flops, base, out_of_time) per --causal setting with
  time left in its share of --time_budget: the forward FLOPs, cuDNN's
  {pass: ms} (its rows added to result) and the share's clock."""
  b, h, length, d = q.shape
  started = time.perf_counter()
  settings = causal_settings()
  for share, causal in enumerate(settings):
    out_of_time = (lambda share=share:
                   out_of_time_share(started, share, len(settings)))
    if out_of_time():
      continue
    flops = forward_flops(b, h, length, d, causal)
    yield causal, flops, cudnn_peer(result, q, k, v, g, causal, repeats,
                                    smoke, flops), out_of_time


def cudnn_peer(result: dict, q, k, v, g, causal: bool, repeats: int,
               smoke: bool, flops: float) -> dict:
  """{pass: ms} of cuDNN's rows that ran (none in smoke mode); every row,
  a failed one with its status, also appended to result['rows'], with
  TFLOP/s (`flops` per forward, 3.5x that for forward + backward)."""
  base = {}
  for r in [] if smoke else cudnn_rows(q, k, v, g, causal, repeats):
    if r.get('ms'):
      base[r['pass']] = r['ms']
      work = flops * (1 if r['pass'] == 'forward' else 3.5)
      r['tflops'] = work / r['ms'] / 1e9
    result['rows'].append({'causal': causal, **r})
  return base


def output_stem(out_dir: str, stem: str, kind: str) -> str:
  """OUT/STEM, or OUT/STEM_KIND for a kind other than none."""
  return os.path.join(out_dir, stem + ('' if kind == 'none' else f'_{kind}'))


def stop_if_device_lost() -> None:
  """After a row failed (and the caller saved its rows): if the GPU no
  longer computes, exit with LOST_DEVICE for gpu_session.sh to resume in a
  fresh process."""
  if jax.default_backend() == 'gpu' and not device_alive():
    print(f'the device was lost: exiting with status {LOST_DEVICE} '
          '(--resume continues in a fresh process)', flush=True)
    raise SystemExit(LOST_DEVICE)


def earlier_rows(out_dir: str | None, stem: str, kind: str) -> list[dict]:
  """The rows of an earlier run's STEM(_KIND).json (none if absent)."""
  if not out_dir:
    return []
  return measure.earlier_rows(output_stem(out_dir, stem, kind) + '.json')


def write_outputs(out_dir: str | None, stem: str, kind: str, result: dict,
                  markdown: str) -> None:
  """STEM.json and STEM.md (STEM_KIND.* for a kind other than none) under
  out_dir, if one is given; rewritten after every row."""
  if not out_dir:
    return
  os.makedirs(out_dir, exist_ok=True)
  stem = output_stem(out_dir, stem, kind)
  with open(f'{stem}.json', 'w') as f:
    json.dump(result, f, indent=2)
  with open(f'{stem}.md', 'w') as f:
    f.write(markdown)

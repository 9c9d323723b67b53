"""GPU benchmark: attention forward+backward in bfloat16, selfattn's
`attention_impl` paths against Flax, cuDNN and JAX's Pallas flash attention.

  python scripts/bench_gpu.py --out DIR          # on a GPU (default DIR: $OUT)
  python scripts/bench_gpu.py --smoke            # tiny, on the CPU, < 1 min
  python scripts/bench_gpu.py --probe=P.json ... # skip the rows that
                                                 # scripts/kernel_probe.py
                                                 # found hanging or failing
  scripts/gpu_session.sh bench                   # what a lent GPU session runs

One row = one attention core (no projections) on per-head q, k, v of
(B, H, L, D), differentiated w.r.t. q, k, v and the encoding's parameters
(the loss is sum(out * g) for a fixed random g), jitted and compiled ahead of
time. Rows:

  selfattn:IMPL   selfattn.MultiHeadAttention's own routing (`_attend`, the
                  code `attention_impl=IMPL` runs) for IMPL in plain, chunked,
                  fused, pallas, per encoding (none, rope, alibi, t5, shaw,
                  xl). The `path` column says what actually ran: 'fused'
                  falls back to plain for Shaw's value term and 'pallas' for
                  encodings its kernel does not compute (xl); such rows
                  repeat the plain row's numbers (or, with no plain row,
                  the first fallback's) instead of timing it again.
                  'pallas' runs the Triton kernels until the Hopper ones
                  have run on a GPU (pallas_attention.AUTO_TAKES_HOPPER).
  selfattn:pallas_hopper
                  'pallas' with the Hopper kernels where they apply
                  (pallas_attention.hopper_in_auto(): hopper_attention.py,
                  hopper_backward.py; kernel column mosaic-gpu), Triton
                  elsewhere: the two compared in one call.
  selfattn:pallas_hopper_fused
                  pallas_hopper with the one-kernel backward
                  (hopper_backward.fused_in_tuned: dQ by TMA reduce-add)
                  for none, rope, alibi and t5; the other encodings' rows
                  repeat pallas_hopper's numbers.
  flax            flax.nnx.dot_product_attention (no encoding), the Flax peer
                  of the `x flax` column.
  cudnn           jax.nn.dot_product_attention(implementation='cudnn'), no
                  bias: the `x cudnn` column's denominator.
  cudnn+bias      the same with a materialized (1, H, L, L) bias (ALiBi's,
                  not differentiated): what a logit-term encoding costs when
                  it is handed to cuDNN as a bias.
  pallas_mha      jax.experimental.pallas.ops.gpu.attention.mha (Triton),
                  JAX's Pallas flash attention, forward and backward kernels.
  pallas_mgpu     jax.experimental.pallas.ops.gpu.attention_mgpu (Mosaic GPU,
                  Hopper only, head width a multiple of 64, no causal
                  backward), where the installed JAX has it; in float16
                  where the run is in bfloat16, which it refuses; q comes
                  scaled by 1/sqrt(D), which it does not apply.
  tokamax         tokamax.dot_product_attention(implementation='mosaic'):
                  Google's Mosaic GPU flash attention (sm90 kernels on
                  Hopper), where tokamax is installed (not a requirement;
                  gpu_session.sh carries it: scripts/tokamax_peer.py); on
                  the CPU its 'xla' implementation stands in, to check the
                  call.
  tokamax_tuned   the same, its forward and backward configured as its own
                  tuning data chose them on an H100 at the nearest shape
                  (tokamax_peer.tuned_op; the plain row runs its heuristic
                  config wherever that data has no entry: on an H200, and
                  at H = 16); GPU only.
  tokamax+bias    the same as tokamax with cudnn+bias's (1, H, L, L) ALiBi
                  bias: how tokamax takes a relative encoding (its backward
                  writes a (B, H, L, L) score gradient in the bias's dtype
                  and sums it to the bias's shape, as cudnn+bias computes
                  dbias).

Columns: median ms over --repeats runs after --warmup (each run ends in
block_until_ready); TFLOP/s and its fraction of the GPU's bf16 dense peak
(datasheet, by device kind, or --peak_tflops) and of the bf16 matmul rate
measured in the same run; memory as XLA's compiled size of the function
(arguments + outputs + temporaries, `memory_analysis()`) and the process's
device high-water mark (`memory_stats()['peak_bytes_in_use']`, shown only
when this row raised it); `x flax` and `x cudnn`: the row's time over the
flax / cudnn row at the same length and mask; `rel err`: |out - ref| / |ref|
of the forward output against selfattn's plain path in float32 at 'highest'
precision, at --check_length only (default: the summary length if it is
run, which the targets are judged at, else the shortest); `kernel`:
the attention custom calls in the compiled HLO (cudnn-fmha, triton,
mosaic-gpu; 'xla' when none).

FLOPs are counted analytically, the same for every row at a length:
4 B H L^2 D per forward (q k^T and p v, 2 FLOPs per multiply-add), x 3.5 for
forward+backward (the FlashAttention papers' convention: backward = 2.5 x
forward), halved when causal; relative terms, softmax and rotations are not
counted. A combination that does not fit, or that a kernel refuses, prints a
row saying so (OOM predicted from the compiled size, OOM at run, unsupported,
skipped with the reason) instead of stopping the run. Results are written
after every row, so a run stopped by a time limit keeps what it measured.

Outputs under --out: NAME.json (every row and the machine), NAME.md (the
tables). The last thing printed is which encodings reach cuDNN's fused kernel
through attention_impl='fused', a summary at one length (with issue 47's
targets) and the total time.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import math
import os
import re
import statistics
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if '--smoke' in sys.argv and '--xla_backend_optimization_level' not in (
    os.environ.get('XLA_FLAGS', '')):
  # The smoke run checks the code, not the speed: skip LLVM's optimisation
  # passes as the test suite does (tests/conftest.py), set before JAX loads.
  os.environ['XLA_FLAGS'] = ' '.join(filter(None, [
      os.environ.get('XLA_FLAGS'), '--xla_backend_optimization_level=0']))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402
from flax import nnx  # noqa: E402

import selfattn  # noqa: E402
from selfattn.nn import attention as sa_attention  # noqa: E402
from selfattn.nn import hopper_backward  # noqa: E402
from scripts.gpu_targets import row_impl, targets, targets_table  # noqa: E402
from scripts.measure import LOST_DEVICE  # noqa: E402
from scripts.measure import earlier_rows  # noqa: E402
from scripts.measure import lost_device  # noqa: E402
from scripts.measure import time_calls  # noqa: E402
from scripts import probe_verdicts  # noqa: E402
from scripts import tokamax_peer  # noqa: E402

ENCODINGS = ('none', 'rope', 'alibi', 't5', 'shaw', 'xl')
IMPLS = tuple(i for i in ('plain', 'chunked', 'fused', 'pallas')
              if i in sa_attention.IMPLEMENTATIONS) + ('pallas_hopper',
                                                       'pallas_hopper_fused')
HOPPER_PATH = 'pallas (hopper where it applies)'
# Encodings whose Hopper backward has the one-kernel form (rope: rotated
# first, then none's kernels); the others' pallas_hopper_fused row is the
# pallas_hopper row's numbers.
FUSED_ENCODINGS = hopper_backward.FUSED_KINDS + ('rope',)
PEERS = ('flax', 'cudnn', 'cudnn+bias', 'pallas_mha', 'pallas_mgpu', 'tokamax',
         'tokamax_tuned', 'tokamax+bias')
GPU_ONLY = ('cudnn', 'cudnn+bias', 'pallas_mgpu', 'tokamax_tuned')
# The peers the rows are measured against: `x flax`, and `x cudnn`, which
# is the targets' ratio (gpu_targets.py; its memory target too).
DENOMINATOR_PEERS = ('flax', 'cudnn')

_OUT = flags.DEFINE_string(
    'out', os.environ.get('OUT'),
    'Directory for NAME.json and NAME.md (default $OUT; none: print only).')
_NAME = flags.DEFINE_string('name', 'bench_gpu',
                            'Base name of the output files.')
_SMOKE = flags.DEFINE_bool(
    'smoke', False, 'Tiny shapes (L = 128, 256; B 2, H 2, D 16; float32) '
    'that run on the CPU in under a minute; GPU-only peers are skipped with '
    'the reason.')
_LENGTHS = flags.DEFINE_list('lengths', '1024,2048,4096,8192,16384,32768',
                             'Sequence lengths (queries = keys).')
_TOKENS = flags.DEFINE_integer('tokens', 16384, 'Batch = max(1, tokens // L) '
                               'unless --batch is set.')
_BATCH = flags.DEFINE_integer('batch', 0,
                              'Fixed batch size (0: from --tokens).')
_HEADS = flags.DEFINE_integer('heads', 16, 'Attention heads H.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 64, 'Head width D.')
_DTYPE = flags.DEFINE_enum(
    'dtype', None, ['bfloat16', 'float16', 'float32'],
    'q, k, v dtype (default bfloat16; float32 in --smoke).')
_ENCODINGS = flags.DEFINE_list(
    'encodings', ','.join(ENCODINGS),
    f'Encodings of the selfattn rows ({", ".join(ENCODINGS)}).')
_IMPLS = flags.DEFINE_list(
    'impls', ','.join(IMPLS),
    f'selfattn attention_impl values ({", ".join(IMPLS)}).')
_PEERS = flags.DEFINE_list('peers', ','.join(PEERS),
                           f'Peers ({", ".join(PEERS)}).')
_CAUSAL = flags.DEFINE_list('causal', 'false', 'Masks to run: false '
                            '(bidirectional), true (causal), or both '
                            '(false,true).')
_MODE = flags.DEFINE_enum(
    'mode', 'train', ['train', 'forward'], "What a row times: 'train' (the "
    "loss and its gradients) or 'forward' (the output alone; FLOPs x1).")
_REPEATS = flags.DEFINE_integer('repeats', 10, 'Timed runs per row (median).')
_WARMUP = flags.DEFINE_integer('warmup', 3, 'Untimed runs before timing.')
_PEAK = flags.DEFINE_float(
    'peak_tflops', 0.0, "The device's dense bf16 peak in TFLOP/s (0: from "
    "the device kind's datasheet).")
_BUDGET = flags.DEFINE_float(
    'time_budget', 0.0, 'Seconds after which no new row is started (0: '
    'none); the rest are listed as not run.')
_CHECK = flags.DEFINE_bool(
    'check', True, "Compare each row's forward output with the float32 "
    'plain path at --check_length.')
_CHECK_LENGTH = flags.DEFINE_integer(
    'check_length', 0, 'Length of the output check (0: --summary_length '
    'where it is among --lengths: the targets count a row only where its '
    'check passed, scripts/gpu_targets.py; else the shortest of '
    '--lengths).')
_PROBE = flags.DEFINE_string(
    'probe', None, "scripts/kernel_probe.py's verdicts (JSON): rows it found "
    'hanging, faulting or failing are skipped with its reason, so that one '
    "broken kernel does not stop the process's other rows.")
_RESUME = flags.DEFINE_bool(
    'resume', False, 'Continue NAME.json under --out: its rows (by label) '
    'are kept and not run again. A run whose device is lost after a row '
    'fails (a kernel fault leaves the CUDA context unusable) writes its rows '
    'and exits with status 75 (LOST_DEVICE); scripts/gpu_session.sh then '
    'resumes it in a fresh process with the rest of its time budget.')
_SUMMARY_LENGTH = flags.DEFINE_integer(
    'summary_length', 8192, 'Length of the printed summary (the longest run '
    'if absent).')

# Dense bf16 tensor-core peaks from NVIDIA's datasheets (TFLOP/s, no sparsity).
DATASHEET_BF16_TFLOPS = (
    ('H100 PCIe', 756.0), ('H100 NVL', 835.0), ('H100', 989.0),
    ('H200', 989.0), ('H800', 989.0), ('GH200', 989.0),
    ('A100', 312.0), ('L40S', 362.0), ('B200', 2250.0),
)

FLOP_CONVENTION = (
    'FLOPs = 4*B*H*L^2*D per forward (q.k^T and p.v, 2 FLOPs per '
    'multiply-add), x3.5 for forward+backward (backward = 2.5 x forward, as '
    'the FlashAttention papers count), halved when causal; relative terms, '
    'softmax and rotations not counted (the same count for every row at a '
    'length); --mode=forward counts the forward alone.')


# --------------------------------------------------------------------------
# Machine.
# --------------------------------------------------------------------------

def _version(dist: str) -> str | None:
  try:
    return importlib.metadata.version(dist)
  except importlib.metadata.PackageNotFoundError:
    return None


def machine() -> dict:
  device = jax.devices()[0]
  info = {
      'device_kind': device.device_kind, 'platform': device.platform,
      'device_count': jax.device_count(), 'cpu_cores': os.cpu_count(),
      'python': sys.version.split()[0], 'jax': jax.__version__,
      'jaxlib': _version('jaxlib'), 'flax': _version('flax'),
  }
  for dist in ('jax-cuda13-plugin', 'jax-cuda12-plugin', 'jax-cuda13-pjrt',
               'jax-cuda12-pjrt', 'nvidia-cudnn-cu13', 'nvidia-cudnn-cu12'):
    if _version(dist):
      info[dist] = _version(dist)
  try:
    from jax._src.lib import cuda_versions   # None without the CUDA plugin
    if cuda_versions is not None:
      info['cudnn_runtime'] = cuda_versions.cudnn_get_version()
      info['cuda_runtime'] = cuda_versions.cuda_runtime_get_version()
  except Exception:  # noqa: BLE001  (private module: informational only)
    pass
  return info


def datasheet_peak(kind: str) -> float | None:
  for name, tflops in DATASHEET_BF16_TFLOPS:
    if name.lower() in kind.lower():
      return tflops
  return None


def matmul_tflops(n: int, dtype, repeats: int) -> float:
  """The measured matrix-product rate (random data, median of repeats)."""
  a = jax.random.normal(jax.random.key(0), (n, n), dtype)
  b = jax.random.normal(jax.random.key(1), (n, n), dtype)
  f = jax.jit(jnp.matmul).lower(a, b).compile()
  return 2 * n ** 3 / _median_seconds(f, (a, b), repeats, 3)[0] / 1e12


def _median_seconds(compiled, args, repeats: int, warmup: int):
  samples = time_calls(compiled, args, repeats, warmup)
  return statistics.median(samples), min(samples)


def _memory_stats() -> dict:
  try:
    return jax.devices()[0].memory_stats() or {}
  except Exception:  # noqa: BLE001  (some backends do not implement it)
    return {}


# --------------------------------------------------------------------------
# The rows.
# --------------------------------------------------------------------------

def relative_for(name: str, heads: int, head_dim: int, max_len: int):
  if name == 'none':
    return None
  kind, options = selfattn.get_position(name)
  return kind.build(num_heads=heads, head_dim=head_dim, max_len=max_len,
                    param_dtype=jnp.float32, rngs=nnx.Rngs(0), **options)


class _Core(selfattn.MultiHeadAttention):
  """MultiHeadAttention's routing without the output projection: `_attend`
  on per-head q, k, v returns (B, H, L, D)."""

  def _merge_heads(self, out_BxHxLqxD):
    return out_BxHxLqxD


def selfattn_path(impl: str, relative) -> str:
  """What MultiHeadAttention._attend runs for this impl and encoding with no
  dropout, bias, positions or masks other than `causal`."""
  if impl == 'fused' and not sa_attention.can_fuse(relative):
    return 'plain (fallback: value term)'
  if impl == 'pallas':
    from selfattn.nn import pallas_attention
    if not pallas_attention.supports(relative):
      return 'plain (fallback: not in kernel)'
  return impl


def code_run(path: str) -> str:
  """The code a row's path runs, for reusing its numbers: a fallback to the
  plain path ('plain (fallback: ...)') runs 'plain', so the first such row
  of an encoding (xl has one per impl) times it and the rest repeat it."""
  return 'plain' if path.startswith('plain (fallback') else path


@dataclasses.dataclass
class Case:
  """One row to measure: forward(*args) -> output in `layout`; the arguments
  at `diff` are differentiated."""
  impl: str
  encoding: str
  path: str
  forward: object
  args: tuple
  diff: tuple
  layout: str = 'bhld'
  ref_bias: object = None       # the bias the reference adds (cudnn+bias)


def selfattn_case(impl, encoding, x, causal) -> Case:
  b, h, length, d = x['q'].shape
  relative = relative_for(encoding, h, d, length)
  hopper = impl in ('pallas_hopper', 'pallas_hopper_fused')
  attention_impl = 'pallas' if hopper else impl
  module = _Core(h * d, h, relative=relative, attention_impl=attention_impl,
                 dtype=x['q'].dtype, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(module, nnx.Param, ...)

  def forward(q, k, v, params):
    m = nnx.merge(graphdef, params, rest, copy=True)
    with contextlib.ExitStack() as stack:
      if hopper:
        from selfattn.nn import pallas_attention
        stack.enter_context(pallas_attention.hopper_in_auto())
      if impl == 'pallas_hopper_fused':
        stack.enter_context(hopper_backward.fused_in_tuned())
      return m._attend(q, k, v, None, mask=None, bias=None, causal=causal,
                       positions=None, key_positions=None,
                       deterministic=True)

  path = selfattn_path(attention_impl, relative)
  if hopper and path == 'pallas':
    path = HOPPER_PATH
    if impl == 'pallas_hopper_fused' and encoding in FUSED_ENCODINGS:
      path = 'pallas (hopper, one-kernel backward)'
  return Case(row_impl(impl), encoding, path, forward,
              (x['q'], x['k'], x['v'], params), (0, 1, 2, 3))


def alibi_bias(heads: int, length: int, dtype) -> jax.Array:
  """ALiBi's (1, H, L, L) bias (selfattn.ALiBi's values), materialized in
  `dtype` by one fused computation (no float32 copy of that size)."""
  def make():
    q = jnp.zeros((1, heads, length, 1), dtype)
    return selfattn.ALiBi(heads).logits(q, q).astype(dtype)
  return jax.jit(make)()


def peer_case(peer, x, causal, gpu: bool) -> Case | str:
  """The peer's Case, or the reason it is skipped here."""
  b, h, length, d = x['q'].shape
  scale = 1.0 / math.sqrt(d)
  blhd = (x['q_t'], x['k_t'], x['v_t'])
  if peer in GPU_ONLY and not gpu:
    return f'skipped: needs a CUDA GPU (backend is {jax.default_backend()})'
  if peer == 'flax':
    def forward(q, k, v):
      return nnx.dot_product_attention(q, k, v, is_causal=causal)
    return Case('flax', 'none', 'nnx.dot_product_attention', forward, blhd,
                (0, 1, 2), 'blhd')
  if peer == 'cudnn':
    def forward(q, k, v):
      return jax.nn.dot_product_attention(q, k, v, is_causal=causal,
                                          implementation='cudnn')
    return Case('cudnn', 'none', 'jax.nn cudnn', forward, blhd, (0, 1, 2),
                'blhd')
  if peer == 'cudnn+bias':
    bias = alibi_bias(h, length, x['q'].dtype)

    def forward(q, k, v, bias):
      return jax.nn.dot_product_attention(q, k, v, bias=bias, is_causal=causal,
                                          implementation='cudnn')
    return Case('cudnn+bias', 'bias (1,H,L,L)', 'jax.nn cudnn, bias', forward,
                blhd + (bias,), (0, 1, 2), 'blhd', ref_bias=bias)
  if peer == 'pallas_mha':
    try:
      from jax.experimental.pallas.ops.gpu import attention as pallas_gpu
    except Exception as e:  # noqa: BLE001
      return f'unsupported: jax.experimental.pallas.ops.gpu.attention: {e}'
    interpret = not gpu
    if interpret and length > 256:
      return 'skipped: interpret mode on the CPU is for L <= 256'

    def forward(q, k, v):
      return pallas_gpu.mha(q, k, v, segment_ids=None, sm_scale=scale,
                            causal=causal, interpret=interpret)
    path = 'pallas mha (interpret)' if interpret else 'pallas mha'
    return Case('pallas_mha', 'none', path, forward, blhd, (0, 1, 2), 'blhd')
  if peer == 'pallas_mgpu':
    try:
      from jax.experimental.pallas.ops.gpu import attention_mgpu
    except Exception as e:  # noqa: BLE001
      return f'unsupported: jax.experimental.pallas.ops.gpu.attention_mgpu: {e}'
    if d % 64:
      return f'unsupported: attention_mgpu needs D % 64 == 0 (D = {d})'
    if causal:
      return 'unsupported: attention_mgpu has no causal backward pass'
    config = attention_mgpu.TuningConfig(
        block_q=64, block_kv=128, max_concurrent_steps=2, block_q_dkv=64,
        block_kv_dkv=64, block_q_dq=64, block_kv_dq=64)
    # Its shared-memory buffers are float16 whatever the inputs (JAX 0.11.2
    # and 0.12): bfloat16 fails to lower ('Expected dtypes to match', run 1
    # on the H200). So a bfloat16 run times it in float16, the same bytes
    # and tensor-core rate. It does not scale the logits: q comes scaled
    # by 1/sqrt(D) (exact for D = 64), as the other rows' kernels do inside.
    dtype = jnp.float16 if x['q'].dtype == jnp.bfloat16 else x['q'].dtype
    args = tuple(a.astype(dtype) for a in (blhd[0] * scale,) + blhd[1:])

    def forward(q, k, v):
      return attention_mgpu.attention(q, k, v, config)
    path = 'pallas mosaic-gpu' + (
        f' ({jnp.dtype(dtype).name})' if dtype != x['q'].dtype else '')
    return Case('pallas_mgpu', 'none', path, forward, args, (0, 1, 2), 'blhd')
  if peer in ('tokamax', 'tokamax_tuned', 'tokamax+bias'):
    try:
      tokamax = tokamax_peer.load()
    except Exception as e:  # noqa: BLE001
      return f'unsupported: tokamax does not import here ({_short(e)})'
    implementation = 'mosaic' if gpu else 'xla'
    if peer == 'tokamax_tuned':    # GPU_ONLY: its configs are Mosaic GPU's
      capability = getattr(jax.devices()[0], 'compute_capability', '?')
      if not capability.startswith('9.'):
        return (f'unsupported: tokamax\'s H100 configs are sm90 kernels\' '
                f'(compute capability {capability})')
      tuned = tokamax_peer.tuned_op(blhd[0].shape,
                                    jnp.dtype(blhd[0].dtype).name, causal)
      if isinstance(tuned, str):
        return tuned
      op, path = tuned
      return Case('tokamax_tuned', 'none', path,
                  tokamax_peer.attention(tokamax, op, causal), blhd,
                  (0, 1, 2), 'blhd')
    forward = tokamax_peer.attention(tokamax, implementation, causal)
    path = f'tokamax {implementation}'
    if peer == 'tokamax':
      return Case('tokamax', 'none', path, forward, blhd, (0, 1, 2), 'blhd')
    bias = alibi_bias(h, length, x['q'].dtype)
    return Case('tokamax+bias', 'bias (1,H,L,L)', path + ', bias', forward,
                blhd + (bias,), (0, 1, 2), 'blhd', ref_bias=bias)
  raise ValueError(f'unknown peer {peer!r}; valid: {", ".join(PEERS)}')


def grad_step(case: Case):
  """jit of what --mode times. 'train': the loss sum(forward * g) and its
  gradients w.r.t. the case's `diff` (the value too, so that every path
  runs its forward: a backward that needs nothing of the forward's output,
  as the Pallas kernel's recomputing one did in run 1, would otherwise let
  XLA drop the forward kernel).
  'forward': the output alone. g is the last argument."""
  def loss(*args):
    out = case.forward(*args[:-1])
    return jnp.sum(out.astype(jnp.float32) * args[-1])
  if _MODE.value == 'forward':
    return jax.jit(loss)
  return jax.jit(jax.value_and_grad(loss, argnums=case.diff))


def _to_bhld(out, layout):
  return out if layout == 'bhld' else jnp.swapaxes(out, 1, 2)


# --------------------------------------------------------------------------
# Measuring one row.
# --------------------------------------------------------------------------

KERNEL_PATTERNS = (('cudnn-fmha', '__cudnn$fmha'), ('triton', 'triton'),
                   ('mosaic-gpu', 'mosaic'))


def kernels_in(hlo_text: str) -> tuple[str, list[str]]:
  """(label, distinct custom-call targets) of a compiled HLO text."""
  targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', hlo_text)))
  found = [label for label, pattern in KERNEL_PATTERNS
           if any(pattern in t for t in targets)]
  return (','.join(found) or 'xla'), targets


def _short(e: BaseException) -> str:
  text = f'{type(e).__name__}: {e}'.strip().splitlines()
  return text[0][:240] if text else type(e).__name__


def _is_oom(e: BaseException) -> bool:
  text = str(e)
  return ('RESOURCE_EXHAUSTED' in text or 'Out of memory' in text
          or 'out of memory' in text)


def measure(case: Case, cotangent, flops: float, repeats: int, warmup: int
            ) -> dict:
  row = {'path': case.path}
  started = time.perf_counter()
  try:
    fn = grad_step(case)
    args = case.args + (cotangent,)
    compiled = fn.lower(*args).compile()
  except Exception as e:  # noqa: BLE001
    row['status'] = (('OOM at compile: ' if _is_oom(e) else 'unsupported: ')
                     + _short(e))
    return row
  row['compile_s'] = time.perf_counter() - started
  try:
    row['kernel'], row['custom_calls'] = kernels_in(compiled.as_text())
  except Exception:  # noqa: BLE001
    row['kernel'], row['custom_calls'] = '?', []
  try:
    m = compiled.memory_analysis()
    row['compiled_mib'] = (m.argument_size_in_bytes + m.output_size_in_bytes
                           + m.temp_size_in_bytes) / 2 ** 20
    row['temp_mib'] = m.temp_size_in_bytes / 2 ** 20
    stats = _memory_stats()
    if 'bytes_limit' in stats:
      free = stats['bytes_limit'] - stats.get('bytes_in_use', 0)
      need = m.output_size_in_bytes + m.temp_size_in_bytes
      if need > free:
        row['status'] = (f'OOM (predicted: needs {need / 2 ** 30:.1f} GiB '
                         f'beyond its inputs, {free / 2 ** 30:.1f} GiB free)')
        return row
  except Exception:  # noqa: BLE001  (memory_analysis is optional)
    pass
  before = _memory_stats().get('peak_bytes_in_use')
  try:
    median, fastest = _median_seconds(compiled, args, repeats, warmup)
  except Exception as e:  # noqa: BLE001
    row['status'] = (('OOM at run: ' if _is_oom(e) else 'error at run: ')
                     + _short(e))
    return row
  after = _memory_stats().get('peak_bytes_in_use')
  if after is not None and (before is None or after > before):
    row['peak_mib'] = after / 2 ** 20
  row.update(status='ok', ms=1e3 * median, ms_min=1e3 * fastest,
             tflops=flops / median / 1e12)
  return row


def reference_output(encoding: str, x: dict, causal: bool, bias=None):
  """selfattn's plain path in float32 at 'highest' precision, (B, H, L, D)."""
  b, h, length, d = x['q'].shape
  relative = relative_for(encoding, h, d, length)
  q, k, v = (x[n].astype(jnp.float32) for n in 'qkv')
  if bias is not None:
    bias = bias.astype(jnp.float32)
  with jax.default_matmul_precision('highest'):
    out, _ = sa_attention.dot_product_attention(
        q, k, v, causal=causal, relative=relative, bias=bias)
  return out


def relative_error(case: Case, reference) -> float:
  with jax.default_matmul_precision('highest'):
    out = jax.jit(case.forward)(*case.args)
  out = _to_bhld(out, case.layout).astype(jnp.float32)
  return float(jnp.linalg.norm(out - reference) / jnp.linalg.norm(reference))


# --------------------------------------------------------------------------
# The run.
# --------------------------------------------------------------------------

def inputs(batch, heads, length, head_dim, dtype) -> dict:
  keys = jax.random.split(jax.random.key(length), 4)
  shape = (batch, heads, length, head_dim)
  x = {n: jax.random.normal(key, shape, dtype) for n, key in zip('qkv', keys)}
  x.update({f'{n}_t': jnp.swapaxes(x[n], 1, 2) for n in 'qkv'})
  x['g'] = jax.random.normal(keys[3], shape, jnp.float32)
  x['g_t'] = jnp.swapaxes(x['g'], 1, 2)
  return jax.block_until_ready(x)


def attention_flops(batch, heads, length, head_dim, causal) -> float:
  forward = 4.0 * batch * heads * length * length * head_dim
  factor = 1.0 if _MODE.value == 'forward' else 3.5
  return factor * forward / (2 if causal else 1)


def row_plan(lengths, masks, peers, encodings, impls) -> list[tuple]:
  """(length, causal, encoding or 'peer', impl or peer) of every row, in the
  order they run: per length and mask the targets' denominators
  (DENOMINATOR_PEERS), then the encodings' rows, then the other peers. A
  time budget stops new rows, so one that ends early cuts the peers that
  are there for context, not a target's row."""
  plan = []
  for length in lengths:
    for causal in masks:
      first = [p for p in peers if p in DENOMINATOR_PEERS]
      plan += [(length, causal, 'peer', p) for p in first]
      plan += [(length, causal, e, i) for e in encodings for i in impls]
      plan += [(length, causal, 'peer', p) for p in peers if p not in first]
  return plan


def add_ratios(rows: list[dict]) -> None:
  base = {}
  for r in rows:
    if r['impl'] in ('flax', 'cudnn') and r.get('status') == 'ok':
      base[(r['impl'], r['length'], r['causal'])] = r['ms']
  for r in rows:
    for peer in ('flax', 'cudnn'):
      t = base.get((peer, r['length'], r['causal']))
      if t and r.get('status') == 'ok':
        r[f'x_{peer}'] = r['ms'] / t


def fused_reach(rows: list[dict]) -> dict:
  """encoding -> {causal: kernel label} of attention_impl='fused', from the
  first length where it compiled."""
  out = {}
  for r in rows:
    if r['impl'] == row_impl('fused') and 'kernel' in r:
      key = 'causal' if r['causal'] else 'bidirectional'
      out.setdefault(r['encoding'], {}).setdefault(key, {
          'length': r['length'], 'path': r['path'], 'kernel': r['kernel'],
          'reaches_cudnn': 'cudnn-fmha' in r['kernel']})
  return out


def _fmt(v, spec):
  return '' if v is None else format(v, spec)


COLUMNS = ['length', 'batch', 'causal', 'encoding', 'impl', 'path', 'kernel',
           'ms', 'TFLOP/s', 'of peak', 'of matmul', 'compiled MiB', 'peak MiB',
           'x flax', 'x cudnn', 'rel err', 'status']
TEXT_COLUMNS = ('causal', 'encoding', 'impl', 'path', 'kernel', 'status')


def markdown(result: dict) -> str:
  m = result['machine']
  what = ('forward' if result.get('mode') == 'forward'
          else 'forward+backward')
  lines = [f'# Attention {what} on {m["device_kind"]} '
           f'({m["platform"]}), JAX {m["jax"]}, {result["dtype"]}'
           f'{" (smoke)" if result["smoke"] else ""}', '',
           f'- H = {result["heads"]} heads, D = {result["head_dim"]}, batch = '
           f'{result["batch_rule"]}.',
           f'- {FLOP_CONVENTION}',
           f'- Peak: {_fmt(result["peak_tflops"], ".0f") or "unknown"} TFLOP/s '
           f'({result["peak_source"]}); measured {result["matmul_label"]}: '
           f'{result["matmul_tflops"]:.1f} TFLOP/s.',
           '- ms: median over the timed runs; compiled MiB: arguments + '
           'outputs + temporaries of the compiled function; peak MiB: the '
           "process's device high-water mark, shown when this row raised it; "
           "x flax / x cudnn: time over that peer's at the same length and "
           'mask; rel err: forward output against the float32 plain path '
           f'(L = {result["check_length"]} only).', '',
           '| ' + ' | '.join(COLUMNS) + ' |',
           '|' + '|'.join('---' if c in TEXT_COLUMNS else '---:'
                          for c in COLUMNS) + '|']
  # By length and mask; within them, in the order measured.
  for r in sorted(result['rows'], key=lambda r: (r['length'], r['causal'])):
    lines.append('| ' + ' | '.join([
        str(r['length']), str(r['batch']), 'yes' if r['causal'] else 'no',
        r['encoding'], r['impl'], r.get('path', ''), r.get('kernel', ''),
        _fmt(r.get('ms'), '.3f'), _fmt(r.get('tflops'), '.3g'),
        _fmt(r.get('of_peak'), '.1%'), _fmt(r.get('of_matmul'), '.1%'),
        _fmt(r.get('compiled_mib'), '.4g'), _fmt(r.get('peak_mib'), '.4g'),
        _fmt(r.get('x_flax'), '.2f'), _fmt(r.get('x_cudnn'), '.2f'),
        _fmt(r.get('rel_err'), '.1e'), r.get('status', '')]) + ' |')
  lines += ['', "## Which encodings reach cuDNN through attention_impl='fused'",
            '',
            reach_table(result['fused_reach'])]
  if result.get('targets'):
    lines += ['', "## Issue 47's targets (selfattn's pallas kernel over cuDNN "
              "without bias, this call; met only where measured)", '',
              targets_table(result['targets'])]
  if result.get('not_run'):
    lines += ['', f'Not run (time budget of {result["time_budget"]:.0f} s '
              f'spent): ' + ', '.join(result['not_run'])]
  return '\n'.join(lines) + '\n'


def reach_table(reach: dict) -> str:
  lines = ['| encoding | mask | length | path | kernel in the compiled '
           'fwd+bwd | cuDNN fused kernel |', '|---|---|---:|---|---|---|']
  for encoding, by_mask in reach.items():
    for mask, r in by_mask.items():
      lines.append(f'| {encoding} | {mask} | {r["length"]} | {r["path"]} | '
                   f'{r["kernel"]} | {"yes" if r["reaches_cudnn"] else "no"} |')
  return '\n'.join(lines)


def summary(result: dict) -> str:
  """ms per encoding (rows) and impl (columns) at one length, first mask."""
  rows = [r for r in result['rows'] if 'length' in r]
  lengths = sorted({r['length'] for r in rows if r.get('status') == 'ok'})
  if not lengths:
    return 'no row measured'
  length = (_SUMMARY_LENGTH.value if _SUMMARY_LENGTH.value in lengths
            else lengths[-1])
  causal = rows[0]['causal']
  impls = list(dict.fromkeys(r['impl'] for r in rows))
  encodings = list(dict.fromkeys(r['encoding'] for r in rows))
  cell = {}
  for r in rows:
    if r['length'] == length and r['causal'] == causal:
      cell[(r['encoding'], r['impl'])] = (
          f'{r["ms"]:.2f}' if r.get('status') == 'ok'
          else r.get('status', '').split(':')[0].split(' (')[0])
  lines = [f'ms at L = {length}, {"causal" if causal else "bidirectional"} '
           f'({"forward" if _MODE.value == "forward" else "forward+backward"}):',
           '',
           '| encoding | ' + ' | '.join(impls) + ' |',
           '|---|' + '---:|' * len(impls)]
  for e in encodings:
    lines.append(f'| {e} | ' + ' | '.join(cell.get((e, i), '')
                                          for i in impls) + ' |')
  lines += ['', f'Issue 47\'s targets at L = {length} (selfattn\'s pallas '
            f'kernel over cuDNN without bias, this call):', '',
            targets_table(targets(rows, length))]
  return '\n'.join(lines)


def write(result: dict) -> None:
  out = _OUT.value
  if not out:
    return
  os.makedirs(out, exist_ok=True)
  base = os.path.join(out, _NAME.value)
  with open(base + '.json.tmp', 'w') as f:
    json.dump(result, f, indent=1, default=str)
  os.replace(base + '.json.tmp', base + '.json')
  with open(base + '.md', 'w') as f:
    f.write(markdown(result))


def main(argv):
  del argv
  smoke = _SMOKE.value
  gpu = jax.default_backend() == 'gpu'
  def smoke_or(name, small, value):
    return small if smoke and not flags.FLAGS[name].present else value

  lengths = smoke_or('lengths', [128, 256], [int(n) for n in _LENGTHS.value])
  heads = smoke_or('heads', 2, _HEADS.value)
  head_dim = smoke_or('head_dim', 16, _HEAD_DIM.value)
  fixed_batch = smoke_or('batch', 2, _BATCH.value)
  dtype_name = _DTYPE.value or ('float32' if smoke else 'bfloat16')
  dtype = jnp.dtype(dtype_name)
  repeats = smoke_or('repeats', 3, _REPEATS.value)
  warmup = smoke_or('warmup', 1, _WARMUP.value)
  check_length = _CHECK_LENGTH.value or (
      _SUMMARY_LENGTH.value if _SUMMARY_LENGTH.value in lengths
      else min(lengths))
  masks = {'false': [False], 'true': [True], 'both': [False, True]}
  bad = [c for c in _CAUSAL.value if c.strip().lower() not in masks]
  if bad or not _CAUSAL.value:
    raise app.UsageError(f'--causal: {bad or _CAUSAL.value} unknown; valid: '
                         f'false, true, both (or false,true)')
  masks_to_run = list(dict.fromkeys(
      m for c in _CAUSAL.value for m in masks[c.strip().lower()]))
  for flag, valid in ((_ENCODINGS, ENCODINGS), (_IMPLS, IMPLS),
                      (_PEERS, PEERS)):
    for name in flag.value:
      if name not in valid:
        raise app.UsageError(f'--{flag.name}: {name!r} unknown; valid: '
                             f'{", ".join(valid)}')

  probe = probe_verdicts.load(_PROBE.value)
  started = time.perf_counter()
  info = machine()
  peak, source = _PEAK.value or None, '--peak_tflops'
  if peak is None:
    peak = datasheet_peak(info['device_kind']) if gpu else None
    source = ('datasheet bf16 dense' if peak
              else 'no datasheet figure for this device')
  mm_n = 8192 if gpu else 512
  mm_dtype = jnp.bfloat16 if gpu else jnp.float32
  mm = matmul_tflops(mm_n, mm_dtype, repeats)
  result = {
      'machine': info, 'smoke': smoke, 'dtype': dtype_name, 'heads': heads,
      'head_dim': head_dim,
      'batch_rule': (f'{fixed_batch}' if fixed_batch
                     else f'max(1, {_TOKENS.value} // L)'),
      'flop_convention': FLOP_CONVENTION, 'peak_tflops': peak,
      'peak_source': source, 'matmul_tflops': mm,
      'matmul_label': f'{jnp.dtype(mm_dtype).name} {mm_n}^3 matmul',
      'mode': _MODE.value,
      'repeats': repeats, 'warmup': warmup, 'time_budget': _BUDGET.value,
      'check_length': check_length if _CHECK.value else None,
      'rows': [], 'fused_reach': {}, 'not_run': [],
  }
  print(f'# bench_gpu --mode={_MODE.value} on {info["device_kind"]} ({info["platform"]}), JAX '
        f'{info["jax"]}, {dtype_name}, H={heads}, D={head_dim}; matmul '
        f'{mm:.1f} TFLOP/s; peak {peak} ({source})', flush=True)
  print(f'# {FLOP_CONVENTION}', flush=True)
  rows = result['rows']
  if _RESUME.value and _OUT.value:
    rows += earlier_rows(os.path.join(_OUT.value, _NAME.value + '.json'))
    result['resumed_rows'] = len(rows)
  done = {r.get('label') for r in rows}
  plan = row_plan(lengths, masks_to_run, _PEERS.value, _ENCODINGS.value,
                  _IMPLS.value)
  x, x_length, references = None, None, {}
  # Rows whose numbers a fallback row repeats (resumed ones too).
  measured = {(r['length'], r['causal'], r['encoding'], code_run(r['path'])): r
              for r in rows if r.get('path') and r['impl'].startswith(
                  row_impl(''))}
  for length, causal, encoding, impl in plan:
    label = f'L={length} {"causal" if causal else "bidir"} {encoding}/{impl}'
    if label in done:
      continue
    if _BUDGET.value and time.perf_counter() - started > _BUDGET.value:
      result['not_run'].append(label)
      continue
    batch = fixed_batch or max(1, _TOKENS.value // length)
    if x_length != length:
      x = None
      references.clear()
      try:
        x = inputs(batch, heads, length, head_dim, dtype)
      except Exception as e:  # noqa: BLE001
        print(f'  inputs at L={length} failed: {_short(e)}', flush=True)
      x_length = length
    row = {'label': label, 'length': length, 'batch': batch,
           'causal': causal}
    if x is None:
      row.update(encoding=encoding, impl=impl, status='OOM making the inputs')
      rows.append(row)
      continue
    skipped = None
    if encoding != 'peer':
      skipped = probe_verdicts.skip_reason(probe, encoding, impl, causal)
      if probe is not None:
        row['probe'] = probe_verdicts.note(probe, encoding, impl, causal)
    try:
      if skipped:
        case = skipped
      elif encoding == 'peer':
        case = peer_case(impl, x, causal, gpu)
      else:
        case = selfattn_case(impl, encoding, x, causal)
    except Exception as e:  # noqa: BLE001
      case = (('OOM making its inputs: ' if _is_oom(e) else 'unsupported: ')
              + _short(e))
    if isinstance(case, str):
      row.update(encoding=encoding if skipped else 'none',
                 impl=row_impl(impl) if skipped else impl, status=case)
    else:
      row.update(encoding=case.encoding, impl=case.impl)
      g = x['g'] if case.layout == 'bhld' else x['g_t']
      flops = attention_flops(batch, heads, length, head_dim, causal)
      # A row whose code an earlier row ran (a fallback to plain; a
      # pallas_hopper_fused row of an encoding with no one-kernel backward)
      # repeats that row's numbers.
      ran = (length, causal, encoding, code_run(case.path))
      reuse = measured.get(ran) if encoding != 'peer' else None
      if reuse is not None:
        row.update({k: v for k, v in reuse.items()
                    if k not in ('path', 'impl', 'encoding')})
        row['path'] = case.path
      else:
        try:
          row.update(measure(case, g, flops, repeats, warmup))
        except Exception as e:  # noqa: BLE001
          row['status'] = 'error: ' + _short(e)
          traceback.print_exc()
        if (_CHECK.value and length == check_length
            and row.get('status') == 'ok'):
          try:
            key = (case.encoding, causal)
            if key not in references:
              references[key] = reference_output(
                  'none' if encoding == 'peer' else encoding, x, causal,
                  case.ref_bias)
            row['rel_err'] = relative_error(case, references[key])
          except Exception as e:  # noqa: BLE001
            row['rel_err_error'] = _short(e)
        if encoding != 'peer':
          measured[ran] = dict(row)
      if row.get('status') == 'ok':
        if peak:
          row['of_peak'] = row['tflops'] / peak
        row['of_matmul'] = row['tflops'] / mm
    rows.append(row)
    add_ratios(rows)
    result['fused_reach'] = fused_reach(rows)
    result['seconds'] = time.perf_counter() - started
    write(result)
    print(f'  {label:42s} {row.get("path", ""):32s} '
          f'{row.get("kernel", ""):11s} {_fmt(row.get("ms"), "9.3f")} ms '
          f'{_fmt(row.get("compiled_mib"), "8.0f")} MiB '
          f'{_fmt(row.get("rel_err"), ".1e")} {row.get("status", "")}',
          flush=True)
    if gpu and lost_device(row):
      print(f'\nthe device was lost after {label}: exiting with status '
            f'{LOST_DEVICE} (--resume continues in a fresh process)',
            flush=True)
      sys.exit(LOST_DEVICE)
  result['seconds'] = time.perf_counter() - started
  result['targets'] = targets(rows, _SUMMARY_LENGTH.value)
  write(result)
  if result['not_run']:
    print(f'\nnot run (time budget): {len(result["not_run"])} rows, from '
          f'{result["not_run"][0]}')
  print('\n## Which encodings reach cuDNN through attention_impl=\'fused\'\n')
  print(reach_table(result['fused_reach']))
  print('\n' + summary(result))
  print(f'\ntotal {result["seconds"]:.0f} s'
        + (f'; wrote {os.path.join(_OUT.value, _NAME.value)}.json and .md'
           if _OUT.value else ''))


if __name__ == '__main__':
  app.run(main)

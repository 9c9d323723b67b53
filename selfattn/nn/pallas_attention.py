"""Pallas flash attention whose relative terms are computed inside the
kernels from small tables (`attention_impl='pallas'`): forward, and a
backward of two kernels (dQ with the table gradients; dK and dV), all
O(L) memory. The kernel bodies and what they compute are in
pallas_kernels.py; this module lays the arrays out for each backend,
chooses the backend per lowering platform and wires the custom VJP.

Encodings: none; ALiBi (both forms, from its slopes); T5 (from its
(num_buckets, H) table); Shaw (a^K and a^V, (2k + 1, D) shared or
(H, 2k + 1, D) per head); rotation-only encodings (RoPE, PoPE) rotate q and
k once outside the kernel (O(L D)) and then use the 'none' kernel.
Gradients reach q, k, v and the T5 and Shaw tables. For Triton (and
interpret mode) this module also makes the tables the kernels gather
T5's and Shaw's terms from: each head's T5 bias per offset, and Shaw's
rows of scale log2(e) q a^K^T and of dO a^V^T, (B * H, Lq_pad, 2k + 1)
float32, O(L k) (pallas_kernels.Gathered; Mosaic TPU selects per bucket
instead).

Causal masking (key j is allowed for query i iff j <= i + Lk - Lq) and a key
padding mask (B, Lk) are applied per block, and the loops skip the blocks
the causal mask removes. A query row with no allowed key outputs zeros, as
the plain path does.

On a Hopper GPU (sm90) none, ALiBi, T5, Shaw and the rotation-only
encodings in bf16 or f16 with key lengths (not a general key mask) can run
the Mosaic GPU forward of hopper_attention.py instead, and the Mosaic GPU
backward of hopper_backward.py (dQ with T5's and Shaw's table gradients,
dK/dV; Shaw's where its table rows fit in shared memory, else the Triton
pair): `gpu_kernel='hopper'`, or 'auto' under
hopper_in_auto() (by default once AUTO_TAKES_HOPPER is set, after a GPU has
run them). A call with no logit term (none, or a rotation), key lengths and
16-bit inputs can go to cuDNN's flash attention instead (cudnn_flash.py,
gpu_kernel='cudnn'; 'auto' once AUTO_TAKES_CUDNN is set), which an H100 ran
2.8x faster than the Triton kernel for it.

Backends, chosen when the step is lowered (jax.lax.platform_dependent), not
by the host's default backend: Triton for 'cuda' and 'rocm', named
explicitly, so the choice does not rest on JAX's default, which has moved
between releases (Triton in 0.12.0.1; Mosaic GPU's pallas_call, where it was
the default, takes async copies of <= 256 rows and would stage each head's
whole K and V in shared memory); Mosaic for 'tpu'; interpret mode for 'cpu' (correctness, not
speed). tests/nn/test_lowering.py lowers every case for 'cuda' and 'tpu' from
the CPU. A module lowered for several platforms at once is refused by Pallas
(each branch's compiler parameters name one backend); lower one platform at
a time.

Supported: positions None (0..L-1) only; key padding only (no general
(Lq, Lk) mask, no float bias); no dropout on the weights; no Huang or
Transformer-XL terms. MultiHeadAttention falls back to the plain path for
everything else (see its attention_impl paragraph).
"""

from __future__ import annotations

import contextlib
import functools
import math
from typing import Iterator

import jax
import jax.numpy as jnp
from absl import logging
from jax.experimental import pallas as pl

from selfattn.nn import cudnn_flash
from selfattn.nn import hopper_attention as hopper
from selfattn.nn import hopper_backward
from selfattn.nn import masks
from selfattn.nn import pallas_kernels as kernels
from selfattn.nn import positions
from selfattn.nn.gpu_kernels import GPU_KERNELS
from selfattn.nn.cudnn_flash import cudnn_traceable
from selfattn.nn.pallas_kernels import Config
from selfattn.nn.pallas_kernels import TritonLaunch
from selfattn.nn.pallas_kernels import TritonTuning

BLOCK_Q = 128
BLOCK_K = 128
_default_gpu_kernel = ['auto']
# 'auto' hands the calls with no logit term (none, rotations) to cuDNN
# (cudnn_flash.py) only once that route has run on a GPU. cuDNN's kernel
# has run there (issue 47's table: 2.8x the Triton kernel's speed for this
# case); this route into it, with key_value_seq_lengths, has not. Set True
# after a GPU session passes tests/nn/test_cudnn_flash.py; read at tracing.
# Under 'auto' it then takes such calls before the Hopper kernels would.
AUTO_TAKES_CUDNN = False
# 'auto' takes the Hopper kernels only once they have run on a GPU: until a
# lent H100/H200 has compiled, checked and timed them (BENCHMARKS.md, GPU
# section), 'auto' keeps the Triton kernels, which an H100 has run. Set
# True after that run; read at tracing, as AUTO_TAKES_CUDNN is.
# hopper_in_auto() overrides it around a block of tracing (the bench's
# pallas_hopper row, the lowering tests).
AUTO_TAKES_HOPPER = False
_hopper_in_auto_overrides: list[bool] = []


@contextlib.contextmanager
def hopper_in_auto(enabled: bool = True) -> Iterator[None]:
  """Inside it, gpu_kernel='auto' takes the Hopper kernels where they
  apply (or, with enabled=False, does not), whatever AUTO_TAKES_HOPPER
  says."""
  _hopper_in_auto_overrides.append(bool(enabled))
  try:
    yield
  finally:
    _hopper_in_auto_overrides.pop()


_gather_terms = [True]


@contextlib.contextmanager
def selected_terms() -> Iterator[None]:
  """Inside it (read at tracing), T5's and Shaw's terms are selected per
  bucket on every backend, the form Mosaic TPU runs, instead of Triton's
  gathered loads (pallas_kernels.Gathered): the CPU tests run the TPU's
  form in interpret mode with it."""
  _gather_terms.append(False)
  try:
    yield
  finally:
    _gather_terms.pop()


def _auto_takes_hopper() -> bool:
  """AUTO_TAKES_HOPPER, or the innermost hopper_in_auto's choice."""
  if _hopper_in_auto_overrides:
    return _hopper_in_auto_overrides[-1]
  return AUTO_TAKES_HOPPER


@contextlib.contextmanager
def default_gpu_kernel(name: str) -> Iterator[None]:
  """Inside it, pallas_attention calls that name no `gpu_kernel` use
  `name` (one of GPU_KERNELS): a whole model's choice, e.g. the Triton
  forward on a Hopper to compare the two (scripts/bench_gpu.py). Read when
  a function is traced, so wrap the tracing (jit's first call, `lower`)."""
  if name not in GPU_KERNELS:
    raise ValueError(f'gpu_kernel={name!r}; choose one of {GPU_KERNELS}')
  _default_gpu_kernel.append(name)
  try:
    yield
  finally:
    _default_gpu_kernel.pop()


@functools.cache
def _warn_cudnn_refused(message: str) -> None:
  """Logged once per distinct refusal (every trace would repeat it)."""
  logging.warning("gpu_kernel='auto': cuDNN refused the call (%s); the "
                  'Pallas kernels run it instead', message)


def _is_rotation_only(relative) -> bool:
  """A RelativePosition that only rotates q and k (RoPE, PoPE)."""
  base = positions.RelativePosition
  if not isinstance(relative, base):
    return False
  cls = type(relative)
  return (cls.logits is base.logits and cls.values is base.values
          and cls.blockwise_logits is base.blockwise_logits)


def kernel_kind(relative) -> str | None:
  """The kernels' name for an encoding ('none' for no encoding, an absolute
  one or a rotation-only one, RoPE, PoPE or a user's; 'alibi', 't5',
  'shaw' for exactly those classes), or None where they do not compute it.
  Reads only the encoding's type, so an abstract module (nnx.eval_shape)
  answers too."""
  if relative is None or _is_rotation_only(relative):
    return 'none'
  # The class itself, not a subclass: the kernels recompute its term from
  # its tables with their own copy of its bucketing, which a subclass may
  # have changed anywhere (a private helper included).
  for kind, cls in (('alibi', positions.ALiBi),
                    ('t5', positions.T5RelativeBias),
                    ('shaw', positions.ShawRelative)):
    if type(relative) is cls:
      return kind
  return None


def _describe(relative):
  """(kind, table, options) of a supported encoding, or None if it is not."""
  kind = kernel_kind(relative)
  if kind == 'alibi':
    slopes = jnp.asarray(positions.alibi_slopes(relative.num_heads),
                         jnp.float32)
    return 'alibi', slopes, {'symmetric': bool(relative.symmetric)}
  if kind == 't5':
    return 't5', relative.bias[...], {
        'num_buckets': int(relative.num_buckets),
        'max_distance': int(relative.max_distance)}
  if kind == 'shaw':
    a_v = None if relative.a_V is None else relative.a_V[...]
    return 'shaw', (relative.a_K[...], a_v), {
        'clip': int(relative.clip_distance),
        'shared_heads': bool(relative.shared_heads)}
  return None if kind is None else ('none', None, {})


def supports(relative) -> bool:
  """Whether pallas_attention computes this encoding: none, ALiBi (both
  forms), T5, Shaw (key and value terms), and rotation-only encodings (RoPE,
  PoPE)."""
  return _describe(relative) is not None


def gpu_kernel_problem(gpu_kernel: str, relative, dtype, num_heads: int,
                       head_dim: int, causal: tuple[bool, ...] = (False,)
                       ) -> str | None:
  """Why `gpu_kernel` would refuse a model's self-attention, or None: what
  pallas_attention checks when a call is traced, asked of the model before
  any work (config validation). relative: the model's encoding hooks (None
  for none or an absolute encoding), built with its parameters; dtype: the
  activations'; causal: the values the model's calls take. Lengths, which
  no kernel refuses, are not asked about."""
  if gpu_kernel not in GPU_KERNELS:
    return f'gpu_kernel={gpu_kernel!r}; choose one of {GPU_KERNELS}'
  kind = kernel_kind(relative)
  if kind is None:
    return (f'the Pallas kernels do not compute {type(relative).__name__} '
            f'(they compute none, alibi, t5, shaw, rope and pope); '
            f'attention_impl=pallas runs the plain path for it')
  if gpu_kernel in ('auto', 'triton'):
    return None
  q = jax.ShapeDtypeStruct((1, num_heads, BLOCK_Q, head_dim), dtype)
  if relative is not None:
    q, _ = jax.eval_shape(lambda q, k: relative.rotate(q, k), q, q)
  width = max(q.shape[-1], head_dim)
  v = jax.ShapeDtypeStruct((1, num_heads, BLOCK_Q, head_dim), dtype)
  for is_causal in causal:
    if gpu_kernel == 'hopper':
      options = {} if kind != 'shaw' else dict(
          clip=int(relative.clip_distance),
          values=relative.a_V is not None)
      if not hopper.supports(kind, dtype, width, causal=is_causal, **options):
        return (f"gpu_kernel='hopper' computes {hopper.KINDS} ('none': no "
                f'encoding, an absolute one, RoPE or PoPE) in bfloat16 or '
                f'float16 with heads up to {hopper.MAX_HEAD} wide, where its '
                f'shared memory fits (for Shaw, by its clip distance); got '
                f'{kind}, {jnp.dtype(dtype).name}, heads {width} wide'
                f"{f', clip {relative.clip_distance}' if kind == 'shaw' else ''}")
    elif not cudnn_flash.computes(q, q, v, kind=kind, causal=is_causal,
                                  key_mask=False):
      return ("gpu_kernel='cudnn' computes no encoding, an absolute one or "
              'RoPE (no logit term, one head width: PoPE widens q and k) in '
              'bfloat16 or float16, heads a multiple of 8 up to 128 wide; '
              f'got {type(relative).__name__ if relative else "no term"} '
              f'({kind}), {jnp.dtype(dtype).name}, q/k heads {q.shape[-1]} '
              f'and v heads {head_dim} wide')
  if (gpu_kernel == 'hopper' and cudnn_traceable()
      and not hopper.lowering_for_hopper()):
    return ("gpu_kernel='hopper' needs an sm90 GPU (H100, H200) and JAX "
            f'0.11 or later; this process has {jax.devices("cuda")[0].device_kind}'
            f' and JAX {jax.__version__}')
  if gpu_kernel == 'cudnn' and not cudnn_traceable():
    return ("gpu_kernel='cudnn' needs a CUDA GPU in this process (cuDNN is "
            f'traced there); this one has {jax.default_backend()}')
  return None


# --------------------------------------------------------------------------
# Laying the arrays out for one backend.
# --------------------------------------------------------------------------

class _Arrays:
  """One call's operands padded to a backend's layout, with their
  BlockSpecs. Queries are tiled by the grid's second axis in
  query-major kernels (forward, dQ), keys in the key-major one (dK/dV);
  the other side is one whole (padded) ref per head, read block by block
  inside the kernel's loop (on Triton a ref is a pointer, each pl.ds load
  one tile; on Mosaic TPU the head's rows sit in VMEM)."""

  def __init__(self, cfg: Config, backend: str, q, k, v, key_valid, table):
    b, h, lq, dq = q.shape
    lk, dv = k.shape[2], v.shape[3]
    self.cfg, self.backend = cfg, backend
    self.b, self.h, self.lq, self.lk, self.dq, self.dv = b, h, lq, lk, dq, dv
    self.lay = lay = kernels.layout(cfg, backend, lq, lk, dq, dv)
    self.lq_pad = kernels.round_up(lq, lay.block_q)
    self.lk_pad = kernels.round_up(lk, lay.block_k)
    self.q = self.rows(q, self.lq_pad, lay.head_q)
    self.k = self.rows(k, self.lk_pad, lay.head_q)
    self.v = self.rows(v, self.lk_pad, lay.head_v)
    self.valid = self.lengths = None
    if key_valid is not None:
      valid = jnp.pad(key_valid.astype(jnp.int32),
                      [(0, 0), (0, self.lk_pad - lk)])
      self.valid = valid[:, None, :]                          # (B, 1, Lk_pad)
      if cfg.key_prefix:
        # Each batch row's key length, one (1, lanes) tile per row.
        lengths = key_valid.sum(-1, dtype=jnp.int32)
        self.lengths = jnp.broadcast_to(lengths[:, None, None],
                                        (b, 1, lay.stat_lanes))
    self.tables = []
    if cfg.kind in ('alibi', 't5'):
      # One (1, lanes) tile per head: (H,) slopes broadcast, or the head's
      # num_buckets biases zero-padded.
      per_head = (jnp.asarray(table, jnp.float32)[:, None]
                  if cfg.kind == 'alibi'
                  else jnp.asarray(table).T.astype(jnp.float32))
      tile = (jnp.broadcast_to(per_head, (h, lay.lanes))
              if per_head.shape[1] == 1
              else jnp.pad(per_head, [(0, 0), (0, lay.lanes - per_head.shape[1])]))
      self.tables.append(tile[:, None, :])                    # (H, 1, lanes)
      if cfg.kind == 't5' and lay.gathers:
        self.tables.append(self.t5_offsets(table))       # (H, 1, offset_lanes)
    elif cfg.kind == 'shaw':
      for t, width in zip(table, (lay.head_q, lay.head_v)):   # (H, 2k + 1, D)
        if t is not None:
          self.tables.append(jnp.pad(t, [(0, 0), (0, lay.table_rows - t.shape[1]),
                                         (0, width - t.shape[2])]))

  def t5_offsets(self, table):
    """(H, 1, offset_lanes) float32: each head's bias of offsets -M..M in
    base-2 units, zero-padded (the gathered T5 term, kernels.Gathered)."""
    m = self.cfg.max_distance
    buckets = positions.t5_bucket(jnp.arange(-m, m + 1), self.cfg.num_buckets,
                                  m)
    per_offset = kernels.LOG2E * jnp.asarray(table, jnp.float32)[buckets].T
    return jnp.pad(per_offset, [(0, 0), (0, self.lay.offset_lanes - 2 * m - 1)]
                   )[:, None, :]

  def shaw_rows(self, x, table, scale: float):
    """(B * H, Lq_pad, 2k + 1) float32: scale x t^T per query row, of rows
    x (B * H, Lq_pad, W) (q or dO) and Shaw's padded (H, rows, W) table t
    (a^K or a^V): the gathered Shaw term (kernels.Gathered), O(L k)."""
    n = 2 * self.cfg.clip + 1
    x = x.reshape(self.b, self.h, *x.shape[1:])
    out = jnp.einsum('bhld,hrd->bhlr', x, table[:, :n].astype(x.dtype),
                     preferred_element_type=jnp.float32)
    return (scale * out).reshape(self.b * self.h, x.shape[2], n)

  def gathered_rows(self, do=None):
    """The Shaw rows the kernels gather from, in Refs.pop order: q a^K^T,
    and dO a^V^T when do (the backward's dO rows) is given."""
    if not (self.cfg.kind == 'shaw' and self.lay.gathers):
      return []
    out = [self.shaw_rows(self.q, self.tables[0],
                          kernels.logit_scale(self.cfg))]
    if do is not None and self.cfg.shaw_values:
      out.append(self.shaw_rows(do, self.tables[1], 1.0))
    return out

  def rows(self, x, length: int, width: int):
    """(B, H, L, D) -> (B * H, length, width), zero-padded."""
    x = jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]),
                    (0, width - x.shape[3])])
    return x.reshape(self.b * self.h, length, width)

  def stats(self, x):
    """(B, H, Lq) float32 -> (B * H, Lq_pad, stat_lanes)."""
    x = jnp.pad(x.astype(jnp.float32), [(0, 0), (0, 0), (0, self.lq_pad - self.lq)])
    x = x.reshape(self.b * self.h, self.lq_pad, 1)
    return jnp.broadcast_to(x, x.shape[:2] + (self.lay.stat_lanes,))

  def tiled(self, width: int, block: int):
    """The spec of a (B * H, L_pad, width) operand tiled by the grid."""
    return pl.BlockSpec((None, block, width), lambda r, i: (r, i, 0))

  def whole(self, length: int, width: int):
    """The spec of a (B * H, length, width) operand, one ref per head."""
    return pl.BlockSpec((None, length, width), lambda r, i: (r, 0, 0))

  def extra(self, key_tiled: bool, gathered_rows=()):
    """(inputs, specs) of the key mask, the tables and Shaw's gathered rows
    (whole per batch row and head), in Refs.pop order."""
    h, lay = self.h, self.lay
    inputs, specs = [], []
    if self.valid is not None:
      inputs.append(self.valid)
      if key_tiled:
        specs.append(pl.BlockSpec((None, 1, lay.block_k),
                                  lambda r, j: (jax.lax.div(r, h), 0, j)))
      else:
        specs.append(pl.BlockSpec((None, 1, self.lk_pad),
                                  lambda r, i: (jax.lax.div(r, h), 0, 0)))
    if self.lengths is not None:
      inputs.append(self.lengths)
      specs.append(pl.BlockSpec((None, 1, lay.stat_lanes),
                                lambda r, i: (jax.lax.div(r, h), 0, 0)))
    for t in self.tables:
      inputs.append(t)
      specs.append(pl.BlockSpec((None,) + t.shape[1:],
                                lambda r, i: (jax.lax.rem(r, h), 0, 0)))
    for x in gathered_rows:
      inputs.append(x)
      specs.append(self.whole(*x.shape[1:]))
    return inputs, specs

  def call(self, kernel, grid_blocks: int, inputs, in_specs, out_shape,
           out_specs, pass_name: str):
    """The pallas_call of one pass ('forward', 'dq' or 'dkdv'), named
    selfattn_flash_<pass> in the lowered module."""
    return pl.pallas_call(
        kernel, out_shape=out_shape, grid=(self.b * self.h, grid_blocks),
        in_specs=in_specs, out_specs=out_specs,
        interpret=self.backend == 'interpret',
        compiler_params=_compiler_params(self.backend, self.cfg, self.lay,
                                         pass_name),
        name=f'selfattn_flash_{pass_name}',
    )(*inputs)

  def unrows(self, x, length: int, width: int):
    """(B * H, L_pad, D_pad) -> (B, H, length, width)."""
    return x.reshape(self.b, self.h, x.shape[1], x.shape[2])[
        :, :, :length, :width]


def _compiler_params(backend: str, cfg: Config, lay: kernels.Layout,
                     pass_name: str):
  """The backend named explicitly, not left to JAX's default, which has
  moved between releases (module docstring); on Triton, the pass's
  warps and stages (cfg.triton, or kernels.default_triton_tuning)."""
  if backend == 'triton':
    from jax.experimental.pallas import triton as pltriton
    launch = kernels.triton_launch(cfg.triton, pass_name, lay.head_q)
    return pltriton.CompilerParams(num_warps=launch.num_warps,
                                   num_stages=launch.num_stages)
  if backend == 'mosaic_tpu':
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel'))
  return None


# --------------------------------------------------------------------------
# The pallas_calls of one backend.
# --------------------------------------------------------------------------

def _hopper_config(cfg: Config, interpret: bool,
                   pass_name: str) -> hopper.HopperConfig:
  """The HopperConfig of a pass of a call the Hopper kernels compute, with
  hopper.TUNED's shapes for it as the call's forward was traced with them
  (Config.hopper_shapes): the backward, traced later, runs and is routed
  by the same ones."""
  return hopper.HopperConfig(kind=cfg.kind, symmetric=cfg.symmetric,
                             causal=cfg.causal, scale=cfg.scale,
                             num_buckets=cfg.num_buckets,
                             max_distance=cfg.max_distance,
                             clip=cfg.clip, shaw_values=cfg.shaw_values,
                             interpret=interpret,
                             **dict(dict(cfg.hopper_shapes)[pass_name]))


def _key_lengths(key_valid):
  """Each row's key length: key_valid is a prefix mask where the Hopper
  kernels run (built from key lengths), so its row sums are the lengths."""
  return None if key_valid is None else key_valid.sum(-1, dtype=jnp.int32)


def _hopper_forward(cfg: Config, interpret: bool, q, k, v, key_valid, table):
  """_forward_call's result from the Hopper kernel."""
  out, lse = hopper.forward(_hopper_config(cfg, interpret, 'forward'), q, k,
                            v, _key_lengths(key_valid), table)
  return out.astype(v.dtype), lse


def _hopper_backward(hcfg: hopper.HopperConfig, q, k, v, key_valid, table,
                     g, lse, delta):
  """_backward_call's result from the Hopper backward kernels: T5's and
  Shaw's table gradients with them (ALiBi's slopes are constants)."""
  dq, dk, dv, dtable = hopper_backward.backward(
      hcfg, q, k, v, _key_lengths(key_valid), table, g, lse, delta)
  if dtable is not None:
    dtable = jax.tree.map(lambda g, t: g.astype(t.dtype), dtable, table)
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dtable


def _forward_call(cfg: Config, backend: str, q, k, v, key_valid, table):
  """(out (B, H, Lq, Dv) in v's dtype, lse (B, H, Lq) float32): q rotated,
  not scaled; invalid keys and values already zeroed."""
  if backend in ('hopper', 'hopper_interpret'):
    return _hopper_forward(cfg, backend == 'hopper_interpret', q, k, v,
                           key_valid, table)
  a = _Arrays(cfg, backend, q, k, v, key_valid, table)
  lay = a.lay
  extra, extra_specs = a.extra(key_tiled=False,
                               gathered_rows=a.gathered_rows())
  kernel = functools.partial(
      kernels.forward_kernel, cfg=cfg, lay=lay, lq=a.lq, lk=a.lk,
      num_key_blocks=a.lk_pad // lay.block_k, has_valid=a.valid is not None)
  bh = a.b * a.h
  out, lse = a.call(
      kernel, a.lq_pad // lay.block_q, [a.q, a.k, a.v] + extra,
      [a.tiled(lay.head_q, lay.block_q), a.whole(a.lk_pad, lay.head_q),
       a.whole(a.lk_pad, lay.head_v)] + extra_specs,
      (jax.ShapeDtypeStruct((bh, a.lq_pad, lay.head_v), v.dtype),
       jax.ShapeDtypeStruct((bh, a.lq_pad, lay.stat_lanes), jnp.float32)),
      (a.tiled(lay.head_v, lay.block_q), a.tiled(lay.stat_lanes, lay.block_q)),
      'forward')
  return (a.unrows(out, a.lq, a.dv),
          a.unrows(lse, a.lq, 1)[..., 0])


def _backward_call(cfg: Config, backend: str, q, k, v, key_valid, table, g,
                   lse, delta):
  """(dq, dk, dv, dtable) of the forward's output cotangent g: the dQ
  kernel (with the tables' gradients, summed here over batch and query
  blocks) and the dK/dV kernel."""
  if backend in ('hopper', 'hopper_interpret'):
    hcfg = _hopper_config(cfg, backend == 'hopper_interpret', 'backward')
    if hopper_backward.backward_fits(hcfg, max(q.shape[-1], v.shape[-1])):
      return _hopper_backward(hcfg, q, k, v, key_valid, table, g, lse, delta)
    # Shaw whose table rows (or T5 whose buckets' sums) would not fit the
    # backward kernels' shared memory: the Hopper forward's out and lse,
    # Triton's backward with the tables' gradients.
    backend = 'triton' if backend == 'hopper' else 'interpret'
  a = _Arrays(cfg, backend, q, k, v, key_valid, table)
  lay = a.lay
  bh, nq, nk = a.b * a.h, a.lq_pad // lay.block_q, a.lk_pad // lay.block_k
  do = a.rows(g.astype(v.dtype), a.lq_pad, lay.head_v)
  lse, delta = a.stats(lse), a.stats(delta)
  common = dict(cfg=cfg, lay=lay, lq=a.lq, lk=a.lk,
                has_valid=a.valid is not None)

  gathered = a.gathered_rows(do)

  # dQ: query-major, like the forward; per-program table gradients.
  extra, extra_specs = a.extra(key_tiled=False, gathered_rows=gathered)
  table_shapes = []
  if cfg.kind == 't5':
    table_shapes = [(1, lay.lanes)]
  elif cfg.kind == 'shaw':
    table_shapes = [(lay.table_rows, lay.head_q)] + (
        [(lay.table_rows, lay.head_v)] if cfg.shaw_values else [])
  per_program = lambda shape: pl.BlockSpec((None, None) + shape,
                                           lambda r, i: (r, i, 0, 0))
  outs = a.call(
      functools.partial(kernels.dq_kernel, num_key_blocks=nk, **common), nq,
      [a.q, a.k, a.v, do, lse, delta] + extra,
      [a.tiled(lay.head_q, lay.block_q), a.whole(a.lk_pad, lay.head_q),
       a.whole(a.lk_pad, lay.head_v), a.tiled(lay.head_v, lay.block_q),
       a.tiled(lay.stat_lanes, lay.block_q),
       a.tiled(lay.stat_lanes, lay.block_q)] + extra_specs,
      [jax.ShapeDtypeStruct((bh, a.lq_pad, lay.head_q), q.dtype)]
      + [jax.ShapeDtypeStruct((bh, nq) + s, jnp.float32) for s in table_shapes],
      [a.tiled(lay.head_q, lay.block_q)]
      + [per_program(s) for s in table_shapes],
      'dq')
  dq, table_grads = outs[0], outs[1:]

  # dK, dV: key-major.
  extra, extra_specs = a.extra(key_tiled=True, gathered_rows=gathered)
  dk, dv = a.call(
      functools.partial(kernels.dkdv_kernel, num_query_blocks=nq, **common),
      nk, [a.q, a.k, a.v, do, lse, delta] + extra,
      [a.whole(a.lq_pad, lay.head_q), a.tiled(lay.head_q, lay.block_k),
       a.tiled(lay.head_v, lay.block_k), a.whole(a.lq_pad, lay.head_v),
       a.whole(a.lq_pad, lay.stat_lanes),
       a.whole(a.lq_pad, lay.stat_lanes)] + extra_specs,
      (jax.ShapeDtypeStruct((bh, a.lk_pad, lay.head_q), k.dtype),
       jax.ShapeDtypeStruct((bh, a.lk_pad, lay.head_v), v.dtype)),
      (a.tiled(lay.head_q, lay.block_k), a.tiled(lay.head_v, lay.block_k)),
      'dkdv')

  def summed(x, rows, width):      # (B * H, nq, R, W) -> (H, rows, width)
    x = x.reshape(a.b, a.h, nq, x.shape[2], x.shape[3]).sum((0, 2))
    return x[:, :rows, :width]

  dtable = None
  if cfg.kind == 't5':
    dtable = summed(table_grads[0], 1, cfg.num_buckets)[:, 0].T.astype(
        table.dtype)                                      # (num_buckets, H)
  elif cfg.kind == 'shaw':
    rows = 2 * cfg.clip + 1
    d_a_k = summed(table_grads[0], rows, a.dq).astype(table[0].dtype)
    d_a_v = (summed(table_grads[1], rows, a.dv).astype(table[1].dtype)
             if cfg.shaw_values else None)
    dtable = (d_a_k, d_a_v)
  return (a.unrows(dq, a.lq, a.dq), a.unrows(dk, a.lk, a.dq),
          a.unrows(dv, a.lk, a.dv), dtable)


def _per_platform(cfg: Config, call, *args):
  """`call(cfg, backend, *args)` for the platform being lowered for, chosen
  at lowering time (jax.lax.platform_dependent), not by the host's
  default backend: a step lowered for 'cuda' on a CPU machine holds the
  Triton kernels. Every branch returns the same canonical shapes."""
  hopper_kernel = cfg.gpu_kernel == 'hopper'
  if cfg.interpret:
    return call(cfg, 'hopper_interpret' if hopper_kernel else 'interpret',
                *args)
  branch = lambda backend: functools.partial(call, cfg, backend)
  per_platform = dict(cuda=branch('hopper' if hopper_kernel else 'triton'),
                      rocm=branch('triton'),
                      tpu=branch('mosaic_tpu'))
  if cfg.interpret is None:
    per_platform['cpu'] = branch('interpret')
  return jax.lax.platform_dependent(*args, **per_platform)


# --------------------------------------------------------------------------
# The custom VJP.
# --------------------------------------------------------------------------

@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, key_valid, table):
  return _per_platform(cfg, _forward_call, q, k, v, key_valid, table)[0]


def _flash_fwd(cfg, q, k, v, key_valid, table):
  out, lse = _per_platform(cfg, _forward_call, q, k, v, key_valid, table)
  # O(L) residuals: the inputs, the output and one float per query row.
  return out, (q, k, v, key_valid, table, out, lse)


def _flash_bwd(cfg, residuals, g):
  q, k, v, key_valid, table, out, lse = residuals
  delta = jnp.sum(g.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)
  dq, dk, dv, dtable = _per_platform(cfg, _backward_call, q, k, v, key_valid,
                                     table, g, lse, delta)
  if table is not None and dtable is None:
    dtable = jax.tree.map(jnp.zeros_like, table)          # ALiBi: constants
  return dq, dk, dv, None, dtable


_flash.defvjp(_flash_fwd, _flash_bwd)

# --------------------------------------------------------------------------
# The public function.
# --------------------------------------------------------------------------

def pallas_attention(q_BxHxLqxD: jax.Array, k_BxHxLkxD: jax.Array,
                     v_BxHxLkxD: jax.Array, *, relative=None,
                     causal: bool = False, key_valid: jax.Array | None = None,
                     key_lengths: jax.Array | None = None,
                     block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                     interpret: bool | None = None,
                     gpu_kernel: str | None = None,
                     triton: TritonTuning | None = None) -> jax.Array:
  """Flash attention with the relative term computed in the kernel.

  Args:
    q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD: per-head queries, keys, values.
    relative: None, positions.ALiBi (either form), positions.T5RelativeBias,
      positions.ShawRelative (with or without a^V, shared or per-head
      tables), or a rotation-only encoding (RoPE, PoPE: rotated here, then
      no term).
      Anything else raises ValueError (see `supports`). Default positions
      (0..L-1) only.
    causal: key j attends to query i iff j <= i + (Lk - Lq).
    key_valid: (B, Lk) bool, True = a real key, or None. Invalid keys and
      values are zeroed first, so NaN or inf there never reaches the output.
    key_lengths: (B,) int, keys [0, length) real, or None: key padding as
      lengths (valid_lens), which the Hopper kernel takes; not with
      key_valid.
    block_q, block_k: block sizes, fitted to each backend's rules
      (pallas_kernels.layout: powers of two >= 16 on Triton, >= 8 in
      interpret mode, multiples of 8 and 128 on TPU) and to the lengths;
      lengths that are not multiples are padded and the padding masked.
    interpret: True: Pallas interpret mode everywhere; None (default): the
      platform's kernel when lowered for 'cuda', 'rocm' or 'tpu' and
      interpret mode when lowered for 'cpu'; False: never interpret (a CPU
      lowering then fails).
    gpu_kernel: the kernels on a CUDA GPU (None: 'auto', or the name
      default_gpu_kernel set): 'cudnn': cuDNN's flash attention through
      jax.nn (cudnn_flash.py) for a call with no logit term (none or a
      rotation), one 16-bit dtype and head width, key lengths or no mask,
      causal only with Lq == Lk, traced by a process with a CUDA device
      (ValueError otherwise; the CPU and TPU lowerings of the same trace
      keep these kernels); 'auto': that where AUTO_TAKES_CUDNN is set and
      the call qualifies, else Triton, or, under hopper_in_auto()
      (AUTO_TAKES_HOPPER), the Hopper kernels (hopper_attention.py,
      hopper_backward.py) where the GPU lowered for is an sm90 part and the
      call is one they compute (none, ALiBi, T5, Shaw or a rotation, bf16
      or f16, heads up to 128 wide, no key_valid; Shaw's with its table
      rows in shared memory: hopper_attention.supports, and for the
      backward hopper_backward.backward_computes, else Triton's);
      'hopper' insists
      (ValueError where the call is not one they compute; with
      interpret=True they run in JAX's Mosaic GPU interpreter); 'triton'
      never uses them.
    triton: the Triton kernels' warps and stages per pass (TritonTuning of
      forward, dq, dkdv, each a TritonLaunch or None; None, or a None
      field: default_triton_tuning's rule). Only the Triton lowering reads
      it (scripts/tune_triton.py is to measure them on a GPU).

  Returns:
    (B, H, Lq, Dv) in v's dtype, equal to dot_product_attention's output; a
    query with no allowed key gets zeros. Differentiable in q, k, v and the
    T5 and Shaw tables, through the Pallas backward kernels.
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  described = _describe(relative)
  if described is None:
    raise ValueError(f'pallas_attention does not compute '
                     f'{type(relative).__name__}; supported: none, alibi, t5, '
                     f'shaw and rotation-only encodings (rope, pope)')
  kind, table, options = described
  masks.check_heads(q, k, v)
  b, h, lq, _ = q.shape
  lk = k.shape[2]
  # The plain path's check: a table for other heads or another width would
  # be padded into the kernels' layout and give a number.
  masks.check_built_for(relative, h, q.shape[-1])
  if gpu_kernel is None:
    gpu_kernel = _default_gpu_kernel[-1]
  if gpu_kernel not in GPU_KERNELS:
    raise ValueError(f'gpu_kernel={gpu_kernel!r}; choose one of {GPU_KERNELS}')
  if triton is not None:
    triton = kernels.check_triton_tuning(triton)
  if key_lengths is not None:
    if key_valid is not None:
      raise ValueError('give key_valid or key_lengths, not both')
    key_lengths = jnp.asarray(key_lengths)
    if (key_lengths.shape != (b,)
        or not jnp.issubdtype(key_lengths.dtype, jnp.integer)):
      raise ValueError(f'key_lengths must be integers of shape {(b,)}; got '
                       f'{key_lengths.dtype} {key_lengths.shape}')
    key_valid = jnp.arange(lk)[None, :] < key_lengths[:, None]
    prefix_mask = True
  else:
    prefix_mask = key_valid is None
  if key_valid is not None:
    key_valid = jnp.asarray(key_valid)
    if key_valid.dtype != jnp.bool_ or key_valid.shape != (b, lk):
      raise ValueError(f'key_valid must be bool of shape {(b, lk)}; got '
                       f'{key_valid.dtype} {key_valid.shape}')
    used = key_valid[:, None, :, None]
    k = jnp.where(used, k, jnp.zeros((), k.dtype))
    v = jnp.where(used, v, jnp.zeros((), v.dtype))
  if not b * lq * lk:
    # An empty axis: no block to launch, and every query (if any) has no
    # key, so zeros, as on the plain path.
    return jnp.zeros((b, h, lq, v.shape[-1]), v.dtype)
  if kind == 'shaw' and options['shared_heads']:
    # One (H, 2k + 1, D) table per term (check_built_for above held a
    # per-head one to H); a shared table is broadcast here, outside the
    # custom_vjp, so its gradient sums over the heads.
    table = tuple(None if t is None else jnp.broadcast_to(t[None], (h,) + t.shape)
                  for t in table)
  scale = 1.0 / math.sqrt(q.shape[-1])       # of the head before `rotate`
  if relative is not None:
    q, k = relative.rotate(q, k)
  width = max(q.shape[-1], v.shape[-1])
  clip = options.get('clip', 0)
  shaw_values = kind == 'shaw' and table[1] is not None
  hopper_computes = (prefix_mask and q.dtype == k.dtype == v.dtype
                     and hopper.supports(kind, q.dtype, width, clip,
                                         shaw_values, bool(causal)))
  if gpu_kernel == 'hopper' and not hopper_computes:
    raise ValueError(
        f"gpu_kernel='hopper' computes {hopper.KINDS} in bf16 or f16, heads "
        f'up to {hopper.MAX_HEAD} wide, with key lengths, where its shared '
        f'memory fits (hopper_attention.supports, for Shaw by k); got '
        f'{kind}, {q.dtype}/{k.dtype}/{v.dtype}, width {width}'
        f"{f', clip {clip}' if kind == 'shaw' else ''}, "
        f"{'key lengths' if prefix_mask else 'a key_valid mask'}")
  use_cudnn = gpu_kernel == 'cudnn' or (gpu_kernel == 'auto'
                                         and AUTO_TAKES_CUDNN)
  if use_cudnn:
    qualifies = (not interpret and cudnn_flash.computes(
        q, k, v, kind=kind, causal=bool(causal), key_mask=not prefix_mask)
                 and cudnn_traceable())
    if gpu_kernel == 'cudnn' and not qualifies:
      raise ValueError(
          "gpu_kernel='cudnn' computes calls with no logit term (none or a "
          'rotation) in bf16 or f16 with one head width (a multiple of 8 up '
          'to 128), key lengths or no mask, causal only with Lq == Lk, not '
          'interpreted, traced by a process with a CUDA device; got '
          f'{kind}, {q.dtype}/{k.dtype}/{v.dtype}, widths {q.shape[-1]}/'
          f'{v.shape[-1]}, Lq={lq}, Lk={lk}, causal={bool(causal)}, '
          f"{'a key_valid mask' if not prefix_mask else 'key lengths or none'}"
          f", interpret={interpret}, "
          f"{'a' if cudnn_traceable() else 'no'} CUDA device")
    use_cudnn = qualifies
  use_hopper = gpu_kernel == 'hopper' or (
      gpu_kernel == 'auto' and _auto_takes_hopper() and hopper_computes
      and not interpret
      and hopper.lowering_for_hopper())
  cfg = Config(
      kind=kind, symmetric=options.get('symmetric', False),
      num_buckets=options.get('num_buckets', 0),
      max_distance=options.get('max_distance', 0),
      clip=clip,
      shaw_values=shaw_values,
      causal=bool(causal),
      scale=scale, block_q=int(block_q), block_k=int(block_k),
      interpret=None if interpret is None else bool(interpret),
      gpu_kernel='hopper' if use_hopper else 'triton',
      key_prefix=prefix_mask and key_valid is not None, triton=triton,
      gather_terms=_gather_terms[-1],
      hopper_shapes=tuple(
          (pass_name, tuple(sorted(hopper.TUNED[pass_name, bool(causal)]
                                   .items())))
          for pass_name in ('forward', 'backward')) if use_hopper else ())
  if use_cudnn:
    # cuDNN for a step lowered for 'cuda', these kernels for the others.
    own_kernels = lambda q, k, v: _flash(cfg, q, k, v, key_valid, table)

    def on_cuda(q, k, v):
      try:
        return cudnn_flash.attention(q, k, v, key_lengths=key_lengths,
                                     causal=bool(causal), scale=scale)
      except (ValueError, NotImplementedError, RuntimeError) as e:
        # cuDNN's trace-time refusals (its version, the GPU, no cuDNN at
        # all): 'auto' keeps these kernels; 'cudnn' insists.
        if gpu_kernel == 'cudnn':
          raise
        _warn_cudnn_refused(str(e).split('\n')[0])
        return own_kernels(q, k, v)
    return jax.lax.platform_dependent(q, k, v, cuda=on_cuda,
                                      default=own_kernels)
  return _flash(cfg, q, k, v, key_valid, table)


__all__ = ['AUTO_TAKES_CUDNN', 'AUTO_TAKES_HOPPER', 'BLOCK_Q', 'BLOCK_K',
           'GPU_KERNELS', 'TritonLaunch', 'TritonTuning',
           'default_gpu_kernel', 'gpu_kernel_problem', 'hopper_in_auto',
           'kernel_kind', 'pallas_attention', 'supports']

"""A Pallas flash-attention forward kernel whose relative terms are computed
inside the kernel from small tables (`attention_impl='pallas'`).

One program per (batch * head, query block) keeps the FlashAttention
running maximum m, normaliser l and unnormalised output acc in float32 and
visits the key blocks of its row in a `lax.fori_loop`:

    s   = (q_blk k_blk^T) * scale + term(offsets)     (masked to -inf)
    m'  = max(m, rowmax(s));  p = exp(s - m');  a = exp(m - m')
    l'  = a l + rowsum(p);    acc' = a acc + p v_blk;    out = acc / l

The relative term of a block is computed from the block's iota offsets
(key index - query index), never from an (Lq, Lk) array:

  ALiBi  the head's slope, passed in as an (H,) table: -slope * |o| for the
         symmetric form, -slope * (|o| - 0.5 [o < 0]) for the default
         asymmetric one (positions.ALiBi.logits);
  T5     the (num_buckets, H) bias table: the bucket of each offset with
         positions.t5_bucket itself (the same arithmetic as the plain
         path), then a select over the head's num_buckets scalars;
  Shaw   a^K and a^V, (2k + 1, D) shared or (H, 2k + 1, D) per head: the key
         term q . a^K[clip(o)] from the row's (bq, 2k + 1) product q a^K^T
         (once per query block) and a select per clipped offset; the value
         term sums each block's weights per clipped offset, (bq, 2k + 1),
         and adds that times a^V to acc. Only key blocks near the diagonal
         do the 2k + 1 selects: a block wholly at offsets <= -k or >= +k
         (most of them once L >> k) adds one column of q a^K^T and
         rowsum(p) times one row of a^V (_shaw_far_blocks splits the key
         loop into the three ranges);
  none   no term. Rotation-only encodings (RoPE, PoPE) rotate q and k once
         outside the kernel (O(L D)) and then use this case.

Causal masking (key j is allowed for query i iff j <= i + Lk - Lq) and a key
padding mask (B, Lk) are applied per block; with causal=True the key loop
stops at the last block the query block can see. A query row with no
allowed key outputs zeros, as the plain path does.

Backward: forward kernel + recomputing backward, not a Pallas backward
kernel. The `jax.custom_vjp` saves only q, k, v, the key mask and the
encoding's table (O(L) residuals) and differentiates
chunked.chunked_attention, which recomputes every block (O(L) memory, XLA
code). Gradients reach q, k, v and the T5 and Shaw tables.

Supported: positions None (0..L-1) only; key padding only (no general
(Lq, Lk) mask, no float bias); no dropout on the weights; no Huang or
Transformer-XL terms. MultiHeadAttention falls back to the plain path for
everything else (see its attention_impl paragraph).

On CPU the kernel runs in Pallas interpret mode (the default there), which is
for testing correctness, not speed.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from selfattn import chunked
from selfattn import positions

BLOCK_Q = 128
BLOCK_K = 128


class _Config(NamedTuple):
  """Static description of one kernel call (hashable: a nondiff argument)."""
  kind: str              # 'none', 'alibi', 't5' or 'shaw'
  symmetric: bool        # ALiBi's symmetric form
  num_buckets: int       # T5
  max_distance: int      # T5
  clip: int              # Shaw's clip distance k (2k + 1 table rows)
  shaw_values: bool      # Shaw with a value table a^V
  causal: bool
  scale: float           # softmax scale, 1/sqrt(D) of the head before rotate
  block_q: int
  block_k: int
  interpret: bool | None  # None: per lowering platform (interpret on cpu)


def _is_rotation_only(relative) -> bool:
  """A RelativePosition that only rotates q and k (RoPE, PoPE)."""
  base = positions.RelativePosition
  if not isinstance(relative, base):
    return False
  cls = type(relative)
  return (cls.logits is base.logits and cls.values is base.values
          and cls.blockwise_logits is base.blockwise_logits)


def _describe(relative):
  """(kind, table, options) of a supported encoding, or None if it is not."""
  if relative is None:
    return 'none', None, {}
  if (isinstance(relative, positions.ALiBi)
      and type(relative).logits is positions.ALiBi.logits):
    slopes = jnp.asarray(positions.alibi_slopes(relative.num_heads),
                         jnp.float32)
    return 'alibi', slopes, {'symmetric': bool(relative.symmetric)}
  if (isinstance(relative, positions.T5RelativeBias)
      and type(relative).logits is positions.T5RelativeBias.logits):
    return 't5', relative.bias[...], {
        'num_buckets': int(relative.num_buckets),
        'max_distance': int(relative.max_distance)}
  if (isinstance(relative, positions.ShawRelative)
      and type(relative).logits is positions.ShawRelative.logits
      and type(relative).values is positions.ShawRelative.values):
    a_v = None if relative.a_V is None else relative.a_V[...]
    return 'shaw', (relative.a_K[...], a_v), {
        'clip': int(relative.clip_distance),
        'shared_heads': bool(relative.shared_heads)}
  if _is_rotation_only(relative):
    return 'none', None, {}
  return None


def supports(relative) -> bool:
  """Whether pallas_attention computes this encoding: none, ALiBi (both
  forms), T5, Shaw (key and value terms), and rotation-only encodings (RoPE,
  PoPE)."""
  return _describe(relative) is not None


def _alibi_distance(offset: jax.Array, symmetric: bool) -> jax.Array:
  """ALiBi's distance (float32) of offsets key - query; the bias is
  -slope * distance (positions.ALiBi.logits)."""
  distance = jnp.abs(offset).astype(jnp.float32)
  if not symmetric:
    distance = distance - 0.5 * (offset < 0)
  return distance


def _round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def _pow2(n: int) -> int:
  """The smallest power of two >= n (n >= 1)."""
  return 1 << max(0, int(n) - 1).bit_length()


class _Layout(NamedTuple):
  """Static block and padding choices of one backend for one call: the
  shape rules differ (Triton: every array a power of two, a dot's dims >= 16;
  Mosaic TPU: a block's last two dims multiples of (8, 128) or the array's
  own; interpret: the Triton layout with blocks down to 8, so the CPU tests
  run the padded tables a GPU runs)."""
  block_q: int
  block_k: int
  head_q: int        # q and k head width after zero padding
  head_v: int        # v head width after zero padding (columns sliced off)
  table_rows: int    # Shaw's 2k + 1 rows after zero padding
  lanes: int         # width of the per-head ALiBi / T5 tile


def _layout(cfg: _Config, backend: str, lq: int, lk: int, dq: int,
            dv: int) -> _Layout:
  rows = 2 * cfg.clip + 1
  lanes = {'alibi': 1, 't5': cfg.num_buckets}.get(cfg.kind, 1)
  if backend == 'mosaic_tpu':
    # Sublanes of 8, lanes of 128; head widths stay whole (a block dim equal
    # to the array's is allowed), so q, k, v need no padding.
    return _Layout(block_q=min(_round_up(cfg.block_q, 8), _round_up(lq, 8)),
                   block_k=_round_up(min(cfg.block_k, lk), 128),
                   head_q=dq, head_v=dv, table_rows=_round_up(rows, 128),
                   lanes=_round_up(lanes, 128))
  # Triton: powers of two throughout, and tl.dot wants every dim >= 16.
  smallest = 16 if backend == 'triton' else 8
  block = lambda b, n: max(smallest, min(_pow2(b), _pow2(n)))
  return _Layout(block_q=block(cfg.block_q, lq), block_k=block(cfg.block_k, lk),
                 head_q=max(16, _pow2(dq)), head_v=max(16, _pow2(dv)),
                 table_rows=max(16, _pow2(rows)), lanes=_pow2(lanes))


# --------------------------------------------------------------------------
# The forward kernel.
# --------------------------------------------------------------------------

def _column(x: jax.Array, n: int) -> jax.Array:
  """Column n of a (rows, width) value as (rows, 1). A masked row sum, not
  x[:, n:n + 1]: Pallas's Triton lowering has no slice of a value."""
  lane = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  return jnp.sum(jnp.where(lane == n, x, 0.0), axis=1, keepdims=True)


def _kernel(*refs, cfg: _Config, lay: _Layout, lq: int, lk: int,
            num_key_blocks: int, has_valid: bool):
  q_ref, k_ref, v_ref = refs[:3]
  rest = list(refs[3:])
  valid_ref = rest.pop(0) if has_valid else None
  table_ref = rest.pop(0) if cfg.kind in ('alibi', 't5') else None
  a_k_ref = rest.pop(0) if cfg.kind == 'shaw' else None
  a_v_ref = rest.pop(0) if cfg.kind == 'shaw' and cfg.shaw_values else None
  (o_ref,) = rest
  bq, bk = lay.block_q, lay.block_k
  i = pl.program_id(1)
  f32 = jnp.float32

  q = q_ref[...]                                  # (bq, Dq), input dtype
  q_idx = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  num_rows = 2 * cfg.clip + 1
  # Per-head scalars and columns, read once per program as (1, 1) / (bq, 1)
  # values (no scalar loads: Mosaic TPU reads scalars only from SMEM).
  if cfg.kind == 'alibi':
    slope = jnp.max(table_ref[...].astype(f32), axis=1, keepdims=True)
  if cfg.kind == 't5':
    row = table_ref[...].astype(f32)                          # (1, lanes)
    bucket_values = [_column(row, n) for n in range(cfg.num_buckets)]
  if cfg.kind == 'shaw':
    # Shaw's key term per query and clipped offset, (bq, rows), once per
    # program; the padding rows of a^K are zero and never selected.
    q_dot_a = jax.lax.dot_general(
        q, a_k_ref[...].astype(q.dtype), (((1,), (1,)), ((), ())),
        preferred_element_type=f32) * cfg.scale
    key_columns = [_column(q_dot_a, r) for r in range(num_rows)]
  if a_v_ref is not None:
    a_v = a_v_ref[...]                                        # (rows, Dv)
    edge_values = {'left': a_v_ref[pl.ds(0, 1), :].astype(f32),
                   'right': a_v_ref[pl.ds(num_rows - 1, 1), :].astype(f32)}

  def body(j, carry, region='near'):
    # region (static): 'near' blocks see per-offset rows of the Shaw tables
    # or T5 buckets; 'left' / 'right' blocks lie wholly at offsets <= -k /
    # >= +k (Shaw) or beyond max_distance (T5), so every entry uses the one
    # edge row (a column of q a^K^T, one a^V row) or edge bucket.
    acc, m, l = carry
    start = pl.multiple_of(j * bk, bk)
    k_blk = k_ref[pl.ds(start, bk), :]                        # (bk, Dq)
    v_blk = v_ref[pl.ds(start, bk), :]                        # (bk, Dv)
    s = jax.lax.dot_general(q, k_blk, (((1,), (1,)), ((), ())),
                            preferred_element_type=f32) * cfg.scale
    k_idx = start + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
    offset = k_idx - q_idx
    if cfg.kind == 'alibi':
      s = s - slope * _alibi_distance(offset, cfg.symmetric)
    elif cfg.kind == 't5' and region != 'near':
      # Offsets at or beyond max_distance share each direction's last bucket.
      half = cfg.num_buckets // 2
      s = s + bucket_values[half - 1 if region == 'left' else cfg.num_buckets - 1]
    elif cfg.kind == 't5':
      bucket = positions.t5_bucket(offset, cfg.num_buckets, cfg.max_distance)
      term = jnp.zeros((bq, bk), f32)
      for n, value in enumerate(bucket_values):   # a select per bucket
        term = jnp.where(bucket == n, value, term)
      s = s + term
    elif cfg.kind == 'shaw' and region != 'near':
      s = s + key_columns[0 if region == 'left' else num_rows - 1]
    elif cfg.kind == 'shaw':
      bucket = jnp.clip(offset, -cfg.clip, cfg.clip) + cfg.clip
      term = jnp.zeros((bq, bk), f32)
      for r, column in enumerate(key_columns):    # a select per offset
        term = jnp.where(bucket == r, column, term)
      s = s + term
    keep = k_idx < lk
    if cfg.causal:
      keep = keep & (k_idx <= q_idx + (lk - lq))
    if valid_ref is not None:
      keep = keep & (valid_ref[:, pl.ds(start, bk)] != 0)     # (1, bk)
    s = jnp.where(keep, s, -jnp.inf)
    m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp(s - m_safe)                     # masked: exp(-inf) = 0
    alpha = jnp.exp(m - m_safe)                 # m = -inf (nothing yet): 0
    l = alpha * l + jnp.sum(p, axis=1, keepdims=True)
    pv = jax.lax.dot_general(p.astype(v_blk.dtype), v_blk,
                             (((1,), (0,)), ((), ())),
                             preferred_element_type=f32)
    if a_v_ref is not None and region != 'near':
      # Every weight of a far block multiplies the same edge row of a^V.
      pv = pv + jnp.sum(p, axis=1, keepdims=True) * edge_values[region]
    elif a_v_ref is not None:
      # Shaw's value term: the block's weights summed per clipped offset,
      # (bq, rows), against a^V (rows, Dv).
      lane = jax.lax.broadcasted_iota(jnp.int32, (bq, lay.table_rows), 1)
      folded = jnp.zeros((bq, lay.table_rows), f32)
      for r in range(num_rows):
        mass = jnp.sum(jnp.where(bucket == r, p, 0.0), axis=1, keepdims=True)
        folded = jnp.where(lane == r, mass, folded)
      pv = pv + jax.lax.dot_general(folded.astype(v_blk.dtype),
                                    a_v.astype(v_blk.dtype),
                                    (((1,), (0,)), ((), ())),
                                    preferred_element_type=f32)
    return alpha * acc + pv, m_new, l

  dv = v_ref.shape[-1]
  carry = (jnp.zeros((bq, dv), f32), jnp.full((bq, 1), -jnp.inf, f32),
           jnp.zeros((bq, 1), f32))
  if cfg.causal:
    # Key blocks wholly above the diagonal add nothing: stop before them.
    seen = i * bq + bq + (lk - lq)         # keys up to the block's last row's
    upper = jnp.clip(_floor_div(seen + bk - 1, bk, lq - lk), 0, num_key_blocks)
  else:
    upper = num_key_blocks
  if cfg.kind in ('shaw', 't5'):
    reach = cfg.clip if cfg.kind == 'shaw' else cfg.max_distance
    left_end, right_start = _far_blocks(i, bq, bk, reach, upper)
    for lo, hi, region in ((0, left_end, 'left'),
                           (left_end, right_start, 'near'),
                           (right_start, upper, 'right')):
      carry = jax.lax.fori_loop(lo, hi, functools.partial(body, region=region),
                                carry)
    acc, _, l = carry
  else:
    acc, _, l = jax.lax.fori_loop(0, upper, body, carry)
  out = jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)
  o_ref[...] = out.astype(o_ref.dtype)


def _floor_div(x, d: int, lowest: int):
  """floor(x / d) for an int32 x >= lowest (static) and d > 0, as a
  truncating division of x shifted to be non-negative: jnp.floor_divide
  lowers through `sign`, which Mosaic TPU lowers only on a TPU host."""
  shift = _round_up(max(0, -lowest), d)
  return jax.lax.div(jnp.asarray(x + shift, jnp.int32), jnp.int32(d)) - shift // d


def _far_blocks(i, bq: int, bk: int, clip: int, upper):
  """(left_end, right_start) for query block i: key blocks [0, left_end)
  hold only offsets (key - query) <= -clip, blocks [right_start, upper)
  only offsets >= +clip, for every row of the block (padding rows too, so
  the split is conservative); 0 <= left_end <= right_start <= upper.
  clip is Shaw's k or T5's max_distance: beyond it every entry of a block
  uses one table row or bucket per direction. Python ints or traced int32
  scalars alike."""
  first_q, last_q = i * bq, i * bq + bq - 1
  # Block j's largest offset is j bk + bk - 1 - first_q <= -clip
  #   <=> j <= floor((first_q - clip - bk + 1) / bk).
  left_end = _floor_div(first_q - clip - bk + 1, bk, -clip - bk + 1) + 1
  # Block j's smallest offset is j bk - last_q >= clip
  #   <=> j >= ceil((last_q + clip) / bk) = floor((last_q + clip + bk - 1) / bk).
  right_start = _floor_div(last_q + clip + bk - 1, bk, 0)
  left_end = jnp.clip(left_end, 0, upper)
  right_start = jnp.clip(right_start, left_end, upper)
  return left_end, right_start


def _pallas_forward(cfg: _Config, backend: str, q, k, v, key_valid, table):
  """One backend's pallas_call: q (B, H, Lq, Dq) rotated, not scaled;
  k (B, H, Lk, Dq) and v (B, H, Lk, Dv) with invalid keys already zeroed;
  key_valid (B, Lk) bool or None; table (H,) slopes, (num_buckets, H) T5
  biases, Shaw's (a^K, a^V or None) each (H, 2k + 1, D), or None.
  backend: 'triton' (CUDA and ROCm), 'mosaic_tpu' or 'interpret'."""
  b, h, lq, dq = q.shape
  lk, dv = k.shape[2], v.shape[3]
  lay = _layout(cfg, backend, lq, lk, dq, dv)
  bq, bk = lay.block_q, lay.block_k
  lq_pad, lk_pad = _round_up(lq, bq), _round_up(lk, bk)

  def pad(x, length, width):            # (B, H, L, D) -> (B * H, length, width)
    x = jnp.pad(x, [(0, 0), (0, 0), (0, length - x.shape[2]),
                    (0, width - x.shape[3])])
    return x.reshape(b * h, length, width)

  inputs = [pad(q, lq_pad, lay.head_q), pad(k, lk_pad, lay.head_q),
            pad(v, lk_pad, lay.head_v)]
  # Keys and values: the whole (padded) sequence of the row's head as one
  # ref, read block by block inside the kernel's key loop. On Triton a ref is
  # a pointer (each pl.ds load is one (bk, D) tile); on Mosaic TPU the
  # head's K and V sit in VMEM.
  in_specs = [
      pl.BlockSpec((None, bq, lay.head_q), lambda r, i: (r, i, 0)),
      pl.BlockSpec((None, lk_pad, lay.head_q), lambda r, i: (r, 0, 0)),
      pl.BlockSpec((None, lk_pad, lay.head_v), lambda r, i: (r, 0, 0)),
  ]
  if key_valid is not None:
    valid = jnp.pad(key_valid.astype(jnp.int32), [(0, 0), (0, lk_pad - lk)])
    inputs.append(valid[:, None, :])                        # (B, 1, Lk_pad)
    in_specs.append(pl.BlockSpec((None, 1, lk_pad), lambda r, i: (jax.lax.div(r, h), 0, 0)))
  if cfg.kind in ('alibi', 't5'):
    # One (1, lanes) tile per head: (H,) slopes broadcast, or the head's
    # num_buckets biases zero-padded.
    per_head = (jnp.asarray(table, jnp.float32)[:, None] if cfg.kind == 'alibi'
                else jnp.asarray(table).T.astype(jnp.float32))
    width = per_head.shape[1]
    tile = (jnp.broadcast_to(per_head, (h, lay.lanes)) if width == 1
            else jnp.pad(per_head, [(0, 0), (0, lay.lanes - width)]))
    inputs.append(tile[:, None, :])                         # (H, 1, lanes)
    in_specs.append(pl.BlockSpec((None, 1, lay.lanes), lambda r, i: (jax.lax.rem(r, h), 0, 0)))
  elif cfg.kind == 'shaw':
    for t, width in zip(table, (lay.head_q, lay.head_v)):    # (H, 2k + 1, D)
      if t is not None:
        t = jnp.pad(t, [(0, 0), (0, lay.table_rows - t.shape[1]),
                        (0, width - t.shape[2])])
        inputs.append(t)
        in_specs.append(pl.BlockSpec((None, lay.table_rows, width),
                                     lambda r, i: (jax.lax.rem(r, h), 0, 0)))
  kernel = functools.partial(_kernel, cfg=cfg, lay=lay, lq=lq, lk=lk,
                             num_key_blocks=lk_pad // bk,
                             has_valid=key_valid is not None)
  out = pl.pallas_call(
      kernel,
      out_shape=jax.ShapeDtypeStruct((b * h, lq_pad, lay.head_v), v.dtype),
      grid=(b * h, lq_pad // bq),
      in_specs=in_specs,
      out_specs=pl.BlockSpec((None, bq, lay.head_v), lambda r, i: (r, i, 0)),
      interpret=backend == 'interpret',
      compiler_params=_compiler_params(backend, lay),
      name='selfattn_flash_relative',
  )(*inputs)
  return out.reshape(b, h, lq_pad, lay.head_v)[:, :, :lq, :dv]


def _compiler_params(backend: str, lay: _Layout):
  """The backend named explicitly, not left to JAX's default (Mosaic GPU
  since JAX 0.10, whose async copies take <= 256 rows and whose shared
  memory would hold each head's whole K and V)."""
  if backend == 'triton':
    from jax.experimental.pallas import triton as pltriton
    # JAX's own Triton flash attention uses 4 warps for 128-wide blocks of
    # head width <= 64, 8 above.
    return pltriton.CompilerParams(num_warps=4 if lay.head_q <= 64 else 8,
                                   num_stages=2)
  if backend == 'mosaic_tpu':
    from jax.experimental.pallas import tpu as pltpu
    return pltpu.CompilerParams(dimension_semantics=('parallel', 'parallel'))
  return None


def _forward(cfg: _Config, q, k, v, key_valid, table):
  """The kernel for the platform being lowered for, chosen at lowering time
  (jax.lax.platform_dependent), not by the host's default backend: a step
  lowered for 'cuda' on a CPU machine holds the Triton kernel."""
  args = (q, k, v, key_valid, table)
  if cfg.interpret:
    return _pallas_forward(cfg, 'interpret', *args)
  branch = lambda backend: functools.partial(_pallas_forward, cfg, backend)
  per_platform = dict(cuda=branch('triton'), rocm=branch('triton'),
                      tpu=branch('mosaic_tpu'))
  if cfg.interpret is None:
    per_platform['cpu'] = branch('interpret')
  return jax.lax.platform_dependent(*args, **per_platform)


# --------------------------------------------------------------------------
# The recomputing backward.
# --------------------------------------------------------------------------

class _TableTerms:
  """The kernel's logit term as RelativePosition hooks over an explicit
  table (so chunked_attention's VJP reaches the table)."""

  reach = None

  def __init__(self, cfg: _Config, table):
    self.cfg, self.table = cfg, table

  def rotate(self, q, k, q_pos=None, k_pos=None):
    return q, k

  def logits(self, q, k, q_pos=None, k_pos=None):
    offsets = positions.position_offsets(q_pos, k_pos, q.shape[2], k.shape[2])
    if offsets.ndim == 2:
      offsets = offsets[None]                                # (B|1, Lq, Lk)
    if self.cfg.kind == 'alibi':
      distance = _alibi_distance(offsets, self.cfg.symmetric)
      return -self.table[None, :, None, None] * distance[:, None]
    if self.cfg.kind == 'shaw':
      q_dot_a = jnp.einsum('bhqd,hrd->bhqr', q, self.table[0].astype(q.dtype))
      return positions.gather_offsets(q_dot_a, self._shaw_bucket(offsets))
    buckets = positions.t5_bucket(offsets, self.cfg.num_buckets,
                                  self.cfg.max_distance)
    return jnp.moveaxis(self.table[buckets], -1, 1)          # (B|1, H, Lq, Lk)

  def _shaw_bucket(self, offsets):
    clip = self.cfg.clip
    return jnp.clip(offsets, -clip, clip) + clip

  def values(self, weights, v, q_pos=None, k_pos=None):
    if self.cfg.kind != 'shaw' or self.table[1] is None:
      return None
    offsets = positions.position_offsets(q_pos, k_pos, weights.shape[2],
                                         weights.shape[3])
    if offsets.ndim == 2:
      offsets = offsets[None]
    folded = positions.fold_by_bucket(weights, self._shaw_bucket(offsets),
                                      2 * self.cfg.clip + 1)
    return jnp.einsum('bhqr,hrd->bhqd', folded.astype(v.dtype),
                      self.table[1].astype(v.dtype))

  def blockwise_logits(self, *args):
    return None


def _recompute(cfg: _Config, q, k, v, key_valid, table):
  """The same function in XLA code with O(L) memory (chunked_attention)."""
  factor = cfg.scale * math.sqrt(q.shape[-1])    # chunked scales by 1/sqrt(Dq)
  if factor != 1.0:
    q = q * jnp.asarray(factor, q.dtype)
  mask = None if key_valid is None else key_valid[:, None, None, :]
  relative = None if cfg.kind == 'none' else _TableTerms(cfg, table)
  return chunked.chunked_attention(
      q, k, v, mask=mask, causal=cfg.causal, relative=relative,
      query_chunk=cfg.block_q, key_chunk=cfg.block_k)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(cfg, q, k, v, key_valid, table):
  return _forward(cfg, q, k, v, key_valid, table)


def _flash_fwd(cfg, q, k, v, key_valid, table):
  return _forward(cfg, q, k, v, key_valid, table), (q, k, v, key_valid, table)


def _flash_bwd(cfg, residuals, g):
  q, k, v, key_valid, table = residuals
  _, vjp = jax.vjp(
      lambda q, k, v, table: _recompute(cfg, q, k, v, key_valid, table),
      q, k, v, table)
  dq, dk, dv, dtable = vjp(g)
  return dq, dk, dv, None, dtable


_flash.defvjp(_flash_fwd, _flash_bwd)


# --------------------------------------------------------------------------
# The public function.
# --------------------------------------------------------------------------

def pallas_attention(q_BxHxLqxD: jax.Array, k_BxHxLkxD: jax.Array,
                     v_BxHxLkxD: jax.Array, *, relative=None,
                     causal: bool = False, key_valid: jax.Array | None = None,
                     block_q: int = BLOCK_Q, block_k: int = BLOCK_K,
                     interpret: bool | None = None) -> jax.Array:
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
    block_q, block_k: block sizes (clipped to the lengths rounded up to 8;
      lengths that are not multiples are padded and the padding masked).
    interpret: run Pallas in interpret mode; None: on the CPU backend only.

  Returns:
    (B, H, Lq, Dv) in v's dtype, equal to dot_product_attention's output; a
    query with no allowed key gets zeros. Differentiable in q, k, v and the
    T5 and Shaw tables (forward kernel + recomputing backward through
    chunked.chunked_attention, not a Pallas backward kernel).
  """
  q, k, v = q_BxHxLqxD, k_BxHxLkxD, v_BxHxLkxD
  described = _describe(relative)
  if described is None:
    raise ValueError(f'pallas_attention does not compute '
                     f'{type(relative).__name__}; supported: none, alibi, t5, '
                     f'shaw and rotation-only encodings (rope, pope)')
  kind, table, options = described
  if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
    raise ValueError(f'q, k, v must be (B, H, L, D); got {q.shape}, '
                     f'{k.shape}, {v.shape}')
  b, h, lq, _ = q.shape
  lk = k.shape[2]
  if key_valid is not None:
    key_valid = jnp.asarray(key_valid)
    if key_valid.dtype != jnp.bool_ or key_valid.shape != (b, lk):
      raise ValueError(f'key_valid must be bool of shape {(b, lk)}; got '
                       f'{key_valid.dtype} {key_valid.shape}')
    used = key_valid[:, None, :, None]
    k = jnp.where(used, k, jnp.zeros((), k.dtype))
    v = jnp.where(used, v, jnp.zeros((), v.dtype))
  if kind == 't5' and table.shape[1] != h:
    raise ValueError(f'the T5 table has {table.shape[1]} heads; q has {h}')
  if kind == 'alibi' and table.shape[0] != h:
    raise ValueError(f'ALiBi has {table.shape[0]} heads; q has {h}')
  if kind == 'shaw':
    # One (H, 2k + 1, D) table per term; a shared table is broadcast here,
    # outside the custom_vjp, so its gradient sums over the heads.
    def per_head(t):
      if t is None:
        return None
      if options['shared_heads']:
        return jnp.broadcast_to(t[None], (h,) + t.shape)
      if t.shape[0] != h:
        raise ValueError(f'the Shaw table has {t.shape[0]} heads; q has {h}')
      return t
    table = tuple(per_head(t) for t in table)
  scale = 1.0 / math.sqrt(q.shape[-1])       # of the head before `rotate`
  if relative is not None:
    q, k = relative.rotate(q, k)
  cfg = _Config(
      kind=kind, symmetric=options.get('symmetric', False),
      num_buckets=options.get('num_buckets', 0),
      max_distance=options.get('max_distance', 0),
      clip=options.get('clip', 0),
      shaw_values=kind == 'shaw' and table[1] is not None,
      causal=bool(causal),
      scale=scale, block_q=int(block_q), block_k=int(block_k),
      interpret=None if interpret is None else bool(interpret))
  return _flash(cfg, q, k, v, key_valid, table)


__all__ = ['BLOCK_Q', 'BLOCK_K', 'pallas_attention', 'supports']

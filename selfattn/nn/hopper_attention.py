"""A Hopper (sm90) flash-attention forward on Mosaic GPU (`plgpu.kernel`):
TMA loads, wgmma, one producer warpgroup and two compute warpgroups,
K/V pipelined through `stages` shared-memory slots (FlashAttention-3's
shape; JAX's attention_mgpu.py and tokamax's sm90 kernel were read, not
copied).

What it adds to a plain flash forward, and why:
  - the relative term from iota offsets inside the kernel, O(L) memory:
    ALiBi's -slope * distance (both forms); T5's bucket biases (near
    blocks select the bucket's bias per entry); Shaw's keys and values
    (below); none; rotation-only encodings (RoPE, PoPE) arrive rotated and
    use 'none'. A far block (wholly past T5's max_distance or Shaw's k, or
    for ALiBi wholly off the diagonal) costs what 'none' costs but for
    ALiBi's one add per entry: the part of its term that depends on the
    query alone (T5's edge bias, Shaw's edge row, ALiBi's row term) joins
    the row's max and lse once per row (logits2);
  - masks only where a block needs one: key blocks wholly inside the
    causal limit and the batch row's key length run unmasked, the blocks
    crossing either limit run masked, and blocks wholly past them are never
    loaded (causal block skipping, and padding skipping per batch row);
  - softmax in base 2 with the scale folded into one multiply (`exp2`, the
    norm since FlashAttention-2), lse returned in natural log for the
    backward (hopper_backward.py; the Triton pair reads the same lse).

Per program: one (batch, head, tile of 2 * block_q query rows). Warpgroups
0 and 1 each own block_q rows; warpgroup 2 only issues TMA copies of key
blocks [0, tile_end) into slot j % stages, reusing a slot once both
compute warpgroups released it. A compute warpgroup that needs fewer
blocks than its tile (causal) observes the rest's loads and releases them
unread, so the producer never waits forever and every thread sees every
phase of the barriers it shares (JAX 0.11's interpreter checks it); the
producer ends by observing the last releases. A schedule barrier alternates the two
compute warpgroups between their matmuls and their softmax (FA3's
ping-pong), so the tensor cores stay busy while the other group
exponentiates.

Interpret mode (`interpret=True`, the CPU tests) runs the same kernel in
JAX's Mosaic GPU interpreter, with one difference the interpreter forces:
its wgmma reads the left operand only from shared memory, so P is staged
through a (block_q, block_k) shared buffer there, where the GPU feeds it
from registers and accumulates P V into the running output in place.

Shaw (k = clip): the key term scale q_i . a^K_{c(j-i)}, c = clip(., -k, k)
+ k, arrives as QA (B, H, 2k+1, Lq), q a^K^T computed before the kernel
(O(L k) memory); far blocks take one edge row of it (per row, logits2),
near blocks select the offset's row per entry. With values, the kernel
also returns each row's softmax mass per table row, W (B, H, 2k+1, Lq):
the edges accumulate over far blocks in registers, the 2k-1 interior rows
only over the near ones, in shared memory (rescaled on each near block,
and once at the end from the near region's running max); the value term
W a^V is one small matmul after the kernel. The backward
(hopper_backward.py) recomputes the same terms. A near block wholly to one
side of the diagonal selects and folds only the rows it can hold
(held_rows), T5's buckets too. The table rows take shared memory
((2k+1) x 64 float32 per buffer and group): where a kernel's scratch
would not fit (fits; wide heads, large k), the call is Triton's.

Shapes: q (B, H, Lq, D), k and v (B, H, Lk, D), bf16 or f16, D padded
with zeros to a multiple of 64 (at most MAX_HEAD); lengths are padded to
the blocks and the padding masked through the key length.
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

# The bucketed encodings' bookkeeping (far-block split, edge rows, bucket of
# an offset) is the Triton kernels'; HopperConfig has the fields it reads.
from selfattn.nn import pallas_kernels as kernels

F32 = jnp.float32
LN2, LOG2E = kernels.LN2, kernels.LOG2E      # base-2 scores, as the Triton kernels

KINDS = ('none', 'alibi', 't5', 'shaw')   # the forward's; the backward's below
BACKWARD_KINDS = ('none', 'alibi', 't5', 'shaw')   # where their scratch fits
DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
HEAD_MULTIPLE = 64          # a 128-byte swizzled row of 16-bit values
COMPUTE_GROUPS = 2


# Block shapes per (pass, causal) for heads up to 128 wide, as
# scripts/tune_hopper.py prints them, with the run that chose them. None is
# measured yet: these are FlashAttention-3's and JAX's shapes for D = 64
# (64-row compute groups, 128-row streamed blocks, two stages), and the
# backward's two kernels (fused_dq=False) until a GPU has timed the fused
# one against them.
TUNED = {
    ('forward', False): dict(block_k=128, stages=2, ping_pong=True),
    ('forward', True): dict(block_k=128, stages=2, ping_pong=True),
    ('backward', False): dict(block_k=128, stages=2, fused_dq=False),
    ('backward', True): dict(block_k=128, stages=2, fused_dq=False),
}


class HopperConfig(NamedTuple):
  """Static description of one kernel call, forward or backward (hashable)."""
  kind: str                 # one of KINDS
  symmetric: bool           # ALiBi's symmetric form
  causal: bool
  scale: float              # softmax scale, 1/sqrt(D) of the unpadded head
  num_buckets: int = 0      # T5
  max_distance: int = 0     # T5
  clip: int = 0             # Shaw's k: table rows 2k + 1
  shaw_values: bool = False  # Shaw with a value table a^V
  block_q: int = 64         # query rows per compute warpgroup
  block_k: int = 128
  stages: int = 2           # key/value blocks in flight
  ping_pong: bool = True    # the schedule barrier between compute groups
  # The backward as one kernel, dQ added into by TMA reduce-add
  # (hopper_backward._add_dq_share; none, ALiBi, T5), else dQ's and
  # dK/dV's kernels.
  fused_dq: bool = False
  interpret: bool = False   # JAX's Mosaic GPU interpreter (CPU tests)
  # Interpreted: its happens-before race detector, which raises on a race
  # between TMA copies and shared-memory loads and stores (JAX 0.11/0.12's
  # does not track wgmma's operand reads); slower, for tests.
  detect_races: bool = False


# Widest head (after padding to HEAD_MULTIPLE): at 128 the backward's
# shared memory is ~192 KiB of the 227 KiB an sm90 block may have.
MAX_HEAD = 128


def supports(kind: str, dtype, head_dim: int, clip: int = 0,
             values: bool = False, causal: bool = False) -> bool:
  """Whether these kernels compute the call's forward (else the Triton ones
  do): head_dim is the widest of q's (after any rotation) and v's; clip
  and values are Shaw's k and whether it has a value table (its rows take
  shared memory: fits)."""
  if not (kind in KINDS and jnp.dtype(dtype) in DTYPES
          and round_up(head_dim, HEAD_MULTIPLE) <= MAX_HEAD):
    return False
  cfg = tuned_config(kind, 'forward', clip, values, causal)
  return fits(forward_scratch(cfg, round_up(head_dim, HEAD_MULTIPLE),
                              jnp.dtype(dtype)))


def tuned_config(kind: str, pass_name: str, clip: int = 0,
                 values: bool = False, causal: bool = False) -> HopperConfig:
  """A config at TUNED's shapes for a pass ('forward' or 'backward'), with
  what its scratch depends on (the kind, Shaw's k and value table): the
  routing's question of whether a call fits."""
  return HopperConfig(kind=kind, symmetric=False, causal=causal, scale=1.0,
                      clip=clip, shaw_values=values,
                      **TUNED[pass_name, causal])


# An sm90 block's shared memory, as Mosaic GPU checks it when lowering:
# each scratch buffer starts at a 1 KiB boundary, each barrier takes 8
# bytes. Shaw's table rows ((2k+1) x block float32 per buffer) are what can
# pass it. With values the forward fits up to k = 70 with 64-wide heads
# and k = 30 with 128-wide ones, the backward up to k = 30 and k = 6
# (hopper_backward.backward_computes; so the default k = 16 at 128-wide
# heads has Triton's backward). Keys only, about twice those k.
SMEM_BYTES = 227 * 1024
SMEM_ALIGNMENT = 1024
BARRIER_BYTES = 8


def smem_bytes(scratch) -> int:
  """Shared memory of a kernel's scratch: a nest of tuples of plgpu.SMEM
  and plgpu.Barrier specs (None where a kernel has none). Mosaic GPU adds
  its reduction scratch to a kernel that reduces across lanes (fits
  counts it)."""
  if scratch is None:
    return 0
  if isinstance(scratch, (tuple, list)):
    return sum(smem_bytes(item) for item in scratch)
  if hasattr(scratch, 'num_barriers'):      # a shape, e.g. (stages,)
    return BARRIER_BYTES * math.prod(scratch.num_barriers)
  size = math.prod(scratch.shape) * jnp.dtype(scratch.dtype).itemsize
  return round_up(size, SMEM_ALIGNMENT)


def fits(scratch) -> bool:
  """Whether a kernel's scratch fits an sm90 block's shared memory beside
  the scratch Mosaic GPU reserves for row reductions (the forward's and
  dQ's; counted for dK/dV too, which has none: 2 KiB on the safe side)."""
  return smem_bytes(scratch) + reduction_scratch_bytes() <= SMEM_BYTES


def reduction_scratch_bytes() -> int:
  """Shared memory Mosaic GPU reserves in a kernel with a cross-warp
  reduction (its CompilerParams' default; 2 KiB in JAX 0.11 and 0.12)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  return plgpu.CompilerParams().reduction_scratch_bytes


# Device kinds of sm90 parts (wgmma is sm90a only: not Ampere, not Blackwell).
HOPPER_DEVICE_KINDS = ('H100', 'H200', 'H800', 'H20', 'GH200')


def _is_hopper_kind(device_kind: str) -> bool:
  return any(name in device_kind.split() for name in HOPPER_DEVICE_KINDS)


def lowering_for_hopper() -> bool:
  """Whether the GPU being lowered for is a Hopper: the abstract device of
  the current abstract mesh where one is set (lowering from a host without
  a GPU, selfattn.nn.lowering), else this host's first GPU."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  if not hasattr(plgpu, 'kernel'):           # JAX before 0.11
    return False
  device = getattr(jax.sharding.get_abstract_mesh(), 'abstract_device', None)
  if device is not None:
    return _is_hopper_kind(str(device.device_kind))
  try:
    gpus = jax.devices('gpu')
  except RuntimeError:
    return False
  return bool(gpus) and getattr(gpus[0], 'compute_capability', '') == '9.0'


def head_table(cfg: HopperConfig, table, heads: int) -> jax.Array:
  """The kernels' per-head table input: ALiBi's (H,) slopes, T5's
  (H, num_buckets) biases, or (H,) zeros."""
  if cfg.kind == 't5':
    return jnp.asarray(table, F32).T
  if cfg.kind == 'alibi':
    return jnp.asarray(table, F32)
  return jnp.zeros((heads,), F32)


def check(cfg: HopperConfig) -> None:
  if cfg.kind not in KINDS:
    raise ValueError(f'kind={cfg.kind!r}: the Hopper kernel computes {KINDS}')
  if cfg.kind == 't5' and (cfg.num_buckets < 4 or cfg.max_distance < 1):
    raise ValueError(f'T5 needs num_buckets >= 4 and max_distance >= 1; got '
                     f'{cfg.num_buckets}, {cfg.max_distance}')
  if cfg.kind == 'shaw' and cfg.clip < 1:
    raise ValueError(f"Shaw needs clip >= 1; got {cfg.clip}")
  if cfg.block_q % 64 or cfg.block_k % 64:
    raise ValueError(f'block_q={cfg.block_q} and block_k={cfg.block_k} must '
                     f'be multiples of 64 (a wgmma tile)')
  if cfg.stages < 2:
    raise ValueError(f'stages={cfg.stages} must be at least 2')


def check_width(width: int) -> None:
  if width > MAX_HEAD:
    raise ValueError(f'heads {width} wide after padding: the Hopper kernels '
                     f'take up to {MAX_HEAD} (shared memory)')


def round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def cdiv(x, d: int):
  """ceil(x / d) of a non-negative int32."""
  return lax.div(x + (d - 1), jnp.int32(d))


def key_end(cfg: HopperConfig, length, shift, last_row, bk: int):
  """One past the last key block that query rows up to last_row attend
  to (keys [0, length); causal with shift = Lk - Lq)."""
  seen = length
  if cfg.causal:
    seen = jnp.minimum(seen, jnp.maximum(last_row + 1 + shift, 0))
  return cdiv(seen, bk)


def unmasked_end(cfg: HopperConfig, length, shift, first_row, bk: int, end):
  """Key blocks [0, result) are wholly inside both limits for every row
  from first_row on: they need no mask."""
  full = lax.div(length, jnp.int32(bk))
  if cfg.causal:
    full = jnp.minimum(full, lax.div(jnp.maximum(first_row + shift + 1, 0),
                                     jnp.int32(bk)))
  return jnp.minimum(full, end)


def block_indices(row_base, column_base, shape):
  """(row, column) int32 indices of a block, WGMMA layout."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  iota = lambda axis: plgpu.broadcasted_iota(jnp.int32, shape, axis,
                                             layout=plgpu.Layout.WGMMA)
  return row_base + iota(0), column_base + iota(1)


def head_terms(cfg: HopperConfig, table_ref, h):
  """The head's encoding scalars in base 2: ALiBi's slope log2 e, T5's
  bias of bucket n times log2 e as a function of n (a scalar load, n
  static or traced), else None."""
  if cfg.kind == 'alibi':
    return table_ref[h] * LOG2E
  if cfg.kind == 't5':
    return lambda n: table_ref[h, n] * LOG2E
  return None


def regions(cfg: HopperConfig, row_block, bq: int, bk: int, end):
  """[(lo, hi, region)] of key blocks [0, end) for query rows
  [row_block bq, row_block bq + bq): the far blocks on each side (T5's and
  Shaw's past max_distance or k, one bucket or table row each, no search;
  ALiBi's wholly off the diagonal, a row plus a column term) apart from
  the near ones; one 'near' range otherwise."""
  if not kernels.splits(cfg):
    return [(jnp.int32(0), end, 'near')]
  left_end, right_start = kernels.far_blocks(row_block, bq, bk,
                                             kernels.reach(cfg), end)
  return [(jnp.int32(0), left_end, 'left'), (left_end, right_start, 'near'),
          (right_start, end, 'right')]


def over_blocks(cfg: HopperConfig, step, carry, row_block, bq: int, bk: int,
                full, end):
  """step(j, carry, masked=, region=) over key blocks [0, end) in
  static (region, masked) segments: blocks below `full` unmasked."""
  for lo, hi, region in regions(cfg, row_block, bq, bk, end):
    for a, b, masked in kernels.masked_split(full, lo, hi):
      carry = lax.fori_loop(a, b, functools.partial(
          step, masked=masked, region=region), carry)
  return carry


def held_rows(cfg: HopperConfig, starts, shape, query_axis: int = 0):
  """(first, stop), traced int32: the buckets or table rows [first, stop)
  a near block can hold, from the range of its offsets (starts: its first
  query and key; query_axis as logits2's). A block wholly left of the
  diagonal (every offset < 0) holds only T5's lower half or Shaw's rows
  below k, one wholly right only the other half (kernels.side_rows), so
  its selects and folds run half as many rounds. Bounds of the loops, not
  loops of their own: a near loop split by side (kernels.near_sides, as
  the Triton dQ does) lowered 1.6x slower here (Shaw's training call at
  8192, 4.2 -> 6.7 s), for the same rounds."""
  q0, k0 = starts
  queries, keys = shape if query_axis == 0 else shape[::-1]
  lowest = k0 - (q0 + queries - 1)
  highest = k0 + keys - 1 - q0
  rows = kernels.num_rows(cfg)
  half = len(kernels.side_rows(cfg, 'left'))
  return (jnp.where(lowest > 0, rows - half, 0).astype(jnp.int32),
          jnp.where(highest < 0, half, rows).astype(jnp.int32))


def shaw_vector(qa_smem, n, query_axis: int = 0):
  """Table row n's term of the block's queries (the key term: base-2
  values of scale q a^K_n; the backward's dO a^V_n) from shared memory, a
  vector along the queries: axis 0 of the block (the forward, dQ) or axis
  1 (dK/dV's transposed blocks)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  return plgpu.load(qa_smem.at[n],
                    layout=plgpu.Layout.WGMMA.reduce(1 - query_axis))


def shaw_row(qa_smem, n, shape, query_axis: int = 0):
  """shaw_vector broadcast along the keys, to the block's shape."""
  return lax.broadcast_in_dim(shaw_vector(qa_smem, n, query_axis), shape,
                              [query_axis])


def table_term(cfg: HopperConfig, value, bucket, like, held):
  """T5's or Shaw's per-entry term of a near block: value(n) of each
  entry's bucket or table row n, by one select per row (no gather), over
  the rows the block can hold (held: held_rows). (A far block's term is
  one edge's, far_terms.)

  The rows are a loop, not unrolled: the same selects, but Mosaic GPU's
  layout inference grows with the unrolled ops. One attention call's
  forward and backward with Shaw at k = 16 took 48 s to lower unrolled
  against 12 s rolled (8k, from this CPU, 2026-11-28); with T5's 32
  buckets (then unrolled, the biases held in registers) a call at 1000
  took 9.3 s, 7.0 s with these selects rolled and 5.5 s with its dQ folds
  in shared memory too (hopper_backward.fold_into). Shaw's rows come from
  shared memory by a traced index, T5's biases by a scalar load each."""
  return lax.fori_loop(
      *held,
      lambda n, term: jnp.where(bucket == n, value(n), term),
      jnp.zeros_like(like))


def iota_vector(n: int, query_axis: int, along_queries: bool):
  """0..n-1 (float32) as a vector along a block's queries or its keys,
  in the layout that broadcasts it over the other axis."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  axis = query_axis if along_queries else 1 - query_axis
  return plgpu.broadcasted_iota(
      jnp.int32, (n,), 0,
      layout=plgpu.Layout.WGMMA.reduce(1 - axis)).astype(F32)


def far_terms(cfg: HopperConfig, terms, region: str, starts, shape,
              query_axis: int = 0):
  """A far block's term split into (queries', keys') parts: the first a
  scalar or a vector along the queries, the second None or a vector along
  the keys (query_axis: as logits2's). T5: the edge bucket's bias; Shaw:
  the edge row of QA per query; ALiBi, with q0, k0 = starts (the block's
  first query and key) and slope in base 2: kernels.alibi_split of the
  block's positions relative to q0, as the Triton kernels'."""
  if cfg.kind == 't5':
    return terms(kernels.edge(cfg, region)), None
  if cfg.kind == 'shaw':
    return shaw_vector(terms, kernels.edge(cfg, region), query_axis), None
  q0, k0 = starts
  rows, columns = ((shape[0], shape[1]) if query_axis == 0
                   else (shape[1], shape[0]))
  query = iota_vector(rows, query_axis, along_queries=True)
  key = (k0 - q0).astype(F32) + iota_vector(columns, query_axis,
                                            along_queries=False)
  return kernels.alibi_split(cfg, region, terms, query, key)


def logits2(cfg: HopperConfig, s, q_idx, k_idx, terms, length, shift,
            masked: bool, region: str = 'near', bucket=None,
            query_axis: int = 0, starts=None, held=None):
  """(logits, per_query) of a block of raw scores s (q k^T): base-2
  logits, the scale and the encoding's term (head_terms; Shaw's: the QA
  rows in shared memory) folded in, -inf where the pair is not allowed
  (masked blocks only: keys past `length`, causal with `shift` = Lk - Lq).

  A far block (region 'left' or 'right', regions) leaves out of the
  logits the part of its term that depends on the query alone and
  returns it as per_query (far_terms: T5's edge bias, Shaw's edge row of
  QA, ALiBi's row term), which the caller folds into its per-row max or
  lse: softmax is unchanged by a constant per row, so that is one
  subtract per row where adding it was one add per entry. per_query is
  0.0 in near blocks, where T5 and Shaw (`bucket`: each entry's, the
  caller's kernels.bucket_of) look the term up by one select per bucket
  (no gather) and ALiBi computes it per entry. starts: the block's first
  query and key (ALiBi's far blocks). query_axis: 1 for dK/dV's
  transposed blocks (keys on axis 0). held: the rows a near block can hold
  (held_rows)."""
  s = s * (cfg.scale * LOG2E)
  per_query = 0.0
  if region != 'near' and kernels.splits(cfg):
    per_query, per_key = far_terms(cfg, terms, region, starts, s.shape,
                                   query_axis)
    if per_key is not None:
      s = s + lax.broadcast_in_dim(per_key, s.shape, [1 - query_axis])
  elif cfg.kind == 'alibi':
    s = s - terms * kernels.alibi_distance(k_idx - q_idx, cfg.symmetric)
  elif cfg.kind in ('t5', 'shaw'):
    if cfg.kind == 't5':
      value = terms                                 # a scalar per bucket
    else:
      value = lambda n: shaw_row(terms, n, s.shape, query_axis)
    s = s + table_term(cfg, value, bucket, s, held)
  if masked:
    keep = k_idx < length
    if cfg.causal:
      keep = keep & (k_idx <= q_idx + shift)
    s = jnp.where(keep, s, -jnp.inf)
  return s, per_query


def block_logits2(cfg: HopperConfig, s, terms, length, shift, masked: bool,
                  region: str, starts, query_axis: int = 0):
  """(logits, per_query, bucket, held) of a block of raw scores s whose
  first query and key are `starts`: logits2, with the iota indices (masked
  or near blocks), each entry's bucket or table row and the rows the block
  can hold (held_rows; T5's and Shaw's near blocks, else None) that it and
  the caller's folds need."""
  q0, k0 = starts
  q_idx = k_idx = bucket = None
  near = region == 'near' and kernels.splits(cfg)
  if masked or near:
    if query_axis == 0:
      q_idx, k_idx = block_indices(q0, k0, s.shape)
    else:
      k_idx, q_idx = block_indices(k0, q0, s.shape)
  held = None
  if near and cfg.kind in ('t5', 'shaw'):
    bucket = kernels.bucket_of(cfg, k_idx - q_idx)
    held = held_rows(cfg, starts, s.shape, query_axis)
  s, per_query = logits2(cfg, s, q_idx, k_idx, terms, length, shift, masked,
                         region, bucket, query_axis, starts, held)
  return s, per_query, bucket, held


def per_row(vector, shape, axis: int = 0):
  """A vector along a block's axis (or a scalar) to the block's shape."""
  if jnp.ndim(vector) == 0:
    return vector
  return lax.broadcast_in_dim(vector, shape, [axis])


def accumulate_product(acc, a, b_ref, a_smem, interpret: bool):
  """acc + a @ b_ref on the tensor cores (wgmma), a a value in registers.
  The GPU accumulates in place from registers; JAX's interpreter takes the
  left operand only from shared memory, so there a goes through a_smem."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  if interpret:
    a_smem[...] = a
    plgpu.commit_smem()

    def product(acc_ref):
      plgpu.wgmma(acc_ref, a_smem, b_ref)
      return acc_ref[...]
    return acc + pl.run_scoped(product, plgpu.ACC(acc.shape, F32))

  def accumulate(acc_ref):
    plgpu.wgmma(acc_ref, a, b_ref)
  return pl.run_state(accumulate)(plgpu.ACC.init(acc))


def product(a_ref, b_ref, shape):
  """a_ref @ b_ref (float32, WGMMA layout), both operands in shared memory."""
  import jax.experimental.pallas.mosaic_gpu as plgpu

  def product(acc_ref):
    plgpu.wgmma(acc_ref, a_ref, b_ref)
    return acc_ref[...]
  return pl.run_scoped(product, plgpu.ACC(shape, F32))


def add_to_row(rows_smem, n, value, layout, decay=None):
  """rows_smem[n] = rows_smem[n] (times decay) + value, for a (rows, block)
  float32 buffer of per-row sums kept in shared memory rather than in
  registers: unrolled, a register row per table row or bucket made Mosaic
  GPU's layout inference (which grows with the unrolled ops) the slowest
  part of lowering, and each row costs every thread of the group about
  two registers (33 rows at k = 16, twice in Shaw's dQ with values).
  Lowered for cuda at 8k and k = 16 from this CPU (2026-11-28), Shaw's
  forward with values took 4.5 s with its masses in registers and 2.8 s
  here; its dQ kernel 5.6 s and 3.1 s. Each entry is held, and read back,
  by the same threads of the warpgroup (one layout for the load and the
  store; Mosaic GPU stores a replicated layout from every replica), so
  consecutive blocks need no barrier between them."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  row = rows_smem.at[n]
  old = plgpu.load(row, layout=layout)
  row[...] = (old if decay is None else old * decay) + value


def _shaw_masses(cfg: HopperConfig, masses, mass_smem, p, alpha, psum,
                 bucket, m_new, region: str, held):
  """Shaw with values: each row's softmax mass per table row. The edges
  (left, right) are carried in registers and rescale every block; the
  interior rows 1..2k-1 sit in mass_smem ((2k+1, bq) float32, zeroed
  first) and change only in near blocks, rescaling there (all of them;
  the masses only of the rows the block can hold, held_rows);
  m_near, the running max when the near blocks ended, lets the epilogue
  bring them to the final max."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  left, right, m_near = masses
  left, right = left * alpha, right * alpha
  if region == 'left':
    return left + psum, right, m_near
  if region == 'right':
    return left, right + psum, m_near
  mass = lambda n: jnp.where(bucket == n, p, 0.0).sum(axis=1)
  layout = plgpu.Layout.WGMMA.reduce(1)
  first, stop = held
  # The interior rows 1..2k-1: those the block can hold gain its mass, the
  # others (none on the diagonal) are only rescaled.
  inner = (jnp.maximum(first, 1), jnp.minimum(stop, 2 * cfg.clip))
  for lo, hi in ((1, inner[0]), (inner[1], 2 * cfg.clip)):
    @pl.loop(lo, hi)
    def _rescale(n):
      add_to_row(mass_smem, n, 0.0, layout, alpha)

  @pl.loop(*inner)
  def _interior(n):
    add_to_row(mass_smem, n, mass(n), layout, alpha)
  # Edges a block cannot hold add their mass, 0.
  left, right = left + mass(0), right + mass(2 * cfg.clip)
  return left, right, m_new


def _kernel(*refs, cfg: HopperConfig, lq: int, lk: int, dtype):
  import jax.experimental.pallas.mosaic_gpu as plgpu
  shaw = cfg.kind == 'shaw'
  values = shaw and cfg.shaw_values
  q_ref, k_ref, v_ref, len_ref, table_ref = refs[:5]
  qa_ref = refs[5] if shaw else None
  out_ref, lse_ref = refs[5 + shaw:7 + shaw]
  w_ref = refs[7 + shaw] if values else None
  scoped = refs[-1]
  smem, (k_ready, v_ready, q_ready, qa_ready), (k_free, v_free), turn = scoped
  q_smem2, k_smem, v_smem, p_smem2, lse_smem2, qa_smem2, mass_smem2 = smem
  bq, bk, stages = cfg.block_q, cfg.block_k, cfg.stages
  b = lax.axis_index('batch')
  h = lax.axis_index('heads')
  wg = lax.axis_index('wg')
  tile_base = lax.axis_index('q_tiles') * (COMPUTE_GROUPS * bq)
  shift = lk - lq                        # causal: key j for query i iff j <= i + shift
  length = jnp.clip(len_ref[b], 0, lk)   # this row's keys [0, length)

  tile_end = key_end(cfg, length, shift, tile_base + COMPUTE_GROUPS * bq - 1,
                     bk)

  def take_turn():
    if cfg.ping_pong:
      plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(turn)

  @pl.when(wg < COMPUTE_GROUPS)
  def _compute():
    plgpu.set_max_registers(232, action='increase')
    q_smem, lse_smem = q_smem2.at[wg], lse_smem2.at[wg]
    q_base = tile_base + wg * bq
    end = key_end(cfg, length, shift, q_base + bq - 1, bk)
    full = unmasked_end(cfg, length, shift, q_base, bk, end)
    plgpu.copy_gmem_to_smem(q_ref.at[b, h, pl.ds(q_base, bq)], q_smem,
                            q_ready.at[wg])
    terms = head_terms(cfg, table_ref, h)
    if shaw:
      # This block's rows of QA, (2k+1, bq): the key term per table row.
      terms = qa_smem2.at[wg]
      plgpu.copy_gmem_to_smem(qa_ref.at[b, h, :, pl.ds(q_base, bq)], terms,
                              qa_ready.at[wg])
      plgpu.barrier_wait(qa_ready.at[wg])
    plgpu.barrier_wait(q_ready.at[wg])
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    rows = lambda value: plgpu.layout_cast(jnp.full((bq,), value, F32),
                                           row_layout)
    m, l = rows(-jnp.inf), rows(0.0)
    acc = plgpu.layout_cast(jnp.zeros((bq, q_smem.shape[-1]), F32),
                            plgpu.Layout.WGMMA)
    masses, mass_smem = (), None
    if values:
      mass_smem = mass_smem2.at[wg]
      masses = (rows(0.0), rows(0.0), rows(-jnp.inf))

      @pl.loop(1, 2 * cfg.clip)
      def _zero(n):
        mass_smem.at[n][...] = rows(0.0)
    pl.when(wg == 1)(take_turn)

    def step(j, carry, masked: bool, region: str):
      acc, m, l, masses = carry
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])

      def scores(acc_ref):
        plgpu.wgmma(acc_ref, q_smem, k_smem.at[slot].transpose((1, 0)))
        take_turn()
        return acc_ref[...]
      s = pl.run_scoped(scores, plgpu.ACC((bq, bk), F32))
      plgpu.barrier_arrive(k_free.at[slot])
      s, per_query, bucket, held = block_logits2(
          cfg, s, terms, length, shift, masked, region, (q_base, j * bk))
      # The row max of the whole logits, the far blocks' per-query term
      # (logits2) added per row.
      m_new = jnp.maximum(m, s.max(axis=1) + per_query)
      # A row with nothing allowed yet keeps m = -inf; shift by 0 there.
      m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new) if masked else m_new
      alpha = jnp.exp2(m - m_use)
      p = jnp.exp2(s - per_row(m_use - per_query, s.shape))
      psum = p.sum(axis=1)
      l = l * alpha + psum
      if values:
        masses = _shaw_masses(cfg, masses, mass_smem, p, alpha, psum, bucket,
                              m_new, region, held)
      acc = acc * lax.broadcast_in_dim(alpha, acc.shape, [0])
      p16 = p.astype(dtype)
      if cfg.ping_pong:
        plgpu.barrier_arrive(turn)
      plgpu.barrier_wait(v_ready.at[slot])
      if cfg.ping_pong:
        plgpu.barrier_wait(turn)
      acc = accumulate_product(acc, p16, v_smem.at[slot],
                        p_smem2.at[wg] if cfg.interpret else None,
                        cfg.interpret)
      plgpu.barrier_arrive(v_free.at[slot])
      return acc, m_new, l, masses

    acc, m, l, masses = over_blocks(cfg, step, (acc, m, l, masses),
                                    lax.div(q_base, bq), bq, bk, full, end)

    @pl.loop(end, tile_end)
    def _release(j):
      # Blocks the tile's other group needs and this one does not: observe
      # their loads (every thread sees every phase of a barrier it shares;
      # JAX 0.11's interpreter checks), free the slots, keep the turns.
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])
      plgpu.barrier_wait(v_ready.at[slot])
      plgpu.barrier_arrive(k_free.at[slot])
      plgpu.barrier_arrive(v_free.at[slot])
      take_turn()
      take_turn()

    pl.when(wg == 0)(take_turn)
    has_key = l > 0
    inv = jnp.where(has_key, 1.0 / jnp.where(has_key, l, 1.0), 0.0)
    q_smem[...] = (acc * lax.broadcast_in_dim(inv, acc.shape, [0])).astype(
        dtype)
    # A row with no allowed key: output 0 and lse = +inf (backward weight 0).
    lse_smem[...] = jnp.where(
        has_key, (m + jnp.log2(jnp.where(has_key, l, 1.0))) * LN2, jnp.inf)
    if values:
      # Normalized masses per table row: the edges from registers, the
      # interior rows rescaled in place from the near blocks' max.
      left, right, m_near = masses
      near_seen = has_key & (m_near > -jnp.inf)
      rescale = jnp.where(near_seen, jnp.exp2(jnp.where(near_seen, m_near, m)
                                              - m), 0.0) * inv
      mass_smem.at[0][...] = left * inv
      mass_smem.at[2 * cfg.clip][...] = right * inv

      @pl.loop(1, 2 * cfg.clip)
      def _normalize(n):
        add_to_row(mass_smem, n, 0.0, row_layout, rescale)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, out_ref.at[b, h, pl.ds(q_base, bq)])
    plgpu.copy_smem_to_gmem(lse_smem, lse_ref.at[b, h, pl.ds(q_base, bq)])
    if values:
      plgpu.copy_smem_to_gmem(mass_smem, w_ref.at[b, h, :, pl.ds(q_base, bq)])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == COMPUTE_GROUPS)
  def _produce():
    plgpu.set_max_registers(40, action='decrease')

    def load(ref, smem, ready, j, slot):
      plgpu.copy_gmem_to_smem(ref.at[b, h, pl.ds(j * bk, bk)], smem.at[slot],
                              ready.at[slot])

    def load_both(j, slot):
      load(k_ref, k_smem, k_ready, j, slot)
      load(v_ref, v_smem, v_ready, j, slot)

    for j in range(stages):
      pl.when(j < tile_end)(functools.partial(load_both, j, j))

    @pl.loop(stages, jnp.maximum(tile_end, stages))
    def _refill(j):
      # Each block's keys as soon as their slot's keys are freed (after
      # the groups' q k^T), its values once the values are (after p v):
      # the next keys load while the values are still being read.
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_free.at[slot])
      load(k_ref, k_smem, k_ready, j, slot)
      plgpu.barrier_wait(v_free.at[slot])
      load(v_ref, v_smem, v_ready, j, slot)

    @pl.loop(jnp.maximum(tile_end - stages, 0), tile_end)
    def _drain(j):
      # Observe the last blocks' release too (each thread sees every phase
      # of the barriers it shares).
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_free.at[slot])
      plgpu.barrier_wait(v_free.at[slot])


def interpret_params(cfg: HopperConfig):
  """The interpreter's parameters of an interpreted call (None: compiled
  for the GPU)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  if not cfg.interpret:
    return None
  return plgpu.InterpretGPUParams(detect_races=cfg.detect_races)


def tiled_smem(shape, dtype):
  """A shared buffer of 16-bit operands in wgmma's layout: 8 x 64 tiles,
  128-byte swizzle."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  return plgpu.SMEM(shape, dtype,
                    transforms=(plgpu.TilingTransform((8, 64)),
                                plgpu.SwizzleTransform(128)))


def forward_scratch(cfg: HopperConfig, width: int, dtype):
  """The forward kernel's scratch, (shared buffers, ready barriers, freed
  barriers, turn barrier), for heads `width` wide (padded)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  bq, bk, groups = cfg.block_q, cfg.block_k, COMPUTE_GROUPS
  shaw = cfg.kind == 'shaw'
  tiled = lambda shape: tiled_smem(shape, dtype)
  table_rows = lambda used: (
      plgpu.SMEM((groups, kernels.num_rows(cfg), bq), F32) if used else None)
  smem = (tiled((groups, bq, width)),
          tiled((cfg.stages, bk, width)),
          tiled((cfg.stages, bk, width)),
          tiled((groups, bq, bk)) if cfg.interpret else None,
          plgpu.SMEM((groups, bq), F32),
          table_rows(shaw),                             # QA's rows
          table_rows(shaw and cfg.shaw_values))         # the masses
  barriers = (plgpu.Barrier(num_barriers=cfg.stages),
              plgpu.Barrier(num_barriers=cfg.stages),
              plgpu.Barrier(num_barriers=groups),
              plgpu.Barrier(num_barriers=groups) if shaw else None)
  freed = (plgpu.Barrier(num_arrivals=groups, num_barriers=cfg.stages),) * 2
  turn = plgpu.Barrier(num_arrivals=groups)
  return smem, barriers, freed, turn


def forward(cfg: HopperConfig, q: jax.Array, k: jax.Array, v: jax.Array,
            key_lengths: jax.Array | None,
            table: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """(out (B, H, Lq, Dv) in q's dtype, lse (B, H, Lq) float32, natural log).

  q, k, v: (B, H, L, D), bf16 or f16, q rotated and not scaled (cfg.scale
  is applied here). key_lengths: (B,) int, keys [0, length) attended, or
  None for all. table: ALiBi's (H,) slopes, T5's (num_buckets, H) biases
  (positions.T5RelativeBias.bias), Shaw's per-head (a^K (H, 2k+1, D), a^V
  (H, 2k+1, Dv) or None), else None.
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu
  check(cfg)
  b, h, lq, d = q.shape
  lk, dv = k.shape[2], v.shape[3]
  if jnp.dtype(q.dtype) not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
    raise ValueError(f'the Hopper kernel takes bf16 or f16 q, k, v of one '
                     f'dtype; got {q.dtype}, {k.dtype}, {v.dtype}')
  width = round_up(max(d, dv), HEAD_MULTIPLE)
  check_width(width)
  lq_pad = round_up(lq, COMPUTE_GROUPS * cfg.block_q)
  lk_pad = round_up(lk, cfg.block_k)
  pad = lambda x, length: jnp.pad(
      x, [(0, 0), (0, 0), (0, length - x.shape[2]), (0, width - x.shape[3])])
  shaw = cfg.kind == 'shaw'
  extra_in, a_v = [], None
  if shaw:
    a_k, a_v = table
    # The key term of every (query, table row), base 2: (B, H, 2k+1, Lq).
    qa = jnp.einsum('bhld,hrd->bhrl', q, a_k.astype(q.dtype),
                    preferred_element_type=F32) * (cfg.scale * LOG2E)
    extra_in = [jnp.pad(qa, [(0, 0)] * 3 + [(0, lq_pad - lq)])]
    cfg = cfg._replace(shaw_values=a_v is not None)
    table = None
  q, k, v = pad(q, lq_pad), pad(k, lk_pad), pad(v, lk_pad)
  lengths = (jnp.full((b,), lk, jnp.int32) if key_lengths is None
             else jnp.asarray(key_lengths, jnp.int32))
  table = head_table(cfg, table, h)
  # No more slots than key blocks (a short sequence has one).
  cfg = cfg._replace(stages=min(cfg.stages, lk_pad // cfg.block_k))
  bq = cfg.block_q
  smem, barriers, freed, turn = forward_scratch(cfg, width, q.dtype)
  # What a GPU allocates (the interpreter's extra buffer has no limit).
  if not fits(forward_scratch(cfg._replace(interpret=False), width,
                              q.dtype)):
    raise ValueError(f'kind={cfg.kind!r} with heads {width} wide (padded)'
                     + (f' and clip={cfg.clip}' if shaw else '')
                     + ': the Hopper forward\'s scratch would not fit in '
                     'shared memory (supports)')
  body = functools.partial(_kernel, cfg=cfg, lq=lq, lk=lk, dtype=q.dtype)

  def entry(*refs):
    pl.run_scoped(lambda *scoped: body(*refs, scoped), smem, barriers, freed,
                  turn, collective_axes='wg')

  out_type = [jax.ShapeDtypeStruct((b, h, lq_pad, width), q.dtype),
              jax.ShapeDtypeStruct((b, h, lq_pad), F32)]
  if cfg.shaw_values:
    out_type.append(jax.ShapeDtypeStruct((b, h, kernels.num_rows(cfg), lq_pad),
                                         F32))
  outs = plgpu.kernel(
      entry,
      out_type=tuple(out_type),
      grid=(h, lq_pad // (COMPUTE_GROUPS * bq), b),
      grid_names=('heads', 'q_tiles', 'batch'),
      num_threads=COMPUTE_GROUPS + 1, thread_name='wg',
      compiler_params=plgpu.CompilerParams(approx_math=True),
      interpret=interpret_params(cfg),
      kernel_name='selfattn_hopper_forward',
  )(q, k, v, lengths, table, *extra_in)
  out, lse = outs[0][:, :, :lq, :dv], outs[1][:, :, :lq]
  if cfg.shaw_values:
    # Shaw's value term, sum over table rows of mass x a^V (O(L k) work).
    term = jnp.einsum('bhrl,hrd->bhld', outs[2][..., :lq], a_v.astype(F32))
    out = (out.astype(F32) + term).astype(q.dtype)
  return out, lse


__all__ = ['BACKWARD_KINDS', 'HopperConfig', 'KINDS', 'TUNED', 'check',
           'fits', 'forward_scratch', 'reduction_scratch_bytes', 'smem_bytes',
           'tiled_smem', 'tuned_config',
           'forward', 'lowering_for_hopper', 'supports']

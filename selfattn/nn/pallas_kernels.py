"""The bodies of selfattn's Pallas flash-attention kernels (forward, dQ,
dK/dV) and the static choices they share; pallas_attention.py calls them.

Every kernel visits (query block, key block) pairs and recomputes the block
of scores from q, k and the encoding's small tables:

    s = (q k^T) * scale + term(offsets)   masked to -inf where not allowed

held in base-2 units, s * log2(e), so every exponential is one exp2 (the
scale and the encoding's small tables carry the log2(e) factor, once per
program; FlashAttention-2/3 and JAX's own Triton kernel do the same: Pallas
lowers exp to libdevice's range-reduced __nv_expf, exp2 to __nv_exp2f):

  forward  one program per (batch * head, query block), a loop over key
           blocks: the running max m, normaliser l and output acc in
           float32 (FlashAttention); writes out and lse = m + log l
           (natural units, what the backward and the Hopper kernels share).
  dQ       one program per (batch * head, query block), a loop over key
           blocks: p = exp(s - lse), dp = dO v^T (+ Shaw's value term),
           ds = p (dp - delta), dq += ds k; the table gradients (T5's per
           bucket sums of ds, Shaw's ds and p folded per clipped offset)
           accumulate per program and are summed outside.
  dK/dV    one program per (batch * head, key block), a loop over query
           blocks: dv += p^T dO, dk += ds^T q.

delta = rowsum(dO * out) is computed outside (O(L D)). The relative term of
a block comes from its iota offsets (key index - query index), never from an
(Lq, Lk) array: ALiBi's -slope * distance; T5's bias per offset and Shaw's
q a^K^T (and dO a^V^T for its value term) per clipped offset. On Triton
and in interpret mode those two are gathered loads (`Gathered`) from small
tables made outside: T5's bias of each offset -M..M per head (base 2),
Shaw's rows of scale log2(e) q a^K^T and of dO a^V^T, (Lq_pad, 2k + 1) per
batch row and head, O(L k). There Shaw's value term and table gradients
sum only the two clipped rows inside the loop (`edge_sums`, carried as
columns) and fold the 2k - 1 interior offsets once per program after it
(`band`). Mosaic TPU has no such gather and selects and folds per bucket
instead (T5's bucket of each offset, Shaw's columns of a per-program
q a^K^T matmul), as the CPU tests do under
pallas_attention.selected_terms(); T5's table gradient folds per bucket on
both. Blocks wholly beyond Shaw's clip k or T5's
max_distance (most of them once L >> k) use one edge row or bucket per
direction instead, and blocks wholly to one side of the diagonal take
ALiBi's bias as a row term plus a column term: `far_blocks` and
`far_query_blocks` split each loop into its left, near and right ranges.
A far block's term that depends on the query alone (the edge row or
bucket, ALiBi's row term) joins the row's max or lse once per row rather
than each entry (`logit_term`'s per_query), and Shaw's far value term
joins delta (`with_value_term`). Near blocks wholly to one side of the
diagonal hold only that side's buckets or rows, so where a loop selects or
folds per bucket they run apart (`by_sides`, `near_sides`) over that
side's only (`side_rows`).

Shapes follow the backend's rules (`layout`): Triton wants every array a
power of two and a dot's dims >= 16, and has no slice of a value (columns
are masked row sums); Mosaic TPU wants a block's last two dims multiples of
(8, 128) or the array's own, reads scalars only from SMEM (per-head scalars
are (1, 1) reductions of a tile) and lowers `sign` (so floor_divide) only
on a TPU host (`floor_div`).
"""

from __future__ import annotations

import functools
import math
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from selfattn.nn import positions

F32 = jnp.float32
LOG2E = math.log2(math.e)    # exp(x) = exp2(x * LOG2E)
LN2 = math.log(2.0)


class TritonLaunch(NamedTuple):
  """How one Triton kernel is launched: warps per program and software
  pipelining stages of its loop's loads."""
  num_warps: int
  num_stages: int


class TritonTuning(NamedTuple):
  """Launch parameters per Triton kernel; a field left None takes
  default_triton_tuning's launch. The three kernels differ in what a
  program holds (the forward: a q block and its output accumulator; dQ: a
  q and a dO block and dQ's accumulator; dK/dV: a k and a v block and two
  accumulators), so the best warps and stages need not be shared
  (scripts/tune_triton.py)."""
  forward: TritonLaunch | None = None
  dq: TritonLaunch | None = None
  dkdv: TritonLaunch | None = None


# Triton takes warps in powers of two; past 16 (512 threads) a 128-row
# block leaves a warp too few rows to keep its MMA units busy.
TRITON_WARPS = (1, 2, 4, 8, 16)
TRITON_PASSES = TritonTuning._fields


def default_triton_tuning(head_q: int) -> TritonTuning:
  """The launch every call gets unless it names one: JAX's own Triton flash
  attention's rule (4 warps for heads up to 64 wide, 8 above; 2 stages),
  for all three kernels. Untuned per kernel: issue 47 asks for a GPU's
  measurement before another default."""
  launch = TritonLaunch(num_warps=4 if head_q <= 64 else 8, num_stages=2)
  return TritonTuning(launch, launch, launch)


def triton_launch(tuning: TritonTuning | None, pass_name: str,
                  head_q: int) -> TritonLaunch:
  """The launch of one pass: `tuning`'s, or the default where it names
  none."""
  launch = None if tuning is None else getattr(tuning, pass_name)
  return launch or getattr(default_triton_tuning(head_q), pass_name)


def check_triton_tuning(tuning: TritonTuning) -> TritonTuning:
  """`tuning` with each field checked and made plain ints (ValueError
  naming the field)."""
  if not isinstance(tuning, TritonTuning):
    raise ValueError(f'triton must be a TritonTuning (forward, dq, dkdv), '
                     f'got {type(tuning).__name__}')
  checked = []
  for name, launch in zip(TRITON_PASSES, tuning):
    if launch is None:
      checked.append(None)
      continue
    if not isinstance(launch, tuple) or len(launch) != 2:
      raise ValueError(f'triton.{name}={launch!r}; give a TritonLaunch('
                       f'num_warps, num_stages) or None (the default)')
    values = []
    for field, value in zip(TritonLaunch._fields, launch):
      try:
        if isinstance(value, bool):
          raise TypeError
        values.append(operator.index(value))
      except TypeError:
        raise ValueError(f'triton.{name}.{field}={value!r}; must be an '
                         f'integer') from None
    warps, stages = values
    if warps not in TRITON_WARPS:
      raise ValueError(f'triton.{name}.num_warps={warps!r}; choose one of '
                       f'{TRITON_WARPS}')
    if stages < 1:
      raise ValueError(f'triton.{name}.num_stages={stages!r}; must be an '
                       f'integer >= 1')
    checked.append(TritonLaunch(warps, stages))
  return TritonTuning(*checked)


class Config(NamedTuple):
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
  # The GPU kernels: 'triton', or 'hopper' (hopper_attention.py and
  # hopper_backward.py, Mosaic GPU on sm90).
  gpu_kernel: str = 'triton'
  # The key mask is a prefix (key lengths): the kernels also read each
  # batch row's length, skip the key blocks past it and leave unmasked the
  # blocks wholly inside it.
  key_prefix: bool = False
  # The Triton kernels' warps and stages (None: default_triton_tuning).
  triton: TritonTuning | None = None
  # T5's and Shaw's terms by gathered loads where the backend has them
  # (Triton, interpret mode: Layout.gathers); False: the per-bucket
  # selects Mosaic TPU runs, also in interpret mode (its CPU tests).
  gather_terms: bool = True
  # The Hopper kernels' shapes per pass, ((pass, ((field, value), ...)),
  # ...): hopper_attention.TUNED's rows for this call's mask as they were
  # when its forward was traced, so that its backward (traced later, where
  # a context that changed TUNED may have ended) runs the same form.
  hopper_shapes: tuple = ()


class Layout(NamedTuple):
  """Static block and padding choices of one backend for one call (Triton:
  powers of two, dots >= 16; Mosaic TPU: (8, 128) tiles; interpret: the
  Triton layout with blocks down to 8, so the CPU tests run the padded
  tables a GPU runs)."""
  block_q: int
  block_k: int
  head_q: int        # q and k head width after zero padding
  head_v: int        # v head width after zero padding (columns sliced off)
  table_rows: int    # Shaw's 2k + 1 rows after zero padding
  lanes: int         # width of the per-head ALiBi / T5 tile
  stat_lanes: int    # width of the per-row lse / delta columns
  # T5's and Shaw's per-entry terms read by gathered loads (`Gathered`):
  # Triton and interpret mode; Mosaic TPU selects per bucket.
  gathers: bool = False
  offset_lanes: int = 1   # T5: the per-offset table's width (2M + 1 padded)


def round_up(n: int, m: int) -> int:
  return -(-n // m) * m


def pow2(n: int) -> int:
  """The smallest power of two >= n (n >= 1)."""
  return 1 << max(0, int(n) - 1).bit_length()


def layout(cfg: Config, backend: str, lq: int, lk: int, dq: int,
           dv: int) -> Layout:
  rows = 2 * cfg.clip + 1
  lanes = {'alibi': 1, 't5': cfg.num_buckets}.get(cfg.kind, 1)
  if backend == 'mosaic_tpu':
    # Sublanes of 8, lanes of 128; head widths stay whole (a block dim equal
    # to the array's is allowed), so q, k, v need no padding.
    return Layout(block_q=min(round_up(cfg.block_q, 8), round_up(lq, 8)),
                  block_k=round_up(min(cfg.block_k, lk), 128),
                  head_q=dq, head_v=dv, table_rows=round_up(rows, 128),
                  lanes=round_up(lanes, 128), stat_lanes=128)
  gathers = cfg.gather_terms and cfg.kind in ('t5', 'shaw')
  smallest = 16 if backend == 'triton' else 8
  block = lambda b, n: max(smallest, min(pow2(b), pow2(n)))
  return Layout(block_q=block(cfg.block_q, lq), block_k=block(cfg.block_k, lk),
                head_q=max(16, pow2(dq)), head_v=max(16, pow2(dv)),
                table_rows=max(16, pow2(rows)), lanes=pow2(lanes),
                stat_lanes=1, gathers=gathers,
                offset_lanes=pow2(2 * cfg.max_distance + 1)
                if gathers and cfg.kind == 't5' else 1)


# --------------------------------------------------------------------------
# Helpers shared by the kernels.
# --------------------------------------------------------------------------

def alibi_distance(offset: jax.Array, symmetric: bool) -> jax.Array:
  """ALiBi's distance (float32) of offsets key - query; the bias is
  -slope * distance (positions.ALiBi.logits)."""
  distance = jnp.abs(offset).astype(F32)
  if not symmetric:
    distance = distance - 0.5 * (offset < 0)
  return distance


def floor_div(x, d: int, lowest: int):
  """floor(x / d) for an int32 x >= lowest (static) and d > 0, as a
  truncating division of x shifted to be non-negative: jnp.floor_divide
  lowers through `sign`, which Mosaic TPU lowers only on a TPU host."""
  shift = round_up(max(0, -lowest), d)
  return jax.lax.div(jnp.asarray(x + shift, jnp.int32), jnp.int32(d)) - shift // d


def far_blocks(i, bq: int, bk: int, clip: int, upper):
  """(left_end, right_start) for query block i: key blocks [0, left_end)
  hold only offsets (key - query) <= -clip, blocks [right_start, upper)
  only offsets >= +clip, for every row of the block (padding rows too, so
  the split is conservative); 0 <= left_end <= right_start <= upper.
  clip is Shaw's k or T5's max_distance (beyond it every entry of a block
  uses one table row or bucket per direction), or 1 for ALiBi (`reach`).
  Python ints or traced int32 scalars alike."""
  first_q, last_q = i * bq, i * bq + bq - 1
  # Block j's largest offset is j bk + bk - 1 - first_q <= -clip
  #   <=> j <= floor((first_q - clip - bk + 1) / bk).
  left_end = floor_div(first_q - clip - bk + 1, bk, -clip - bk + 1) + 1
  # Block j's smallest offset is j bk - last_q >= clip
  #   <=> j >= ceil((last_q + clip) / bk) = floor((last_q + clip + bk - 1) / bk).
  right_start = floor_div(last_q + clip + bk - 1, bk, 0)
  left_end = jnp.clip(left_end, 0, upper)
  right_start = jnp.clip(right_start, left_end, upper)
  return left_end, right_start


def far_query_blocks(j, bq: int, bk: int, clip: int, lower, upper):
  """(right_end, left_start) for key block j: query blocks [lower,
  right_end) see it only at offsets (key - query) >= +clip, blocks
  [left_start, upper) only at offsets <= -clip (the transpose of
  far_blocks); lower <= right_end <= left_start <= upper."""
  first_k, last_k = j * bk, j * bk + bk - 1
  # Block i's smallest offset is first_k - (i bq + bq - 1) >= clip
  #   <=> i <= floor((first_k - bq + 1 - clip) / bq).
  right_end = floor_div(first_k - bq + 1 - clip, bq, 1 - bq - clip) + 1
  # Block i's largest offset is last_k - i bq <= -clip
  #   <=> i >= ceil((last_k + clip) / bq).
  left_start = floor_div(last_k + clip + bq - 1, bq, 0)
  right_end = jnp.clip(right_end, lower, upper)
  left_start = jnp.clip(left_start, right_end, upper)
  return right_end, left_start


def column(x: jax.Array, n: int) -> jax.Array:
  """Column n of a (rows, width) value as (rows, 1). A masked row sum, not
  x[:, n:n + 1]: Pallas's Triton lowering has no slice of a value."""
  lane = jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  return jnp.sum(jnp.where(lane == n, x, 0.0), axis=1, keepdims=True)


def table_row(table: jax.Array, n: int) -> jax.Array:
  """Row n of a (rows, width) value as (1, width), by a masked column sum
  (no slice of a value in Pallas's Triton lowering)."""
  row = jax.lax.broadcasted_iota(jnp.int32, table.shape, 0)
  return jnp.sum(jnp.where(row == n, table, 0.0), axis=0, keepdims=True)


def row_dot(x: jax.Array, row: jax.Array) -> jax.Array:
  """x row^T, (n, 1) float32, of x (n, width) and row (1, width) in x's
  dtype: one column of dot_t(x, table) by products and a lane sum, where
  a far block needs only its edge's column of a table (2k + 1 columns,
  padded to a power of two, by the matmul). Equal to that column up to the
  order of the sum for 16-bit x; for float32 x it is full float32 where
  Triton's dot at the default precision runs TF32."""
  return jnp.sum(x.astype(F32) * row.astype(x.dtype).astype(F32), axis=1,
                 keepdims=True)


def dot(a, b, contract=((1,), (0,))):
  return jax.lax.dot_general(a, b, (contract, ((), ())),
                             preferred_element_type=F32)


def dot_t(a, b):
  """a b^T."""
  return dot(a, b, ((1,), (1,)))


def tdot(a, b):
  """a^T b."""
  return dot(a, b, ((0,), (0,)))


def edge(cfg: Config, region: str) -> int:
  """The table row (Shaw) or bucket (T5) every entry of a far block uses."""
  if cfg.kind == 'shaw':
    return 0 if region == 'left' else 2 * cfg.clip
  half = cfg.num_buckets // 2
  return half - 1 if region == 'left' else cfg.num_buckets - 1


def num_rows(cfg: Config) -> int:
  return 2 * cfg.clip + 1 if cfg.kind == 'shaw' else cfg.num_buckets


def bucket_of(cfg: Config, offset: jax.Array) -> jax.Array:
  if cfg.kind == 'shaw':
    return jnp.clip(offset, -cfg.clip, cfg.clip) + cfg.clip
  return positions.t5_bucket(offset, cfg.num_buckets, cfg.max_distance)


def select_columns(bucket, columns, shape, rows=None) -> jax.Array:
  """(bq, bk): columns[bucket[i, j]][i] by one select per column (no
  gather), over the columns `rows` (all by default: side_rows gives a
  near block's off the diagonal)."""
  term = jnp.zeros(shape, F32)
  for r in range(len(columns)) if rows is None else rows:
    term = jnp.where(bucket == r, columns[r], term)
  return term


def fold(cfg: Config, x, bucket, region: str, width: int,
         side: str = 'both') -> jax.Array:
  """(bq, width): x's row sums per table row / bucket (lane r = row r);
  a near block on one side of the diagonal (`side`, near_sides) sums only
  that side's buckets."""
  lane = jax.lax.broadcasted_iota(jnp.int32, (x.shape[0], width), 1)
  if region != 'near':
    return jnp.where(lane == edge(cfg, region),
                     jnp.sum(x, axis=1, keepdims=True), 0.0)
  out = jnp.zeros((x.shape[0], width), F32)
  for r in side_rows(cfg, side):
    mass = jnp.sum(jnp.where(bucket == r, x, 0.0), axis=1, keepdims=True)
    out = jnp.where(lane == r, mass, out)
  return out


class Gathered(NamedTuple):
  """T5's or Shaw's per-entry term read by gathered loads (Layout.gathers):
  one load per entry, at the clipped offset's column, where the select
  form runs a compare and a select per bucket on every entry of a near
  block (at 4 warps such a block compiled to 24-71k SASS instructions,
  its folds included, against a far block's 1.1-2.9k:
  scripts/triton_offline_facts.py, BENCHMARKS.md).

    T5:   ref (1, P): one head's bias of each offset -M..M in base-2 units
          (offsets past M share its bucket, so the clip is exact);
    Shaw: ref (Lq_pad, 2k + 1): one batch row's and head's scale log2(e)
          q a^K^T (or dO a^V^T), one row per query; `rows` are the
          block's rows (a pl.ds) for the far blocks' edge column."""
  ref: object
  reach: int              # M or k
  per_query: bool         # Shaw's rows; T5's one row
  rows: object = None

  def term(self, region: str, q_idx, offset):
    """A far block's edge column, (bq, 1) or (1, 1), or a near block's
    (bq, bk) entries, float32."""
    if region != 'near':
      col = pl.ds(0 if region == 'left' else 2 * self.reach, 1)
      return self.ref[self.rows, col] if self.per_query else self.ref[:, col]
    col = jnp.clip(offset, -self.reach, self.reach) + self.reach
    return self.ref[q_idx, col] if self.per_query else self.ref[0, col]


class Refs(NamedTuple):
  """A kernel's optional inputs, popped in the order pallas_attention
  passes them."""
  valid: object = None
  length: object = None      # key_prefix: the row's key length, (1, lanes)
  table: object = None       # ALiBi slopes or T5 biases, (1, lanes)
  a_k: object = None         # Shaw, (rows, Dq)
  a_v: object = None         # Shaw, (rows, Dv)
  offsets: object = None     # gathers, T5: (1, offset_lanes), see Gathered
  key_rows: object = None    # gathers, Shaw: (Lq_pad, 2k + 1) q a^K^T
  value_rows: object = None  # gathers, Shaw's backward: dO a^V^T

  @classmethod
  def pop(cls, cfg: Config, lay: Layout, rest: list, has_valid: bool,
          backward: bool = False) -> 'Refs':
    take = lambda present: rest.pop(0) if present else None
    shaw, t5 = cfg.kind == 'shaw', cfg.kind == 't5'
    return cls(valid=take(has_valid),
               length=take(has_valid and cfg.key_prefix),
               table=take(cfg.kind in ('alibi', 't5')),
               a_k=take(shaw),
               a_v=take(shaw and cfg.shaw_values),
               offsets=take(t5 and lay.gathers),
               key_rows=take(shaw and lay.gathers),
               value_rows=take(shaw and lay.gathers and cfg.shaw_values
                               and backward))


def key_length(refs: Refs):
  """The batch row's key length (an int32 scalar) where the key mask is a
  prefix, else None: a reduction of its (1, lanes) tile."""
  if refs.length is None:
    return None
  return jnp.max(refs.length[...])


def head_scalars(cfg: Config, refs: Refs):
  """ALiBi's slope as (1, 1), or T5's biases as a list of (1, 1), times
  log2(e) (the scores' base-2 units): read once per program as reductions
  of the head's tile."""
  if cfg.kind == 'alibi':
    return LOG2E * jnp.max(refs.table[...].astype(F32), axis=1, keepdims=True)
  if cfg.kind == 't5':
    if refs.offsets is not None:
      return Gathered(refs.offsets, cfg.max_distance, per_query=False)
    row = LOG2E * refs.table[...].astype(F32)
    return [column(row, n) for n in range(cfg.num_buckets)]
  return None


def logit_term(cfg: Config, region: str, q_idx, k_idx, scalars,
               key_columns, starts=None, side: str = 'both'):
  """(term (bq, bk) or (1, bk) or None, bucket (bq, bk) or None, per_query
  (bq|1, 1) or None) of one block: ALiBi's bias (`alibi_rows_and_columns`
  on a block wholly to one side of the diagonal; starts: its first query
  and key); T5's or Shaw's per-bucket values (Shaw's are the columns of
  scale * q a^K^T), gathered (`Gathered`) or selected per offset near the
  diagonal (over the rows of the block's side of it: side_rows), the edge
  value beyond.

  A far block's part of the term that depends on the query alone (ALiBi's
  row term, T5's edge bias, Shaw's edge column) is left out of `term` and
  returned as per_query, for the caller to fold into the row's max or lse
  (`less`): softmax is unchanged by a constant per row, so that is one
  subtract per row where adding it was one add per entry, and a far T5 or
  Shaw block costs what a block without an encoding costs."""
  offset = k_idx - q_idx
  if cfg.kind == 'alibi':
    if region != 'near':
      row, col = alibi_rows_and_columns(cfg, region, scalars, starts,
                                        k_idx.shape)
      return col, None, row
    return -scalars * alibi_distance(offset, cfg.symmetric), None, None
  if cfg.kind not in ('t5', 'shaw'):
    return None, None, None
  values = scalars if cfg.kind == 't5' else key_columns
  if isinstance(values, Gathered):
    term = values.term(region, q_idx, offset)
    return (term, None, None) if region == 'near' else (None, None, term)
  if region != 'near':
    return None, None, values[edge(cfg, region)]
  bucket = bucket_of(cfg, offset)
  return (select_columns(bucket, values, offset.shape, side_rows(cfg, side)),
          bucket, None)


def less(x, per_query):
  """x - per_query, a row's max, lse or delta less a far block's term that
  depends on the query alone (logit_term); x where there is none."""
  return x if per_query is None else x - per_query


def value_term(cfg: Config, region: str, value_columns, q_idx, k_idx,
               bucket, side: str = 'both'):
  """Shaw's dO a^V^T term of dp for one block: its edge column in a far
  block (which with_value_term takes from delta instead), the entry's
  offset's column near the diagonal."""
  if isinstance(value_columns, Gathered):
    return value_columns.term(region, q_idx, k_idx - q_idx)
  if region != 'near':
    return value_columns[edge(cfg, region)]
  return select_columns(bucket, value_columns, bucket.shape,
                        side_rows(cfg, side))


def with_value_term(cfg: Config, region: str, dp, delta, value_columns,
                    q_idx, k_idx, bucket, side: str = 'both'):
  """(dp, delta) with Shaw's value term (value_term) where there is one: a
  near block's per entry in dp, a far block's edge column, one per row,
  taken from delta instead (ds = p (dp + term - delta))."""
  if value_columns is None:
    return dp, delta
  term = value_term(cfg, region, value_columns, q_idx, k_idx, bucket, side)
  return (dp + term, delta) if region == 'near' else (dp, delta - term)


def keep_mask(cfg: Config, q_idx, k_idx, lq: int, lk: int, valid):
  """Which entries of a block are attended: real keys, causal, padding."""
  keep = k_idx < lk
  if cfg.causal:
    keep = keep & (k_idx <= q_idx + (lk - lq))
  if valid is not None:
    keep = keep & (valid != 0)
  return keep


def alibi_split(cfg: Config, region: str, slope, query, key):
  """ALiBi's bias on a block wholly left (every offset < 0) or right (> 0)
  of the diagonal as (a term of the query, a term of the key), of query
  and key positions relative to the block's first query q0 (float32):
  left, -slope (q - k - asym / 2) = -slope (q - q0 - asym / 2) + slope
  (k - q0); right, -slope (k - q) = slope (q - q0) - slope (k - q0). The
  key's product is of a whole number below the lengths, rounded once as
  the plain path's slope * distance is; the query's is small (q - q0 <
  the block), and the sum rounds once more: about twice the plain path's
  rounding at offsets of 30,000. Any shapes (the Triton kernels' (bq, 1)
  and (1, bk), the Hopper kernels' vectors)."""
  if region == 'left':
    half = 0.0 if cfg.symmetric else 0.5
    return -slope * (query - half), slope * key
  return slope * query, -slope * key


def alibi_rows_and_columns(cfg: Config, region: str, slope, starts, shape):
  """alibi_split's row term (bq, 1) and column term (1, bk) of a block:
  two adds an entry where |offset| costs a subtract, an absolute value, a
  conversion and a multiply. slope: (1, 1), times log2(e); starts: the
  block's first query and key."""
  bq, bk = shape
  q0, k0 = starts
  q = jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0).astype(F32)
  k = (k0 - q0 + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)).astype(F32)
  return alibi_split(cfg, region, slope, q, k)


def splits(cfg: Config) -> bool:
  """Whether the loops split into far blocks (left, right of the diagonal,
  past Shaw's k, T5's max_distance or, for ALiBi, the diagonal itself)
  and near ones."""
  return cfg.kind in ('shaw', 't5', 'alibi')


def regions(cfg: Config, split, lower, upper):
  """[(lo, hi, region)] of a loop: one 'near' range, or left/near/right
  from a far-block split (`splits`)."""
  if not splits(cfg):
    return [(lower, upper, 'near')]
  first, second, names = split
  return [(lower, first, names[0]), (first, second, 'near'),
          (second, upper, names[1])]


def side_rows(cfg: Config, side: str) -> range:
  """The table rows or buckets a near block on `side` of the diagonal can
  hold: T5's lower half for offsets <= 0 ('left': every offset < 0), its
  upper half for offsets > 0 ('right'), Shaw's k rows on that side; all
  of them on the diagonal ('both')."""
  rows = num_rows(cfg)
  if side == 'both':
    return range(rows)
  # Shaw's rows clip(d, -k, k) + k: below k for d < 0, above it for d > 0.
  half = cfg.num_buckets // 2 if cfg.kind == 't5' else cfg.clip
  return range(half) if side == 'left' else range(rows - half, rows)


def near_sides(i, bq: int, bk: int, lo, hi):
  """[(a, b, side)] of near key blocks [lo, hi) of query block i: those
  wholly left of the diagonal (every offset < 0), those crossing it, and
  those wholly right (every offset > 0), by far_blocks at a reach of 1."""
  left_end, right_start = far_blocks(i, bq, bk, 1, hi)
  left_end = jnp.clip(left_end, lo, hi)
  right_start = jnp.clip(right_start, left_end, hi)
  return [(lo, left_end, 'left'), (left_end, right_start, 'both'),
          (right_start, hi, 'right')]


def near_query_sides(j, bq: int, bk: int, lo, hi):
  """[(a, b, side)] of near query blocks [lo, hi) of key block j (the
  transpose of near_sides, in the dK/dV kernels' order): those that see it
  only at offsets > 0 ('right'), those crossing the diagonal ('both'),
  those only at offsets < 0 ('left')."""
  right_end, left_start = far_query_blocks(j, bq, bk, 1, lo, hi)
  return [(lo, right_end, 'right'), (right_end, left_start, 'both'),
          (left_start, hi, 'left')]


def by_sides(cfg: Config, lay: Layout, kernel: str) -> bool:
  """Whether a kernel's near blocks run apart by their side of the
  diagonal (near_sides), which halves a per-bucket loop in those off it:
  T5's and Shaw's term selects of the select form (Mosaic TPU), in every
  kernel, and the dQ kernel's folds (T5's in both forms; Shaw's with
  gathered terms are `band`'s). kernel: 'forward', 'dq' or 'dkdv'."""
  if cfg.kind not in ('t5', 'shaw'):
    return False
  return not lay.gathers or (kernel == 'dq' and cfg.kind == 't5')


def reach(cfg: Config) -> int:
  """How far from the diagonal a far block's offsets all are."""
  if cfg.kind == 'alibi':
    return 1
  return cfg.clip if cfg.kind == 'shaw' else cfg.max_distance


def key_upper(cfg: Config, i, bq: int, bk: int, lq: int, lk: int,
              num_key_blocks: int):
  """One past the last key block query block i may see."""
  if not cfg.causal:
    return num_key_blocks
  seen = i * bq + bq + (lk - lq)       # keys up to the block's last row's
  return jnp.clip(floor_div(seen + bk - 1, bk, lq - lk), 0, num_key_blocks)


def unmasked_key_blocks(cfg: Config, i, bq: int, bk: int, lq: int, lk: int,
                        has_valid: bool, length=None):
  """Key blocks [0, result) hold only keys every row of query block i
  attends (real, inside the key length, and causal-allowed for its first
  row): they need no mask. None of them with a general key mask
  (has_valid without a length), whose zeros may be anywhere."""
  if has_valid and length is None:
    return jnp.int32(0)
  full = jnp.int32(lk // bk)               # past it: the padded last block
  if length is not None:
    full = jnp.minimum(full, jax.lax.div(length, jnp.int32(bk)))
  if cfg.causal:
    # Block j's last key j bk + bk - 1 <= i bq + (lk - lq), the first row's
    # last allowed key  <=>  j < (i bq + lk - lq + 1) / bk.
    full = jnp.minimum(full, jnp.maximum(
        floor_div(i * bq + (lk - lq) + 1, bk, lk - lq + 1), 0))
  return full


def masked_split(at, lo, hi, unmasked_below: bool = True):
  """[(a, b, masked)] of a loop [lo, hi) split at `at`: the blocks below it
  need no mask (unmasked_below) or the blocks from it on, so a mask is
  applied only where a block needs one."""
  at = jnp.clip(at, lo, hi)
  return [(lo, at, not unmasked_below), (at, hi, unmasked_below)]


def over_key_blocks(cfg: Config, body, carry, i, bq: int, bk: int, lq: int,
                    lk: int, num_key_blocks: int, has_valid: bool,
                    length=None, sides: bool = False):
  """Query block i's loop over its key blocks (the forward and dQ kernels):
  body(j, carry, region, masked) -> carry, run region by region (near and
  far blocks apart for the bucketed encodings, so far blocks skip the
  bucket search), and in each the blocks that need no mask apart. With a
  key length, the blocks wholly past it are skipped. sides: the near
  blocks also apart by their side of the diagonal (near_sides), passed
  to body as side= ('left', 'both' or 'right')."""
  upper = key_upper(cfg, i, bq, bk, lq, lk, num_key_blocks)
  if length is not None:
    upper = jnp.minimum(upper, jax.lax.div(length + (bk - 1), jnp.int32(bk)))
  full = unmasked_key_blocks(cfg, i, bq, bk, lq, lk, has_valid, length)
  split = None
  if splits(cfg):
    split = (*far_blocks(i, bq, bk, reach(cfg), upper), ('left', 'right'))
  near_parts = (lambda lo, hi: near_sides(i, bq, bk, lo, hi)) if sides else None
  for lo, hi, region in regions(cfg, split, 0, upper):
    carry = over_region(body, carry, lo, hi, region, full, near_parts)
  return carry


def over_region(body, carry, lo, hi, region: str, full, near_parts=None,
                unmasked_below: bool = True):
  """body(b, carry, region=, masked=[, side=]) over blocks [lo, hi) of one
  region: the blocks that need no mask apart (masked_split at `full`),
  and a near region also apart by side where near_parts(lo, hi) gives
  the (a, b, side) parts (near_sides, near_query_sides)."""
  parts = [(lo, hi, None)]
  if near_parts is not None and region == 'near':
    parts = near_parts(lo, hi)
  for part_lo, part_hi, side in parts:
    step = body if side is None else functools.partial(body, side=side)
    for a, b, masked in masked_split(full, part_lo, part_hi, unmasked_below):
      carry = jax.lax.fori_loop(a, b, functools.partial(
          step, region=region, masked=masked), carry)
  return carry


def first_unmasked_query_block(cfg: Config, j, bq: int, bk: int, lq: int,
                               lk: int, lower, upper, has_valid: bool,
                               length=None):
  """Query blocks [result, upper) attend every key of key block j (causal:
  the block's first row already sees j's last key): they need no mask;
  upper with a general key mask, or where the block crosses the key
  length. Padding keys past lk need none here: a key's dK and dV rows
  depend on its own weights only, and theirs are cut off."""
  if has_valid and length is None:
    return jnp.int32(upper)
  first = jnp.int32(lower)
  if cfg.causal:
    # Row i bq sees key j bk + bk - 1 iff j bk + bk - 1 <= i bq + lk - lq
    #   <=> i >= ceil((j bk + bk - 1 - (lk - lq)) / bq).
    first = jnp.maximum(first, floor_div(
        j * bk + bk - 1 - (lk - lq) + bq - 1, bq, bk - 1 - (lk - lq) + bq - 1))
  if length is not None:
    # Past the length: every block masked. (Arithmetic: a select of these
    # int32 scalars failed Pallas's Triton lowering, an i1 x i32 multiply.)
    crosses = (j * bk + bk > length).astype(jnp.int32)
    first = first + crosses * (upper - first)
  return jnp.clip(first, lower, upper)


def query_lower(cfg: Config, j, bq: int, bk: int, lq: int, lk: int):
  """The first query block that may see key block j."""
  if not cfg.causal:
    return 0
  first = jnp.maximum(j * bk - (lk - lq), 0)   # the first query seeing it
  return floor_div(first, bq, 0)


def logit_scale(cfg: Config) -> float:
  """scale * log2(e): q k^T (and Shaw's q a^K^T) to base-2 scores."""
  return cfg.scale * LOG2E


def key_columns_of(cfg: Config, q, refs: Refs, rows):
  """Shaw's per-offset columns of scale * log2(e) * q a^K^T, (bq, 1) each,
  or their `Gathered` rows (`rows`: the block's, a pl.ds); None for the
  other kinds."""
  if cfg.kind != 'shaw':
    return None
  if refs.key_rows is not None:
    return Gathered(refs.key_rows, cfg.clip, per_query=True, rows=rows)
  q_dot_a = dot_t(q, refs.a_k[...].astype(q.dtype)) * logit_scale(cfg)
  return [column(q_dot_a, n) for n in range(num_rows(cfg))]


def key_block(j, k_ref, v_ref, valid_ref, bq: int, bk: int):
  """Key block j of a query-major kernel (forward, dQ): its keys, values,
  (bq, bk) key indices and (1, bk) padding flags (None without a mask)."""
  start = pl.multiple_of(j * bk, bk)
  k_idx = start + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  valid = None if valid_ref is None else valid_ref[:, pl.ds(start, bk)]
  return (k_ref[pl.ds(start, bk), :], v_ref[pl.ds(start, bk), :], k_idx,
          valid)


def block_scores(cfg: Config, region: str, q, k_blk, q_idx, k_idx, scalars,
                 key_columns, lq: int, lk: int, valid, masked: bool = True,
                 starts=None, side: str = 'both'):
  """(s, keep, bucket, per_query) of one (bq, bk) block: scale * q k^T plus
  the encoding's term, in base-2 units (times log2(e)), which entries are
  attended (None for a block that needs no mask), each entry's table row
  or bucket (near blocks of Shaw and T5, else None), and a far block's
  term that depends on the query alone, left out of s (logit_term; side:
  a near block's side of the diagonal)."""
  s = dot_t(q, k_blk) * logit_scale(cfg)
  term, bucket, per_query = logit_term(cfg, region, q_idx, k_idx, scalars,
                                       key_columns, starts, side)
  if term is not None:
    s = s + term
  keep = keep_mask(cfg, q_idx, k_idx, lq, lk, valid) if masked else None
  return s, keep, bucket, per_query


def weights(s, lse2, keep):
  """p = 2^(s - lse) of a block in base-2 units, 0 where not attended."""
  p = jnp.exp2(s - lse2)
  return p if keep is None else jnp.where(keep, p, 0.0)


def band(cfg: Config, lay: Layout, refs: Refs, k_ref, v_ref, q, lse2, i0,
         lq: int, lk: int, do=None, delta=None):
  """Shaw's interior offsets, |d| < k, of one query block, once per program
  (with gathered terms, near blocks fold only the two clipped rows): (p,
  ds), each (bq, table_rows) float32, lane d + k holding row i's weight
  and score gradient at key i + d (0 where that key is not attended; ds
  zero without dO). Those are one entry per row and offset, so each is a
  row's dot product with a gathered key (and value) row, where a fold
  inside a near block is a compare, select and row sum per table row over
  the whole (bq, bk) tile. Scores as block_scores makes them, in base-2
  units (lse2, (bq, 1)), but from full float32 products where the loop's
  dot runs Triton's default precision (TF32 for float32 inputs); the key
  mask, lengths and causal limit as keep_mask."""
  bq = q.shape[0]
  pos = i0 + jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
  rows = pl.ds(pl.multiple_of(i0, bq), bq)
  lane = jax.lax.broadcasted_iota(jnp.int32, (bq, lay.table_rows), 1)
  columns = lambda x: jax.lax.broadcasted_iota(jnp.int32, x.shape, 1)
  q32 = q.astype(F32)
  do32 = None if do is None else do.astype(F32)

  def body(d, carry):
    fold_p, fold_ds = carry
    j = pos + d                                    # (bq, 1) key of each row
    at = jnp.clip(j, 0, lk - 1)
    keep = (j >= 0) & (j < lk)
    if cfg.causal:
      keep = keep & (j <= pos + (lk - lq))
    if refs.valid is not None:
      keep = keep & (refs.valid[jnp.zeros_like(at), at] != 0)
    k_d = k_ref[jnp.broadcast_to(at, q.shape), columns(q)]
    s = (jnp.sum(q32 * k_d.astype(F32), axis=1, keepdims=True)
         * logit_scale(cfg) + refs.key_rows[rows, pl.ds(d + cfg.clip, 1)])
    p = jnp.where(keep, jnp.exp2(s - lse2), 0.0)
    fold_p = jnp.where(lane == d + cfg.clip, p, fold_p)
    if do is not None:
      v_d = v_ref[jnp.broadcast_to(at, do.shape), columns(do)]
      dp = jnp.sum(do32 * v_d.astype(F32), axis=1, keepdims=True)
      if refs.value_rows is not None:
        dp = dp + refs.value_rows[rows, pl.ds(d + cfg.clip, 1)]
      fold_ds = jnp.where(lane == d + cfg.clip, p * (dp - delta), fold_ds)
    return fold_p, fold_ds

  zeros = jnp.zeros((bq, lay.table_rows), F32)
  return jax.lax.fori_loop(1 - cfg.clip, cfg.clip, body, (zeros, zeros))


def edge_sums(cfg: Config, region: str, x, offset, row_sum=None):
  """(left, right), (bq, 1) each: x's row sums over Shaw's two clipped
  table rows (offsets <= -k, >= k) in one block, the rest being `band`'s:
  a far block's whole row (row_sum, if already summed) on its side, a near
  block's masked sums. Carried as two columns where a (bq, 2k + 1) fold
  would hold one nonzero lane per far block."""
  if region != 'near':
    total = jnp.sum(x, axis=1, keepdims=True) if row_sum is None else row_sum
    zero = jnp.zeros_like(total)
    return (total, zero) if region == 'left' else (zero, total)
  left = offset <= -cfg.clip
  right = (offset >= cfg.clip) & ~left         # k = 0: one row, one side
  mass = lambda keep: jnp.sum(jnp.where(keep, x, 0.0), axis=1, keepdims=True)
  return mass(left), mass(right)


def place_edges(cfg: Config, width: int, left, right) -> jax.Array:
  """(bq, width): edge_sums' columns in lanes 0 and 2k (added: at k = 0
  both are row 0)."""
  lane = jax.lax.broadcasted_iota(jnp.int32, (left.shape[0], width), 1)
  return (jnp.where(lane == 0, left, 0.0)
          + jnp.where(lane == 2 * cfg.clip, right, 0.0))


def banded(cfg: Config, lay: Layout) -> bool:
  """Whether Shaw's interior offsets are folded by `band` (gathered terms)
  rather than inside the near blocks."""
  return cfg.kind == 'shaw' and lay.gathers


# --------------------------------------------------------------------------
# The kernels.
# --------------------------------------------------------------------------

def forward_kernel(*refs, cfg: Config, lay: Layout, lq: int, lk: int,
                   num_key_blocks: int, has_valid: bool):
  q_ref, k_ref, v_ref = refs[:3]
  rest = list(refs[3:])
  r = Refs.pop(cfg, lay, rest, has_valid)
  o_ref, lse_ref = rest
  bq, bk = lay.block_q, lay.block_k
  i = pl.program_id(1)
  q = q_ref[...]                                  # (bq, Dq), input dtype
  q_idx = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  rows = pl.ds(pl.multiple_of(i * bq, bq), bq)
  scalars = head_scalars(cfg, r)
  key_columns = key_columns_of(cfg, q, r, rows)
  if r.a_v is not None:
    a_v = r.a_v[...]
  # Banded Shaw values: the two clipped rows' weights ride along as
  # columns, rescaled with acc; `band` adds the interior after the loop.
  edges = r.a_v is not None and banded(cfg, lay)

  def body(j, carry, region, masked, side='both'):
    acc, m, l = carry[:3]
    k_blk, v_blk, k_idx, valid = key_block(j, k_ref, v_ref, r.valid, bq, bk)
    s, keep, bucket, per_query = block_scores(
        cfg, region, q, k_blk, q_idx, k_idx, scalars, key_columns, lq, lk,
        valid, masked, starts=(i * bq, j * bk), side=side)
    if masked:
      s = jnp.where(keep, s, -jnp.inf)
    top = jnp.max(s, axis=1, keepdims=True)
    if per_query is not None:      # the max of the whole logits
      top = top + per_query
    m_new = jnp.maximum(m, top)
    m_safe = jnp.where(m_new == -jnp.inf, 0.0, m_new)
    p = jnp.exp2(s - less(m_safe, per_query))   # masked: 2^-inf = 0
    alpha = jnp.exp2(m - m_safe)                # m = -inf (nothing yet): 0
    row_sum = jnp.sum(p, axis=1, keepdims=True)
    l = alpha * l + row_sum
    pv = dot(p.astype(v_blk.dtype), v_blk)
    if edges:
      left, right = edge_sums(cfg, region, p, k_idx - q_idx, row_sum)
      return (alpha * acc + pv, m_new, l, alpha * carry[3] + left,
              alpha * carry[4] + right)
    if r.a_v is not None:
      # Shaw's value term: the block's weights summed per clipped offset,
      # (bq, rows), against a^V (rows, Dv).
      folded = fold(cfg, p, bucket, region, lay.table_rows, side)
      pv = pv + dot(folded.astype(v_blk.dtype), a_v.astype(v_blk.dtype))
    return alpha * acc + pv, m_new, l

  dv = v_ref.shape[-1]
  carry = (jnp.zeros((bq, dv), F32), jnp.full((bq, 1), -jnp.inf, F32),
           jnp.zeros((bq, 1), F32)) + (jnp.zeros((bq, 1), F32),) * (2 * edges)
  carry = over_key_blocks(cfg, body, carry, i, bq, bk, lq, lk, num_key_blocks,
                          has_valid, key_length(r),
                          sides=by_sides(cfg, lay, 'forward'))
  acc, m, l = carry[:3]
  if edges:
    a_v_row = lambda n: r.a_v[pl.ds(n, 1), :].astype(F32)      # (1, Dv)
    acc = acc + carry[3] * a_v_row(0) + carry[4] * a_v_row(2 * cfg.clip)
  has_key = l > 0
  out = jnp.where(has_key, acc / jnp.where(has_key, l, 1.0), 0.0)
  if r.a_v is not None and banded(cfg, lay):
    # The interior offsets' share of Shaw's value term, from the final
    # statistics (base 2; no key: +inf, so no weight).
    lse2 = jnp.where(has_key, m + jnp.log2(jnp.where(has_key, l, 1.0)),
                     jnp.inf)
    weights_by_offset, _ = band(cfg, lay, r, k_ref, v_ref, q, lse2, i * bq,
                                lq, lk)
    out = out + dot(weights_by_offset.astype(v_ref.dtype),
                    a_v.astype(v_ref.dtype))
  o_ref[...] = out.astype(o_ref.dtype)
  # A row with no allowed key gets lse = +inf: its backward weights are 0.
  # m is base 2; lse leaves in natural units.
  lse = jnp.where(has_key, LN2 * m + jnp.log(jnp.where(has_key, l, 1.0)),
                  jnp.inf)
  lse_ref[...] = jnp.broadcast_to(lse, lse_ref.shape)


def dq_kernel(*refs, cfg: Config, lay: Layout, lq: int, lk: int,
              num_key_blocks: int, has_valid: bool):
  q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
  rest = list(refs[6:])
  r = Refs.pop(cfg, lay, rest, has_valid, backward=True)
  dq_ref = rest.pop(0)
  table_grad_refs = rest                # T5: (1, lanes); Shaw: a^K, a^V
  bq, bk = lay.block_q, lay.block_k
  i = pl.program_id(1)
  q, do = q_ref[...], do_ref[...]
  lse2 = LOG2E * jnp.max(lse_ref[...], axis=1, keepdims=True)   # (bq, 1)
  delta = jnp.max(delta_ref[...], axis=1, keepdims=True)
  q_idx = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  rows = pl.ds(pl.multiple_of(i * bq, bq), bq)
  scalars = head_scalars(cfg, r)
  key_columns, value_columns = key_columns_of(cfg, q, r, rows), None
  if r.value_rows is not None:
    value_columns = Gathered(r.value_rows, cfg.clip, per_query=True,
                             rows=rows)
  elif r.a_v is not None:
    do_dot_a = dot_t(do, r.a_v[...].astype(do.dtype))       # (bq, rows)
    value_columns = [column(do_dot_a, n) for n in range(num_rows(cfg))]
  width = {'t5': lay.lanes, 'shaw': lay.table_rows}.get(cfg.kind, 1)
  # Banded Shaw: the loop carries only the two clipped rows' sums of ds
  # and p, (bq, 1) each (edge_sums); `band` gives the interior after it.
  edges = banded(cfg, lay)

  def body(j, carry, region, masked, side='both'):
    acc = carry[0]
    k_blk, v_blk, k_idx, valid = key_block(j, k_ref, v_ref, r.valid, bq, bk)
    s, keep, bucket, per_query = block_scores(
        cfg, region, q, k_blk, q_idx, k_idx, scalars, key_columns, lq, lk,
        valid, masked, starts=(i * bq, j * bk), side=side)
    p = weights(s, less(lse2, per_query), keep)
    dp = dot_t(do, v_blk)
    dp, row_delta = with_value_term(cfg, region, dp, delta, value_columns,
                                    q_idx, k_idx, bucket, side)
    ds = p * (dp - row_delta)      # d loss / d s in natural units
    acc = acc + dot(ds.astype(k_blk.dtype), k_blk)
    if edges:
      ds_left, ds_right, p_left, p_right = carry[1:]
      left, right = edge_sums(cfg, region, ds, k_idx - q_idx)
      ds_left, ds_right = ds_left + left, ds_right + right
      if value_columns is not None:
        left, right = edge_sums(cfg, region, p, k_idx - q_idx)
        p_left, p_right = p_left + left, p_right + right
      return acc, ds_left, ds_right, p_left, p_right
    fold_ds, fold_p = carry[1:]
    if cfg.kind == 't5' and bucket is None and region == 'near':
      # T5's gathered term finds no bucket; its fold needs them.
      bucket = bucket_of(cfg, k_idx - q_idx)
    if cfg.kind in ('t5', 'shaw'):
      fold_ds = fold_ds + fold(cfg, ds, bucket, region, width, side)
    if value_columns is not None:
      fold_p = fold_p + fold(cfg, p, bucket, region, width, side)
    return acc, fold_ds, fold_p

  acc = jnp.zeros((bq, q_ref.shape[-1]), F32)
  if edges:
    carry = (acc,) + (jnp.zeros((bq, 1), F32),) * 4
  else:
    carry = (acc, jnp.zeros((bq, width), F32), jnp.zeros((bq, width), F32))
  carry = over_key_blocks(cfg, body, carry, i, bq, bk, lq, lk, num_key_blocks,
                          has_valid, key_length(r),
                          sides=by_sides(cfg, lay, 'dq'))
  acc = carry[0]
  if edges:
    # The interior offsets' weights and score gradients from `band`, the
    # clipped rows' from the loop.
    fold_p, fold_ds = band(cfg, lay, r, k_ref, v_ref, q, lse2, i * bq, lq,
                           lk, do=do, delta=delta)
    fold_ds = fold_ds + place_edges(cfg, width, carry[1], carry[2])
    fold_p = fold_p + place_edges(cfg, width, carry[3], carry[4])
  else:
    fold_ds, fold_p = carry[1:]
  if cfg.kind == 'shaw':
    # s = scale q (k + a^K[bucket]): dq = scale (ds k + fold(ds) a^K), and
    # this program's share of d a^K = scale fold(ds)^T q, d a^V = fold(p)^T dO.
    a_k = r.a_k[...]
    acc = acc + dot(fold_ds.astype(a_k.dtype), a_k)
    table_grad_refs[0][...] = cfg.scale * tdot(fold_ds, q.astype(F32))
    if r.a_v is not None:
      table_grad_refs[1][...] = tdot(fold_p, do.astype(F32))
  elif cfg.kind == 't5':
    table_grad_refs[0][...] = jnp.sum(fold_ds, axis=0, keepdims=True)
  dq_ref[...] = (cfg.scale * acc).astype(dq_ref.dtype)


def dkdv_kernel(*refs, cfg: Config, lay: Layout, lq: int, lk: int,
                num_query_blocks: int, has_valid: bool):
  q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
  rest = list(refs[6:])
  r = Refs.pop(cfg, lay, rest, has_valid, backward=True)
  dk_ref, dv_ref = rest
  bq, bk = lay.block_q, lay.block_k
  j = pl.program_id(1)
  k_blk, v_blk = k_ref[...], v_ref[...]                     # (bk, D)
  k_idx = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  valid = None if r.valid is None else r.valid[...]          # (1, bk)
  scalars = head_scalars(cfg, r)
  rows = num_rows(cfg) if cfg.kind in ('shaw', 't5') else 0
  if cfg.kind == 'shaw' and r.key_rows is None:
    a_k = r.a_k[...]
    edge_rows = lambda table: {region: table_row(table, edge(cfg, region))
                               for region in ('left', 'right')}
    a_k_edges = edge_rows(a_k)
  if r.a_v is not None and r.key_rows is None:
    a_v = r.a_v[...]
    a_v_edges = edge_rows(a_v)

  def body(i, carry, region, masked, side='both'):
    dk, dv = carry
    start = pl.multiple_of(i * bq, bq)
    q = q_ref[pl.ds(start, bq), :]
    do = do_ref[pl.ds(start, bq), :]
    lse2 = LOG2E * jnp.max(lse_ref[pl.ds(start, bq), :], axis=1,
                           keepdims=True)
    delta = jnp.max(delta_ref[pl.ds(start, bq), :], axis=1, keepdims=True)
    q_idx = start + jax.lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
    key_columns = value_columns = None
    if r.key_rows is not None:
      # Gathered: the block's rows of q a^K^T and dO a^V^T, made outside.
      block_rows = pl.ds(start, bq)
      key_columns = Gathered(r.key_rows, cfg.clip, True, block_rows)
      if r.value_rows is not None:
        value_columns = Gathered(r.value_rows, cfg.clip, True, block_rows)
    elif cfg.kind == 'shaw' and region == 'near':
      # Near the diagonal every column of this query block's scale log2(e)
      # q a^K^T (and dO a^V^T) is used: one small matmul each.
      q_dot_a = dot_t(q, a_k.astype(q.dtype)) * logit_scale(cfg)
      key_columns = [column(q_dot_a, n) for n in range(rows)]
      if r.a_v is not None:
        do_dot_a = dot_t(do, a_v.astype(do.dtype))
        value_columns = [column(do_dot_a, n) for n in range(rows)]
    elif cfg.kind == 'shaw':
      # A far block reads its edge's column only: one row's products.
      n = edge(cfg, region)
      key_columns = {n: row_dot(q, a_k_edges[region]) * logit_scale(cfg)}
      if r.a_v is not None:
        value_columns = {n: row_dot(do, a_v_edges[region])}
    s, keep, bucket, per_query = block_scores(
        cfg, region, q, k_blk, q_idx, k_idx, scalars, key_columns, lq, lk,
        valid, masked, starts=(start, j * bk), side=side)
    p = weights(s, less(lse2, per_query), keep)
    dv = dv + tdot(p.astype(do.dtype), do)
    dp = dot_t(do, v_blk)
    dp, row_delta = with_value_term(cfg, region, dp, delta, value_columns,
                                    q_idx, k_idx, bucket, side)
    ds = p * (dp - row_delta)
    dk = dk + tdot(ds.astype(q.dtype), q)
    return dk, dv

  carry = (jnp.zeros((bk, k_ref.shape[-1]), F32),
           jnp.zeros((bk, v_ref.shape[-1]), F32))
  lower = query_lower(cfg, j, bq, bk, lq, lk)
  length = key_length(r)
  if length is not None:
    # Keys wholly past the length: no query block, zero dK and dV (as a
    # product: see first_unmasked_query_block).
    past = (j * bk >= length).astype(jnp.int32)
    lower = lower + past * (num_query_blocks - lower)
  split = None
  if splits(cfg):
    split = (*far_query_blocks(j, bq, bk, reach(cfg), lower,
                               num_query_blocks), ('right', 'left'))
  first = first_unmasked_query_block(cfg, j, bq, bk, lq, lk, lower,
                                     num_query_blocks, has_valid, length)
  near_parts = None
  if by_sides(cfg, lay, 'dkdv'):
    near_parts = lambda lo, hi: near_query_sides(j, bq, bk, lo, hi)
  for lo, hi, region in regions(cfg, split, lower, num_query_blocks):
    carry = over_region(body, carry, lo, hi, region, first, near_parts,
                        unmasked_below=False)
  dk, dv = carry
  dk_ref[...] = (cfg.scale * dk).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)

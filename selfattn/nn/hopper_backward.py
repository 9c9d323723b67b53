"""The Hopper flash-attention backward on Mosaic GPU: a dQ kernel and a
dK/dV kernel, each with one producer warpgroup streaming blocks through
shared-memory slots and two compute warpgroups (hopper_attention.py's
forward has the same shape and explains the pipeline).

With s = scale q k^T + term (ALiBi's, from iota offsets; T5's bucket
bias; Shaw's scale q a^K of the pair's table row, from QA = q a^K^T
computed before the kernels; T5's and Shaw's far blocks take one edge
bucket or row, ALiBi's a row and a column term, the part that depends on
the query alone folded into the row's lse as in the forward, and Shaw's
edge row of DA into its delta) and the forward's lse, p = exp(s - lse),
delta = rowsum(dO * out) (computed outside, O(L D)):

  dQ    per (batch, head, tile of 2 x block_q query rows), over key blocks:
        dp = dO v^T; ds = p (dp - delta); dq += ds k       (3 matmuls)
        Shaw's value term adds dO a^V of the pair's row to dp (from DA =
        dO a^V^T, computed before the kernels). T5, Shaw: each row's sums
        of ds per bucket or table row (and Shaw's of p, with values; a far
        block's row sums go to its edge whole), written (B, H, rows, Lq)
        and turned into the tables' gradients and Shaw's dq term
        scale fold(ds) a^K after the kernel, O(L k) memory
  dK/dV per (batch, head, tile of 2 x block_q key rows), over query blocks
        (streamed q, dO, lse, delta; Shaw's QA and DA rows): p^T from
        k q^T; dv += p^T dO;
        dp^T = v dO^T; ds^T = p^T (dp^T - delta); dk += ds^T q   (4 matmuls)

One kernel instead (HopperConfig.fused_dq; FlashAttention-3's form; kinds
none, ALiBi, T5): the dK/dV kernel also computes each block's share of dQ,
dq[queries] += (ds^T)^T k, and adds it into a float32 dQ in global memory
by a TMA reduce-add (_add_dq_share): 5 matmuls and one exp2 per block pair
where the two kernels run 7 and two, since the dQ kernel recomputes s, p
and dp. dQ starts as zeros (a mutable array operand) and is scaled and
cast after the kernel. With 128-row query blocks the two compute groups
split each block's rows, each adding its half from both groups' keys, so
a key tile adds once per dQ row (pairs_queries); with 64-row blocks each
adds its own keys' share of every row. The adds land in no fixed order,
so on a GPU dQ is not bit-reproducible between runs (as FlashAttention-3's
is not). JAX's Mosaic
GPU interpreter has no reduce-add, so there each (tile, group) writes its
shares into its own slice of a (tiles x groups, B, H, Lq, D) buffer,
summed after the kernel: the same products, a plain copy where the GPU
reduces (O(L^2 D / block_q) memory, for the CPU tests' shapes). T5's bias
gradient is a sum over all pairs, so this kernel folds ds per key row
(row sums of its transposed blocks); Shaw's dq term and table gradients
need sums per query row (column sums here, across warps): Shaw keeps the
two kernels, and so does a call whose fused scratch would not fit in
shared memory or that asks XLA for deterministic GPU ops (XLA_FLAGS
--xla_gpu_deterministic_ops: deterministic_ops).

Both skip the blocks no allowed pair reaches (causal, key lengths) without
loading them, and mask only the blocks crossing a limit. Softmax in base 2
(lse scaled by log2 e once per row). Where a compute group needs fewer
blocks of the stream than its tile's other group (causal), it waits for
and releases the others, so each thread observes every phase of the
barriers it shares with the producer (JAX 0.11's interpreter checks it).
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import re
from typing import Iterator

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from selfattn.nn import pallas_kernels as kernels
from selfattn.nn.hopper_attention import BACKWARD_KINDS
from selfattn.nn.hopper_attention import add_to_row
from selfattn.nn.hopper_attention import fits
from selfattn.nn.hopper_attention import COMPUTE_GROUPS
from selfattn.nn.hopper_attention import F32
from selfattn.nn.hopper_attention import HEAD_MULTIPLE
from selfattn.nn.hopper_attention import LOG2E
from selfattn.nn.hopper_attention import HopperConfig
from selfattn.nn.hopper_attention import accumulate_product
from selfattn.nn.hopper_attention import block_logits2
from selfattn.nn.hopper_attention import cdiv
from selfattn.nn.hopper_attention import check
from selfattn.nn.hopper_attention import check_width
from selfattn.nn.hopper_attention import head_table
from selfattn.nn.hopper_attention import head_terms
from selfattn.nn.hopper_attention import interpret_params
from selfattn.nn.hopper_attention import key_end
from selfattn.nn.hopper_attention import over_blocks
from selfattn.nn.hopper_attention import per_row
from selfattn.nn.hopper_attention import product
from selfattn.nn.hopper_attention import unmasked_end
from selfattn.nn.hopper_attention import round_up
from selfattn.nn.hopper_attention import shaw_row
from selfattn.nn.hopper_attention import shaw_vector
from selfattn.nn.hopper_attention import table_term
from selfattn.nn.hopper_attention import tiled_smem
from selfattn.nn.hopper_attention import tuned_config
from selfattn.nn.hopper_attention import TUNED


# The kinds the fused backward computes (HopperConfig.fused_dq).
FUSED_KINDS = ('none', 'alibi', 't5')
# XLA's switches for bit-reproducible GPU runs: under either the backward
# keeps the two kernels, whose results do not depend on the order of
# atomic adds.
DETERMINISTIC_FLAGS = re.compile(
    r'--xla_gpu_(?:deterministic_ops|exclude_nondeterministic_ops)'
    r'(?:=(?:true|1))?(?=\s|$)')


def deterministic_ops() -> bool:
  """Whether XLA_FLAGS asks for deterministic GPU ops
  (--xla_gpu_deterministic_ops or --xla_gpu_exclude_nondeterministic_ops),
  which the fused backward's reduce-add is not: read when a call is
  traced."""
  flags = os.environ.get('XLA_FLAGS', '')
  return DETERMINISTIC_FLAGS.search(flags) is not None


@contextlib.contextmanager
def fused_in_tuned(fused: bool = True) -> Iterator[None]:
  """Inside it, hopper_attention.TUNED's backward rows ask for the fused
  backward (or, fused=False, the two kernels): the form a call traced
  here runs (TUNED is read when a call is traced), as it will be once a
  GPU has chosen it; the rows are restored after."""
  saved = dict(TUNED)
  for key, shape in saved.items():
    if key[0] == 'backward':
      TUNED[key] = {**shape, 'fused_dq': fused}
  try:
    yield
  finally:
    TUNED.clear()
    TUNED.update(saved)


def takes_fused(cfg: HopperConfig, width: int, dtype) -> bool:
  """Whether cfg asks for the fused backward and may have it: a kind it
  computes, no deterministic ops asked for, and its scratch (for heads
  `width` wide) within a GPU's shared memory."""
  return (cfg.fused_dq and cfg.kind in FUSED_KINDS
          and not deterministic_ops()
          and fits(dkdv_scratch(cfg._replace(interpret=False), width,
                                dtype)))


def stream_blocks(j0, end, stages, slots_and_refs, ready, free, index_of):
  """The producer's loop: blocks [j0, end) of every (gmem block getter,
  smem slots) pair into slot (j - j0) % stages, refilling a slot once both
  compute groups freed it, then waiting for the last ones to be freed."""
  import jax.experimental.pallas.mosaic_gpu as plgpu

  def load(j, slot):
    for (block_of, slots), barrier in zip(slots_and_refs, ready):
      plgpu.copy_gmem_to_smem(block_of(index_of(j)), slots.at[slot],
                              barrier.at[slot])

  for n in range(stages):
    pl.when(j0 + n < end)(functools.partial(load, j0 + n, n))

  @pl.loop(j0 + stages, jnp.maximum(end, j0 + stages))
  def _refill(j):
    slot = lax.rem(j - j0, jnp.int32(stages))
    plgpu.barrier_wait(free.at[slot])
    load(j, slot)

  @pl.loop(jnp.maximum(end - stages, j0), end)
  def _drain(j):
    # Observe the last blocks' release too.
    plgpu.barrier_wait(free.at[lax.rem(j - j0, jnp.int32(stages))])


def fold_into(cfg: HopperConfig, fold_smem, x, bucket, region: str,
              layout, held=None):
  """T5's and Shaw's sums of x per bucket or table row, for each row of the
  block, added into fold_smem ((rows, bq) float32, zeroed before the
  first block; in shared memory rather than registers: add_to_row says
  why): a far block's row sums all go to its edge, a near block's by one
  select per bucket or table row it can hold (held: held_rows), in a
  loop."""
  if region != 'near':
    add_to_row(fold_smem, kernels.edge(cfg, region), x.sum(axis=1), layout)
    return

  @pl.loop(*held)
  def _bucket(n):
    add_to_row(fold_smem, n, jnp.where(bucket == n, x, 0.0).sum(axis=1),
               layout)


def _dq_kernel(*refs, cfg: HopperConfig, lq: int, lk: int, dtype):
  import jax.experimental.pallas.mosaic_gpu as plgpu
  bucketed = cfg.kind in ('t5', 'shaw')
  shaw = cfg.kind == 'shaw'
  values = shaw and cfg.shaw_values
  (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref,
   table_ref) = refs[:8]
  refs = refs[8:]
  # Shaw's inputs: QA, and with values DA (B, H, 2k+1, Lq).
  qa_ref, refs = (refs[0], refs[1:]) if shaw else (None, refs)
  da_ref, refs = (refs[0], refs[1:]) if values else (None, refs)
  dq_ref = refs[0]
  fold_ref = refs[1] if bucketed else None       # ds per bucket / table row
  mass_ref = refs[2] if values else None         # p per table row
  scoped = refs[-1]
  smem, (k_ready, v_ready), own_ready, free, _ = scoped
  (q_smem2, do_smem2, lse_smem2, delta_smem2, k_smem, v_smem, ds_smem2,
   qa_smem2, da_smem2, fold_smem2, mass_smem2) = smem
  bq, bk, stages = cfg.block_q, cfg.block_k, cfg.stages
  b, h, wg = (lax.axis_index(n) for n in ('batch', 'heads', 'wg'))
  tile_base = lax.axis_index('tiles') * (COMPUTE_GROUPS * bq)
  shift = lk - lq
  length = jnp.clip(len_ref[b], 0, lk)

  tile_end = key_end(cfg, length, shift, tile_base + COMPUTE_GROUPS * bq - 1,
                     bk)

  @pl.when(wg < COMPUTE_GROUPS)
  def _compute():
    plgpu.set_max_registers(232, action='increase')
    q_smem, do_smem = q_smem2.at[wg], do_smem2.at[wg]
    base = tile_base + wg * bq
    rows = pl.ds(base, bq)
    own = [(q_ref.at[b, h, rows], q_smem),
           (do_ref.at[b, h, rows], do_smem),
           (lse_ref.at[b, h, rows], lse_smem2.at[wg]),
           (delta_ref.at[b, h, rows], delta_smem2.at[wg])]
    if shaw:        # the rows' QA (and DA) per table row
      own.append((qa_ref.at[b, h, :, rows], qa_smem2.at[wg]))
    if values:
      own.append((da_ref.at[b, h, :, rows], da_smem2.at[wg]))
    for (src, dst), barrier in zip(own, own_ready):
      plgpu.copy_gmem_to_smem(src, dst, barrier.at[wg])
    for barrier in own_ready:
      plgpu.barrier_wait(barrier.at[wg])
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    lse2 = plgpu.load(lse_smem2.at[wg], layout=row_layout) * LOG2E
    delta = plgpu.load(delta_smem2.at[wg], layout=row_layout)
    terms = qa_smem2.at[wg] if shaw else head_terms(cfg, table_ref, h)
    end = key_end(cfg, length, shift, base + bq - 1, bk)
    full = unmasked_end(cfg, length, shift, base, bk, end)

    def step(j, dq, masked: bool, region: str):
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])
      s = product(q_smem, k_smem.at[slot].transpose((1, 0)), (bq, bk))
      s2, per_query, bucket, held = block_logits2(
          cfg, s, terms, length, shift, masked, region, (base, j * bk))
      # The far blocks' per-query term (logits2) joins the row's lse.
      p = jnp.exp2(s2 - per_row(lse2 - per_query, s2.shape))
      plgpu.barrier_wait(v_ready.at[slot])
      dp = product(do_smem, v_smem.at[slot].transpose((1, 0)), (bq, bk))
      row_delta = delta
      if values:    # out's value term W a^V: dp gains dO a^V of the pair's row
        if region == 'near':
          dp = dp + table_term(
              cfg, lambda n: shaw_row(da_smem2.at[wg], n, dp.shape), bucket,
              dp, held)
        else:       # a far block's is one row's: it joins delta per row
          row_delta = delta - shaw_vector(da_smem2.at[wg],
                                          kernels.edge(cfg, region))
        fold_into(cfg, mass_smem2.at[wg], p, bucket, region, row_layout,
                  held)
      ds = p * (dp - lax.broadcast_in_dim(row_delta, dp.shape, [0]))
      if bucketed:
        fold_into(cfg, fold_smem2.at[wg], ds, bucket, region, row_layout,
                  held)
      dq = accumulate_product(dq, ds.astype(dtype), k_smem.at[slot],
                              ds_smem2.at[wg] if cfg.interpret else None,
                              cfg.interpret)
      plgpu.barrier_arrive(free.at[slot])
      return dq

    dq = plgpu.layout_cast(jnp.zeros((bq, q_smem.shape[-1]), F32),
                           plgpu.Layout.WGMMA)
    zeros = plgpu.layout_cast(jnp.zeros((bq,), F32), row_layout)
    for sums, used in ((fold_smem2, bucketed), (mass_smem2, values)):
      if used:
        @pl.loop(0, kernels.num_rows(cfg))
        def _zero(n):
          sums.at[wg, n][...] = zeros
    dq = over_blocks(cfg, step, dq, lax.div(base, bq), bq, bk, full, end)

    @pl.loop(end, tile_end)
    def _release(j):
      # Observe the loads of blocks only the other group needs, then free.
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])
      plgpu.barrier_wait(v_ready.at[slot])
      plgpu.barrier_arrive(free.at[slot])

    q_smem[...] = (dq * cfg.scale).astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, h, rows])
    if bucketed:
      plgpu.copy_smem_to_gmem(fold_smem2.at[wg], fold_ref.at[b, h, :, rows])
    if values:
      plgpu.copy_smem_to_gmem(mass_smem2.at[wg], mass_ref.at[b, h, :, rows])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == COMPUTE_GROUPS)
  def _produce():
    plgpu.set_max_registers(40, action='decrease')
    block = lambda ref: (lambda j: ref.at[b, h, pl.ds(j * bk, bk)])
    stream_blocks(0, tile_end, stages, ((block(k_ref), k_smem),
                                        (block(v_ref), v_smem)),
                  (k_ready, v_ready), free, lambda j: j)


def query_regions(cfg: HopperConfig, key_block, bq: int, bkv: int, start,
                  end):
  """[(lo, hi, region)] of query blocks [start, end) for keys [key_block
  bkv, key_block bkv + bkv): the far blocks on each side (the transpose of
  hopper_attention.regions: queries far left of the keys see them at
  offsets >= max_distance, k or 1, the 'right' edge) apart from the near
  ones; one 'near' range otherwise."""
  if not kernels.splits(cfg):
    return [(start, end, 'near')]
  right_end, left_start = kernels.far_query_blocks(
      key_block, bq, bkv, kernels.reach(cfg), start, end)
  return [(start, right_end, 'right'), (right_end, left_start, 'near'),
          (left_start, end, 'left')]


def pairs_queries(cfg: HopperConfig) -> bool:
  """Whether the fused backward's two compute groups split each query
  block's dQ share by queries, each adding half the rows from both groups'
  keys (FlashAttention-3's one reduce-add per query row and key tile),
  rather than each adding its own keys' share of every row (twice the
  reduce-add traffic): possible where half a streamed block is still a
  wgmma tile of 64 rows (block_k >= 128)."""
  return cfg.block_k % (COMPUTE_GROUPS * 64) == 0


def meet(pair) -> None:
  """Both compute groups at `pair` (a barrier of COMPUTE_GROUPS
  arrivals): each goes on once the other has arrived."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  plgpu.barrier_arrive(pair)
  plgpu.barrier_wait(pair)


def _add_dq_share(cfg: HopperConfig, ds_smem2, k_smem2, share_smem,
                  dq_rows, pair, wg) -> None:
  """The fused backward's step: dQ's rows of one query block (dq_rows)
  gain ds k, their share from this key tile. Each group's ds^T (keys x
  queries, the inputs' dtype) is in its ds_smem2 slot (stored by the
  caller; in interpret mode by accumulate_product) and is read transposed
  as wgmma's left operand; the float32 share goes to share_smem and from
  there into dq_rows by a TMA reduce-add, whose reads of the previous
  share are waited for first.

  pairs_queries: the groups meet at `pair` (both ds^T written) and each
  adds half the rows from both groups' keys. ds_smem2 is one of two slots
  by block parity, so no second meeting is needed before a group writes
  its next ds^T: to write this slot again it must pass the next block's
  meeting, which the other group reaches only after its product here has
  read the slot (the product waits for its wgmma). A group with no pair
  for this block takes part with zeros (both its slots zeroed before).
  Else each adds its own keys' share of every row and `pair` is None.

  In interpret mode (no reduce-add there) dq_rows is this (tile, group)'s
  own slice, written by a plain copy."""
  import jax.experimental.pallas.mosaic_gpu as plgpu

  def add(share, rows):
    plgpu.wait_smem_to_gmem(0, wait_read_only=True)
    share_smem[...] = share
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(share_smem, rows,
                            reduction_op=None if cfg.interpret else 'add')

  if pair is None:
    add(product(ds_smem2.at[wg].transpose((1, 0)), k_smem2.at[wg],
                share_smem.shape), dq_rows)
    return
  meet(pair)
  half = share_smem.shape[0]

  def rows_of(group):
    # Static slices: a group's half of the queries, from every key.
    queries = pl.ds(group * half, half)

    def both_groups(acc_ref):
      for g in range(COMPUTE_GROUPS):
        plgpu.wgmma(acc_ref, ds_smem2.at[g, :, queries].transpose((1, 0)),
                    k_smem2.at[g])
      return acc_ref[...]
    share = pl.run_scoped(both_groups, plgpu.ACC(share_smem.shape, F32))
    add(share, dq_rows.at[queries])

  for group in range(COMPUTE_GROUPS):
    pl.when(wg == group)(functools.partial(rows_of, group))


def _dkdv_kernel(*refs, cfg: HopperConfig, lq: int, lk: int,
                 num_query_blocks: int, dtype):
  """dK and dV of a tile of keys; with cfg.fused_dq (none, ALiBi, T5)
  also each block's share of dQ, added into dq_ref (see dq_shares), and
  T5's sums of ds per bucket and key row."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  shaw = cfg.kind == 'shaw'
  values = shaw and cfg.shaw_values
  fused, fused_t5 = cfg.fused_dq, cfg.fused_dq and cfg.kind == 't5'
  (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref,
   table_ref) = refs[:8]
  qa_ref = refs[8] if shaw else None        # QA, DA: streamed like q
  da_ref = refs[9] if values else None
  dq_ref = refs[8] if fused else None       # float32, the shares' sum
  dk_ref, dv_ref = refs[8 + shaw + values + fused:][:2]
  fold_ref = refs[-2] if fused_t5 else None  # ds per bucket and key row
  smem, ready, own_ready, free, pair = refs[-1]
  (k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem, a_smem2,
   qa_smem, da_smem, dq_smem2, fold_smem2) = smem
  bkv, bq, stages = cfg.block_q, cfg.block_k, cfg.stages   # keys per group
  b, h, wg = (lax.axis_index(n) for n in ('batch', 'heads', 'wg'))
  tile = lax.axis_index('tiles')
  tile_base = tile * (COMPUTE_GROUPS * bkv)
  shift = lk - lq
  length = jnp.clip(len_ref[b], 0, lk)
  # The GPU adds every share into one dQ; the interpreter, which cannot,
  # gives each (tile, group) a slice of its own (dq_shares).
  part = tile * COMPUTE_GROUPS + wg if cfg.interpret else 0

  def query_start(key_base):
    """The first query block any of keys [key_base, ...) is allowed for;
    num_query_blocks where none is (the keys are past the length)."""
    first = jnp.int32(0)
    if cfg.causal:
      first = lax.div(jnp.maximum(key_base - shift, 0), jnp.int32(bq))
    return jnp.where(key_base < length, jnp.minimum(first, num_query_blocks),
                     num_query_blocks)

  tile_start = query_start(tile_base)

  @pl.when(wg < COMPUTE_GROUPS)
  def _compute():
    plgpu.set_max_registers(232, action='increase')
    k_smem, v_smem = k_smem2.at[wg], v_smem2.at[wg]
    base = tile_base + wg * bkv
    keys = pl.ds(base, bkv)
    plgpu.copy_gmem_to_smem(k_ref.at[b, h, keys], k_smem, own_ready[0].at[wg])
    plgpu.copy_gmem_to_smem(v_ref.at[b, h, keys], v_smem, own_ready[1].at[wg])
    plgpu.barrier_wait(own_ready[0].at[wg])
    plgpu.barrier_wait(own_ready[1].at[wg])
    if pair is not None:
      # Paired, this group's wgmma reads the other group's keys too: their
      # load's completion, observed here as well as through the meetings.
      plgpu.barrier_wait(own_ready[0].at[1 - wg])
    terms = head_terms(cfg, table_ref, h)
    start = query_start(base)
    # Query blocks from which every pair with these keys is allowed.
    if cfg.causal:
      full = cdiv(jnp.maximum(base + bkv - 1 - shift, 0), bq)
    else:
      full = jnp.int32(0)
    full = jnp.where(base + bkv <= length, jnp.clip(full, start,
                                                    num_query_blocks),
                     num_query_blocks)
    column_layout = plgpu.Layout.WGMMA.reduce(0)
    key_layout = plgpu.Layout.WGMMA.reduce(1)
    # The left operands' shared buffer: the interpreter's wgmma reads them
    # only from there; fused, the last of them, ds^T, is dQ's too, in one
    # of two slots by block parity where the groups pair up.
    ds_slot = ((lambda i: lax.rem(i, jnp.int32(2))) if pair is not None
               else (lambda i: 0))
    a_smem_of = lambda i: a_smem2.at[ds_slot(i), wg] if cfg.interpret else None
    if fused_t5:
      zeros = plgpu.layout_cast(jnp.zeros((bkv,), F32), key_layout)

      @pl.loop(0, kernels.num_rows(cfg))
      def _zero(n):
        fold_smem2.at[wg, n][...] = zeros

    add_dq_share = lambda i: _add_dq_share(
        cfg, a_smem2.at[ds_slot(i)], k_smem2, dq_smem2.at[wg],
        dq_ref.at[part, b, h, pl.ds(i * bq, bq)], pair, wg)
    if pair is not None:
      # Where this group has no pair with a block, its share is zeros.
      for parity in range(2):
        a_smem2.at[parity, wg][...] = plgpu.layout_cast(
            jnp.zeros((bkv, bq), dtype), plgpu.Layout.WGMMA)
      plgpu.commit_smem()

    # Paired, every block in [tile_start, num_query_blocks) meets exactly
    # once per group, released here or stepped below (add_dq_share): a
    # block skipped by one group alone would leave the other waiting.
    @pl.loop(tile_start, start)
    def _release(i):
      # Blocks the tile's other group needs first: wait (the barriers'
      # phases advance per wait) and free them; paired, add the other
      # group's share of this group's half of the rows.
      slot = lax.rem(i - tile_start, jnp.int32(stages))
      for barrier in ready:
        plgpu.barrier_wait(barrier.at[slot])
      plgpu.barrier_arrive(free.at[slot])
      if pair is not None:
        add_dq_share(i)

    def step(i, carry, masked: bool, region: str):
      dk, dv = carry
      slot = lax.rem(i - tile_start, jnp.int32(stages))
      for barrier in ready:
        plgpu.barrier_wait(barrier.at[slot])
      s_t = product(k_smem, q_smem.at[slot].transpose((1, 0)), (bkv, bq))
      s2, per_query, bucket, held = block_logits2(
          cfg, s_t, qa_smem.at[slot] if shaw else terms, length, shift,
          masked, region, (i * bq, base), query_axis=1)
      lse2 = plgpu.load(lse_smem.at[slot], layout=column_layout) * LOG2E
      p_t = jnp.exp2(s2 - per_row(lse2 - per_query, s2.shape, 1))
      a_smem = a_smem_of(i)
      dv = accumulate_product(dv, p_t.astype(dtype), do_smem.at[slot],
                              a_smem, cfg.interpret)
      dp_t = product(v_smem, do_smem.at[slot].transpose((1, 0)), (bkv, bq))
      delta = plgpu.load(delta_smem.at[slot], layout=column_layout)
      if values:    # dp gains dO a^V of the pair's table row
        if region == 'near':
          dp_t = dp_t + table_term(
              cfg, lambda n: shaw_row(da_smem.at[slot], n, dp_t.shape, 1),
              bucket, dp_t, held)
        else:       # one row's in a far block: it joins delta
          delta = delta - shaw_vector(da_smem.at[slot],
                                      kernels.edge(cfg, region), 1)
      ds_t = p_t * (dp_t - lax.broadcast_in_dim(delta, dp_t.shape, [1]))
      if fused_t5:
        fold_into(cfg, fold_smem2.at[wg], ds_t, bucket, region, key_layout,
                  held)
      ds16 = ds_t.astype(dtype)
      if fused and not cfg.interpret:
        # dQ's left operand, stored before dK's product so that ds_t
        # (float32) need not live across it.
        a_smem2.at[ds_slot(i), wg][...] = ds16
        plgpu.commit_smem()
      dk = accumulate_product(dk, ds16, q_smem.at[slot], a_smem,
                              cfg.interpret)
      plgpu.barrier_arrive(free.at[slot])
      if fused:
        add_dq_share(i)
      return dk, dv

    zeros = lambda width: plgpu.layout_cast(jnp.zeros((bkv, width), F32),
                                            plgpu.Layout.WGMMA)
    carry = (zeros(k_smem.shape[-1]), zeros(v_smem.shape[-1]))
    for lo, hi, region in query_regions(cfg, lax.div(base, bkv), bq, bkv,
                                        start, num_query_blocks):
      for a, b_, masked in kernels.masked_split(full, lo, hi,
                                                unmasked_below=False):
        carry = lax.fori_loop(a, b_, functools.partial(
            step, masked=masked, region=region), carry)
    dk, dv = carry
    if pair is not None:
      # The other group's last products read these keys: done before they
      # are overwritten.
      meet(pair)
    k_smem[...] = (dk * cfg.scale).astype(dtype)
    v_smem[...] = dv.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, h, keys])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, h, keys])
    if fused_t5:
      plgpu.copy_smem_to_gmem(fold_smem2.at[wg], fold_ref.at[b, h, :, keys])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == COMPUTE_GROUPS)
  def _produce():
    plgpu.set_max_registers(40, action='decrease')
    block = lambda ref: (lambda i: ref.at[b, h, pl.ds(i * bq, bq)])
    table_rows = lambda ref: (lambda i: ref.at[b, h, :, pl.ds(i * bq, bq)])
    streams = [(block(q_ref), q_smem), (block(do_ref), do_smem),
               (block(lse_ref), lse_smem), (block(delta_ref), delta_smem)]
    if shaw:
      streams.append((table_rows(qa_ref), qa_smem))
    if values:
      streams.append((table_rows(da_ref), da_smem))
    stream_blocks(tile_start, num_query_blocks, stages, tuple(streams),
                  ready, free, lambda i: i)


def backward_scratch(cfg: HopperConfig, smem, num_streamed: int,
                     num_own: int, paired: bool = False):
  """A backward kernel's scratch: (shared buffers, ready barriers of the
  streamed blocks' slots, the compute groups' own loads, freed slots, and
  where they pair up (pairs_queries) the groups' meeting barrier, else
  None)."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  ready = tuple(plgpu.Barrier(num_barriers=cfg.stages)
                for _ in range(num_streamed))
  own = tuple(plgpu.Barrier(num_barriers=COMPUTE_GROUPS)
              for _ in range(num_own))
  freed = plgpu.Barrier(num_arrivals=COMPUTE_GROUPS, num_barriers=cfg.stages)
  pair = plgpu.Barrier(num_arrivals=COMPUTE_GROUPS) if paired else None
  return smem, ready, own, freed, pair


def dq_scratch(cfg: HopperConfig, width: int, dtype):
  """The dQ kernel's scratch: its groups' q, dO, lse, delta, key and
  value slots, Shaw's QA (and DA) rows, and the sums per bucket or table
  row: T5's and Shaw's of ds, Shaw's of p with values."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  tiled, groups = lambda shape: tiled_smem(shape, dtype), COMPUTE_GROUPS
  bq, bk, stages = cfg.block_q, cfg.block_k, cfg.stages
  shaw = cfg.kind == 'shaw'
  values = shaw and cfg.shaw_values
  rows = kernels.num_rows(cfg) if cfg.kind in ('t5', 'shaw') else 0
  row_smem = lambda used: (plgpu.SMEM((groups, rows, bq), F32) if used
                           else None)
  smem = (tiled((groups, bq, width)), tiled((groups, bq, width)),
          plgpu.SMEM((groups, bq), F32), plgpu.SMEM((groups, bq), F32),
          tiled((stages, bk, width)), tiled((stages, bk, width)),
          tiled((groups, bq, bk)) if cfg.interpret else None,
          row_smem(shaw), row_smem(values),             # QA, DA
          row_smem(rows), row_smem(values))             # ds's sums, p's
  return backward_scratch(cfg, smem, 2, 4 + shaw + values)


def dkdv_scratch(cfg: HopperConfig, width: int, dtype):
  """The dK/dV kernel's scratch: its groups' k and v, the streamed query
  blocks' q, dO, lse, delta (and Shaw's QA and DA rows) slots; fused
  (cfg.fused_dq), each group's ds^T (the inputs' dtype) and float32 dQ
  share, and T5's sums of ds per bucket and key row."""
  import jax.experimental.pallas.mosaic_gpu as plgpu
  tiled, groups = lambda shape: tiled_smem(shape, dtype), COMPUTE_GROUPS
  bq, bk, stages = cfg.block_q, cfg.block_k, cfg.stages
  shaw = cfg.kind == 'shaw'
  values = shaw and cfg.shaw_values
  fused = cfg.fused_dq      # as the kernel reads it (takes_fused settles it)
  paired = fused and pairs_queries(cfg)
  rows = kernels.num_rows(cfg) if shaw else 0
  buckets = kernels.num_rows(cfg) if fused and cfg.kind == 't5' else 0
  smem = (tiled((groups, bq, width)), tiled((groups, bq, width)),
          tiled((stages, bk, width)), tiled((stages, bk, width)),
          plgpu.SMEM((stages, bk), F32), plgpu.SMEM((stages, bk), F32),
          # Left operands staged for the interpreter; fused, ds^T (two
          # slots by block parity where the groups pair up).
          tiled((2 if paired else 1, groups, bq, bk))
          if cfg.interpret or fused else None,
          plgpu.SMEM((stages, rows, bk), F32) if shaw else None,
          plgpu.SMEM((stages, rows, bk), F32) if values else None,
          # Float32 in 32-wide tiles with the 128-byte swizzle: the
          # share's stores from wgmma's layout without bank conflicts.
          plgpu.SMEM((groups, bk // groups if paired else bk, width), F32,
                     transforms=(plgpu.TilingTransform((8, 32)),
                                 plgpu.SwizzleTransform(128)))
          if fused else None,
          plgpu.SMEM((groups, buckets, bq), F32) if buckets else None)
  return backward_scratch(cfg, smem, 4 + shaw + values, 2, paired)


def backward_computes(kind: str, head_dim: int, clip: int = 0,
                      values: bool = False, causal: bool = False,
                      num_buckets: int = 0) -> bool:
  """Whether backward computes the backward of a call the forward computes
  (hopper_attention.supports), at TUNED's shapes: head_dim the widest of
  q's and v's, clip and values Shaw's k and whether it has a value table,
  num_buckets T5's (the dQ kernel's sums per bucket take shared memory).
  The two kernels or, where TUNED asks for it, the fused one (backward
  runs the two where it would not fit).
  Shaw's table rows take shared memory in both kernels (dQ holds four
  (2k+1) x block_q buffers per group: QA, DA and the sums of ds and p;
  dK/dV streams QA and DA per stage), so its backward fits only for narrow
  heads and moderate k: with values up to k = 30 at 64-wide heads and
  k = 6 at 128-wide ones (dQ is the limit), keys only up to 62 and 14."""
  return backward_fits(
      tuned_config(kind, 'backward', clip, values, causal)._replace(
          num_buckets=num_buckets), head_dim)


def backward_fits(cfg: HopperConfig, head_dim: int) -> bool:
  """backward_computes at cfg's shapes (a call's routing, at the shapes
  its forward was traced with): the fused kernel where cfg asks for it and
  it fits, else the two kernels where their scratch fits on a GPU."""
  if cfg.kind not in BACKWARD_KINDS:
    return False
  width = round_up(head_dim, HEAD_MULTIPLE)
  if takes_fused(cfg, width, jnp.bfloat16):
    return True
  split = cfg._replace(fused_dq=False, interpret=False)
  return (fits(dq_scratch(split, width, jnp.bfloat16))
          and fits(dkdv_scratch(split, width, jnp.bfloat16)))


def backward(cfg: HopperConfig, q: jax.Array, k: jax.Array, v: jax.Array,
             key_lengths: jax.Array | None, table: jax.Array | None,
             d_out: jax.Array, lse: jax.Array, delta: jax.Array
             ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """(dq, dk, dv) in q's dtype of hopper_attention.forward's output, and
  the table's gradient in float32: T5's (num_buckets, H); Shaw's (d a^K
  (H, 2k+1, D), d a^V (H, 2k+1, Dv) or None); None for the other kinds.

  q, k, v, key_lengths, table: as the forward's (ALiBi's slopes, T5's
  (num_buckets, H) biases, Shaw's per-head (a^K, a^V or None), or None:
  BACKWARD_KINDS). d_out: (B, H, Lq, Dv) the output's cotangent; lse: the
  forward's (B, H, Lq) float32 (+inf where a row had no key); delta:
  (B, H, Lq) float32 rowsum(d_out * out), out with Shaw's value term.
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu
  check(cfg)
  b, h, lq, d = q.shape
  lk, dv_width = k.shape[2], v.shape[3]
  if cfg.kind not in BACKWARD_KINDS:
    raise ValueError(f'kind={cfg.kind!r}: the Hopper backward computes '
                     f'{BACKWARD_KINDS}')
  width = round_up(max(d, dv_width), HEAD_MULTIPLE)
  check_width(width)
  shaw = cfg.kind == 'shaw'
  q_in, d_out_in = q, d_out
  a_k = a_v = None
  if shaw:
    a_k, a_v = table
    cfg = cfg._replace(shaw_values=a_v is not None)
    table = None
  bq, bk = cfg.block_q, cfg.block_k
  tile = math.lcm(COMPUTE_GROUPS * bq, bk)
  lq_pad, lk_pad = round_up(lq, tile), round_up(lk, tile)
  # dQ streams key blocks, dK/dV query blocks: no more slots than blocks.
  dq_cfg = cfg._replace(stages=min(cfg.stages, lk_pad // bk))
  dkdv_cfg = cfg._replace(stages=min(cfg.stages, lq_pad // bk))
  # The fused kernel where it was asked for and fits, else the two.
  fused = takes_fused(dkdv_cfg, width, q.dtype)
  dkdv_cfg = dkdv_cfg._replace(fused_dq=fused)
  # What a GPU allocates (the interpreter's extra buffer has no limit).
  on_gpu = lambda c: c._replace(interpret=False)
  if not fused and not (fits(dq_scratch(on_gpu(dq_cfg), width, q.dtype))
                        and fits(dkdv_scratch(on_gpu(dkdv_cfg), width,
                                              q.dtype))):
    raise ValueError(f'kind={cfg.kind!r} with heads {max(d, dv_width)} wide'
                     + (f' and clip={cfg.clip}' if shaw else '')
                     + ": the Hopper backward kernels' scratch would not fit "
                     'in shared memory (backward_computes)')
  pad = lambda x, length: jnp.pad(
      x.astype(q.dtype), [(0, 0), (0, 0), (0, length - x.shape[2]),
                          (0, width - x.shape[3])])
  q, d_out = pad(q, lq_pad), pad(d_out, lq_pad)
  k, v = pad(k, lk_pad), pad(v, lk_pad)
  # Padded query rows: lse = +inf makes their weights 0.
  lse = jnp.pad(lse.astype(F32), [(0, 0), (0, 0), (0, lq_pad - lq)],
                constant_values=jnp.inf)
  delta = jnp.pad(delta.astype(F32), [(0, 0), (0, 0), (0, lq_pad - lq)])
  lengths = (jnp.full((b,), lk, jnp.int32) if key_lengths is None
             else jnp.asarray(key_lengths, jnp.int32))
  table = head_table(cfg, table, h)
  rows = kernels.num_rows(cfg) if cfg.kind in ('t5', 'shaw') else 0
  extra = []
  if shaw:
    # As the forward: QA = scale log2(e) q a^K^T, base 2, and for the value
    # term DA = dO a^V^T, the pair's share of dp; (B, H, 2k+1, Lq), O(L k).
    table_rows = lambda x, t, factor: jnp.pad(
        jnp.einsum('bhld,hrd->bhrl', x, t.astype(x.dtype),
                   preferred_element_type=F32) * factor,
        [(0, 0)] * 3 + [(0, lq_pad - lq)])
    extra.append(table_rows(q_in, a_k, cfg.scale * LOG2E))
    if cfg.shaw_values:
      extra.append(table_rows(d_out_in.astype(q.dtype), a_v, 1.0))
  interpret = interpret_params(cfg)
  operands = (q, k, v, d_out, lse, delta, lengths, table, *extra)

  def call(kernel, scratch, out_type, tiles, name, args=operands):
    def entry(*refs):
      pl.run_scoped(lambda *scoped: kernel(*refs, scoped), *scratch,
                    collective_axes='wg')

    return plgpu.kernel(
        entry, out_type=out_type, grid=(h, tiles, b),
        grid_names=('heads', 'tiles', 'batch'),
        num_threads=COMPUTE_GROUPS + 1, thread_name='wg',
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret, kernel_name=name)(*args)

  # dK/dV: key tiles of 2 x bq rows, query blocks of bk streamed.
  num_query_blocks = lq_pad // bk
  key_tiles = lk_pad // (COMPUTE_GROUPS * bq)
  dkdv = lambda args, out_type: call(
      functools.partial(_dkdv_kernel, cfg=dkdv_cfg, lq=lq, lk=lk,
                        num_query_blocks=num_query_blocks, dtype=q.dtype),
      dkdv_scratch(dkdv_cfg, width, q.dtype),
      (jax.ShapeDtypeStruct((b, h, lk_pad, width), q.dtype),) * 2 + out_type,
      key_tiles, 'selfattn_hopper_fused_backward' if fused
      else 'selfattn_hopper_dkdv', args)
  if fused:
    # One kernel: dK/dV's, adding each block's share of dQ into dQ, which
    # starts as zeros (a mutable array): on the GPU one (B, H, L, D), in
    # the interpreter a slice per (tile, group), summed here.
    parts = key_tiles * COMPUTE_GROUPS if cfg.interpret else 1
    dq_shares = jax.new_ref(jnp.zeros((parts, b, h, lq_pad, width), F32))
    by_key = ((jax.ShapeDtypeStruct((b, h, rows, lk_pad), F32),)
              if cfg.kind == 't5' else ())
    dk, dv, *folds = dkdv((*operands, dq_shares), by_key)
    dq = (cfg.scale * dq_shares[...].sum(0))[:, :, :lq, :d].astype(q.dtype)
    # T5: ds's sums per bucket and key row, summed over the keys too.
    dtable = folds[0].sum((0, 3)).T if folds else None
    return dq, dk[:, :, :lk, :d], dv[:, :, :lk, :dv_width], dtable

  # dQ: query tiles of 2 x bq rows, key blocks of bk streamed.
  # T5, Shaw: each query row's sums of ds per bucket / table row, and
  # Shaw's masses of p per table row with values, (B, H, rows, Lq): O(L)
  # memory, reduced to the tables' gradients below.
  by_rows = jax.ShapeDtypeStruct((b, h, rows, lq_pad), F32)
  dq_out = ((jax.ShapeDtypeStruct((b, h, lq_pad, width), q.dtype),)
            + (by_rows,) * (bool(rows) + cfg.shaw_values))
  dq, *by_row = call(
      functools.partial(_dq_kernel, cfg=dq_cfg, lq=lq, lk=lk, dtype=q.dtype),
      dq_scratch(dq_cfg, width, q.dtype), dq_out,
      lq_pad // (COMPUTE_GROUPS * bq), 'selfattn_hopper_dq')
  dq = dq[:, :, :lq, :d]
  dtable = None
  if cfg.kind == 't5':
    dtable = by_row[0].sum((0, 3)).T                  # (num_buckets, H)
  elif shaw:
    # s = scale q (k_j + a^K_row): dq gains scale sum_row fold(ds) a^K_row,
    # d a^K_row = scale sum fold(ds) q; out gains sum_row W a^V_row, so
    # d a^V_row = sum W dO, W the masses of p.
    folds = by_row[0][..., :lq]
    dq = (dq.astype(F32) + cfg.scale * jnp.einsum(
        'bhrl,hrd->bhld', folds, a_k.astype(F32))).astype(q.dtype)
    d_a_k = cfg.scale * jnp.einsum('bhrl,bhld->hrd', folds,
                                   q_in.astype(F32))
    d_a_v = (jnp.einsum('bhrl,bhld->hrd', by_row[1][..., :lq],
                        d_out_in.astype(F32)) if cfg.shaw_values else None)
    dtable = (d_a_k, d_a_v)

  dk, dv = dkdv(operands, ())
  return dq, dk[:, :, :lk, :d], dv[:, :, :lk, :dv_width], dtable


__all__ = ['FUSED_KINDS', 'backward', 'backward_computes', 'backward_fits',
           'deterministic_ops', 'dkdv_scratch', 'dq_scratch', 'fused_in_tuned',
           'takes_fused']

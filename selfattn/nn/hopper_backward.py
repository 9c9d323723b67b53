"""The Hopper flash-attention backward on Mosaic GPU: a dQ kernel and a
dK/dV kernel, each with one producer warpgroup streaming blocks through
shared-memory slots and two compute warpgroups (hopper_attention.py's
forward has the same shape and explains the pipeline).

With s = scale q k^T + term (ALiBi's, from iota offsets; T5's bucket
bias, one edge bucket on blocks wholly beyond max_distance as in the
forward) and the forward's lse, p = exp(s - lse), delta = rowsum(dO * out)
(computed outside, O(L D)):

  dQ    per (batch, head, tile of 2 x block_q query rows), over key blocks:
        dp = dO v^T; ds = p (dp - delta); dq += ds k       (3 matmuls)
        T5: each row's sums of ds per bucket (a far block's row sums go to
        its edge bucket whole), written (B, H, num_buckets, Lq) and summed
        to the table's gradient after the kernel, O(L) memory
  dK/dV per (batch, head, tile of 2 x block_q key rows), over query blocks
        (streamed q, dO, lse, delta): p^T from k q^T; dv += p^T dO;
        dp^T = v dO^T; ds^T = p^T (dp^T - delta); dk += ds^T q   (4 matmuls)

Both skip the blocks no allowed pair reaches (causal, key lengths) without
loading them, and mask only the blocks crossing a limit. Softmax in base 2
(lse scaled by log2 e once per row). Where a compute group needs fewer
blocks of the stream than its tile's other group (causal), it waits for
and releases the others, so each thread observes every phase of the
barriers it shares with the producer (JAX 0.11's interpreter checks it).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from selfattn.nn import pallas_kernels as kernels
from selfattn.nn.hopper_attention import BACKWARD_KINDS
from selfattn.nn.hopper_attention import COMPUTE_GROUPS
from selfattn.nn.hopper_attention import F32
from selfattn.nn.hopper_attention import HEAD_MULTIPLE
from selfattn.nn.hopper_attention import LOG2E
from selfattn.nn.hopper_attention import HopperConfig
from selfattn.nn.hopper_attention import accumulate_product
from selfattn.nn.hopper_attention import block_indices
from selfattn.nn.hopper_attention import cdiv
from selfattn.nn.hopper_attention import check
from selfattn.nn.hopper_attention import check_width
from selfattn.nn.hopper_attention import head_table
from selfattn.nn.hopper_attention import head_terms
from selfattn.nn.hopper_attention import key_end
from selfattn.nn.hopper_attention import logits2
from selfattn.nn.hopper_attention import over_blocks
from selfattn.nn.hopper_attention import product
from selfattn.nn.hopper_attention import unmasked_end
from selfattn.nn.hopper_attention import round_up


def _stream(j0, end, stages, slots_and_refs, ready, free, index_of):
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


def _fold(cfg: HopperConfig, folds, x, bucket, region: str):
  """T5: each row's sums of x per bucket, added to `folds` (a (bq,) row
  vector per bucket): a far block's row sums all go to its edge bucket,
  a near block's by one select per bucket."""
  if region != 'near':
    n = kernels.edge(cfg, region)
    return folds[:n] + (folds[n] + x.sum(axis=1),) + folds[n + 1:]
  return tuple(f + jnp.where(bucket == n, x, 0.0).sum(axis=1)
               for n, f in enumerate(folds))


def _dq_kernel(*refs, cfg: HopperConfig, lq: int, lk: int, dtype):
  import jax.experimental.pallas.mosaic_gpu as plgpu
  t5 = cfg.kind == 't5'
  (q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref, table_ref,
   dq_ref) = refs[:9]
  dtable_ref = refs[9] if t5 else None
  scoped = refs[-1]
  smem, (k_ready, v_ready), own_ready, free = scoped
  (q_smem2, do_smem2, lse_smem2, delta_smem2, k_smem, v_smem, ds_smem2,
   fold_smem2) = smem
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
    for src, dst, barrier in ((q_ref, q_smem, own_ready[0]),
                              (do_ref, do_smem, own_ready[1]),
                              (lse_ref, lse_smem2.at[wg], own_ready[2]),
                              (delta_ref, delta_smem2.at[wg], own_ready[3])):
      plgpu.copy_gmem_to_smem(src.at[b, h, rows], dst, barrier.at[wg])
    for barrier in own_ready:
      plgpu.barrier_wait(barrier.at[wg])
    row_layout = plgpu.Layout.WGMMA.reduce(1)
    lse2 = plgpu.load(lse_smem2.at[wg], layout=row_layout) * LOG2E
    delta = plgpu.load(delta_smem2.at[wg], layout=row_layout)
    terms = head_terms(cfg, table_ref, h)
    end = key_end(cfg, length, shift, base + bq - 1, bk)
    full = unmasked_end(cfg, length, shift, base, bk, end)

    def step(j, carry, masked: bool, region: str):
      dq, folds = carry
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])
      s = product(q_smem, k_smem.at[slot].transpose((1, 0)), (bq, bk))
      q_idx, k_idx = block_indices(base, j * bk, (bq, bk))
      bucket = (kernels.bucket_of(cfg, k_idx - q_idx)
                if t5 and region == 'near' else None)
      s2 = logits2(cfg, s, q_idx, k_idx, terms, length, shift, masked,
                   region, bucket)
      p = jnp.exp2(s2 - lax.broadcast_in_dim(lse2, s2.shape, [0]))
      plgpu.barrier_wait(v_ready.at[slot])
      dp = product(do_smem, v_smem.at[slot].transpose((1, 0)), (bq, bk))
      ds = p * (dp - lax.broadcast_in_dim(delta, dp.shape, [0]))
      if t5:
        folds = _fold(cfg, folds, ds, bucket, region)
      dq = accumulate_product(dq, ds.astype(dtype), k_smem.at[slot],
                              ds_smem2.at[wg] if cfg.interpret else None,
                              cfg.interpret)
      plgpu.barrier_arrive(free.at[slot])
      return dq, folds

    dq = plgpu.layout_cast(jnp.zeros((bq, q_smem.shape[-1]), F32),
                           plgpu.Layout.WGMMA)
    folds = ()
    if t5:
      folds = tuple(plgpu.layout_cast(jnp.zeros((bq,), F32), row_layout)
                    for _ in range(cfg.num_buckets))
    dq, folds = over_blocks(cfg, step, (dq, folds), lax.div(base, bq), bq, bk,
                            full, end)

    @pl.loop(end, tile_end)
    def _release(j):
      # Observe the loads of blocks only the other group needs, then free.
      slot = lax.rem(j, jnp.int32(stages))
      plgpu.barrier_wait(k_ready.at[slot])
      plgpu.barrier_wait(v_ready.at[slot])
      plgpu.barrier_arrive(free.at[slot])

    q_smem[...] = (dq * cfg.scale).astype(dtype)
    if t5:
      fold_smem = fold_smem2.at[wg]
      for n, f in enumerate(folds):
        fold_smem.at[n][...] = f
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(q_smem, dq_ref.at[b, h, rows])
    if t5:
      plgpu.copy_smem_to_gmem(fold_smem, dtable_ref.at[b, h, :, rows])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == COMPUTE_GROUPS)
  def _produce():
    plgpu.set_max_registers(40, action='decrease')
    block = lambda ref: (lambda j: ref.at[b, h, pl.ds(j * bk, bk)])
    _stream(0, tile_end, stages, ((block(k_ref), k_smem),
                                  (block(v_ref), v_smem)),
            (k_ready, v_ready), free, lambda j: j)


def _query_regions(cfg: HopperConfig, key_block, bq: int, bkv: int, start,
                   end):
  """[(lo, hi, region)] of query blocks [start, end) for keys [key_block
  bkv, key_block bkv + bkv): T5's far blocks on each side (the transpose of
  hopper_attention.regions: queries far left of the keys see them at
  offsets >= max_distance, the 'right' edge bucket) apart from the near
  ones; one 'near' range otherwise."""
  if cfg.kind != 't5':
    return [(start, end, 'near')]
  right_end, left_start = kernels.far_query_blocks(
      key_block, bq, bkv, kernels.reach(cfg), start, end)
  return [(start, right_end, 'right'), (right_end, left_start, 'near'),
          (left_start, end, 'left')]


def _dkdv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, len_ref,
                 table_ref, dk_ref, dv_ref, scoped, *, cfg: HopperConfig,
                 lq: int, lk: int, num_query_blocks: int, dtype):
  import jax.experimental.pallas.mosaic_gpu as plgpu
  smem, ready, own_ready, free = scoped
  k_smem2, v_smem2, q_smem, do_smem, lse_smem, delta_smem, a_smem2 = smem
  bkv, bq, stages = cfg.block_q, cfg.block_k, cfg.stages   # keys per group
  b, h, wg = (lax.axis_index(n) for n in ('batch', 'heads', 'wg'))
  tile_base = lax.axis_index('tiles') * (COMPUTE_GROUPS * bkv)
  shift = lk - lq
  length = jnp.clip(len_ref[b], 0, lk)

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
    a_smem = a_smem2.at[wg] if cfg.interpret else None

    @pl.loop(tile_start, start)
    def _release(i):
      # Blocks the tile's other group needs first: wait (the barriers'
      # phases advance per wait) and free them.
      slot = lax.rem(i - tile_start, jnp.int32(stages))
      for barrier in ready:
        plgpu.barrier_wait(barrier.at[slot])
      plgpu.barrier_arrive(free.at[slot])

    def step(i, carry, masked: bool, region: str):
      dk, dv = carry
      slot = lax.rem(i - tile_start, jnp.int32(stages))
      for barrier in ready:
        plgpu.barrier_wait(barrier.at[slot])
      s_t = product(k_smem, q_smem.at[slot].transpose((1, 0)), (bkv, bq))
      k_idx, q_idx = block_indices(base, i * bq, (bkv, bq))
      bucket = (kernels.bucket_of(cfg, k_idx - q_idx)
                if cfg.kind == 't5' and region == 'near' else None)
      s2 = logits2(cfg, s_t, q_idx, k_idx, terms, length, shift, masked,
                   region, bucket)
      lse2 = plgpu.load(lse_smem.at[slot], layout=column_layout) * LOG2E
      p_t = jnp.exp2(s2 - lax.broadcast_in_dim(lse2, s2.shape, [1]))
      dv = accumulate_product(dv, p_t.astype(dtype), do_smem.at[slot],
                              a_smem, cfg.interpret)
      dp_t = product(v_smem, do_smem.at[slot].transpose((1, 0)), (bkv, bq))
      delta = plgpu.load(delta_smem.at[slot], layout=column_layout)
      ds_t = p_t * (dp_t - lax.broadcast_in_dim(delta, dp_t.shape, [1]))
      dk = accumulate_product(dk, ds_t.astype(dtype), q_smem.at[slot],
                              a_smem, cfg.interpret)
      plgpu.barrier_arrive(free.at[slot])
      return dk, dv

    zeros = lambda width: plgpu.layout_cast(jnp.zeros((bkv, width), F32),
                                            plgpu.Layout.WGMMA)
    carry = (zeros(k_smem.shape[-1]), zeros(v_smem.shape[-1]))
    for lo, hi, region in _query_regions(cfg, lax.div(base, bkv), bq, bkv,
                                         start, num_query_blocks):
      split = jnp.clip(full, lo, hi)
      for a, b_, masked in ((lo, split, True), (split, hi, False)):
        carry = lax.fori_loop(a, b_, functools.partial(
            step, masked=masked, region=region), carry)
    dk, dv = carry
    k_smem[...] = (dk * cfg.scale).astype(dtype)
    v_smem[...] = dv.astype(dtype)
    plgpu.commit_smem()
    plgpu.copy_smem_to_gmem(k_smem, dk_ref.at[b, h, keys])
    plgpu.copy_smem_to_gmem(v_smem, dv_ref.at[b, h, keys])
    plgpu.wait_smem_to_gmem(0)

  @pl.when(wg == COMPUTE_GROUPS)
  def _produce():
    plgpu.set_max_registers(40, action='decrease')
    block = lambda ref: (lambda i: ref.at[b, h, pl.ds(i * bq, bq)])
    _stream(tile_start, num_query_blocks, stages,
            ((block(q_ref), q_smem), (block(do_ref), do_smem),
             (block(lse_ref), lse_smem), (block(delta_ref), delta_smem)),
            ready, free, lambda i: i)


def backward(cfg: HopperConfig, q: jax.Array, k: jax.Array, v: jax.Array,
             key_lengths: jax.Array | None, table: jax.Array | None,
             d_out: jax.Array, lse: jax.Array, delta: jax.Array
             ) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array | None]:
  """(dq, dk, dv) in q's dtype of hopper_attention.forward's output, and
  T5's table gradient (num_buckets, H) float32 (None for the other kinds).

  q, k, v, key_lengths, table: as the forward's (ALiBi's slopes, T5's
  (num_buckets, H) biases or None: BACKWARD_KINDS). d_out: (B, H, Lq, Dv)
  the output's cotangent; lse: the forward's (B, H, Lq) float32 (+inf
  where a row had no key); delta: (B, H, Lq) float32 rowsum(d_out * out).
  """
  import jax.experimental.pallas.mosaic_gpu as plgpu
  check(cfg)
  if cfg.kind not in BACKWARD_KINDS:
    raise ValueError(f'kind={cfg.kind!r}: the Hopper backward computes '
                     f'{BACKWARD_KINDS}')
  b, h, lq, d = q.shape
  lk, dv_width = k.shape[2], v.shape[3]
  width = round_up(max(d, dv_width), HEAD_MULTIPLE)
  check_width(width)
  bq, bk = cfg.block_q, cfg.block_k
  tile = math.lcm(COMPUTE_GROUPS * bq, bk)
  lq_pad, lk_pad = round_up(lq, tile), round_up(lk, tile)
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
  tiled = lambda shape: plgpu.SMEM(
      shape, q.dtype, transforms=(plgpu.TilingTransform((8, 64)),
                                  plgpu.SwizzleTransform(128)))
  interpret = plgpu.InterpretGPUParams() if cfg.interpret else None
  groups = COMPUTE_GROUPS
  operands = (q, k, v, d_out, lse, delta, lengths, table)

  def call(kernel, smem, stages, num_streamed, num_own, out_type, tiles,
           name):
    freed = plgpu.Barrier(num_arrivals=groups, num_barriers=stages)
    ready = tuple(plgpu.Barrier(num_barriers=stages)
                  for _ in range(num_streamed))
    own = tuple(plgpu.Barrier(num_barriers=groups) for _ in range(num_own))

    def entry(*refs):
      pl.run_scoped(lambda *scoped: kernel(*refs, scoped), smem, ready, own,
                    freed, collective_axes='wg')

    return plgpu.kernel(
        entry, out_type=out_type, grid=(h, tiles, b),
        grid_names=('heads', 'tiles', 'batch'), num_threads=groups + 1,
        thread_name='wg',
        compiler_params=plgpu.CompilerParams(approx_math=True),
        interpret=interpret, kernel_name=name)(*operands)

  # dQ: query tiles of 2 x bq rows, key blocks of bk streamed.
  stages = min(cfg.stages, lk_pad // bk)
  dq_cfg = cfg._replace(stages=stages)
  # T5: each query row's sums of ds per bucket, (B, H, num_buckets, Lq)
  # (O(L) memory), summed over batch and rows below.
  t5 = cfg.kind == 't5'
  dq_out = jax.ShapeDtypeStruct((b, h, lq_pad, width), q.dtype)
  if t5:
    dq_out = (dq_out, jax.ShapeDtypeStruct((b, h, cfg.num_buckets, lq_pad),
                                           F32))
  dq = call(
      functools.partial(_dq_kernel, cfg=dq_cfg, lq=lq, lk=lk, dtype=q.dtype),
      (tiled((groups, bq, width)), tiled((groups, bq, width)),
       plgpu.SMEM((groups, bq), F32), plgpu.SMEM((groups, bq), F32),
       tiled((stages, bk, width)), tiled((stages, bk, width)),
       tiled((groups, bq, bk)) if cfg.interpret else None,
       plgpu.SMEM((groups, cfg.num_buckets, bq), F32) if t5 else None),
      stages, 2, 4, dq_out, lq_pad // (groups * bq), 'selfattn_hopper_dq')
  dtable = None
  if t5:
    dq, folds = dq
    dtable = folds.sum((0, 3)).T                      # (num_buckets, H)

  # dK/dV: key tiles of 2 x bq rows, query blocks of bk streamed.
  num_query_blocks = lq_pad // bk
  stages = min(cfg.stages, num_query_blocks)
  dkdv_cfg = cfg._replace(stages=stages)
  dk, dv = call(
      functools.partial(_dkdv_kernel, cfg=dkdv_cfg, lq=lq, lk=lk,
                        num_query_blocks=num_query_blocks, dtype=q.dtype),
      (tiled((groups, bq, width)), tiled((groups, bq, width)),
       tiled((stages, bk, width)), tiled((stages, bk, width)),
       plgpu.SMEM((stages, bk), F32), plgpu.SMEM((stages, bk), F32),
       tiled((groups, bq, bk)) if cfg.interpret else None),
      stages, 4, 2, (jax.ShapeDtypeStruct((b, h, lk_pad, width), q.dtype),) * 2,
      lk_pad // (groups * bq), 'selfattn_hopper_dkdv')
  return (dq[:, :, :lq, :d], dk[:, :, :lk, :d], dv[:, :, :lk, :dv_width],
          dtable)


__all__ = ['backward']

"""The Pallas flash-attention kernel (interpret mode on the CPU) against the
plain path: outputs, gradients, MultiHeadAttention(attention_impl='pallas'),
its fallbacks, and the absence of any (L, L) array."""

import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from selfattn.nn import attention
from selfattn.nn import positions
from selfattn.nn import pallas_attention as pa
from compiled import compiled
from tiers import EXTENDED
from tiers import each_choice
from tiers import keep_in_commit_tier
from tiers import product

B, H, D = 2, 2, 8
BLOCKS = dict(block_q=8, block_k=8)
KINDS = ('none', 'alibi', 'alibi_symmetric', 't5', 'shaw', 'shaw_per_head')


@pytest.fixture(autouse=True)
def _exact_matmuls():
  """Full float32 matmuls in the kernel and in the plain reference. A no-op
  on the CPU; on a GPU both would otherwise round f32 operands to TF32
  (Triton's and XLA's default), about 1e-3 apart, far above these
  tolerances."""
  with jax.default_matmul_precision('highest'):
    yield


def _relative(kind):
  if kind == 'none':
    return None
  if kind == 'alibi':
    return positions.ALiBi(H)
  if kind == 'alibi_symmetric':
    return positions.ALiBi(H, symmetric=True)
  if kind.startswith('shaw'):
    # Clip 3 < the 8-blocks: blocks see both clipped and per-offset rows.
    return positions.ShawRelative(H, D, clip_distance=3,
                                  shared_heads=kind == 'shaw',
                                  rngs=nnx.Rngs(4))
  # Few buckets and a short max_distance so lengths ~20 reach the log-spaced
  # buckets and the last (clipped) one in both directions.
  return positions.T5RelativeBias(H, num_buckets=8, max_distance=12,
                                  rngs=nnx.Rngs(3))


def _qkv(lq, lk, seed=0, dtype=jnp.float32):
  keys = jax.random.split(jax.random.key(seed), 4)
  q = jax.random.normal(keys[0], (B, H, lq, D), dtype)
  k = jax.random.normal(keys[1], (B, H, lk, D), dtype)
  v = jax.random.normal(keys[2], (B, H, lk, D), dtype)
  return q, k, v, jax.random.normal(keys[3], (B, H, lq, D))


def _key_valid(lk, lengths):
  return jnp.arange(lk)[None, :] < jnp.asarray(lengths)[:, None]


def _gradients(fn, g, q, k, v, relative):
  """Gradients of sum(fn(q, k, v, relative) * g) in q, k, v and the
  encoding's tables, under jit."""
  def f(q, k, v, relative):
    return jnp.sum(fn(q, k, v, relative) * g)
  return nnx.jit(nnx.grad(f, argnums=(0, 1, 2, 3)))(q, k, v, relative)


def _plain(q, k, v, relative, causal, key_valid):
  mask = None if key_valid is None else key_valid[:, None, None, :]
  return attention.dot_product_attention(q, k, v, mask=mask, causal=causal,
                                         relative=relative)[0]


# Symmetric ALiBi causal is kept: no other grid here has it, and every
# (kind, causal) pair runs in the commit tier in one test or another.
@pytest.mark.parametrize('causal,kind', each_choice(product(
    [False, True], KINDS), always=[(True, 'alibi_symmetric')]))
def test_forward_equals_plain(kind, causal):
  """Lengths 17 x 23 (not multiples of the 8-blocks, Lq != Lk), key padding
  in one example; the other example's keys are all valid."""
  relative = _relative(kind)
  q, k, v, _ = _qkv(17, 23)
  valid = _key_valid(23, [14, 23])
  out = pa.pallas_attention(q, k, v, relative=relative, causal=causal,
                            key_valid=valid, **BLOCKS)
  want = _plain(q, k, v, relative, causal, valid)
  assert out.shape == want.shape and out.dtype == want.dtype
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  # Without a padding mask too.
  out = pa.pallas_attention(q, k, v, relative=relative, causal=causal,
                            **BLOCKS)
  np.testing.assert_allclose(out, _plain(q, k, v, relative, causal, None),
                             atol=1e-5, rtol=1e-5)


def test_far_blocks_match_a_brute_force_split():
  """far_blocks' ranges against every block's offsets in NumPy: the
  'left' blocks hold only offsets <= -k, the 'right' ones only >= +k, and
  every block that holds only such offsets on one side is classified so
  (the shortcut is taken wherever it applies)."""
  for bq, bk, clip, lq, lk in ((8, 8, 3, 40, 40), (8, 16, 2, 24, 64),
                               (16, 8, 5, 48, 33), (8, 8, 1, 8, 64)):
    nq, nk = -(-lq // bq), -(-lk // bk)
    for upper in (nk, max(nk - 2, 0)):
      for i in range(nq):
        left_end, right_start = map(int, pa.kernels.far_blocks(
            i, bq, bk, clip, upper))
        assert 0 <= left_end <= right_start <= upper
        rows = np.arange(i * bq, i * bq + bq)
        for j in range(upper):
          offsets = np.arange(j * bk, j * bk + bk)[None, :] - rows[:, None]
          is_left, is_right = offsets.max() <= -clip, offsets.min() >= clip
          assert (j < left_end) == is_left, (bq, bk, clip, i, j)
          assert (j >= right_start) == is_right, (bq, bk, clip, i, j)


def test_far_query_blocks_match_a_brute_force_split():
  """far_query_blocks' ranges (the dK/dV kernel's loop over query blocks)
  against every block's offsets in NumPy: query blocks [lower, right_end)
  see key block j only at offsets >= +k, [left_start, upper) only at
  offsets <= -k, and every block that does is classified so."""
  for bq, bk, clip, lq, lk in ((8, 8, 3, 40, 40), (8, 16, 2, 24, 64),
                               (16, 8, 5, 48, 33), (8, 8, 1, 64, 8)):
    nq, nk = -(-lq // bq), -(-lk // bk)
    for lower in (0, 1):
      for j in range(nk):
        right_end, left_start = map(int, pa.kernels.far_query_blocks(
            j, bq, bk, clip, lower, nq))
        assert lower <= right_end <= left_start <= nq
        keys = np.arange(j * bk, j * bk + bk)
        for i in range(lower, nq):
          offsets = keys[None, :] - np.arange(i * bq, i * bq + bq)[:, None]
          is_right, is_left = offsets.min() >= clip, offsets.max() <= -clip
          assert (i < right_end) == is_right, (bq, bk, clip, i, j)
          assert (i >= left_start) == is_left, (bq, bk, clip, i, j)


def test_near_sides_match_a_brute_force_split():
  """near_sides and near_query_sides (the near blocks apart by their side
  of the diagonal) against every block's offsets in NumPy, with unequal
  blocks: the three parts cover the range in order, 'left' blocks hold
  only offsets < 0, 'right' ones only > 0, 'both' ones cross 0."""
  def check(side, offsets, where):
    if side == 'left':
      assert offsets.max() < 0, where
    elif side == 'right':
      assert offsets.min() > 0, where
    else:
      assert offsets.min() <= 0 <= offsets.max(), where

  for bq, bk, lq, lk in ((8, 16, 40, 64), (16, 8, 48, 40), (8, 8, 24, 24)):
    nq, nk = -(-lq // bq), -(-lk // bk)
    for i in range(nq):
      rows = np.arange(i * bq, i * bq + bq)
      for lo, hi in ((0, nk), (1, max(nk - 1, 1))):
        parts = [(int(a), int(b), side) for a, b, side in
                 pa.kernels.near_sides(i, bq, bk, lo, hi)]
        assert [p[2] for p in parts] == ['left', 'both', 'right']
        assert parts[0][0] == lo and parts[-1][1] == hi
        assert all(p[1] == q[0] and p[0] <= p[1]
                   for p, q in zip(parts, parts[1:])), parts
        for a, b, side in parts:
          for j in range(a, b):
            keys = np.arange(j * bk, j * bk + bk)
            check(side, keys[None, :] - rows[:, None], (bq, bk, i, j))
    for j in range(nk):
      keys = np.arange(j * bk, j * bk + bk)
      parts = [(int(a), int(b), side) for a, b, side in
               pa.kernels.near_query_sides(j, bq, bk, 0, nq)]
      assert [p[2] for p in parts] == ['right', 'both', 'left']
      assert parts[0][0] == 0 and parts[-1][1] == nq
      for a, b, side in parts:
        for i in range(a, b):
          rows = np.arange(i * bq, i * bq + bq)
          check(side, keys[None, :] - rows[:, None], (bq, bk, i, j))


def test_side_rows_hold_each_sides_buckets():
  """side_rows: T5's buckets of offsets < 0 and > 0, and Shaw's clipped
  rows of them, each within its side's rows; the diagonal's are all."""
  def cfg(kind, num_buckets=0, max_distance=0, clip=0):
    return pa.kernels.Config(
        kind=kind, symmetric=False, num_buckets=num_buckets,
        max_distance=max_distance, clip=clip, shaw_values=False,
        causal=False, scale=1.0, block_q=8, block_k=8, interpret=True)
  offsets = np.arange(1, 400)
  for num_buckets, max_distance in ((8, 12), (32, 128), (6, 3)):
    t5 = cfg('t5', num_buckets=num_buckets, max_distance=max_distance)
    for side, d in (('left', -offsets), ('right', offsets)):
      buckets = set(np.asarray(positions.t5_bucket(
          jnp.asarray(d), num_buckets, max_distance)).tolist())
      assert buckets <= set(pa.kernels.side_rows(t5, side)), (side, buckets)
    assert pa.kernels.side_rows(t5, 'both') == range(num_buckets)
  for clip in (1, 3, 16):
    shaw = cfg('shaw', clip=clip)
    for side, d in (('left', -offsets), ('right', offsets)):
      rows = set((np.clip(d, -clip, clip) + clip).tolist())
      assert rows == set(pa.kernels.side_rows(shaw, side)), (side, clip)


def _kernel_and_plain_agree(relative, lq, lk, lengths, causal, seed,
                            blocks=BLOCKS, valid=None):
  """Outputs and gradients (q, k, v and the encoding's tables) of the kernel
  against the plain path, with key padding: prefixes of `lengths`, or the
  (B, lk) mask `valid`."""
  q, k, v, g = _qkv(lq, lk, seed=seed)
  if valid is None:
    valid = _key_valid(lk, lengths)
  graphdef, tables = nnx.split(relative)

  def loss(fn, tables, q, k, v):
    out = fn(q, k, v, nnx.merge(graphdef, tables))
    return jnp.sum(out * g), out

  def kernel(q, k, v, rel):
    return pa.pallas_attention(q, k, v, relative=rel, causal=causal,
                               key_valid=valid, **blocks)

  def plain(q, k, v, rel):
    return _plain(q, k, v, rel, causal, valid)

  # One compiled program per path: its outputs and gradients.
  def grad(fn):
    return jax.jit(jax.grad(functools.partial(loss, fn), argnums=(0, 1, 2, 3),
                            has_aux=True))(tables, q, k, v)

  got, ours = grad(kernel)
  want, theirs = grad(plain)
  np.testing.assert_allclose(ours, theirs, atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(a, b, atol=2e-4, rtol=2e-4)


# One case in the commit tier: per-head Shaw, causal. With Lq < Lk its
# causal rows still reach key blocks beyond +k, so the forward and both
# backward kernels take the left, near and right regions there; the shared
# table's far-block gradients run in test_gradients_equal_plain[True-shaw]
# (19 x 19, clip 3: far blocks left of the diagonal) and non-causal Shaw in
# test_gradients_with_key_lengths_equal_plain[False-shaw].
@pytest.mark.parametrize('causal,per_head', keep_in_commit_tier(
    product([False, True], [False, True]), (True, True)))
def test_shaw_far_blocks_forward_and_gradients_equal_plain(per_head, causal):
  """Lengths where most key blocks lie beyond the clip on either side
  (40 x 56, 8-blocks, k = 2): the edge-row shortcut gives the plain path's
  outputs and gradients (q, k, v and both tables)."""
  relative = positions.ShawRelative(H, D, clip_distance=2,
                                    shared_heads=not per_head,
                                    rngs=nnx.Rngs(5))
  _kernel_and_plain_agree(relative, 40, 56, [56, 37], causal, seed=3)


# Two corners in the commit tier (asymmetric bidirectional, symmetric
# causal); the other two forms run at shorter lengths, with fewer far
# blocks, in test_forward_equals_plain and test_gradients_equal_plain.
@pytest.mark.parametrize('symmetric,causal', keep_in_commit_tier(
    product([False, True], [False, True]), (False, False), (True, True)))
def test_alibi_far_blocks_forward_and_gradients_equal_plain(symmetric,
                                                           causal):
  """ALiBi on blocks wholly to one side of the diagonal is a row term plus
  a column term (pallas_kernels.alibi_rows_and_columns): at 40 x 56 with
  8-blocks most blocks take it, on both sides (causal: Lq < Lk, so rows
  still see keys to their right), asymmetric with its half-step left."""
  _kernel_and_plain_agree(positions.ALiBi(H, symmetric=symmetric), 40, 56,
                          [56, 37], causal, seed=6)


def test_far_block_bias_joins_the_row_max():
  """A far block's bias that depends on the query alone is folded into
  the row's max and lse (pallas_kernels.logit_term's per_query): with T5's
  left edge bucket at +100, which the rows meet in their first (left far)
  block, 2^(s - max) overflows float32 unless the bias joins the max."""
  relative = positions.T5RelativeBias(H, num_buckets=8, max_distance=12,
                                      rngs=nnx.Rngs(3))
  relative.bias[...] = relative.bias[...].at[3].set(100.0)   # the left edge
  _kernel_and_plain_agree(relative, 40, 56, [56, 37], False, seed=7)


def _shaw(clip, values=True, per_head=True, seed=5):
  return positions.ShawRelative(H, D, clip_distance=clip,
                                relative_values=values,
                                shared_heads=not per_head, rngs=nnx.Rngs(seed))


# Every other numeric test has block_q == block_k; here the two differ, so a
# query block's start taken in key blocks (or the reverse) fails: Shaw's
# band and ALiBi's row and column terms take both. Keys-only Shaw (no a^V:
# no value term, no clipped-row sums in the forward) runs only here and in
# the clip test below.
@pytest.mark.parametrize('kind,blocks,causal', keep_in_commit_tier(
    [('shaw', (16, 8), False), ('shaw', (8, 16), True),
     ('shaw_keys', (16, 8), True), ('shaw_keys', (8, 16), False),
     ('alibi', (16, 8), True), ('alibi', (8, 16), False),
     ('t5', (16, 8), False), ('t5', (8, 16), True)],
    ('shaw', (16, 8), False), ('shaw_keys', (8, 16), False),
    ('alibi', (16, 8), True), ('t5', (8, 16), True)))
def test_unequal_blocks_equal_plain(kind, blocks, causal):
  """block_q != block_k (16 x 8 and 8 x 16) at 40 x 56 with key padding:
  outputs and gradients, tables included, equal the plain path's."""
  relative = {'shaw': lambda: _shaw(3), 'shaw_keys': lambda: _shaw(3, False),
              'alibi': lambda: positions.ALiBi(H),
              't5': lambda: _relative('t5')}[kind]()
  _kernel_and_plain_agree(relative, 40, 56, [56, 37], causal, seed=7,
                          blocks=dict(block_q=blocks[0], block_k=blocks[1]))


@pytest.mark.parametrize('clip,values', keep_in_commit_tier(
    product([1, 10], [True, False]), (10, True), (1, False)))
def test_shaw_clip_of_one_and_past_the_block_equals_plain(clip, values):
  """Shaw with k = 1 (one interior offset, 0) and k = 10 > the 8-blocks
  (near regions of several blocks, a band longer than a block), causal,
  Lq < Lk, a key mask with zeros inside the sequence (not a prefix)."""
  valid = jnp.asarray([[True] * 56,
                       [i % 5 != 2 for i in range(40)] + [False] * 16])
  _kernel_and_plain_agree(_shaw(clip, values), 24, 56, None, True, seed=clip,
                          valid=valid)


def test_t5_buckets_beyond_max_distance_are_each_directions_last():
  """The kernel's T5 shortcut: every offset at or beyond max_distance falls
  in bucket num_buckets/2 - 1 (keys before the query) or num_buckets - 1
  (after), whatever the float rounding of the log at the boundary."""
  for num_buckets in (4, 6, 8, 16, 32, 64):
    for max_distance in (num_buckets // 2, 12, 100, 128, 1000):
      if max_distance <= num_buckets // 4:
        continue
      far = jnp.arange(max_distance, max_distance + 3000)
      half = num_buckets // 2
      assert set(np.asarray(positions.t5_bucket(
          far, num_buckets, max_distance)).tolist()) == {num_buckets - 1}
      assert set(np.asarray(positions.t5_bucket(
          -far, num_buckets, max_distance)).tolist()) == {half - 1}


@pytest.mark.parametrize('causal', [
    # Extended: [True] takes the same edge-bucket split, on both sides (with
    # Lq < Lk its causal rows reach key blocks beyond +max_distance);
    # non-causal T5 runs in test_gradients_equal_plain[False-t5].
    pytest.param(False, marks=EXTENDED),
    True])
def test_t5_far_blocks_forward_and_gradients_equal_plain(causal):
  """T5 at lengths where most key blocks lie beyond max_distance = 12
  (48 x 72, 8-blocks): the edge-bucket shortcut gives the plain path's
  outputs and gradients (q, k, v and the bias table)."""
  _kernel_and_plain_agree(_relative('t5'), 48, 72, [72, 50], causal, seed=4)


@pytest.mark.parametrize('kind', ['none', 't5'])
def test_fully_masked_rows_output_zeros(kind):
  """Example 1 has no valid key at all; causal with Lq > Lk leaves the first
  Lq - Lk queries of example 0 with none either: zeros, as the plain path,
  and NaN in padded keys never reaches the output."""
  relative = _relative(kind)
  q, k, v, _ = _qkv(21, 16)
  valid = _key_valid(16, [11, 0])
  k = k.at[0, :, 12].set(jnp.nan)
  v = v.at[0, :, 13].set(jnp.inf)
  out = compiled(lambda r: pa.pallas_attention(
      q, k, v, relative=r, causal=True, key_valid=valid, **BLOCKS), relative)
  want = compiled(lambda r: _plain(q, k, v, r, True, valid), relative)
  assert np.all(np.isfinite(out))
  np.testing.assert_allclose(out, want, atol=1e-5, rtol=1e-5)
  assert np.all(np.asarray(out[1]) == 0)
  assert np.all(np.asarray(out[0, :, :21 - 16]) == 0)


# Each causality and each kind once in the commit tier (each_choice).
# ALiBi's Triton backward beyond that: asymmetric bidirectional and
# symmetric with keys on both sides of the diagonal (causal, Lq < Lk) are
# test_alibi_far_blocks_forward_and_gradients_equal_plain's commit-tier
# corners, through the near, left-far and right-far blocks; symmetric
# ALiBi's forward is also in test_forward_equals_plain. Both symmetric
# cases here run with --extended.
@pytest.mark.parametrize('causal,kind', each_choice(product(
    [False, True], ['none', 'alibi', 't5', 'shaw', 'shaw_per_head'])) + [
        pytest.param(False, 'alibi_symmetric', marks=EXTENDED),
        pytest.param(True, 'alibi_symmetric', marks=EXTENDED)])
def test_gradients_equal_plain(kind, causal):
  """Gradients for q, k, v and the encoding's tables (T5's bias, Shaw's
  a^K and a^V, shared or per head), under jit."""
  relative = _relative(kind)
  q, k, v, g = _qkv(19, 19, seed=1)
  valid = _key_valid(19, [19, 12])

  got = _gradients(lambda q, k, v, r: pa.pallas_attention(
      q, k, v, relative=r, causal=causal, key_valid=valid, **BLOCKS),
      g, q, k, v, relative)
  want = _gradients(lambda q, k, v, r: _plain(q, k, v, r, causal, valid),
                    g, q, k, v, relative)
  got_leaves, want_leaves = jax.tree.leaves(got), jax.tree.leaves(want)
  tables = {'t5': 1, 'shaw': 2, 'shaw_per_head': 2}.get(kind, 0)
  assert len(got_leaves) == len(want_leaves) == 3 + tables
  for a, b in zip(got_leaves, want_leaves):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
  for table in got_leaves[3:]:
    assert float(jnp.abs(table).max()) > 0               # the tables learn


# Two cases in the commit tier, causal and not. Shaw's unmasked blocks (its
# table gradients included) run in
# test_gradients_with_key_lengths_equal_plain[False-shaw], whose blocks
# below the key length take the same unmasked loops.
@pytest.mark.parametrize('causal,kind', keep_in_commit_tier(
    product([False, True], ['none', 't5', 'shaw']),
    (False, 'none'), (True, 't5')))
def test_gradients_without_a_key_mask_equal_plain(kind, causal):
  """Without a key mask the kernels mask only the blocks that need it (the
  padded last key block in the forward and dQ; causal blocks crossing the
  diagonal): Lq != Lk, neither a multiple of the 8-blocks, so each loop has
  unmasked and masked blocks."""
  relative = _relative(kind)
  q, k, v, g = _qkv(21, 30, seed=2)

  got = _gradients(lambda q, k, v, r: pa.pallas_attention(
      q, k, v, relative=r, causal=causal, **BLOCKS), g, q, k, v, relative)
  want = _gradients(lambda q, k, v, r: _plain(q, k, v, r, causal, None),
                    g, q, k, v, relative)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


# Two cases in the commit tier: causal without an encoding (the key blocks
# bounded by both the diagonal and a row's length, over several blocks) and
# Shaw's not causal (its tables' gradients past a length). T5's unmasked
# blocks run in test_gradients_without_a_key_mask_equal_plain[True-t5].
@pytest.mark.parametrize('causal,kind', keep_in_commit_tier(
    product([False, True], ['none', 't5', 'shaw']),
    (True, 'none'), (False, 'shaw')))
def test_gradients_with_key_lengths_equal_plain(kind, causal):
  """Key lengths (a prefix mask, as valid_lens arrive): the kernels skip
  the key blocks past a row's length and mask only the block crossing it;
  one row's length is a multiple of the 8-blocks, the other's ends one key
  short of one (15: a dQ kernel reading one key past the length was off
  only there, in a mutation audit; 11 passed it)."""
  relative = _relative(kind)
  q, k, v, g = _qkv(21, 30, seed=3)
  lengths = jnp.array([16, 15])

  got = _gradients(lambda q, k, v, r: pa.pallas_attention(
      q, k, v, relative=r, causal=causal, key_lengths=lengths, **BLOCKS),
      g, q, k, v, relative)
  want = _gradients(lambda q, k, v, r: _plain(
      q, k, v, r, causal, _key_valid(30, lengths)), g, q, k, v, relative)
  for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize('kind', ['t5', 'shaw_per_head'])
def test_bfloat16_inputs(kind):
  """bf16 q, k, v against the float32 plain path: T5 causal, Shaw (its
  gathered rows and band in float32 from bf16 rows) not."""
  q, k, v, _ = _qkv(17, 17, dtype=jnp.bfloat16)
  relative = _relative(kind)
  causal = kind == 't5'
  out = compiled(lambda r: pa.pallas_attention(
      q, k, v, relative=r, causal=causal, **BLOCKS), relative)
  assert out.dtype == jnp.bfloat16
  want = compiled(lambda r: _plain(q.astype(jnp.float32),
                                   k.astype(jnp.float32),
                                   v.astype(jnp.float32), r, causal, None),
                  relative)
  np.testing.assert_allclose(out.astype(jnp.float32), want, atol=3e-2)


def _mha(name, impl, seed=0):
  rngs = nnx.Rngs(seed)
  relative = None
  if name != 'none':
    options = {'clip_distance': 3} if name == 'shaw' else {}
    if name == 't5':
      options = {'num_buckets': 8, 'max_distance': 12}
    kind, options = positions.get_position(name, options)
    relative = kind.build(num_heads=H, head_dim=D, max_len=64,
                          param_dtype=jnp.float32, rngs=nnx.Rngs(5),
                          **options)
  return attention.MultiHeadAttention(H * D, H, relative=relative,
                                      attention_impl=impl, rngs=rngs)


# The rotations in the commit tier (RoPE not causal, PoPE causal): only
# here do they reach the kernel, as the 'none' kernel after rotating q and
# k; MultiHeadAttention hands every encoding's module to pallas_attention
# alike. The others' kernel outputs and table gradients are checked
# directly: none in test_forward_equals_plain[False-none] and
# test_gradients_with_key_lengths_equal_plain[True-none]; ALiBi in
# test_gradients_equal_plain[True-alibi] and, through MultiHeadAttention,
# test_multihead_attention_key_mask; T5 in test_gradients_equal_plain[False-t5]
# and test_gradients_without_a_key_mask_equal_plain[True-t5]; Shaw in
# test_gradients_equal_plain[True-shaw] and
# test_gradients_with_key_lengths_equal_plain[False-shaw].
@pytest.mark.parametrize('causal,name', keep_in_commit_tier(
    product([False, True], ['none', 'alibi', 't5', 'shaw', 'rope', 'pope']),
    (False, 'rope'), (True, 'pope')))
def test_multihead_attention_pallas_equals_plain(name, causal, monkeypatch):
  """End to end with valid_lens: outputs and every parameter's gradient
  (the projections and, for T5, Shaw and PoPE, the encoding's own) agree, and
  the kernel is really called."""
  calls = []
  real = pa.pallas_attention
  monkeypatch.setattr(pa, 'pallas_attention',
                      lambda *a, **kw: calls.append(1) or real(*a, **kw))
  x = jax.random.normal(jax.random.key(7), (B, 13, H * D))
  valid_lens = jnp.array([13, 9])
  models = {impl: _mha(name, impl) for impl in ('plain', 'pallas')}

  def loss(model):
    out = model(x, valid_lens=valid_lens, causal=causal)
    return jnp.sum(out ** 2), out

  # One compiled program per model: its outputs and gradients.
  grad = nnx.jit(nnx.grad(loss, has_aux=True))
  grads, outs = {}, {}
  for impl, m in models.items():
    grads[impl], outs[impl] = grad(m)
  assert calls
  np.testing.assert_allclose(outs['pallas'], outs['plain'],
                             atol=1e-5, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(grads['pallas']),
                  jax.tree.leaves(grads['plain'])):
    np.testing.assert_allclose(a, b, atol=5e-5, rtol=1e-4)


def test_multihead_attention_key_mask(monkeypatch):
  """A (B, 1, 1, Lk) boolean mask is key padding: the kernel takes it (as
  key_valid; equal outputs alone would also pass on the plain fallback)."""
  seen = []
  real = pa.pallas_attention
  monkeypatch.setattr(pa, 'pallas_attention', lambda *a, **kw: seen.append(
      (kw.get('key_valid'), kw.get('key_lengths'))) or real(*a, **kw))
  x = jax.random.normal(jax.random.key(8), (B, 11, H * D))
  mask = (jnp.arange(11)[None] < jnp.array([[11], [6]]))[:, None, None, :]
  # Eager, so that the mask the kernel gets is concrete.
  eager = _mha('alibi', 'pallas')(x, mask=mask)
  assert len(seen) == 1 and seen[0][1] is None
  np.testing.assert_array_equal(seen[0][0], [[True] * 11,
                                             [True] * 6 + [False] * 5])
  want = compiled(lambda m: m(x, mask=mask), _mha('alibi', 'plain'))
  np.testing.assert_allclose(eager, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize('case', ['huang', 'xl', 'bias', 'query_mask',
                                  'positions'])
def test_multihead_attention_falls_back_to_plain(case, monkeypatch):
  """Unsupported encodings, a float bias, a per-query mask or explicit
  positions take the plain path (the kernel is never called) and give its
  outputs."""
  def fail(*args, **kwargs):
    raise AssertionError('pallas_attention should not run')
  monkeypatch.setattr(pa, 'pallas_attention', fail)
  name = case if case in ('huang', 'xl') else 't5'
  x = jax.random.normal(jax.random.key(9), (B, 10, H * D))
  kwargs = {}
  if case == 'bias':
    kwargs['bias'] = jax.random.normal(jax.random.key(1), (1, H, 10, 10))
  if case == 'query_mask':
    kwargs['mask'] = jnp.tril(jnp.ones((10, 10), bool))[None, None]
  if case == 'positions':
    kwargs['positions'] = jnp.broadcast_to(jnp.arange(10) * 2, (B, 10))
  got = compiled(lambda m: m(x, **kwargs), _mha(name, 'pallas'))
  want = compiled(lambda m: m(x, **kwargs), _mha(name, 'plain'))
  np.testing.assert_allclose(got, want, atol=1e-6, rtol=1e-6)


def test_supports_and_errors():
  assert pa.supports(None) and pa.supports(positions.ALiBi(H))
  assert pa.supports(positions.RotaryEncoding(D))
  assert pa.supports(_relative('shaw')) and pa.supports(_relative('t5'))
  huang = positions.HuangRelative(H, D, max_len=16, rngs=nnx.Rngs(0))
  assert not pa.supports(huang)
  # A subclass may change the term anywhere, here a private helper that
  # the kernels' own copy of Shaw's bucketing would not see: plain path.

  class LogShaw(positions.ShawRelative):
    def _bucket(self, q_pos, k_pos, lq, lk):
      return super()._bucket(q_pos // 2, k_pos // 2, lq, lk)

  assert not pa.supports(LogShaw(H, D, clip_distance=4, rngs=nnx.Rngs(0)))
  q, k, v, _ = _qkv(8, 8)
  with pytest.raises(ValueError, match='HuangRelative'):
    pa.pallas_attention(q, k, v, relative=huang)
  with pytest.raises(ValueError, match='key_valid'):
    pa.pallas_attention(q, k, v, key_valid=jnp.ones((B, 7), bool))
  launch = pa.TritonLaunch(num_warps=4, num_stages=2)
  with pytest.raises(ValueError, match=r'triton\.dq\.num_warps=3; choose one '
                     r'of \(1, 2, 4, 8, 16\)'):
    pa.pallas_attention(q, k, v, triton=pa.TritonTuning(
        launch, pa.TritonLaunch(3, 2), launch))
  with pytest.raises(ValueError, match=r'triton\.dkdv\.num_stages=0'):
    pa.pallas_attention(q, k, v, triton=pa.TritonTuning(
        launch, launch, pa.TritonLaunch(4, 0)))
  with pytest.raises(ValueError, match=r'triton\.forward=\(8,\); give a '
                     r'TritonLaunch'):
    pa.pallas_attention(q, k, v, triton=pa.TritonTuning(forward=(8,)))
  with pytest.raises(ValueError, match=r'triton\.dq\.num_stages=2\.5; must '
                     r'be an integer'):
    pa.pallas_attention(q, k, v, triton=pa.TritonTuning(dq=(4, 2.5)))
  assert 'pallas' in attention.IMPLEMENTATIONS


def test_a_table_for_other_heads_is_refused_like_the_plain_path():
  """A Shaw table half the heads' width was zero-padded into the kernels'
  layout and gave a number (a probe): refused now, with the plain path's
  message; so are other head counts and a rotation for another width."""
  q, k, v, _ = _qkv(8, 8)
  for relative in (positions.ShawRelative(H, D // 2, rngs=nnx.Rngs(0)),
                   positions.ShawRelative(H + 1, D, shared_heads=False,
                                          rngs=nnx.Rngs(0)),
                   positions.T5RelativeBias(H + 1, rngs=nnx.Rngs(0)),
                   positions.PolarEncoding(H, 2 * D, rngs=nnx.Rngs(0))):
    for path in (lambda r: pa.pallas_attention(q, k, v, relative=r, **BLOCKS),
                 lambda r: attention.dot_product_attention(q, k, v,
                                                           relative=r)):
      with pytest.raises(ValueError, match=rf'relative={type(relative).__name__}'
                         rf' was built for .*; this attention has {H} heads '
                         rf'of width {D}'):
        path(relative)


@pytest.mark.parametrize('b,lq,lk', [(0, 8, 8), (B, 0, 8), (B, 8, 0)])
def test_an_empty_axis_gives_the_shape_and_zeros(b, lq, lk):
  """Nothing to launch: the kernels raised a slice error (Triton) or a
  division by zero (Hopper), and the plain path's causal mask a max over
  no keys. Both return the shape now, zeros where a query has no key (and
  so zero gradients)."""
  q, k, v, _ = _qkv(lq, lk)
  q, k, v = q[:b], k[:b], v[:b]
  zeros = np.zeros((b, H, lq, D), np.float32)
  got = pa.pallas_attention(q, k, v, relative=_relative('shaw'), causal=True,
                            **BLOCKS)
  np.testing.assert_array_equal(got, zeros)
  plain, _ = attention.dot_product_attention(q, k, v, causal=True)
  np.testing.assert_array_equal(plain, zeros)
  grads = jax.grad(lambda q: pa.pallas_attention(
      q, k, v, relative=_relative('shaw'), **BLOCKS).sum())(q)
  assert grads.shape == q.shape and not np.any(grads)


def _equations(jaxpr):
  """Every equation of a jaxpr and of all its sub-jaxprs (the kernels'
  bodies included)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _equations(sub)


def _shapes(jaxpr):
  """Every variable's shape in a jaxpr and all its sub-jaxprs."""
  for eqn in _equations(jaxpr):
    for var in list(eqn.invars) + list(eqn.outvars):
      shape = getattr(getattr(var, 'aval', None), 'shape', None)
      if shape is not None:
        yield eqn.primitive.name, shape


@pytest.mark.parametrize('kind', ['none', 't5', 'shaw'])
def test_no_quadratic_array(kind):
  """No array with two axes of length >= L, in the forward or in the
  forward + backward, anywhere (outside or inside the kernels, for every
  platform's branch): the largest score tile is one 32 x 32 block. L = 200
  is above the TPU layout's 128 lanes of per-row statistics."""
  length = 200
  relative = _relative(kind)
  q, k, v, g = _qkv(length, length)
  valid = _key_valid(length, [length, 150])

  def forward(q, k, v):
    return pa.pallas_attention(q, k, v, relative=relative, causal=True,
                               key_valid=valid, block_q=32, block_k=32)

  def both(q, k, v):
    return jax.grad(lambda *a: jnp.sum(forward(*a) * g), argnums=(0, 1, 2))(
        q, k, v)

  for fn in (forward, both):
    closed = jax.make_jaxpr(fn)(q, k, v)
    seen = list(_shapes(closed.jaxpr))
    assert any(name == 'pallas_call' for name, _ in seen)
    big = [(name, s) for name, s in seen
           if sum(dim >= length for dim in s) >= 2]
    assert not big, big


def _forward_operands(relative, lq, lk):
  """How many operands the forward pallas_call takes (the terms' tables
  among them), read from the jaxpr."""
  q, k, v, _ = _qkv(lq, lk)
  jaxpr = jax.make_jaxpr(lambda q, k, v: pa.pallas_attention(
      q, k, v, relative=relative, interpret=True, **BLOCKS))(q, k, v)
  counts = [len(e.invars) for e in _equations(jaxpr.jaxpr)
            if e.primitive.name == 'pallas_call'
            and 'selfattn_flash_forward' in str(e.params.get(
                'name_and_src_info', e.params.get('name')))]
  assert len(counts) == 1, counts
  return counts[0]


# The commit tier runs T5 and per-head Shaw causal (Lq < Lk); the extended
# tier adds T5 bidirectional with Lq > Lk, shared Shaw bidirectional and
# keys-only Shaw with a mask that is not a prefix.
@pytest.mark.parametrize('kind,causal', keep_in_commit_tier(
    [('t5', True), ('shaw_per_head', True), ('t5', False), ('shaw', False),
     ('shaw_keys', False)], ('t5', True), ('shaw_per_head', True)))
def test_selected_terms_equal_plain(kind, causal):
  """The per-bucket select form of T5's and Shaw's terms, which Mosaic TPU
  runs (Triton and interpret mode gather them by default,
  pallas_kernels.Gathered), on the CPU: far and near blocks, key padding,
  outputs and gradients. The gathered form has one more operand (T5's
  per-offset table, Shaw's q a^K^T rows), so the two forms differ."""
  relative = {'t5': lambda: _relative('t5'),
              'shaw_per_head': lambda: _shaw(2),
              'shaw': lambda: _shaw(2, per_head=False),
              'shaw_keys': lambda: _shaw(2, values=False)}[kind]()
  gathered = _forward_operands(relative, 24, 24)
  with pa.selected_terms():
    assert _forward_operands(relative, 24, 24) == gathered - 1
    if kind == 't5':
      lq, lk = (48, 72) if causal else (72, 48)
      _kernel_and_plain_agree(relative, lq, lk, [lk, 30], causal, seed=4)
    elif kind == 'shaw_keys':
      valid = jnp.asarray([[i % 3 != 1 for i in range(56)], [True] * 56])
      _kernel_and_plain_agree(relative, 40, 56, None, causal, seed=3,
                              valid=valid)
    else:
      _kernel_and_plain_agree(relative, 40, 56, [56, 37], causal, seed=3)
    if kind == 't5' and causal:
      # block_q != block_k: near_sides (forward, dQ) and near_query_sides
      # (dK/dV) with unequal blocks, where swapping the two fails.
      _kernel_and_plain_agree(relative, 40, 56, [56, 37], False, seed=5,
                              blocks=dict(block_q=8, block_k=16))

"""What a GPU or a TPU would run, lowered from this CPU (issue 32).

`jax.jit(f).trace(*args).lower(lowering_platforms=(p,))` builds the StableHLO
module for platform p without a device, and Pallas lowers its kernels in
Python at that point: to Triton for 'cuda' (a `__gpu$xla.gpu.triton` custom
call holding the kernel's Triton IR) and to Mosaic for 'tpu' (a
`tpu_custom_call`). Block-shape, power-of-two, layout and unsupported-op
errors therefore surface here, on every commit. Nothing is compiled:
Triton's PTX stage, XLA's GPU passes and libtpu's Mosaic passes run only on
a device (BENCHMARKS.md, GPU section, says what the lent GPU checked).

`selfattn.nn.lowering.lowered_text` lowers inside an abstract H100 for 'cuda'
(JAX 0.11 and later ask which GPU a Pallas kernel is for). Each platform is
lowered on its own: Pallas refuses a module lowered for
several platforms at once when a kernel names its backend's compiler
parameters (the Triton branch would be lowered for 'tpu' too).

The (L, L) checks read the module's tensor types: a path that promises O(L)
memory must hold no tensor with two axes of length L, and the plain path,
which materializes the weights, must hold one (so the check can fail).
"""

from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx

from selfattn.nn import attention
from selfattn.nn.lowering import lowered_text
from selfattn.nn import pallas_attention as pa
from selfattn.nn import positions
from selfattn.training import steps
from selfattn import tasks as tasks_lib
from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.encoder import TransformerEncoder
from selfattn.nn.models import LanguageModel
from selfattn.nn.models import SequenceModel
from tiers import EXTENDED
from tiers import each_choice
from tiers import product

PLATFORMS = ('cuda', 'tpu')
KERNEL_CALL = {'cuda': '@__gpu$xla.gpu.triton', 'tpu': '@tpu_custom_call'}
CUDNN_CALL = '__cudnn$fmha'
# One block, the longest of the powers of two (8k), and one length
# that is not a multiple of the 128-row blocks. The lengths in between
# (512, 2048) lowered the same kernels with other grid sizes and loop
# bounds: nothing in a kernel's structure depends on L once it has several
# blocks (the Hopper block table is per pass and mask, not per length).
LENGTHS = (128, 8192, 1000)
HEADS, HEAD_DIM = 2, 64
# Encodings whose relative term the kernel computes; the others fall back to
# the plain path (MultiHeadAttention's attention_impl paragraph).
KERNEL_POSITIONS = ('none', 'sinusoidal', 'learned', 'shaw', 'rope', 'pope',
                    'alibi', 't5')
# Paths that promise no (L, L) array; at STEP_LENGTH 'auto' is chunked.
LINEAR_MEMORY = ('chunked', 'auto')
STEP_LENGTH = 1040           # >= AUTO_CHUNKED_FROM and not a block multiple
assert STEP_LENGTH >= attention.AUTO_CHUNKED_FROM and STEP_LENGTH % 128


@pytest.fixture(autouse=True)
def _hopper_in_auto():
  """'auto' as it will be once the Hopper kernels have run on a GPU
  (pallas_attention.AUTO_TAKES_HOPPER): the abstract H100 then lowers
  them wherever they apply, and Triton elsewhere (the kernel test's
  key_valid call lowers Triton for every encoding at every length)."""
  with pa.hopper_in_auto():
    yield


def _square(text: str, length: int) -> bool:
  """Whether some tensor type in the module has two axes of `length`."""
  return re.search(rf'[<x]{length}x{length}x', text) is not None




# --------------------------------------------------------------------------
# The kernel alone, forward and gradient, at every length.
# --------------------------------------------------------------------------

# Shaw's k in the lowering tests: the near blocks' folds unroll 2k + 1 ways
# (their selects are a loop, hopper_attention.table_term), and Mosaic GPU's
# layout inference grows with them: the Hopper forward and backward of one
# call took 8 s to lower at k = 4 and 12 s at the default k = 16 here
# (2026-11-28). The grids and blocks do not depend on k. Shared memory does
# ((2k + 1) rows of q a^K and dO a^V per block), and Mosaic GPU checks it
# when it lowers, so the kernel test lowers the default k once per
# platform: for cuda at the longest length, for tpu at the odd one
# (DEFAULT_CLIP_AT).
KERNEL_TEST_CLIP = 4
DEFAULT_CLIP_AT = {'cuda': max(LENGTHS), 'tpu': LENGTHS[-1]}   # tpu: the odd one
# Kinds whose Hopper kernels carry a table (T5's buckets, Shaw's rows): at
# 128 they are one near block, the same code as the near blocks at 1000
# and 8192, so there the call lowers the Triton kernels only.
TABLE_KINDS = ('t5', 'shaw', 'shaw_per_head_keys_only')


def _kernel_relative(kind: str, length: int, platform: str):
  rngs = nnx.Rngs(0)
  clip = 16 if length == DEFAULT_CLIP_AT[platform] else KERNEL_TEST_CLIP
  return {
      'none': lambda: None,
      'alibi': lambda: positions.ALiBi(HEADS),
      'alibi_symmetric': lambda: positions.ALiBi(HEADS, symmetric=True),
      't5': lambda: positions.T5RelativeBias(HEADS, rngs=rngs),
      'shaw': lambda: positions.ShawRelative(
          HEADS, HEAD_DIM, clip_distance=clip, rngs=rngs),
      'shaw_per_head_keys_only': lambda: positions.ShawRelative(
          HEADS, HEAD_DIM, clip_distance=KERNEL_TEST_CLIP,
          relative_values=False, shared_heads=False, rngs=rngs),
      'rope': lambda: positions.RotaryEncoding(HEAD_DIM),
  }[kind]()


KERNEL_KINDS = ('none', 'alibi', 'alibi_symmetric', 't5', 'shaw',
                'shaw_per_head_keys_only', 'rope')
# What the Hopper kernels compute in bf16 (rope: rotated first): all three
# kernels of an attention call (Shaw's where its table rows fit in shared
# memory, as at HEAD_DIM = 64 and k = 16; test_hopper_attention.py lowers
# wider heads).
HOPPER_KINDS = ('none', 'alibi', 'alibi_symmetric', 'rope', 't5', 'shaw',
                'shaw_per_head_keys_only')
HOPPER_CALL = '@mosaic_gpu_v2'
# Model positions whose attention those kernels compute (the additive ones
# leave 'none' to the attention).
HOPPER_POSITIONS = ('none', 'sinusoidal', 'learned', 'rope', 'pope', 'alibi',
                    't5', 'shaw')


# The TPU kernels (Mosaic TPU) are lowered at one block and at the odd
# length, which already has several blocks, far and near ones, and a
# padded last block; at 8k they differ only in grid size and loop bounds
# (LENGTHS' comment), and Mosaic TPU checks no memory budget when it
# lowers (libtpu does, on a device).
KERNEL_CASES = [(platform, kind, length)
                for platform in PLATFORMS for kind in KERNEL_KINDS
                for length in LENGTHS
                if not (platform == 'tpu' and length == max(LENGTHS))]


# cuda: every kind at every length in the commit tier (issue 47's check);
# tpu: each kind and each length once (the Mosaic TPU lowering has no
# Hopper variant and no memory check here), every case with --extended.
KERNEL_PARAMS = ([case for case in KERNEL_CASES if case[0] == 'cuda']
                 + each_choice([case for case in KERNEL_CASES
                                if case[0] == 'tpu']))


@pytest.mark.parametrize('platform,kind,length', KERNEL_PARAMS)
def test_kernel_lowers_forward_and_gradient(platform, kind, length):
  """pallas_attention, causal with a key mask and bidirectional with key
  lengths, value and gradients (q, k, v and the encoding's table), lowers
  for the platform with the kernels in it and no (L, L) tensor. On the
  abstract H100 a call the Hopper kernels compute (key lengths; none,
  ALiBi, T5, Shaw, rotations) is three Mosaic GPU kernels (forward, dQ,
  dK/dV), the rest Triton (a key mask; TABLE_KINDS at 128). (Causal
  Hopper steps: the decoder's training steps below.)"""
  relative = _kernel_relative(kind, length, platform)
  graphdef, tables = nnx.split(relative) if relative is not None else (None, None)
  shape = jax.ShapeDtypeStruct((1, HEADS, length, HEAD_DIM), jnp.bfloat16)
  valid = jax.ShapeDtypeStruct((1, length), jnp.bool_)
  lengths = jax.ShapeDtypeStruct((1,), jnp.int32)

  def loss(tables, q, k, v, valid, lengths):
    rel = None if graphdef is None else nnx.merge(graphdef, tables)
    masked = pa.pallas_attention(q, k, v, relative=rel, causal=True,
                                 key_valid=valid)
    padded = pa.pallas_attention(q, k, v, relative=rel, key_lengths=lengths)
    return sum(jnp.sum(x.astype(jnp.float32)) for x in (masked, padded))

  fn = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))
  on_hopper = (platform == 'cuda' and kind in HOPPER_KINDS
               and not (length == 128 and kind in TABLE_KINDS))
  with pa.hopper_in_auto(on_hopper):
    text = lowered_text(fn, tables, shape, shape, shape, valid, lengths,
                        platform=platform)
  # Two calls, each a forward, a dQ and a dK/dV kernel.
  hopper = 3 if on_hopper else 0
  assert text.count(KERNEL_CALL[platform]) == 6 - hopper
  assert text.count(HOPPER_CALL) == hopper
  if platform == 'cuda':
    # Pallas lowers exp to libdevice's range-reduced __nv_expf: the Triton
    # kernels hold their scores in base 2 and call only __nv_exp2f.
    assert '__nv_exp2f' in text and '__nv_expf' not in text
  if length > pa.BLOCK_K:      # at 128 the backward's one block is (L, L)
    assert not _square(text, length)


# --------------------------------------------------------------------------
# Training steps: every attention_impl x every encoding, encoder and decoder.
# --------------------------------------------------------------------------

def _model(kind: str, position: str, impl: str, length: int, *,
           num_layers: int = 1, scan_layers: bool = False,
           remat: bool = False, **position_options):
  """A bfloat16 model: 'encoder' (bidirectional, key padding from
  valid_lens, a linear head) or 'decoder' (causal TransformerDecoder)."""
  stack = dict(position=position, max_len=length, attention_impl=impl,
               dtype=jnp.bfloat16, remat=remat, scan_layers=scan_layers,
               rngs=nnx.Rngs(0), **position_options)
  sizes = (32, HEADS * HEAD_DIM, 2 * HEADS * HEAD_DIM, HEADS, num_layers, 0.0)
  if kind == 'decoder':
    return LanguageModel(TransformerDecoder(*sizes, **stack), 30)
  return SequenceModel(TransformerEncoder(*sizes, **stack), 30,
                       rngs=nnx.Rngs(1))


def _abstract(tree):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _lowered_train_step(model, length: int, platform: str) -> str:
  """steps.train_step (forward, backward, AdamW update) of `model` on a
  (2, length) batch, lowered for `platform`."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adamw(1e-3)
  state = _abstract({'step': jnp.zeros((), jnp.int32), 'params': params,
                     'opt_state': tx.init(params)})
  tokens = jax.ShapeDtypeStruct((2, length), jnp.int32)
  batch = tasks_lib.Batch(tokens, tokens,
                          jax.ShapeDtypeStruct((2, length), jnp.float32),
                          jax.ShapeDtypeStruct((2,), jnp.int32))
  step = functools.partial(steps.train_step, graphdef=graphdef, rest=rest,
                           tx=tx, schedule=optax.constant_schedule(1e-3),
                           dropout_key=jax.random.key(0))
  return lowered_text(step, state, batch, platform=platform)


def _check_step(text: str, impl: str, position: str, length: int,
                platform: str, hopper_in_auto: bool = True) -> None:
  hopper = text.count(HOPPER_CALL)
  kernel = text.count(KERNEL_CALL[platform]) + hopper
  if impl == 'pallas' and position in KERNEL_POSITIONS:
    assert kernel >= 1 and not _square(text, length)
    # bf16 with valid_lens or causal: the Hopper kernels (forward, dQ,
    # dK/dV) for the encodings they compute, on the abstract H100.
    on_hopper = (hopper_in_auto and platform == 'cuda'
                 and position in HOPPER_POSITIONS)
    assert (hopper >= 3) == on_hopper
  elif impl in LINEAR_MEMORY:
    assert kernel == 0 and not _square(text, length)
  else:
    # plain; fused, which is XLA's attention on a host that cannot trace
    # cuDNN (test_fused_step_holds_cudnn_lowered_for_cuda); pallas's
    # fallback for huang and xl: each materializes the weights.
    assert kernel == 0 and _square(text, length)


# (impl, platform, positions): only the kernels route per platform, so they
# are lowered for both; 'auto' at STEP_LENGTH is the chunked path whatever
# the platform, and plain, fused and chunked trace the same StableHLO for
# either (from a CPU host, fused is XLA's attention for 'cuda' too:
# test_fused_step_holds_cudnn_lowered_for_cuda), so once. The O(L) paths
# (chunked, auto) and the kernel hold their promise per encoding; plain and
# fused, which materialize the weights whatever the encoding, are checked
# on the four kinds of term (none, a rotation, a bias, Shaw's, which fused
# leaves to plain).
MATERIALIZING_POSITIONS = ('none', 'rope', 't5', 'shaw')
STEP_CASES = [(impl, platform, position)
              for impl in attention.IMPLEMENTATIONS
              for platform in (PLATFORMS if impl == 'pallas' else ('cuda',))
              for position in (positions.POSITION_NAMES
                               if impl in ('pallas',) + LINEAR_MEMORY
                               else MATERIALIZING_POSITIONS)]


# The extended tier's cases (tiers.py): 'auto' at STEP_LENGTH is the
# chunked path, lowered here for every encoding, so the commit tier checks
# its choice on two (none and Shaw's terms); the kernel's steps for
# encodings whose attention call repeats another's: the additive tables
# (sinusoidal, learned) reach it as 'none' does, and XL falls back to the
# plain path as Huang does; the kernel's steps for tpu but Shaw's (the
# model around the kernel is the same for both platforms, checked per
# encoding on cuda, and each TPU kernel is lowered by
# test_kernel_lowers_forward_and_gradient); and the plain path's steps but
# 'none' (it materializes the weights whatever the encoding; fused keeps
# its four, as it treats them differently).
AUTO_IN_COMMIT_TIER = ('none', 'shaw')
PALLAS_REPEATS = ('sinusoidal', 'learned', 'xl')


def _extended_step(impl: str, platform: str, position: str) -> bool:
  if impl == 'auto':
    return position not in AUTO_IN_COMMIT_TIER
  if impl == 'plain':
    return position != 'none'
  return impl == 'pallas' and (position in PALLAS_REPEATS
                               or (platform == 'tpu' and position != 'shaw'))


STEP_PARAMS = [
    pytest.param(*case, marks=EXTENDED)
    if _extended_step(*case) else case for case in STEP_CASES]


@pytest.mark.parametrize('impl,platform,position', STEP_PARAMS)
def test_training_steps_lower(platform, impl, position):
  """The encoder's and the causal decoder's training step, for each
  attention_impl and encoding, hold the kernel where the path promises it
  and an (L, L) tensor only where the path materializes the weights."""
  options = dict(clip_distance=KERNEL_TEST_CLIP) if position == 'shaw' else {}
  for kind in ('encoder', 'decoder'):
    model = _model(kind, position, impl, STEP_LENGTH, **options)
    text = _lowered_train_step(model, STEP_LENGTH, platform)
    _check_step(text, impl, position, STEP_LENGTH, platform)


# Extended (tiers.py), both platforms: in the commit tier
# test_training_steps_lower[pallas-cuda-shaw] and [pallas-cuda-t5] check the
# same encoder and decoder steps for any (L, L) tensor at STEP_LENGTH, the
# kernel test lowers Shaw's (default k = 16) and T5's kernels at 8192, and
# test_scanned_and_rematerialized_steps_lower[scan_layers-pallas-cuda]
# holds the Triton kernels in a whole cuda step; nothing in the model or in
# pallas_attention branches on L past STEP_LENGTH (the one length switch,
# AUTO_CHUNKED_FROM, is 'auto''s). The TPU kernels at 8k differ from their
# lowering at 1000 only in grid size and loop bounds (KERNEL_CASES' comment).
@EXTENDED
@pytest.mark.parametrize('platform', PLATFORMS)
def test_pallas_training_steps_lower_at_the_longest_length(platform):
  """The table-carrying encodings (Shaw, T5) through the Pallas kernel, in
  the encoder and the decoder, at 8k: no (L, L) tensor anywhere in the step
  at the longest length (test_training_steps_lower checks every encoding at
  STEP_LENGTH; the kernel tests every length). On cuda the Triton kernels,
  'auto''s choice today: the Hopper ones are lowered at 8k by the kernel
  test, and in a whole step at STEP_LENGTH (their Shaw backward at the
  default k = 16 costs a minute more to lower here)."""
  length = max(LENGTHS)
  with pa.hopper_in_auto(False):
    for position in ('shaw', 't5'):
      for kind in ('encoder', 'decoder'):
        model = _model(kind, position, 'pallas', length)
        text = _lowered_train_step(model, length, platform)
        assert text.count(KERNEL_CALL[platform]) >= 1
        assert not _square(text, length)


# Every pair of (layers, path, platform) in the commit tier (4 of the 8
# cases), every case with --extended (tiers.py).
@pytest.mark.parametrize('layers,impl,platform', each_choice(product(
    ('scan_layers', 'remat'), ('pallas', 'chunked'), PLATFORMS), strength=2))
def test_scanned_and_rematerialized_steps_lower(platform, impl, layers):
  """nnx.scan over two layers, or nnx.remat per layer, around the kernel
  or the chunked path: still the kernel, still no (L, L) tensor. Scan and
  remat act on pallas_attention's custom VJP, which the Triton and Hopper
  kernels share, so on cuda the Triton kernels, cheaper to lower, stand
  for both (the Hopper ones, Shaw's included, are lowered in whole steps
  above)."""
  for kind in ('encoder', 'decoder'):
    model = _model(kind, 'shaw', impl, STEP_LENGTH, num_layers=2,
                   scan_layers=layers == 'scan_layers',
                   remat=layers == 'remat', clip_distance=KERNEL_TEST_CLIP)
    with pa.hopper_in_auto(False):
      text = _lowered_train_step(model, STEP_LENGTH, platform)
    _check_step(text, impl, 'shaw', STEP_LENGTH, platform,
                hopper_in_auto=False)


@pytest.mark.parametrize('platform', PLATFORMS)
@pytest.mark.parametrize('impl', attention.IMPLEMENTATIONS)
def test_cached_decode_step_lowers(platform, impl):
  """One decode=True step of a causal decoder against a key/value cache of
  STEP_LENGTH positions: one query against the cache, so an (L, L) tensor
  never appears whatever the path (decode steps take the plain path)."""
  model = _model('decoder', 'rope', impl, STEP_LENGTH)
  model.stack.init_cache(2, STEP_LENGTH)
  graphdef, state = nnx.split(model)

  def decode(state, token):
    m = nnx.merge(graphdef, state)
    logits = m(token, decode=True)
    return logits, nnx.state(m)

  token = jax.ShapeDtypeStruct((2, 1), jnp.int32)
  text = lowered_text(decode, _abstract(state), token, platform=platform)
  assert not _square(text, STEP_LENGTH)
  assert f'2x{HEADS}x{STEP_LENGTH}x{HEAD_DIM}xbf16' in text   # the cache


@pytest.mark.parametrize('platform', PLATFORMS)
def test_translation_step_lowers_with_cross_attention_on_the_kernels(
    platform):
  """An encoder-decoder (translation): the source lengths reach the
  decoder's cross-attention as lengths, so on the abstract H100 every
  attention call (the encoder's, the causal decoder's, the cross) lowers to
  the Hopper kernels and none to Triton; on a TPU, to Mosaic TPU. No
  (Lq, Lk) array of scores in either. Without an encoding: the claim is
  the cross-attention's, which takes none (T5's kernels, about 2.5 s more
  to lower per call, are in test_training_steps_lower[pallas-cuda-t5])."""
  from selfattn.nn.models import Seq2SeqModel
  src_len, tgt_len = 320, 192   # neither a model width (128, 256)
  stack = dict(position='none', max_len=src_len, attention_impl='pallas',
               dtype=jnp.bfloat16, rngs=nnx.Rngs(0))
  sizes = (32, HEADS * HEAD_DIM, 2 * HEADS * HEAD_DIM, HEADS, 1, 0.0)
  model = Seq2SeqModel(TransformerEncoder(*sizes, **stack),
                       TransformerDecoder(*sizes, cross_attention=True,
                                          **stack))
  graphdef, state = nnx.split(model)

  def loss(state, sources, lens, targets):
    logits = nnx.merge(graphdef, state)(sources, lens,
                                        decoder_inputs=targets)
    return logits.astype(jnp.float32).sum()

  text = lowered_text(jax.grad(loss), _abstract(state),
                      jax.ShapeDtypeStruct((2, src_len), jnp.int32),
                      jax.ShapeDtypeStruct((2,), jnp.int32),
                      jax.ShapeDtypeStruct((2, tgt_len), jnp.int32),
                      platform=platform)
  if platform == 'cuda':
    assert text.count(HOPPER_CALL) >= 9 and KERNEL_CALL['cuda'] not in text
  else:
    assert text.count(KERNEL_CALL['tpu']) >= 9
  for lq, lk in ((src_len, src_len), (tgt_len, tgt_len), (tgt_len, src_len)):
    assert not re.search(rf'[<x]{lq}x{lk}x', text), (lq, lk)


@pytest.mark.skipif(
    not attention.cudnn_traceable(),
    reason='needs a CUDA device: jax.nn traces cuDNN attention only where it '
           "can read cuDNN's version and the GPU's compute capability, so "
           "from a CPU host the fused path lowers XLA's attention for 'cuda'")
def test_fused_step_holds_cudnn_lowered_for_cuda():
  """On a GPU host: the fused path's step lowered for 'cuda' holds cuDNN's
  fused kernel, causal (decoder) and padded (encoder)."""
  for kind in ('encoder', 'decoder'):
    model = _model(kind, 'rope', 'fused', 1024)
    assert CUDNN_CALL in _lowered_train_step(model, 1024, 'cuda')


@pytest.mark.skipif(jax.default_backend() == 'gpu',
                    reason='a GPU host answers for itself')
def test_gpu_lowering_without_a_gpu_needs_the_abstract_target():
  """From JAX 0.11 on, a Pallas GPU kernel lowered on a host without a GPU
  asks which GPU it is for: refused outside selfattn.nn.lowering's abstract
  H100, lowered inside it (so the helper every test here uses is needed,
  and sufficient). The Triton kernel's question; the Hopper kernel's
  Mosaic GPU lowering asks none (test_hopper_attention.py)."""
  shape = jax.ShapeDtypeStruct((1, HEADS, 128, HEAD_DIM), jnp.bfloat16)
  attend = lambda q, k, v: pa.pallas_attention(q, k, v, gpu_kernel='triton')
  with pytest.raises(RuntimeError, match='abstract GPU device'):
    jax.jit(attend).trace(shape, shape, shape).lower(
        lowering_platforms=('cuda',))
  assert KERNEL_CALL['cuda'] in lowered_text(attend, shape, shape, shape,
                                             platform='cuda')


def _launches(text: str) -> dict[str, tuple[int, int]]:
  """{kernel name: (num_warps, num_stages)} of the Triton custom calls."""
  found = re.findall(r'name = "(selfattn_flash_\w+)", num_stages = (\d+) : '
                     r'i32, num_warps = (\d+) : i32', text)
  return {name: (int(warps), int(stages)) for name, stages, warps in found}


def test_each_triton_kernel_launches_with_its_own_warps_and_stages():
  """The three Triton kernels take their launch parameters per pass
  (pa.TritonTuning): a call that names none gets the default rule (4 warps
  for heads up to 64 wide, 8 above; 2 stages) on all three; named ones
  reach the lowered module kernel by kernel, and a field left None keeps
  the rule."""
  def lowered(width, triton):
    shape = jax.ShapeDtypeStruct((1, HEADS, 256, width), jnp.bfloat16)
    loss = lambda q, k, v: jnp.sum(pa.pallas_attention(
        q, k, v, gpu_kernel='triton', triton=triton).astype(jnp.float32))
    return _launches(lowered_text(jax.grad(loss, argnums=(0, 1, 2)),
                                  shape, shape, shape, platform='cuda'))

  names = ('selfattn_flash_forward', 'selfattn_flash_dq',
           'selfattn_flash_dkdv')
  assert lowered(64, None) == {name: (4, 2) for name in names}
  tuning = pa.TritonTuning(forward=pa.TritonLaunch(8, 3),
                           dq=pa.TritonLaunch(2, 1),
                           dkdv=pa.TritonLaunch(16, 4))
  assert lowered(64, tuning) == dict(zip(names, [(8, 3), (2, 1), (16, 4)]))
  only_dq = pa.TritonTuning(dq=pa.TritonLaunch(2, 1))
  assert lowered(128, only_dq) == dict(zip(names, [(8, 2), (2, 1), (8, 2)]))

"""cuDNN's route for the calls with no logit term (cudnn_flash.py): the
wrapper's layout, scale, lengths and causal mask checked on the CPU through
jax.nn's XLA implementation against the plain path; which calls qualify;
the refusal on a host without a CUDA device; and, on a GPU (the device
session's `kernel` step), the routed call's cuDNN kernel, outputs and
gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from selfattn.nn import attention
from selfattn.nn import cudnn_flash
from selfattn.nn import pallas_attention as pa
from selfattn.nn import positions
from selfattn.nn.lowering import lowered_text

ON_CUDA = attention.cudnn_traceable()


def _qkv(lq, lk, d=16, dtype=jnp.float32, seed=0):
  keys = jax.random.split(jax.random.key(seed), 3)
  return tuple(jax.random.normal(key, (3, 2, n, d)).astype(dtype)
               for key, n in zip(keys, (lq, lk, lk)))


def _plain(q, k, v, lengths, causal):
  mask = None
  if lengths is not None:
    mask = (jnp.arange(k.shape[2])[None, :]
            < jnp.asarray(lengths)[:, None])[:, None, None, :]
  return attention.dot_product_attention(q, k, v, mask=mask,
                                         causal=causal)[0]


@pytest.mark.parametrize('causal', [False, True])
@pytest.mark.parametrize('lengths', [None, (24, 7, 0), (30, 24, 5)])
def test_the_wrapper_equals_the_plain_path(causal, lengths):
  """Through jax.nn's XLA implementation (the one a CPU can trace): the
  (B, H, L, D) <-> (B, L, H, D) transposes, the scale, the key lengths
  (a row of length 0 outputs zeros, as the plain path; one past Lk reads
  every key) and the causal mask on a square score matrix."""
  q, k, v = _qkv(24, 24)
  wrapper = lambda q, k, v: cudnn_flash.attention(
      q, k, v, key_lengths=lengths, causal=causal, scale=1 / np.sqrt(16),
      implementation='xla')
  plain = lambda q, k, v: _plain(q, k, v, lengths, causal)

  # One compiled program per path: its outputs and gradients.
  def grads(fn):
    def loss(q, k, v):
      out = fn(q, k, v)
      return jnp.sum(out ** 2), out
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

  (got_grads, got), (want_grads, want) = grads(wrapper), grads(plain)
  np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
  if lengths is not None and lengths[2] == 0:
    assert not np.any(np.asarray(got)[2])
  # Gradients too: finite and equal where a row has no key (zero there).
  for g, w in zip(got_grads, want_grads):
    np.testing.assert_allclose(g, w, atol=2e-5, rtol=1e-4)


def test_which_calls_qualify():
  bf16 = _qkv(32, 32, dtype=jnp.bfloat16)
  computes = lambda qkv, kind='none', causal=False, key_mask=False: (
      cudnn_flash.computes(*qkv, kind=kind, causal=causal, key_mask=key_mask))
  assert computes(bf16) and computes(bf16, causal=True)
  assert computes(_qkv(32, 32, dtype=jnp.float16))
  assert not computes(bf16, kind='alibi')            # a logit term
  assert not computes(bf16, kind='shaw')
  assert not computes(bf16, key_mask=True)           # a mask, not lengths
  assert not computes(_qkv(32, 32))                  # float32
  assert not computes(_qkv(32, 32, d=12, dtype=jnp.bfloat16))   # width % 8
  assert not computes(_qkv(32, 32, d=192, dtype=jnp.bfloat16))  # over 128
  rect = _qkv(16, 32, dtype=jnp.bfloat16)
  assert computes(rect)
  assert not computes(rect, causal=True)    # the causal masks' alignments
  q, k, v = bf16
  assert not computes((q, k, v[..., :8]))            # two head widths


@pytest.mark.skipif(ON_CUDA, reason='the refusal of a host without a GPU')
def test_cudnn_is_refused_without_a_cuda_device():
  q, k, v = _qkv(32, 32, dtype=jnp.bfloat16)
  with pytest.raises(ValueError, match="gpu_kernel='cudnn'.*no CUDA device"):
    pa.pallas_attention(q, k, v, gpu_kernel='cudnn')
  with pytest.raises(ValueError, match="gpu_kernel='cudnn'.*alibi"):
    pa.pallas_attention(q, k, v, relative=positions.ALiBi(2),
                        gpu_kernel='cudnn')


def test_auto_routes_nothing_to_cudnn_until_it_has_run_on_a_gpu():
  """A tripwire: flip it with AUTO_TAKES_CUDNN, citing the GPU run of this
  file's GPU test."""
  assert pa.AUTO_TAKES_CUDNN is False


def test_the_route_passes_the_rotated_call_to_cudnn(monkeypatch):
  """The route inside pallas_attention, lowered for 'cuda' from this CPU
  with cuDNN's tracing faked: cudnn_flash.attention receives the rotated
  q and k, the unrotated head's scale, the key lengths and `causal`, and
  the Triton kernels are not in the cuda lowering."""
  calls = []
  real = cudnn_flash.attention

  def spy(q, k, v, **kwargs):
    calls.append((q, k, v, kwargs))
    return real(q, k, v, **kwargs, implementation='xla')

  monkeypatch.setattr(pa, 'cudnn_traceable', lambda: True)
  monkeypatch.setattr(cudnn_flash, 'attention', spy)
  q, k, v = _qkv(32, 32, dtype=jnp.bfloat16)
  rope = positions.RotaryEncoding(16)
  lengths = jnp.array([32, 9, 0])
  text = lowered_text(
      lambda q, k, v: pa.pallas_attention(q, k, v, relative=rope,
                                          causal=True, key_lengths=lengths,
                                          gpu_kernel='cudnn'),
      q, k, v, platform='cuda')
  assert '__gpu$xla.gpu.triton' not in text
  (got_q, got_k, got_v, kwargs), = calls
  assert kwargs['causal'] is True and kwargs['scale'] == 1 / np.sqrt(16)
  np.testing.assert_array_equal(kwargs['key_lengths'], lengths)
  # Traced: shapes and dtypes here; the values below, by evaluating the
  # same rotation eagerly.
  want_q, want_k = rope.rotate(q, k)
  assert got_q.shape == want_q.shape and got_q.dtype == want_q.dtype
  assert got_k.shape == want_k.shape and got_v.shape == v.shape


@pytest.mark.skipif(not ON_CUDA, reason='traces cuDNN: needs a CUDA device')
@pytest.mark.parametrize('causal', [False, True])
def test_routed_call_runs_cudnn_and_equals_the_plain_path(causal):
  """On a GPU: the routed call lowers to cuDNN's fused attention with no
  (L, L) array, and its output and gradients in q, k, v equal the plain
  path's in float32 (bf16 tolerances), lengths 0 and partial included;
  RoPE's rotation first."""
  q, k, v = _qkv(256, 256, d=64, dtype=jnp.bfloat16)
  lengths = jnp.array([256, 100, 0])
  rope = positions.RotaryEncoding(64)

  def loss(fn):
    def f(q, k, v):
      return jnp.sum(fn(q, k, v).astype(jnp.float32) ** 2)
    return jax.jit(jax.value_and_grad(f, argnums=(0, 1, 2)))

  routed = lambda q, k, v: pa.pallas_attention(
      q, k, v, relative=rope, causal=causal, key_lengths=lengths,
      gpu_kernel='cudnn')
  text = jax.jit(routed).lower(q, k, v).as_text()
  assert 'cudnn' in text.lower()
  assert '256x256' not in text          # no (L, L) array: O(L) memory

  def plain(q, k, v):
    f32 = lambda x: x.astype(jnp.float32)
    q, k = rope.rotate(f32(q), f32(k))
    return _plain(q, k, f32(v), lengths, causal)

  (got, got_grads), (want, want_grads) = loss(routed)(q, k, v), loss(plain)(
      q, k, v)
  np.testing.assert_allclose(got, want, rtol=0.02)
  for g, w in zip(got_grads, want_grads):
    w = np.asarray(w)
    np.testing.assert_allclose(np.asarray(g, np.float32), w,
                               atol=0.02 * np.abs(w).max())

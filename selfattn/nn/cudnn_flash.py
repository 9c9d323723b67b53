"""cuDNN's flash attention for the calls where selfattn's kernels add
nothing: no encoding term in the logits (none, or a rotation applied
before), key padding given as lengths, causal only on a square score
matrix. cuDNN takes the lengths and the causal mask natively, so the call
stays O(L) memory, and on an H100 it ran forward + backward at 2.8x the
speed of selfattn's Triton kernel for this case (issue 47's table:
4.61 ms against 13.01 ms, bf16, B = 2, H = 16, L = 8192, D = 64).

pallas_attention routes such a call here under gpu_kernel='cudnn', or
under 'auto' once AUTO_TAKES_CUDNN is set there; only a step lowered for
'cuda' takes it (jax.lax.platform_dependent), and only where this process
can trace cuDNN at all (cudnn_traceable: jax.nn reads cuDNN's version
while tracing). cudnn_takes is the 'fused' path's test too
(attention.fused_attention).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def cudnn_takes(dtype, head_dim: int, *, lq: int = 2, lk: int = 2,
                has_bias: bool = False) -> bool:
  """Whether jax.nn.dot_product_attention's cuDNN path takes the call,
  training included, by its dtype and shapes: bfloat16 or float16, head
  width a multiple of 8 up to 128, and, with a bias or mask (which cuDNN
  receives as a bias), even lengths Lq and Lk (its backward pass refuses
  odd ones). Checked before tracing, because a refusal raised while
  differentiating through nnx.remat or nnx.scan cannot be caught. Whether
  the platform is a GPU is decided later, at lowering (fused_attention)."""
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return False
  if head_dim % 8 or head_dim > 128:
    return False
  return not (has_bias and (lq % 2 or lk % 2))


@functools.cache
def cudnn_traceable() -> bool:
  """Whether this process can trace cuDNN attention at all: jax.nn reads
  cuDNN's version and the GPU's compute capability while tracing, so
  without a CUDA device here ("cuDNN is not detected") a step lowered for
  'cuda' from this host holds XLA's attention instead (JAX's limit)."""
  try:
    return bool(jax.devices('cuda'))
  except RuntimeError:
    return False


def computes(q: jax.Array, k: jax.Array, v: jax.Array, *, kind: str,
             causal: bool, key_mask: bool) -> bool:
  """Whether cuDNN computes this pallas_attention call as selfattn would:
  q, k, v (B, H, L, D) after any rotation, one 16-bit dtype and one head
  width (a multiple of 8 up to 128); kind the kernels' ('none' only: no
  logit term); causal only with Lq == Lk (cuDNN's causal mask is aligned
  at the first key, selfattn's at the last); key_mask: a general key_valid
  mask was given (cuDNN takes lengths only)."""
  return (kind == 'none' and not key_mask
          and q.dtype == k.dtype == v.dtype
          and q.shape[-1] == k.shape[-1] == v.shape[-1]
          and cudnn_takes(q.dtype, q.shape[-1])
          and not (causal and q.shape[2] != k.shape[2]))


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *,
              key_lengths: jax.Array | None, causal: bool, scale: float,
              implementation: str = 'cudnn') -> jax.Array:
  """(B, H, Lq, D) softmax(scale q k^T) v over keys [0, length) of each
  batch row (all keys without lengths), causal if asked, through
  jax.nn.dot_product_attention (implementation 'xla' for the CPU tests of
  this wrapper). A row with no allowed key (length 0) outputs zeros, as
  selfattn's other paths do: cuDNN is given one key for it (what cuDNN
  does with an empty row is not documented; a finite one cannot put NaN
  into the gradients through the zeroing) and its output is replaced by
  zeros. XLA's implementation needs neither, so the CPU tests cannot see
  that precaution."""
  # selfattn reads a length past Lk as every key; cuDNN gets at most Lk.
  lengths = (None if key_lengths is None
             else jnp.clip(jnp.asarray(key_lengths), 0, k.shape[2])
             .astype(jnp.int32))
  to_blhd = lambda x: x.transpose(0, 2, 1, 3)
  at_least_one = None if lengths is None else jnp.maximum(lengths, 1)
  out = jax.nn.dot_product_attention(
      to_blhd(q), to_blhd(k), to_blhd(v), scale=scale, is_causal=causal,
      key_value_seq_lengths=at_least_one, implementation=implementation)
  out = to_blhd(out)
  if lengths is not None:
    out = jnp.where((lengths > 0)[:, None, None, None], out,
                    jnp.zeros((), out.dtype))
  return out


__all__ = ['attention', 'computes', 'cudnn_takes', 'cudnn_traceable']

"""Transformer-XL relative attention (Dai et al. 2019)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn.masks import check_size
from selfattn.nn.positions.offsets import RelativePosition
from selfattn.nn.positions.offsets import gather_offsets
from selfattn.nn.positions.offsets import position_offsets
from selfattn.nn.positions.offsets import relative_to_absolute


def xl_sinusoid(offsets: jax.Array, width: int) -> jax.Array:
  """Transformer-XL's relative embedding phi: [sin(p w), cos(p w)]
  concatenated (not interleaved), w_i = 10000^(-2i/width). (R,) -> (R, width)."""
  inv_freq = 10000.0 ** (-2.0 * jnp.arange(width // 2) / width)
  angle = jnp.asarray(offsets, jnp.float32)[:, None] * inv_freq[None, :]
  return jnp.concatenate([jnp.sin(angle), jnp.cos(angle)], axis=-1)


class TransformerXLRelative(RelativePosition):
  """Transformer-XL relative attention (Dai et al. 2019), as the reference
  suite computes it, non-causal: for query t and key s,

    logit = ((q_t + u_h) . k_s + (q_t + v_h) . R_h(s - t)) / sqrt(D)

  R = phi(offset) W_r (phi: xl_sinusoid over the model width H*D; W_r one
  learned projection per layer, split into heads); u, v (H, D) learned global
  biases, initialised N(0, 0.02). The content term q.k is the attention's own;
  this hook adds the rest. Offsets are key minus query, unbounded on the
  default path (Lq == Lk); explicit positions or Lq != Lk clip offsets to
  +-(max_len - 1).

  One per attention layer: MultiHeadAttention(..., relative=<this>);
  hooks: logits, shapes in RelativePosition's docstring.

  Args: num_heads, head_dim D, max_len (offset range when clipped),
  param_dtype, rngs ('params').
  """

  def __init__(self, num_heads: int, head_dim: int, *, max_len: int = 1024,
               param_dtype=jnp.float32, rngs: nnx.Rngs):
    num_heads = check_size(num_heads, 'num_heads')
    head_dim = check_size(head_dim, 'head_dim')
    max_len = check_size(max_len, 'max_len')   # offsets clip to +-(max_len-1)
    width = num_heads * head_dim
    if width % 2:
      # phi is [sin, cos] halves of the model width.
      # Named as the model's width (config validation prefixes 'config.model.').
      raise ValueError(f'num_hiddens={width}: xl needs an even model width '
                       f'(num_heads * head_dim = {num_heads} x {head_dim})')
    self.num_heads, self.head_dim, self.max_len = num_heads, head_dim, max_len
    self.W_r = nnx.Linear(width, width, use_bias=False,
                          param_dtype=param_dtype, rngs=rngs)
    init = nnx.initializers.normal(0.02)
    self.u = nnx.Param(init(rngs.params(), (num_heads, head_dim), param_dtype))
    self.v = nnx.Param(init(rngs.params(), (num_heads, head_dim), param_dtype))

  trainable = True

  @property
  def position_limit(self) -> int:
    """The longest cache decoding may use (stack.CacheMixin.init_cache):
    cached steps give positions, so they clip offsets at +-(max_len - 1),
    where the full pass (no positions, Lq == Lk) does not; within max_len
    the two agree."""
    return self.max_len

  def built_for(self) -> tuple[int | None, int | None]:
    return self.num_heads, self.head_dim

  def picture(self) -> jax.Array:
    """(offsets -16..16, H * D): the projected relative embeddings R."""
    return self.embeddings(jnp.arange(-16, 17)).reshape(33, -1)

  def embeddings(self, offsets: jax.Array) -> jax.Array:
    """R for (R,) offsets: (R, H, D)."""
    phi = xl_sinusoid(offsets, self.num_heads * self.head_dim)
    return self.W_r(phi).reshape(-1, self.num_heads, self.head_dim)

  def _content_bias_and_query(self, q: jax.Array, k: jax.Array):
    """u . k_s as (B, H, 1, Lk), and q + v (B, H, Lq, D); q arrives scaled
    by 1/sqrt(D), so u and v are scaled alike."""
    scale = 1.0 / math.sqrt(self.head_dim)
    u = (self.u[...] * scale).astype(q.dtype)
    v = (self.v[...] * scale).astype(q.dtype)
    content_bias = jnp.einsum('hd,bhkd->bhk', u, k)[:, :, None, :]
    return content_bias, q + v[None, :, None, :]

  def blockwise_logits(self, num_queries: int, num_keys: int,
                       padded_queries: int, padded_keys: int):
    """The default path's unbounded offsets, per block: R for every offset
    the padded blocks can meet is projected once (O(L) rows, as the default
    path does), and a block of queries from q_start and keys from k_start
    reads its qc + kc - 1 consecutive rows and skews them to (qc, kc). Lq !=
    Lk returns None: the default path clips there, like the positions path."""
    if num_queries != num_keys:
      return None
    first = -(padded_queries - 1)
    table = self.embeddings(jnp.arange(first, padded_keys))

    def term(q, k, q_start, k_start):
      qc, kc = q.shape[2], k.shape[2]
      content_bias, qv = self._content_bias_and_query(q, k)
      # Row r holds offset (k_start - q_start - (qc - 1)) + r, so query a
      # and key b (offset k_start + b - q_start - a) read row b - a + qc - 1.
      rows = jax.lax.dynamic_slice_in_dim(
          table, k_start - q_start - (qc - 1) - first, qc + kc - 1, axis=0)
      by_offset = jnp.einsum('bhqd,rhd->bhqr', qv, rows.astype(q.dtype))
      index = jnp.arange(kc)[None, :] - jnp.arange(qc)[:, None] + qc - 1
      return content_bias + gather_offsets(by_offset, index[None])

    return term

  def logits(self, q: jax.Array, k: jax.Array, q_pos: jax.Array | None = None,
             k_pos: jax.Array | None = None) -> jax.Array:
    content_bias, qv = self._content_bias_and_query(q, k)
    lq, lk = q.shape[2], k.shape[2]
    if q_pos is None and k_pos is None and lq == lk:
      table = self.embeddings(jnp.arange(-(lq - 1), lq)).astype(q.dtype)
      rel = relative_to_absolute(jnp.einsum('bhqd,rhd->bhqr', qv, table))
    else:
      reach = self.max_len - 1
      table = self.embeddings(jnp.arange(-reach, reach + 1)).astype(q.dtype)
      offsets = position_offsets(q_pos, k_pos, lq, lk)
      index = jnp.clip(offsets, -reach, reach) + reach
      if index.ndim == 2:
        index = index[None]
      by_offset = jnp.einsum('bhqd,rhd->bhqr', qv, table)
      rel = gather_offsets(by_offset, jnp.broadcast_to(
          index, (q.shape[0],) + index.shape[1:]))
    return content_bias + rel

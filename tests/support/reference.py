"""Independent NumPy transcriptions of the equations the library implements.

Written from the papers, loops and all, so they share no code with selfattn.
"""

import numpy as np


def softmax_rows(logits, keep):
  """Softmax over the last axis restricted to `keep`; a row with none kept is 0."""
  logits = np.where(keep, logits, -np.inf)
  top = np.max(logits, axis=-1, keepdims=True)
  top = np.where(np.isfinite(top), top, 0.0)
  e = np.where(keep, np.exp(logits - top), 0.0)
  total = e.sum(-1, keepdims=True)
  return e / np.where(total > 0, total, 1.0)


def sinusoid(num_steps, d):
  P = np.zeros((num_steps, d))
  for i in range(num_steps):
    for col in range(d):
      j2 = col - col % 2
      angle = i / 10000 ** (j2 / d)
      P[i, col] = np.sin(angle) if col % 2 == 0 else np.cos(angle)
  return P


def shaw_attention(q, k, v, aK, aV, clip, keep):
  """Shaw et al. (2018) eqs. with the (L, L, D) relative tensors built explicitly.

  q, k, v: (B, H, L, D); aK, aV: (2k+1, D) or (H, 2k+1, D); keep: (B, L) bool.
  """
  B, H, L, D = q.shape
  out = np.zeros_like(q)
  for b in range(B):
    for h in range(H):
      tK = aK if aK.ndim == 2 else aK[h]
      tV = None if aV is None else (aV if aV.ndim == 2 else aV[h])
      rel = np.clip(np.arange(L)[None, :] - np.arange(L)[:, None], -clip, clip) + clip
      AK = tK[rel]                                  # (L, L, D) materialised
      e = np.einsum('id,ijd->ij', q[b, h], k[b, h][None, :, :] + AK) / np.sqrt(D)
      alpha = softmax_rows(e, keep[b][None, :])
      values = v[b, h][None, :, :] + (tV[rel] if tV is not None else 0)
      out[b, h] = np.einsum('ij,ijd->id', alpha, values)
  return out


def huang_logits(q, E, max_len):
  """Music Transformer relative logits S_rel[i, j] = q_i . E[j - i]; offsets
  beyond +-(max_len - 1) (only when L > max_len) use the edge rows.

  q: (B, H, L, D) (already scaled); E: (2*max_len-1, D) or (H, 2*max_len-1, D).
  """
  B, H, L, D = q.shape
  out = np.zeros((B, H, L, L))
  for h in range(H):
    table = E if E.ndim == 2 else E[h]
    for i in range(L):
      for j in range(L):
        offset = min(max(j - i, -(max_len - 1)), max_len - 1)
        out[:, h, i, j] = q[:, h, i] @ table[offset + max_len - 1]
  return out


def assert_encoders_agree(ours, plain, tokens, lens, *, atol=2e-5,
                          grad_atol=2e-4):
  """Two encoders with the same parameters give the same outputs (padded
  and causal) and the same parameter gradients."""
  import jax
  from flax import nnx
  from compiled import compiled

  def outputs_and_grads(m):     # one compiled program per encoder
    loss = lambda m: (m(tokens, lens) ** 2).sum()
    return m(tokens, lens), m(tokens, causal=True), nnx.grad(loss)(m)

  padded, causal, grads = compiled(outputs_and_grads, ours)
  want_padded, want_causal, want_grads = compiled(outputs_and_grads, plain)
  np.testing.assert_allclose(padded, want_padded, atol=atol)
  np.testing.assert_allclose(causal, want_causal, atol=atol)
  for got, want in zip(jax.tree.leaves(grads), jax.tree.leaves(want_grads),
                       strict=True):
    np.testing.assert_allclose(got, want, atol=grad_atol, rtol=1e-4)



def stack_loop_into_scan(loop, scanned):
  """Copies a loop stack's parameters into a scanned one (layer i of the
  stacked arrays = block i of `loop.blks`)."""
  import jax.numpy as jnp
  from flax import nnx
  flat = dict(nnx.to_flat_state(nnx.state(loop, nnx.Param)))
  new = {}
  for path, value in nnx.to_flat_state(nnx.state(scanned, nnx.Param)):
    if path[0] == 'blks':
      layers = [flat[('blks', i) + path[1:]][...] for i in range(len(loop.blks))]
      new[path] = value.replace(jnp.stack(layers))
    else:
      new[path] = value.replace(flat[path][...])
  nnx.update(scanned, nnx.from_flat_state(new))


def assert_scanned_grads_match(loss, loop, scanned, *, atol=1e-4):
  """nnx.grad(loss) of a scanned stack equals the loop's, layer by layer."""
  import jax.numpy as jnp
  from flax import nnx
  from compiled import grads
  g_loop = dict(nnx.to_flat_state(grads(loss, loop)))
  for path, g in nnx.to_flat_state(grads(loss, scanned)):
    if path[0] == 'blks':
      want = jnp.stack([g_loop[('blks', i) + path[1:]][...]
                        for i in range(len(loop.blks))])
    else:
      want = g_loop[path][...]
    np.testing.assert_allclose(g[...], want, atol=atol, rtol=atol)

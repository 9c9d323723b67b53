"""Small layers shared by attention, the encodings and the stacks."""

from __future__ import annotations

from flax import nnx


def dropout_layer(rate: float, rngs: nnx.Rngs) -> nnx.Dropout:
  """nnx.Dropout that starts in eval mode (d2l's call default; model.train()
  turns it on) and takes a 'dropout' (or 'default') rng stream only if rate
  > 0 and the stream exists: Rngs(params=0), or a Linen init with one key,
  builds the module; calling it with dropout on then needs rngs."""
  has_stream = 'dropout' in rngs or 'default' in rngs
  return nnx.Dropout(rate, deterministic=True,
                     rngs=rngs if rate > 0 and has_stream else None)

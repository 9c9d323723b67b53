"""Transformer decoder (d2l's transformer chapter) with any positional encoding,
and cached greedy decoding.

Causal self-attention carries the positional encoding; cross-attention to an
encoder's outputs (optional) carries none, since positions in two different
sequences are not comparable. Decoding one token at a time against a key/value
cache gives the outputs of a full causal pass (tests/nn/test_decoder.py checks it
for every encoding): the cache stores each key's position, and relative
encodings see query and key positions explicitly.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from selfattn.nn import decoding
from selfattn.nn import masks
from selfattn.nn.attention import MultiHeadAttention
from selfattn.nn.attention import poison
from selfattn.nn.layers import AddNorm
from selfattn.nn.layers import PositionWiseFFN
from selfattn.nn.stack import CacheMixin
from selfattn.nn.stack import EmbeddingMixin
from selfattn.nn.stack import check_stack
from selfattn.nn.stack import check_tokens
from selfattn.nn.stack import run_blocks


NO_CROSS_ATTENTION = ('{0} passed, but this decoder was built without '
                      'cross_attention=True, so it would be ignored: build it '
                      'with cross_attention=True or do not pass {0}')


class TransformerDecoderBlock(nnx.Module):
  """Causal self-attention, optional cross-attention, FFN; each in AddNorm.

  X (B, L, num_hiddens) -> (B, L, num_hiddens). Call as `blk(X, enc_outputs=
  None, enc_mask=None, *, mask=None, positions=None, deterministic=None,
  decode=False, enc_lens=None)`: enc_outputs (B, Lk, num_hiddens), enc_mask
  a mask over them (four axes, see masks.py) or enc_lens (B,) their valid
  lengths, mask an extra mask on the self-attention
  (the causal one is always applied). enc_outputs, enc_mask or enc_lens given
  to a block built without cross_attention raise ValueError naming it.

  Args: as TransformerEncoderBlock, plus cross_attention (build the
  encoder-decoder attention).
  """

  def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
               dropout: float = 0.0, *, norm: str = 'post',
               residual: bool = True, norm_type: str = 'layernorm',
               cross_attention: bool = False,
               relative=None,
               use_bias: bool = False, attention_impl: str = 'plain',
               dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs):
    cross_attention = masks.check_flag(cross_attention, 'cross_attention')
    attention = dict(use_bias=use_bias, attention_impl=attention_impl,
                     dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    addnorm = dict(norm=norm, residual=residual, norm_type=norm_type,
                   dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.self_attention = MultiHeadAttention(
        num_hiddens, num_heads, dropout, relative=relative, **attention)
    self.addnorm1 = AddNorm(num_hiddens, dropout, **addnorm)
    if cross_attention:
      self.cross_attention = MultiHeadAttention(num_hiddens, num_heads,
                                                dropout, **attention)
      self.addnorm2 = AddNorm(num_hiddens, dropout, **addnorm)
    else:
      self.cross_attention = self.addnorm2 = None
    self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, num_hiddens,
                               dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.addnorm3 = AddNorm(num_hiddens, dropout, **addnorm)

  def __call__(self, X: jax.Array, enc_outputs: jax.Array | None = None,
               enc_mask: jax.Array | None = None, *,
               mask: jax.Array | None = None,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False,
               cache_start: jax.Array | None = None,
               enc_lens: jax.Array | None = None) -> jax.Array:
    """enc_mask: the cross-attention's mask; or enc_lens, (B,) encoder
    lengths kept as lengths, which attention_impl='pallas''s Hopper and
    cuDNN kernels take (they take no mask)."""
    X = self.addnorm1(
        X, lambda Z: self.self_attention(
            Z, mask=mask, causal=not decode, positions=positions,
            deterministic=deterministic, decode=decode,
            cache_start=cache_start),
        deterministic=deterministic)
    if self.cross_attention is None:
      if (enc_outputs is not None or enc_mask is not None
          or enc_lens is not None):
        given = [name for name, value in (('enc_outputs', enc_outputs),
                                          ('enc_mask', enc_mask),
                                          ('enc_lens', enc_lens))
                 if value is not None]
        raise ValueError(NO_CROSS_ATTENTION.format(' and '.join(given)))
    else:
      if enc_outputs is None:
        raise ValueError('this decoder has cross-attention: pass enc_outputs')
      X = self.addnorm2(
          X, lambda Z: self.cross_attention(Z, enc_outputs, enc_outputs,
                                            enc_lens, mask=enc_mask,
                                            deterministic=deterministic),
          deterministic=deterministic)
    # A function, not the module: nnx.tabulate cannot describe a module
    # given as an argument.
    return self.addnorm3(X, lambda Z: self.ffn(Z),
                         deterministic=deterministic)


class TransformerDecoder(EmbeddingMixin, CacheMixin, nnx.Module):
  """A decoder stack with a dense head over the vocabulary.

  Calls: see `__call__`.

  Args: as TransformerEncoder (norm defaults to 'pre' here and vocab_size
  is required; vocab_size, num_hiddens, ffn_num_hiddens,
  num_heads, num_layers, dropout, position, max_len, norm, residual,
  norm_type, use_bias,
  attention_impl, remat, scan_layers, meter_period, meter_step_tokens,
  dtype, param_dtype, rngs,
  **position_options), plus cross_attention, and tie_output (the logits
  use the token embedding's transpose instead of a dense head). With
  scan_layers the caches too carry the layer axis, and cached decoding runs
  through nnx.scan; remat applies to full (training) passes, not to
  decode=True steps.
  """

  def __init__(self, vocab_size: int, num_hiddens: int, ffn_num_hiddens: int,
               num_heads: int, num_layers: int, dropout: float = 0.0, *,
               position: str = 'sinusoidal', max_len: int = 1024,
               norm: str = 'pre', residual: bool = True,
               norm_type: str = 'layernorm', cross_attention: bool = False,
               use_bias: bool = False,
               attention_impl: str = 'plain', remat: bool = False,
               scan_layers: bool = False, meter_period: int = 0,
               meter_step_tokens: int = 4, tie_output: bool = False,
               dtype=None, param_dtype=jnp.float32, rngs: nnx.Rngs,
               **position_options):
    kind, options = check_stack(
        type(self).__name__, position, position_options, norm=norm,
        vocab_size=vocab_size, num_hiddens=num_hiddens,
        ffn_num_hiddens=ffn_num_hiddens, num_heads=num_heads,
        num_layers=num_layers, max_len=max_len, norm_type=norm_type,
        flags=dict(residual=residual, cross_attention=cross_attention,
                   use_bias=use_bias, remat=remat, scan_layers=scan_layers,
                   tie_output=tie_output))
    if vocab_size is None:
      raise ValueError('TransformerDecoder needs a vocab_size: its output '
                       'head gives logits over the vocabulary')
    self.has_cross_attention = cross_attention

    def block(relative, rngs):
      return TransformerDecoderBlock(
          num_hiddens, ffn_num_hiddens, num_heads, dropout, norm=norm,
          residual=residual, norm_type=norm_type,
          cross_attention=cross_attention,
          relative=relative, use_bias=use_bias,
          attention_impl=attention_impl, dtype=dtype,
          param_dtype=param_dtype, rngs=rngs)

    self._init_layers(
        block, vocab_size=vocab_size, num_hiddens=num_hiddens,
        num_heads=num_heads, num_layers=num_layers, dropout=dropout,
        kind=kind, options=options, max_len=max_len, norm=norm,
        norm_type=norm_type, causal=True, remat=remat,
        scan_layers=scan_layers, dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    # Tied: the logits are the final states against the token embedding
    # (Press & Wolf 2017), no separate output matrix.
    self.dense = None if tie_output else nnx.Linear(
        num_hiddens, vocab_size, dtype=dtype, param_dtype=param_dtype,
        rngs=rngs)
    self._init_meter(meter_period, meter_step_tokens, dtype=dtype,
                     param_dtype=param_dtype, rngs=rngs)
    self._init_cache_fields()

  _self_attention = 'self_attention'

  def __call__(self, tokens: jax.Array, enc_outputs: jax.Array | None = None,
               enc_valid_lens: jax.Array | None = None, *,
               mask: jax.Array | None = None,
               positions: jax.Array | None = None,
               deterministic: bool | None = None,
               decode: bool = False) -> jax.Array:
    """Logits of the next token at every position.

    Args:
      tokens: (B, L) int (or features (B, L, num_hiddens)).
      enc_outputs: (B, Lk, num_hiddens), only for a decoder built with
        cross_attention (otherwise ValueError).
      enc_valid_lens: (B,), valid lengths of enc_outputs.
      mask: an extra mask on the self-attention (four axes, see masks.py);
        the causal one is always applied.
      positions: (B, L) int, explicit positions (randomized encodings).
      deterministic: None follows model.train() / model.eval().
      decode: one step against the caches made by `init_cache` (positions
        continue from the cache). The caches hold init_cache's `max_length`
        tokens. A decode step that would run past them raises ValueError
        when the position is concrete (eager calls); under jit it cannot
        raise, so its logits, and every later step's, are NaN (documented
        poisoning, see attention.poison) instead of the wrong numbers
        clamped writes would give. A prompt longer than max_length or a
        batch other than init_cache's batch_size raise ValueError.

    Returns:
      logits (B, L, vocab_size), float32.
    """
    tokens = check_tokens(tokens)
    b, length = tokens.shape[:2]
    if not self.has_cross_attention:
      for name, value in (('enc_outputs', enc_outputs),
                          ('enc_valid_lens', enc_valid_lens)):
        if value is not None:
          raise ValueError(NO_CROSS_ATTENTION.format(name))
    elif enc_valid_lens is not None and enc_outputs is None:
      raise ValueError('enc_valid_lens was passed without enc_outputs')
    if enc_outputs is not None and (
        enc_outputs.ndim != 3 or enc_outputs.shape[0] != b
        or enc_outputs.shape[2] != self.num_hiddens):
      raise ValueError(f'enc_outputs must be (B, Lk, num_hiddens) with B = '
                       f'{b} (the tokens\' batch) and num_hiddens = '
                       f'{self.num_hiddens}; got shape '
                       f'{tuple(enc_outputs.shape)}')
    overflow = start = None
    if decode:
      positions, start, overflow = self._start_decode(b, length, positions,
                                                      mask)
    enc_mask = enc_lens = None
    if enc_valid_lens is not None:
      enc_valid_lens = masks.check_valid_lens(enc_valid_lens, b,
                                              'enc_valid_lens')
      if enc_valid_lens.ndim == 1:
        # Lengths stay lengths down to the attention (as the encoder's do),
        # which builds the same mask itself; attention_impl='pallas' hands
        # them to the Hopper or cuDNN kernels, which take no mask.
        enc_lens = masks.integer_lengths(enc_valid_lens, 'enc_valid_lens')
      else:
        enc_mask = masks.make_length_mask(enc_valid_lens, length,
                                          enc_outputs.shape[1],
                                          'enc_valid_lens')
    X = self.embed(tokens, positions=positions, deterministic=deterministic)

    def run(blk, X, enc_outputs, enc_mask, enc_lens, mask, positions, start):
      return blk(X, enc_outputs, enc_mask, mask=mask, positions=positions,
                 deterministic=deterministic, decode=decode,
                 cache_start=start, enc_lens=enc_lens)

    # remat is for training passes; a decode step has no backward pass.
    X, _ = run_blocks(self, run, X, enc_outputs, enc_mask, enc_lens, mask,
                      positions, start, remat=self.remat and not decode)
    logits = (self.embedding.attend(X) if self.dense is None
              else self.dense(X)).astype(jnp.float32)
    return logits if overflow is None else poison(overflow, logits)


def greedy_decode(decoder: TransformerDecoder, prompt: jax.Array,
                  num_steps: int, *, enc_outputs: jax.Array | None = None,
                  enc_valid_lens: jax.Array | None = None) -> jax.Array:
  """Greedy generation with the key/value cache.

  prompt (B, P) int -> (B, P + num_steps): the prompt fills the caches in one
  call, then each step feeds the argmax token back (num_steps=0 returns the
  prompt). Jit-able (nnx.jit) with static num_steps; the caches are
  re-initialised on every call.
  """
  if not isinstance(decoder, TransformerDecoder):
    # A causal encoder also decodes, but its outputs are features, not
    # logits: their argmax is no token.
    raise TypeError(f'greedy_decode needs a TransformerDecoder (logits over '
                    f'the vocabulary); got {type(decoder).__name__}')
  prompt = jnp.asarray(prompt)
  if prompt.ndim != 2 or not jnp.issubdtype(prompt.dtype, jnp.integer):
    raise ValueError(f'prompt must be (B, P) int token ids; got shape '
                     f'{tuple(prompt.shape)} and dtype {prompt.dtype}')
  if masks.check_size(num_steps, 'num_steps', 0) == 0:
    return prompt
  # The one decode loop (decoding.generate), greedy.
  args = () if enc_outputs is None else (enc_outputs, enc_valid_lens)
  return decoding.generate(decoder, prompt, int(num_steps), method='greedy',
                           call_args=args).tokens.astype(prompt.dtype)

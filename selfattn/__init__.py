"""selfattn: self-attention and positional encodings in Flax NNX.

Public names (a contract; import them from `selfattn`):
  masked_softmax, dot_product_attention, MultiHeadAttention,
  SinusoidalEncoding, LearnedEncoding, NoEncoding, ShawRelative, HuangRelative,
  RotaryEncoding, PolarEncoding, ALiBi, T5RelativeBias,
  TransformerXLRelative,
  sinusoidal_table, t5_bucket,
  get_position, POSITION_NAMES, RELATIVE_NAMES,
  PositionWiseFFN, AddNorm, TransformerEncoderBlock, TransformerEncoder,
  attention_weights,
  TransformerDecoderBlock, TransformerDecoder, greedy_decode,
  make_padding_mask, make_causal_mask, make_length_mask,
  project_bounded, project_bounded_params (after each update of a training
  loop of your own: PoPE; the second for Linen models through nnx.bridge).

Mask convention (nn/masks.py): boolean, True = attend, four axes broadcastable to
(B, H, Lq, Lk); `valid_lens` (B,) or (B, Lq); `causal=True`; float `bias`.

The package by role: `selfattn.nn` (the reusable modules; these names come
from there), `selfattn.tasks` (tasks and their data) and `selfattn.training`
(the training system behind `python -m selfattn.main`).
"""

from selfattn.nn.attention import MultiHeadAttention
from selfattn.nn.attention import dot_product_attention
from selfattn.nn.attention import masked_softmax
from selfattn.nn.bounded import project_bounded
from selfattn.nn.bounded import project_bounded_params
from selfattn.nn.decoder import TransformerDecoder
from selfattn.nn.decoder import TransformerDecoderBlock
from selfattn.nn.decoder import greedy_decode
from selfattn.nn.encoder import attention_weights
from selfattn.nn.layers import AddNorm
from selfattn.nn.layers import PositionWiseFFN
from selfattn.nn.masks import make_causal_mask
from selfattn.nn.masks import make_length_mask
from selfattn.nn.masks import make_padding_mask
from selfattn.nn.encoder import TransformerEncoder
from selfattn.nn.encoder import TransformerEncoderBlock
from selfattn.nn.positions import ALiBi
from selfattn.nn.positions import HuangRelative
from selfattn.nn.positions import LearnedEncoding
from selfattn.nn.positions import NoEncoding
from selfattn.nn.positions import POSITION_NAMES
from selfattn.nn.positions import PolarEncoding
from selfattn.nn.positions import RELATIVE_NAMES
from selfattn.nn.positions import RotaryEncoding
from selfattn.nn.positions import ShawRelative
from selfattn.nn.positions import SinusoidalEncoding
from selfattn.nn.positions import T5RelativeBias
from selfattn.nn.positions import TransformerXLRelative
from selfattn.nn.positions import get_position
from selfattn.nn.positions import sinusoidal_table
from selfattn.nn.positions import t5_bucket

__version__ = '0.1.0'

# The public names, for `from selfattn import *` and for type checkers
# (mypy --no-implicit-reexport, pyright) that read a py.typed package's
# imports as private unless listed here. tests/test_typing.py checks it.
__all__ = [
    'ALiBi',
    'AddNorm',
    'HuangRelative',
    'LearnedEncoding',
    'MultiHeadAttention',
    'NoEncoding',
    'POSITION_NAMES',
    'PolarEncoding',
    'PositionWiseFFN',
    'RELATIVE_NAMES',
    'RotaryEncoding',
    'ShawRelative',
    'SinusoidalEncoding',
    'T5RelativeBias',
    'TransformerDecoder',
    'TransformerDecoderBlock',
    'TransformerEncoder',
    'TransformerEncoderBlock',
    'TransformerXLRelative',
    '__version__',
    'attention_weights',
    'dot_product_attention',
    'get_position',
    'greedy_decode',
    'make_causal_mask',
    'make_length_mask',
    'make_padding_mask',
    'masked_softmax',
    'project_bounded',
    'project_bounded_params',
    'sinusoidal_table',
    't5_bucket',
]

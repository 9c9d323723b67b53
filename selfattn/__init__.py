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
  make_padding_mask, make_causal_mask, make_length_mask.

Mask convention (masks.py): boolean, True = attend, four axes broadcastable to
(B, H, Lq, Lk); `valid_lens` (B,) or (B, Lq); `causal=True`; float `bias`.
"""

from selfattn.attention import MultiHeadAttention
from selfattn.attention import dot_product_attention
from selfattn.attention import masked_softmax
from selfattn.decoder import TransformerDecoder
from selfattn.decoder import TransformerDecoderBlock
from selfattn.decoder import greedy_decode
from selfattn.encoder import attention_weights
from selfattn.layers import AddNorm
from selfattn.layers import PositionWiseFFN
from selfattn.masks import make_causal_mask
from selfattn.masks import make_length_mask
from selfattn.masks import make_padding_mask
from selfattn.encoder import TransformerEncoder
from selfattn.encoder import TransformerEncoderBlock
from selfattn.positions import ALiBi
from selfattn.positions import HuangRelative
from selfattn.positions import LearnedEncoding
from selfattn.positions import NoEncoding
from selfattn.positions import POSITION_NAMES
from selfattn.positions import PolarEncoding
from selfattn.positions import RELATIVE_NAMES
from selfattn.positions import RotaryEncoding
from selfattn.positions import ShawRelative
from selfattn.positions import SinusoidalEncoding
from selfattn.positions import T5RelativeBias
from selfattn.positions import TransformerXLRelative
from selfattn.positions import get_position
from selfattn.positions import sinusoidal_table
from selfattn.positions import t5_bucket

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
    'sinusoidal_table',
    't5_bucket',
]

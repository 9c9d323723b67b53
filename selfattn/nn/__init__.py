"""selfattn.nn: the library other Flax projects reuse.

Masks, layers, attention (the chapter's reference, fused/cuDNN, chunked,
Pallas kernels), positions/ (every encoding), the encoder and decoder
stacks, the model classes and the decode loop. Imports nothing from
selfattn.tasks or selfattn.training (tests/test_imports.py); every name
below is also exported by `selfattn` itself, except the model classes,
`generate` and `check_token_ids`, which are reached here.
"""

from selfattn.nn.attention import MultiHeadAttention
from selfattn.nn.bounded import project_bounded
from selfattn.nn.bounded import project_bounded_params
from selfattn.nn.attention import dot_product_attention
from selfattn.nn.attention import masked_softmax
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
from selfattn.nn.decoding import generate
from selfattn.nn.models import LanguageModel
from selfattn.nn.models import Seq2SeqModel
from selfattn.nn.models import SequenceModel
from selfattn.nn.stack import check_token_ids
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


"""Every positional encoding, looked up by name.

Absolute encodings (`none`, `sinusoidal`, `learned`) are added to the token
embeddings once, before the first layer. Relative encodings (`shaw`, `huang`,
`rope`, `pope`, `alibi`, `t5`, `xl`) act inside every attention layer through three hooks
that `attention.dot_product_attention` calls:

  rotate(q, k, q_pos, k_pos) -> (q, k)   rotary rotates queries and keys
                               (PoPE maps them to 2D polar features; the
                               softmax scale stays 1/sqrt(D) of the input);
  logits(q, k, q_pos, k_pos) -> (.., Lq, Lk)  a term added to the scaled
                               logits (q arrives already scaled by 1/sqrt(D));
  values(w, v, q_pos, k_pos) -> (B, H, Lq, D) a term added to the attention
                               output (Shaw).

Positions: q_pos (B, Lq) and k_pos (B, Lk) int32, or None for 0..L-1. Explicit
positions serve randomized positional encodings (Ruoss et al. 2023: a sorted
random subset of a larger range) and decoding against cached keys. Offsets are
`k_pos - q_pos` (key position minus query position) everywhere; with None,
`j - i`. Padding never moves the offset between two valid tokens, so relative
encodings give the same outputs for a left-padded sequence as for the unpadded
one. With positions None every encoding runs exactly the code it ran before
positions existed (bit for bit).

Layout: absolute.py (added to the inputs), offsets.py (offsets, skews and
the RelativePosition base), one module per relative family (shaw, huang,
rotary: rope and pope, alibi, xl, t5) and registry.py (lookup by name).
Every name is re-exported here, so `selfattn.nn.positions.X` is unchanged.
"""

from selfattn.nn.positions.absolute import LearnedEncoding  # noqa: F401
from selfattn.nn.positions.absolute import NoEncoding  # noqa: F401
from selfattn.nn.positions.absolute import SinusoidalEncoding  # noqa: F401
from selfattn.nn.positions.absolute import sinusoid_at  # noqa: F401
from selfattn.nn.positions.absolute import sinusoidal_table  # noqa: F401
from selfattn.nn.positions.offsets import RelativePosition  # noqa: F401
from selfattn.nn.positions.offsets import _per_head  # noqa: F401
from selfattn.nn.positions.offsets import _table_init  # noqa: F401
from selfattn.nn.positions.offsets import causal_relative_to_absolute  # noqa: F401
from selfattn.nn.positions.offsets import fold_by_bucket  # noqa: F401
from selfattn.nn.positions.offsets import gather_offsets  # noqa: F401
from selfattn.nn.positions.offsets import position_offsets  # noqa: F401
from selfattn.nn.positions.offsets import relative_offsets  # noqa: F401
from selfattn.nn.positions.offsets import relative_to_absolute  # noqa: F401
from selfattn.nn.positions.shaw import ShawRelative  # noqa: F401
from selfattn.nn.positions.huang import HuangRelative  # noqa: F401
from selfattn.nn.positions.rotary import POPE_DELTA_INITS  # noqa: F401
from selfattn.nn.positions.rotary import PolarEncoding  # noqa: F401
from selfattn.nn.positions.rotary import RotaryEncoding  # noqa: F401
from selfattn.nn.positions.alibi import ALiBi  # noqa: F401
from selfattn.nn.positions.alibi import alibi_slopes  # noqa: F401
from selfattn.nn.positions.xl import TransformerXLRelative  # noqa: F401
from selfattn.nn.positions.xl import xl_sinusoid  # noqa: F401
from selfattn.nn.positions.t5 import T5RelativeBias  # noqa: F401
from selfattn.nn.positions.t5 import t5_bucket  # noqa: F401
from selfattn.nn.positions.registry import POSITIONS  # noqa: F401
from selfattn.nn.positions.registry import POSITION_NAMES  # noqa: F401
from selfattn.nn.positions.registry import PositionKind  # noqa: F401
from selfattn.nn.positions.registry import RELATIVE_NAMES  # noqa: F401
from selfattn.nn.positions.registry import build_abstract  # noqa: F401
from selfattn.nn.positions.registry import build_encoding  # noqa: F401
from selfattn.nn.positions.registry import get_position  # noqa: F401
from selfattn.nn.positions.registry import option_types  # noqa: F401
from selfattn.nn.positions.registry import register_position  # noqa: F401

"""JSB Chorales language model: exercise 3 on real music.

A causal TransformerDecoder predicts the next token of the Music
Transformer's serialization (S, A, T, B per sixteenth note) on random crops
of the training pieces (selfattn/tasks/music/task.py). Needs the data (see
selfattn/tasks/music/jsb.py: $SELFATTN_DATA_DIR, the user cache, or a checked download).

Run one encoding:
  python -m selfattn.main --config=configs/music.py --workdir=runs/jsb_shaw
  python -m selfattn.main --config=configs/music.py --workdir=runs/jsb_rope \
      --config.model.position=rope       # another encoding, meter kept
The study (every encoding, seeds, whole-piece NLL, samples):
  python -m experiments.music --workdir=experiments/results/music

Scales (`--config=configs/music.py:SCALE`):
  cpu    (default) the CPU study's model: windows of 256 tokens (64
         sixteenths, four bars), 2 layers of width 96, 4 heads, dropout
         0.1, batch 16, 1000 steps (4.1M tokens, about 18 passes over the
         training split), sized to fit a study's runs into a few hours of
         the 2-core CPU. It knows the meter (issue 34): crops start on a
         bar line and a learned embedding of the sixteenth within the bar
         is added to the inputs, with shaw's relative positions: the meter
         row of EXPERIMENTS.md section 6 with the lowest validation NLL
         over 5 seeds (0.475; xl's 0.477 is not told apart). Its mean,
         0.475 valid / 0.493 test, beats every floor, the metrical n-gram
         (0.526 / 0.537) included, on each seed. The study's first-pass
         rows turn the meter off (experiments/music.py).
  paper  PoPE's JSB recipe (arXiv 2509.10534, Tables 6-7): 6 layers, width
         256, 8 heads, dropout 0.2, batch 4 x 2048 tokens, AdamW lr 6e-4
         with 10 warmup steps, cosine to 6e-5, weight decay 0.01, clip 1.0,
         beta2 0.99, 3000 steps, pre-RMSNorm. For a GPU.
  quick  a smoke test for the tests.
"""

import ml_collections

from configs import default

SCALES = ('cpu', 'paper', 'quick')


def get_config(scale: str | None = None) -> ml_collections.ConfigDict:
  scale = scale or 'cpu'
  if scale not in SCALES:
    raise ValueError(f'configs/music.py:{scale}: valid scales are '
                     f'{", ".join(SCALES)}')
  config = default.get_config()
  t = config.task
  t.name = 'jsb_chorales'
  t.layout = 'in_place'          # next-token targets at every position
  t.transpose = 0                # the main table: no augmentation

  m = config.model
  m.position = 'rope'
  m.norm = 'pre'
  tr = config.train
  tr.schedule = 'cosine'
  tr.weight_decay = 0.01
  tr.grad_clip = 1.0

  if scale == 'paper':
    t.min_len = t.max_len = 2048
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 6, 256, 8, 1024
    m.dropout = 0.2
    m.norm_type = 'rmsnorm'
    m.max_len = 4 * 2048 + 1
    tr.num_steps, tr.batch_size, tr.learning_rate = 3000, 4, 6e-4
    tr.warmup_steps, tr.final_lr_fraction, tr.b2 = 10, 0.1, 0.99
    tr.log_every, tr.checkpoint_every = 100, 500
    config.eval.every = 500
    config.eval.num_examples = 16
  elif scale == 'cpu':
    t.min_len = t.max_len = 256
    t.crop_align = 16                  # crops start on a 4/4 bar line
    m.position = 'shaw'
    m.meter_period, m.meter_step_tokens = 16, 4   # sixteenth of the bar
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 2, 96, 4, 256
    m.dropout = 0.1
    m.max_len = 4 * 256 + 1            # NLL by position out to 4x the window
    tr.num_steps, tr.batch_size, tr.learning_rate = 1000, 16, 2e-3
    tr.warmup_steps, tr.final_lr_fraction, tr.b2 = 100, 0.1, 0.99
    tr.log_every, tr.checkpoint_every = 250, 500
    config.eval.every = 500
    config.eval.num_examples = 64
  else:
    t.min_len = t.max_len = 64
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 1, 32, 2, 64
    m.dropout = 0.0
    m.max_len = 4 * 64 + 1
    tr.num_steps, tr.batch_size, tr.learning_rate = 60, 16, 3e-3
    tr.warmup_steps = 6
    tr.log_every, tr.checkpoint_every = 30, 30
    config.eval.every = 60
    config.eval.num_examples = 16
  config.eval.lengths = [t.max_len]
  return config

"""Indirect indexing, the PoPE paper's task (Gopalakrishnan et al. 2025):
find a letter in a string of distinct letters, move by a signed shift, name
the letter there. A causal decoder reads `string , letter , +-shift` and is
scored on the target letter alone (selfattn/tasks/synthetic/indirect_indexing.py).

Run one encoding:
  python -m selfattn.main --config=configs/indirect_indexing.py:small \
      --workdir=runs/ii_pope --config.model.position=pope
The study over encodings and seeds: experiments/indirect_indexing.py.

Scales (`--config=configs/indirect_indexing.py:SCALE`):
  paper  the paper's (Tables 6-7): 8 layers, width 512, 8 heads, dropout 0,
         batch 64, AdamW lr 2e-4 with 4000 warmup steps then cosine, weight
         decay 0.01, beta2 0.99, clip 1.0, cosine to 2e-5, pre-RMSNorm,
         100,000 steps. For accelerators.
  small  the CPU study (EXPERIMENTS.md justifies it): 2 layers, width 64.
  quick  a smoke test for the tests.
Every scale trains on the paper's strings of 20-40 letters with shifts in
[-15, 15] and also evaluates on strings of 44, 48 and 52 letters (quick: 52;
52 distinct letters are all [A-Za-z] has): the extrapolation the paper does not test.
"""

import ml_collections

from configs import default

SCALES = ('paper', 'small', 'quick')


def get_config(scale: str | None = None) -> ml_collections.ConfigDict:
  scale = scale or 'small'
  if scale not in SCALES:
    raise ValueError(f'configs/indirect_indexing.py:{scale}: valid scales are '
                     f'{", ".join(SCALES)}')
  config = default.get_config()
  t = config.task
  t.name = 'indirect_indexing'
  t.layout = 'autoregressive'          # the paper's decoder-only model
  t.vocab_size = 52                    # [A-Za-z]
  t.min_len, t.max_len = 20, 40        # string lengths
  t.max_shift = 15

  m = config.model
  m.position = 'pope'
  m.norm = 'pre'
  m.dropout = 0.0
  m.max_len = 64                       # >= the longest sequence, 52 + 7

  tr = config.train
  tr.schedule = 'cosine'
  tr.weight_decay = 0.01
  tr.grad_clip = 1.0

  config.eval.lengths = [20, 30, 40, 44, 48, 52]
  if scale == 'paper':
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 8, 512, 8, 2048
    tr.num_steps, tr.batch_size, tr.learning_rate = 100_000, 64, 2e-4
    tr.warmup_steps = 4000
    tr.final_lr_fraction, tr.b2 = 0.1, 0.99   # cosine to 2e-5
    m.norm_type = 'rmsnorm'
    tr.log_every, tr.checkpoint_every = 1000, 5000
    config.eval.every = 10_000
    config.eval.num_examples = 2048
  elif scale == 'small':
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 2, 64, 4, 128
    tr.num_steps, tr.batch_size, tr.learning_rate = 4000, 64, 3e-3
    tr.warmup_steps = 100
    tr.log_every, tr.checkpoint_every = 500, 1000
    config.eval.every = 1000
    config.eval.num_examples = 512
  else:
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 1, 32, 4, 64
    tr.num_steps, tr.batch_size, tr.learning_rate = 60, 32, 3e-3
    tr.warmup_steps = 10
    tr.log_every, tr.checkpoint_every = 30, 30
    config.eval.every = 60
    config.eval.num_examples = 64
    config.eval.lengths = [20, 40, 52]
  return config

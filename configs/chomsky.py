"""The length-generalization suite under the reference protocol (Deletang et
al. 2023; Ruoss et al. 2023): placeholders layout, one training length per
batch, evaluation on every length above the training range, the reference's
post-LN encoder.

Run one task (any of the 15; see docs/training.md's task table):
  python -m selfattn.main --config=configs/chomsky.py:small --workdir=runs/bucket_sort \
      --config.task.name=bucket_sort --config.model.position=rope \
      --config.model.randomize_positions=True
The run prints its score: accuracy averaged over the evaluated lengths above
config.task.max_len (summary.json: `score`).

Scales (`--config=configs/chomsky.py:small`):
  full   the papers': train 1-40, test 41-500, 5 layers of width 64 with 8
         heads, dropout 0.1, batch 128, 1,000,000 steps (Deletang et al.; they
         sweep lr over 1e-4, 3e-4, 5e-4); with
         --config.model.randomize_positions=True, positions drawn from
         [0, 2048).
         Weeks on a CPU; meant for accelerators.
  small  what experiments/length_generalization.py runs on a 2-core CPU
         (EXPERIMENTS.md justifies it): train 1-16, test 17-48, 2 layers.
  quick  a smoke test for the tests.
"""

import ml_collections

from configs import default


def get_config(scale: str | None = None) -> ml_collections.ConfigDict:
  scale = scale or 'full'
  if scale not in ('full', 'small', 'quick'):
    raise ValueError(f'configs/chomsky.py:{scale}: valid scales are full, '
                     f'small, quick')
  config = default.get_config()
  config.task.name = 'reverse_string'
  config.task.layout = 'placeholders'
  config.task.per_batch_length = True
  config.task.min_len = 1

  m = config.model
  m.position = 'rope'
  m.norm = 'post'                     # the reference encoder is post-LN
  m.residual = True

  t = config.train
  t.schedule = 'constant'             # Adam at a constant rate, as the reference
  t.warmup_steps = 0
  t.weight_decay = 0.0
  t.grad_clip = 1.0

  if scale == 'full':
    config.task.max_len = 40
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 5, 64, 8, 256
    m.dropout = 0.1
    m.max_len = m.max_random_len = 2048
    t.num_steps, t.batch_size, t.learning_rate = 1_000_000, 128, 3e-4
    t.log_every, t.checkpoint_every = 1000, 10_000
    config.eval.lengths = [20, 40] + list(range(41, 501))
    config.eval.num_examples = 512
  elif scale == 'small':
    config.task.max_len = 16
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 2, 64, 4, 128
    m.dropout = 0.0
    m.max_len = m.max_random_len = 256
    t.num_steps, t.batch_size, t.learning_rate = 2000, 64, 1e-3
    t.log_every, t.checkpoint_every = 500, 1000
    config.eval.lengths = [8, 16] + list(range(17, 49))
    config.eval.num_examples = 128
  else:
    config.task.max_len = 8
    m.num_layers, m.num_hiddens, m.num_heads, m.ffn_num_hiddens = 1, 32, 4, 64
    m.max_len = m.max_random_len = 64
    t.num_steps, t.batch_size, t.learning_rate = 150, 32, 3e-3
    t.log_every, t.checkpoint_every = 50, 50
    config.eval.lengths = [8, 9, 12]
    config.eval.num_examples = 64
  config.eval.every = t.num_steps
  return config

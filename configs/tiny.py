"""A seconds-long smoke run of the default config (also what the tests train).

Run:
  python -m selfattn.main --config=configs/tiny.py --workdir=runs/tiny
"""

from configs import default


def get_config(arg: str | None = None):
  config = default.get_config(arg)
  config.task.max_len = 8
  config.model.num_layers = 1
  config.model.num_hiddens = 16
  config.model.num_heads = 2
  config.model.ffn_num_hiddens = 32
  config.model.max_len = 64
  config.train.num_steps = 20
  config.train.batch_size = 8
  config.train.warmup_steps = 2
  config.train.log_every = 5
  config.train.checkpoint_every = 10
  config.train.keep_checkpoints = 5
  config.eval.every = 20
  config.eval.lengths = [4, 8, 12]
  config.eval.num_examples = 16
  return config

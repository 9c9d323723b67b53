"""Training throughput of the music study's CPU default (configs/music.py).

  python scripts/bench_music.py [--quick] [--positions=rope,shaw]

For each encoding: the compiled training step of configs/music.py:cpu (2
layers, width 96, 4 heads, FFN 256, windows of 256 tokens, batch 16,
dropout 0.1) called back to back on pre-generated batches, median over
rounds; tokens/s; and the fraction of this machine's float32 matmul rate
(a 2048^2 matmul through JAX, 512^2 with --quick, measured in the same run) that the step's
matmul FLOPs reach.

FLOPs are counted two ways and both printed:
  * matmul FLOPs from the shapes (2 x multiply-adds; forward + 2x for the
    backward pass): per token and layer, the q/k/v/output projections
    (4 W^2), the FFN (2 W F), q.k^T and weights.v over every key of the
    window (2 L W: the plain path computes the masked upper triangle too),
    and the output head (W V); the encoding's own work is not counted.
  * XLA's cost analysis of the compiled step (everything it executes,
    elementwise work and the optimiser included).
The roofline fraction uses the first: the work a perfect implementation
could not avoid.
"""

from __future__ import annotations

import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from configs import music as music_config  # noqa: E402
from measure import matmul_gflops, step_rates  # noqa: E402
from selfattn.tasks.music import jsb  # noqa: E402
from selfattn.training.steps import Trainer  # noqa: E402

_QUICK = flags.DEFINE_bool('quick', False, 'Fewer steps and rounds.')
_POSITIONS = flags.DEFINE_list('positions', ['none', 'rope', 'shaw', 'pope'],
                               'Encodings to measure.')


def matmul_flops_per_step(config) -> float:
  """Forward+backward matmul FLOPs of one training step, from the shapes."""
  m, t = config.model, config.task
  width, ffn, length = m.num_hiddens, m.ffn_num_hiddens, t.max_len
  per_token_layer = 2 * (4 * width * width + 2 * width * ffn
                         + 2 * length * width)
  per_token = m.num_layers * per_token_layer + 2 * width * jsb.VOCAB_SIZE
  return 3 * per_token * config.train.batch_size * length


def xla_flops(trainer: Trainer, state, batch) -> float | None:
  cost = trainer.train_step.lower(state, batch).compile().cost_analysis()
  if isinstance(cost, list):      # older JAX: one dict per program
    cost = cost[0] if cost else None
  return float(cost['flops']) if cost and 'flops' in cost else None


def bench_position(position: str, steps: int, rounds: int) -> dict:
  config = music_config.get_config('cpu')
  config.model.position = position
  trainer = Trainer(config)
  state = trainer.init_state()
  batches = [trainer.train_batch(s) for s in range(steps)]
  jax.block_until_ready(batches)
  flops_xla = xla_flops(trainer, state, batches[0])
  rate = statistics.median(step_rates(trainer.train_step, state, batches,
                                      rounds))
  tokens = config.train.batch_size * config.task.max_len
  return {'steps_per_sec': rate, 'tokens_per_sec': rate * tokens,
          'matmul_gflop_per_step': matmul_flops_per_step(config) / 1e9,
          'xla_gflop_per_step': None if flops_xla is None else flops_xla / 1e9}


def main(argv) -> None:
  del argv
  quick = _QUICK.value
  steps, rounds = (10, 2) if quick else (60, 5)
  roofline = matmul_gflops(512 if quick else 2048, 3 if quick else 7)
  print(f'# configs/music.py:cpu training step on '
        f'{jax.devices()[0].device_kind} ({jax.default_backend()}), '
        f'{os.cpu_count()} CPU cores; matmul roofline (float32 '
        f'{512 if quick else 2048}^2) {roofline:.1f} GFLOP/s; median of '
        f'{rounds} rounds of {steps} steps\n')
  print('| encoding | steps/s | tokens/s | matmul GFLOP/step | XLA GFLOP/step '
        '| fraction of roofline |')
  print('|---|---:|---:|---:|---:|---:|')
  for position in _POSITIONS.value:
    r = bench_position(position, steps, rounds)
    fraction = r['matmul_gflop_per_step'] * r['steps_per_sec'] / roofline
    xla = ('–' if r['xla_gflop_per_step'] is None
           else f'{r["xla_gflop_per_step"]:.2f}')
    print(f'| {position} | {r["steps_per_sec"]:.2f} | '
          f'{r["tokens_per_sec"]:,.0f} | {r["matmul_gflop_per_step"]:.2f} | '
          f'{xla} | {fraction:.2f} |', flush=True)


if __name__ == '__main__':
  app.run(main)

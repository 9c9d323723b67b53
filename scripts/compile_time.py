"""First-step (compile) time of a train step vs depth, loop vs scanned layers.

  python scripts/compile_time.py [--depths=2,12,24] [--position=shaw]

Prints one line per (depth, scan_layers): the wall time of the first
training step, which is almost all compilation. configs/default.py otherwise.
"""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from configs import default  # noqa: E402
from selfattn.training.steps import Trainer  # noqa: E402

_DEPTHS = flags.DEFINE_list('depths', ['2', '12', '24'], 'Numbers of layers.')
_POSITION = flags.DEFINE_string('position', 'shaw', 'Positional encoding.')


def first_step_seconds(depth: int, scan: bool, position: str = 'shaw') -> float:
  """Wall time of the first train step of configs/default.py (width 64) at
  this depth: almost all of it is compilation."""
  config = default.get_config()
  config.model.num_layers = depth
  config.model.scan_layers = scan
  config.model.position = position
  trainer = Trainer(config)
  state = trainer.init_state()
  start = time.perf_counter()
  state, metrics = trainer.advance(state)
  jax.block_until_ready(metrics)
  return time.perf_counter() - start


def main(argv):
  del argv
  for depth in map(int, _DEPTHS.value):
    loop = first_step_seconds(depth, False, _POSITION.value)
    scan = first_step_seconds(depth, True, _POSITION.value)
    print(f'depth {depth:3d}: loop {loop:6.1f} s, scan_layers {scan:6.1f} s, '
          f'ratio {scan / loop:.2f}', flush=True)


if __name__ == '__main__':
  app.run(main)

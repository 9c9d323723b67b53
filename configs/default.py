"""Default: reverse a string with a 2-layer sinusoidal encoder.

Takes 26 s on the idle 2-core CPU (measured 2026-11-25; 56 s with a study
running beside it, 2026-11-22).

Run:
  python -m selfattn.main --config=configs/default.py --workdir=runs/default

Override any field from the command line, e.g.
  --config.model.position=shaw --config.model.clip_distance=8
  --config.task.name=sort --config.train.num_steps=3000
Rerunning the same command on the same workdir resumes from its last checkpoint.
Watch with: tensorboard --logdir runs

Every field, its default and what it means: selfattn/training/default_config.py
(inside the package, so that projects which pip-install selfattn build on it
too).
"""

from selfattn.training.default_config import get_config

__all__ = ['get_config']

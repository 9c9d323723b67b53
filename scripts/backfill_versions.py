"""Adds `versions` to the committed runs' summary.json files that predate it.

Run once from the repository root (2026-11-27, when the project moved from
JAX 0.10.2 on Python 3.11 to JAX 0.12 on Python 3.12):

    python scripts/backfill_versions.py

Since then `train_and_evaluate` records the stack itself
(`selfattn.training.software.versions`); runs trained before it did not. What they ran
on is known from the repository's history, and each backfilled record says so
in its `recorded` field:

- every CPU run: requirements.txt's pins, which never changed for these
  packages before this move (jax/jaxlib 0.10.2, flax 0.12.8, optax 0.2.8,
  orbax-checkpoint 0.12.8, numpy 2.4.6), on the machine's Python 3.11.7;
- the 48 length-generalization runs of commits 2150c5d and e56b3bd: a lent
  H100 running its image's JAX 0.11.2 (EXPERIMENTS.md, section 5); the rest
  of that image's stack was not recorded, so it stays None.

A summary that already has `versions` is left alone, so running it again
changes nothing.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from selfattn.training import workdir as workdir_lib  # noqa: E402

CPU_STACK = {
    'python': '3.11.7', 'jax': '0.10.2', 'jaxlib': '0.10.2', 'flax': '0.12.8',
    'optax': '0.2.8', 'orbax-checkpoint': '0.12.8', 'numpy': '2.4.6',
    'backend': 'cpu', 'device_kind': 'cpu',
    'recorded': "backfilled 2026-11-27: requirements.txt's pins when the run "
                'was trained (scripts/backfill_versions.py)',
}
H100_STACK = {
    'python': None, 'jax': '0.11.2', 'jaxlib': '0.11.2', 'flax': None,
    'optax': None, 'orbax-checkpoint': None, 'numpy': None,
    'backend': 'gpu', 'device_kind': 'NVIDIA H100 80GB HBM3',
    'recorded': "backfilled 2026-11-27: a lent H100's image, JAX 0.11.2 "
                '(EXPERIMENTS.md section 5); the rest was not recorded '
                '(scripts/backfill_versions.py)',
}
# The commits that added the length-generalization study's GPU runs.
H100_COMMITS = ('2150c5d', 'e56b3bd')


def added_in(commit: str) -> set[str]:
  out = subprocess.run(
      ['git', 'show', '--diff-filter=A', '--name-only', '--format=', commit],
      check=True, capture_output=True, text=True).stdout
  return {line for line in out.splitlines() if line.endswith('summary.json')}


def main() -> None:
  on_h100 = set().union(*(added_in(c) for c in H100_COMMITS))
  changed = {'cpu': 0, 'gpu': 0}
  for path in sorted(glob.glob('experiments/results/**/summary.json',
                               recursive=True)):
    with open(path) as f:
      summary = json.load(f)
    if 'versions' in summary:
      continue
    gpu = path in on_h100
    summary['versions'] = dict(H100_STACK if gpu else CPU_STACK)
    workdir_lib.write_json(path, summary)
    changed['gpu' if gpu else 'cpu'] += 1
  print(f'backfilled {changed["cpu"]} CPU and {changed["gpu"]} H100 runs '
        f'({len(on_h100)} H100 summaries in {", ".join(H100_COMMITS)})')


if __name__ == '__main__':
  main()

#!/usr/bin/env bash
# Runs every study at the settings EXPERIMENTS.md reports, one after another,
# into runs/<study>; then `tensorboard --logdir runs` compares them.
# About 45 minutes on a 2-core CPU with these seed counts; raise --seeds for
# tighter error bars (each driver's time grows linearly with it).
set -euo pipefail
cd "$(dirname "$0")/.."
python -m experiments.chapter --workdir=runs/chapter
python -m experiments.compare_positions --workdir=runs/compare --task=reverse --seeds=2
python -m experiments.exercise1_depth --workdir=runs/exercise1 --seeds=1
python -m experiments.exercise2_learned --workdir=runs/exercise2 --seeds=2
python -m experiments.exercise3_relative --workdir=runs/exercise3 --seeds=1

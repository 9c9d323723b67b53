#!/usr/bin/env bash
# Copies the results.md, results.json and PNGs of the chapter, compare and
# exercise 1-3 studies from runs/ into experiments/results/ (tracked), where
# EXPERIMENTS.md links them. The other studies' committed results hold their
# run directories too (length generalization, indirect indexing, music,
# translation): run those with --workdir=experiments/results/<study>, as
# `scripts/run_experiments.sh experiments/results` does for every study but
# translation (its own commands, EXPERIMENTS.md section 8).
set -euo pipefail
cd "$(dirname "$0")/.."
for study in chapter compare exercise1 exercise2 exercise3; do
  [ -f "runs/$study/results.md" ] || continue   # not run (or not finished) yet
  mkdir -p "experiments/results/$study"
  cp runs/$study/results.md runs/$study/results.json runs/$study/*.png "experiments/results/$study/"
done

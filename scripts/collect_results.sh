#!/usr/bin/env bash
# Copies each study's results.md, results.json and PNGs from runs/ into
# experiments/results/ (tracked), where EXPERIMENTS.md links them.
set -euo pipefail
cd "$(dirname "$0")/.."
for study in chapter compare exercise1 exercise2 exercise3; do
  [ -f "runs/$study/results.md" ] || continue   # not run (or not finished) yet
  mkdir -p "experiments/results/$study"
  cp runs/$study/results.md runs/$study/results.json runs/$study/*.png "experiments/results/$study/"
done

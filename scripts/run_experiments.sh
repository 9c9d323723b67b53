#!/usr/bin/env bash
# Runs the studies of EXPERIMENTS.md sections 0-7 but stack_check (section 4)
# and the convergence checks (sections 5, 6 and 7); translation (section 8) has its own
# commands. At five seeds where a study has seeds, one
# after another,
# into runs/<study> (or $1/<study>); then `tensorboard --logdir runs` compares
# them. Every driver is resumable: rerunning this script skips finished runs,
# resumes unfinished ones from their checkpoints and re-collects the tables,
# so it can be stopped (Ctrl-C) and restarted at any point.
#
# Each study's wall time on this machine is printed and appended to
# <root>/timings.txt. `scripts/run_experiments.sh experiments/results`
# regenerates the committed results in place. Expect most of a day on a
# 2-core CPU. Measured there at five seeds
# (experiments/results/timings.txt): compare 19 min, compare_long about
# 90 min, compare_30k 44 min, exercise1 82 min, exercise1_lr 30 min,
# exercise2 23 min, exercise3 53 min; length_generalization about 6.7 h
# (390 runs at about 62 s each; EXPERIMENTS.md section 5; PoPE adds 60),
# indirect_indexing about 4 h (50 runs, 2-11 min each), music needs the JSB data file
# (selfattn/tasks/music/jsb.py). `--shard=i/n` on
# length_generalization splits it over machines.
set -euo pipefail
cd "$(dirname "$0")/.."
root="${1:-runs}"
mkdir -p "$root"

run() {
  local name="$1"; shift
  local start=$SECONDS
  echo "== $name: python -m $*" >&2
  python -m "$@"
  local took=$((SECONDS - start))
  printf '%s\t%dm%02ds\t%s\n' "$name" $((took / 60)) $((took % 60)) "$(date -Is)" \
    | tee -a "$root/timings.txt" >&2
}

run chapter experiments.chapter --workdir="$root/chapter"
run compare experiments.compare_positions --workdir="$root/compare" --task=reverse --seeds=5
run compare_long experiments.compare_positions --workdir="$root/compare_long" --task=reverse --seeds=5 --steps=10000
run compare_30k experiments.compare_positions --workdir="$root/compare_30k" --task=reverse --seeds=5 --steps=30000 --positions=t5,alibi
run exercise1 experiments.exercise1_depth --workdir="$root/exercise1" --seeds=5
run exercise1_lr experiments.exercise1_learning_rate --workdir="$root/exercise1_lr" --seeds=5
run exercise2 experiments.exercise2_learned --workdir="$root/exercise2" --seeds=5
run exercise3 experiments.exercise3_relative --workdir="$root/exercise3" --seeds=5
run lengthgen experiments.length_generalization --workdir="$root/lengthgen"
run indirect_indexing experiments.indirect_indexing --workdir="$root/indirect_indexing"
run music experiments.music --workdir="$root/music"

#!/usr/bin/env bash
# Re-collects committed studies from clean copies of their committed files
# and compares results.md / results.json byte for byte with the committed
# ones (issue 48's check that a move of the code changed no result).
#
#   scripts/recollect_studies.sh [OUT]        # default OUT: /tmp/recollect
#
# Each study's git-tracked files are copied to OUT/<study> without its
# results.md/json; its driver then runs there (the skeleton drivers with
# --collect_only; exercise 1 and the chapter skip finished runs). A driver that
# would train (its study runner reports runs to train) is stopped at once
# and reported. Prints one line per file (identical / DIFFERS / missing)
# and per study (exit status, seconds). Needs SELFATTN_DATA_DIR for music.
set -u
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/recollect}
PY=${PYTHON:-python3}
rm -rf "$OUT"; mkdir -p "$OUT"

run() {   # run STUDY MODULE [ARGS...]
  local dir=$1 mod=$2
  shift 2
  git ls-files "experiments/results/$dir" | while read -r f; do
    local dest="$OUT/${f#experiments/results/}"
    mkdir -p "$(dirname "$dest")"; cp "$f" "$dest"
  done
  rm -f "$OUT/$dir/results.md" "$OUT/$dir/results.json"   # must be rewritten
  local t0 rc
  t0=$(date +%s)
  "$PY" -m "experiments.$mod" --workdir="$OUT/$dir" "$@" > "$OUT/$dir.log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if grep -qE "[1-9][0-9]* to train" "$OUT/$dir.log"; then
      echo "$dir: would train ($(grep -oE '[0-9]+ of [0-9]+ runs finished, [0-9]+ to train' "$OUT/$dir.log" | head -1)); stopped"
      kill "$pid"
      break
    fi
    sleep 2
  done
  wait "$pid"; rc=$?
  for f in results.md results.json; do
    if [ ! -f "$OUT/$dir/$f" ]; then echo "$dir/$f missing"
    elif cmp -s "experiments/results/$dir/$f" "$OUT/$dir/$f"; then echo "$dir/$f identical"
    else echo "$dir/$f DIFFERS"; fi
  done
  echo "$dir: exit $rc, $(( $(date +%s) - t0 )) s (log: $OUT/$dir.log)"
}

run chapter chapter
run compare compare_positions --task=reverse --collect_only
run compare_long compare_positions --task=reverse --collect_only --steps=10000
run compare_30k compare_positions --task=reverse --collect_only --steps=30000 --positions=t5,alibi
# Not re-collectable from a clean copy: its position probe reads the trained
# models' checkpoints, which are never committed (one line, exit 2).
run exercise1 exercise1_depth
run exercise1_lr exercise1_learning_rate
run exercise2 exercise2_learned --collect_only
run exercise3 exercise3_relative --collect_only
run exercise3_long exercise3_relative --collect_only --steps=5000 --seeds=3
run indirect_indexing indirect_indexing --collect_only
run lengthgen length_generalization --collect_only
run music music --collect_only
run music_convergence music_convergence --collect_only
run music_meter_convergence music_meter_convergence --collect_only
run translation_convergence translation_convergence --collect_only
run indirect_indexing_convergence indirect_indexing_convergence --collect_only
run lengthgen_convergence length_generalization_convergence --collect_only

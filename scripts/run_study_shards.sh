#!/usr/bin/env bash
# Splits the length-generalization study over N processes on one machine
# (a many-core host, or one accelerator shared by several processes):
#   scripts/run_study_shards.sh N WORKDIR [driver flags...]
# Each process trains every N-th run (--shard=i/N) and logs to WORKDIR/shard_i.log;
# finished runs are skipped, so rerunning continues the study. The results are
# collected at the end (and by any later run of the driver).
set -euo pipefail
cd "$(dirname "$0")/.."
n=$1; workdir=$2; shift 2
mkdir -p "$workdir"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # several processes share a GPU
for ((i = 0; i < n; i++)); do
  python -m experiments.length_generalization --workdir="$workdir" \
      --shard="$i/$n" "$@" > "$workdir/shard_$i.log" 2>&1 &
done
wait || true
python -m experiments.length_generalization --workdir="$workdir" --collect_only "$@"

#!/usr/bin/env bash
# Splits the length-generalization study over N processes on one machine
# (a many-core host, or one accelerator shared by several processes):
#   scripts/run_study_shards.sh N WORKDIR [driver flags...]
# Each process trains every N-th run (--shard=i/N) and logs to WORKDIR/shard_i.log;
# finished runs are skipped, so rerunning continues the study. The results are
# collected at the end (and by any later run of the driver).
# Exit status: 0 when every shard finished its runs and the results were
# collected; 75 (EX_TEMPFAIL) when one stopped between runs
# (--stop_between_runs_after; rerun to continue); 1 when a shard failed
# otherwise (each failing shard and its log are named); else the collecting
# call's own status.
set -euo pipefail
cd "$(dirname "$0")/.."
n=$1; workdir=$2; shift 2
mkdir -p "$workdir"
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # several processes share a GPU
pids=()
for ((i = 0; i < n; i++)); do
  python -m experiments.length_generalization --workdir="$workdir" \
      --shard="$i/$n" "$@" > "$workdir/shard_$i.log" 2>&1 &
  pids+=($!)
done
stopped=0; failed=0
for ((i = 0; i < n; i++)); do
  status=0
  wait "${pids[$i]}" || status=$?
  if ((status == 75)); then
    stopped=1
  elif ((status != 0)); then
    failed=1
    echo "shard $i/$n exited with status $status; see $workdir/shard_$i.log" >&2
  fi
done
# Collecting trains nothing, and the driver refuses a time limit with it.
collect=(); skip=0
for arg in "$@"; do
  if ((skip)); then skip=0; continue; fi
  case "$arg" in
    --stop_between_runs_after=*) ;;
    --stop_between_runs_after) skip=1 ;;      # its value is the next word
    *) collect+=("$arg") ;;
  esac
done
collected=0
python -m experiments.length_generalization --workdir="$workdir" --collect_only \
    ${collect[@]+"${collect[@]}"} || collected=$?
# (It fails with 2 where no run has finished yet: the shards' outcome says
# more.)
if ((failed)); then exit 1; fi
if ((stopped)); then
  echo "a shard stopped between runs (--stop_between_runs_after); rerun the same command to continue" >&2
  exit 75
fi
exit "$collected"

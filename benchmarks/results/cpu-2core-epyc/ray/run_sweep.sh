#!/bin/bash
# k = 1 vs 2 Ray workers on the same small table1 sweep (and the single-process run), timed end to end.
# From the repository root: ROUNDS="a" ORDER="single k1 k2" benchmarks/results/cpu-2core-epyc/ray/run_sweep.sh
# (this folder's runs: round a in that order, round b with ORDER="k2 k1"); then summarize.py.
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1
OUT=benchmarks/results/cpu-2core-epyc/ray
COMMON="table1 --k 8 --n 4 --max-new-tokens 32 --threads 1 --no-best-of-m --no-plot --quiet --out-dir $OUT"
run() { tag=$1; shift; s=$(date +%s.%N); l=$(cat /proc/loadavg); python3 -m benchmarks $COMMON --tag $tag "$@" > "${LOG_DIR:-/tmp}/$tag.log" 2>&1; rc=$?; e=$(date +%s.%N); echo "{\"tag\": \"$tag\", \"command\": \"python -m benchmarks $COMMON --tag $tag $*\", \"rc\": $rc, \"end_to_end_s\": $(echo "$e - $s" | bc), \"loadavg_before\": \"$l\", \"loadavg_after\": \"$(cat /proc/loadavg)\"}" >> $OUT/runs.jsonl; }
for round in $ROUNDS; do
  for what in ${ORDER:-single k1 k2}; do
    case $what in
      single) run single_$round ;;
      k1) run ray_k1_$round --ray --ray-workers 1 ;;
      k2) run ray_k2_$round --ray --ray-workers 2 ;;
    esac
  done
done

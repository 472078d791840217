#!/usr/bin/env bash
# The TP decode bar: TP=2 (2 ranks × 1 thread) against TP=1 (1 process × 2 threads, and × 1
# thread) on the same workload, interleaved twice so host drift hits all alike. Run under the
# exclusive measurement lock from the repository root:
#   flock /tmp/chorus-measure.lock bash docs/bench/2026-11-28-tp/run.sh MODEL.gguf OUTDIR
set -euo pipefail
MODEL=$1
OUT=$2
C=${CHORUS_BIN:-build/release/apps/chorus/chorus}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ARGS=(--model "$MODEL" --batches 32 --context 32 --decode-steps 16 --repeats 3)
mkdir -p "$OUT"
for round in 1 2; do
  echo "round $round loadavg before: $(cat /proc/loadavg)"
  $C bench --tp 1 --threads 2 "${ARGS[@]}" --out "$OUT/tp1-t2-r$round" 2>>"$OUT/log.txt"
  mpirun -np 2 --bind-to none $C bench --tp 2 --threads 1 "${ARGS[@]}" --out "$OUT/tp2-t1-r$round" \
    2>>"$OUT/log.txt"
  $C bench --tp 1 --threads 1 "${ARGS[@]}" --out "$OUT/tp1-t1-r$round" 2>>"$OUT/log.txt"
  echo "round $round loadavg after: $(cat /proc/loadavg)"
done

#!/usr/bin/env bash
# Issue 20's speed bars, six invocations with the dtype order alternated (docs/benchmarks.md,
# "The open bars re-measured on 2026-12-03"). Usage: OUT=DIR docs/bench/2026-12-03-bars/issue20-run.sh
set -u
cd "$(dirname "$0")/../../.."
OUT=${OUT:?set OUT to the results folder}
mkdir -p "$OUT"
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then d=q4_0,q4_k_m; else d=q4_k_m,q4_0; fi
  echo "== run $i dtypes $d $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  ./build/release/apps/chorus/chorus bench --shape tinyllama-1.1b --dtypes "$d" --threads 2 \
      --batches 1,32 --decode-steps 32 --repeats 3 --prefill 512 --context 32 \
      --out "$OUT/r$i" 2>&1 | grep -v "^bench:"
done
echo "== done $(date -u +%H:%M:%S)"

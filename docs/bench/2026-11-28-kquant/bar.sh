#!/bin/bash
# One invocation of issue 20's bar command with the new binary: $1 = dtype order, $2 = out name.
cd /work/wt-kquant/docs/bench/2026-11-28-kquant
echo "start $(date -u +%T) load $(cat /proc/loadavg)"
/tmp/kq/chorus_new bench --shape tinyllama-1.1b --dtypes "$1" --threads 2 --prefill 512 --batches 1,32 \
  --decode-steps 16 --context 32 --repeats 3 --out "$2"
echo "end $(date -u +%T) load $(cat /proc/loadavg)"

#!/usr/bin/env bash
# Rounds of the saturated bar-(b) plan: delta server at --max-deltas 0/4/8 and the swap server.
set -u
cd /work/main
export METHOD=bitdelta RATE=2 NUM=64 HOST_CACHE=4096 OUT=/tmp/nsweep
for round in $@; do
  for pop in zipf uniform; do
    for n in 0 4 8; do
      RUN_TAG=n$n-r$round SERVE_FLAGS="--prefault --max-deltas $n" bash bench/serve/delta_vs_swap.sh run delta $pop 2>&1 | tail -1
    done
    RUN_TAG=swap-r$round SERVE_FLAGS="--prefault" bash bench/serve/delta_vs_swap.sh run swap $pop 2>&1 | tail -1
  done
done

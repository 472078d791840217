#!/usr/bin/env bash
# Rounds of the saturated bar-(b) plan: delta server at --max-deltas 0/4/8 and the swap server.
# Usage: OUT=DIR docs/bench/2026-12-03-max-deltas/rounds.sh ROUND... (after the bitdelta setup).
set -u
cd "$(dirname "$0")/../../.."
export METHOD=bitdelta RATE=2 NUM=64 HOST_CACHE=4096 OUT=${OUT:?set OUT to the results folder}
for round in "$@"; do
  for pop in zipf uniform; do
    for n in 0 4 8; do
      RUN_TAG=n$n-r$round SERVE_FLAGS="--prefault --max-deltas $n" bash bench/serve/delta_vs_swap.sh run delta $pop 2>&1 | tail -1
    done
    RUN_TAG=swap-r$round SERVE_FLAGS="--prefault" bash bench/serve/delta_vs_swap.sh run swap $pop 2>&1 | tail -1
  done
done

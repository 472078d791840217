#!/bin/bash
# A/B of the batch-1 K path: old binary (main's kernels) vs new (RowPanels), alternating.
cd /work/wt-kquant/docs/bench/2026-11-28-kquant
F='^(q4_0|q4_k|q6_k)/(5632x2048|32000x2048)/m:1/'
echo "load before $(cat /proc/loadavg) $(date -u +%T)"
for round in 1 2; do
  for isa in avx512 avx2; do
    for bin in old new; do
      b=/tmp/kq/matmul_bench_old; [ $bin = new ] && b=/tmp/kq/matmul_bench_new
      echo "=== round $round isa $isa bin $bin $(date -u +%T) load $(cat /proc/loadavg)"
      CHORUS_ISA=$isa $b --benchmark_filter="$F" --benchmark_min_time=0.2 2>&1 | grep -E "^(q4|q6)"
    done
  done
done
echo "load after $(cat /proc/loadavg) $(date -u +%T)"

#!/bin/bash
# KPF variants: 0 t1/d2 (current), 1 nta, 2 t2, 3 t0, 4 none, 5 t1/d1, 6 t1/d4
B=/work/main/build/release/bench/matmul_bench
for round in 1 2; do
  echo "== round $round $(date +%T) load $(cut -d' ' -f1 /proc/loadavg)"
  $B --benchmark_filter='^(read/bytes:268435456/threads:2|stream/q4_0/threads:2)' --benchmark_min_time=0.5 2>/dev/null | grep -E "read|stream" | awk '{print "ref", $1, $NF, $(NF-1)}'
  for v in 0 1 2 3 4 5 6; do
    KPF=$v $B --benchmark_filter='^stream/(q4_k|q6_k)/threads:(1|2)' --benchmark_min_time=0.5 2>/dev/null | grep stream | awk -v v=$v '{print "KPF" v, $1, $(NF-1), $NF}'
  done
done

#!/bin/bash
for r in 1 2 3 4; do
  for kv in bf16 f32; do
    for b in old new; do
      bin=/work/main/build/release/apps/chorus/chorus; [ $b = old ] && bin=/tmp/old/build/apps/chorus/chorus
      echo "round $r $b kv $kv load $(cut -d' ' -f1 /proc/loadavg) $(date +%H:%M:%S)"
      $bin bench --shape tinyllama-1.1b --dtypes q4_0 --threads 2 --batches 1 --decode-steps 32 --repeats 3 --prefill 16 --context 4000 --kv-dtype $kv 2>&1 | grep -E "decode"
    done
  done
done

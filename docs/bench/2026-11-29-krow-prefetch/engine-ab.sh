#!/bin/bash
# K-quant batch-1 decode, old (9f36121) vs new (K row prefetch), alternating.
for r in 1 2 3; do
  for b in old new; do
    bin=/tmp/abk/chorus-new; [ $b = old ] && bin=/tmp/old/build/apps/chorus/chorus
    echo "round $r $b load $(cut -d' ' -f1 /proc/loadavg) $(date +%H:%M:%S)"
    $bin bench --shape tinyllama-1.1b --dtypes q4_0,q4_k_m,q6_k --threads 2 --batches 1 --decode-steps 32 --repeats 3 --prefill 16 --context 32 2>&1 | grep -E "decode"
  done
done

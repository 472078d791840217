#!/bin/bash
cd /work/main
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then d=q4_0,q4_k_m; else d=q4_k_m,q4_0; fi
  echo "== run $i dtypes $d $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
  ./build/release/apps/chorus/chorus bench --shape tinyllama-1.1b --dtypes $d --threads 2 --batches 1,32 --decode-steps 32 --repeats 3 --prefill 512 --context 32 --out /tmp/b20/r$i 2>&1 | grep -v "^bench:"
done
echo "== done $(date -u +%H:%M:%S)"

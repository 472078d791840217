#!/bin/bash
# Batch-1 decode, the K row path's prefetch into L1 (prefetcht0, KPF_LOC=3: the old build's
# hint) against L2 (prefetcht1, KPF_LOC=2), the same binary, alternating. KPF_* were a
# temporary experiment switch read by ktile::RowPanels; the committed kernel hard-codes T1.
B=${CHORUS:-build/release/apps/chorus/chorus}
for round in 1 2 3; do
  for loc in 3 2; do
    echo "=== round $round KPF_LOC=$loc $(date -u +%H:%M:%S) load $(cut -d' ' -f1-3 /proc/loadavg)"
    KPF_LOC=$loc $B bench --shape tinyllama-1.1b --dtypes q4_0,q4_k_m --threads 2 --batches 1 \
      --decode-steps 32 --repeats 3 --prefill 16 --context 32 2>&1 | grep -E "decode|probe|roofline|dtype" 
  done
done

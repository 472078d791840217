#!/bin/bash
for r in 1 2 3 4; do
  for b in old new; do
    bin=/work/main/build/release/apps/chorus/chorus; [ $b = old ] && bin=/tmp/chorus_old
    echo "$r $b $(date +%T) load $(cut -d' ' -f1 /proc/loadavg) $($bin bench --model /tmp/tl-q4km.gguf --threads 2 --batches 1 --decode-steps 128 --repeats 3 --prefill 16 --context 32 2>/dev/null | grep -E 'decode  ' | sed 's/ *(.*//')"
  done
done

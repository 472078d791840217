#!/bin/bash
# Resident memory of a server with a delta registered, once ready: the base's bf16 matrices
# repacked (2.0 GB) and, before BaseWeightsHash paged sources out as it read them, the whole
# file read back in by hashing it.
for b in OLD NEW; do
  bin=/work/old/build/release/apps/chorus/chorus; [ $b = NEW ] && bin=/work/main/build/release/apps/chorus/chorus
  $bin serve --model base.gguf --delta bd=bd-200.safetensors --port 18231 --tokenizer /work/shared/models/llama2-tokenizer/tokenizer.model > serve-$b.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf localhost:18231/health > /dev/null && break; sleep 1; done
  echo "$b: $(grep -E 'RssAnon|RssFile' /proc/$pid/status | tr -s ' \t\n' ' ')"
  kill $pid; wait $pid 2>/dev/null
done

#!/bin/bash
# Resident memory of a server with a delta registered, once ready: the base's bf16 matrices
# repacked (2.0 GB) and, before BaseWeightsHash paged sources out as it read them, the whole
# file read back in by hashing it.
# OLD / NEW: the two builds' chorus binaries (main 88488f4 and the read-not-load change).
# Binaries and M (the shared model assets) default to paths relative to a clone's root; run
# from the directory holding the models with absolute paths set.
OLD=${OLD:?set OLD to the old build chorus binary} NEW=${NEW:-build/release/apps/chorus/chorus}
TOK=${TOK:-../shared/models/llama2-tokenizer/tokenizer.model}
for b in OLD NEW; do
  bin=$OLD; [ $b = NEW ] && bin=$NEW
  $bin serve --model base.gguf --delta bd=bd-200.safetensors --port 18231 --tokenizer "$TOK" > serve-$b.log 2>&1 &
  pid=$!
  for i in $(seq 1 120); do curl -sf localhost:18231/health > /dev/null && break; sleep 1; done
  echo "$b: $(grep -E 'RssAnon|RssFile' /proc/$pid/status | tr -s ' \t\n' ' ')"
  kill $pid; wait $pid 2>/dev/null
done

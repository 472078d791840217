#!/bin/bash
# Fidelity of BitDelta at TinyLlama shape: the base, the bitdelta delta (bd-200: its distillation
# kept sign x mean) and rtn 2-bit+2:4, each against the fine-tune on the first 12,000 bytes of the "things"
# held-out text. Run in the directory holding base.gguf, ft.gguf and the deltas.
# Binaries and M (the shared model assets) default to paths relative to a clone's root; run
# from the directory holding the models with absolute paths set.
set -e
B=${CHORUS:-build/release/apps/chorus/chorus}
M=${M:-../shared/models}  # the shared model assets
TOK=$M/llama2-tokenizer/tokenizer.model
head -c 12000 $M/stories260K-finetunes/things/data/heldout.txt > heldout-12k.txt
for v in none bd-200 rtn-2-24; do
  if [ $v = none ]; then VA=(); else VA=(--variant $v.safetensors); fi
  /usr/bin/time -f "%e s %M KB" $B eval --model base.gguf "${VA[@]}" --tokenizer $TOK --data heldout-12k.txt --ctx 256 --kl-reference ft.gguf --json > eval-$v.log 2>&1
done

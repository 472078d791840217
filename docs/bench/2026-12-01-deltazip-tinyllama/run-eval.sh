#!/bin/bash
set -e
B=/work/main/build/release/apps/chorus/chorus
TOK=/work/shared/models/llama2-tokenizer/tokenizer.model
/usr/bin/time -f "%e s %M KB" $B compress --base base.gguf --finetuned ft.gguf --method rtn --bits 2 --sparsity 2:4 --output rtn-2-24.safetensors > rtn.log 2>&1
for v in none rtn-2-24 dz-2-24; do
  if [ $v = none ]; then VA=(); else VA=(--variant $v.safetensors); fi
  /usr/bin/time -f "%e s %M KB" $B eval --model base.gguf "${VA[@]}" --tokenizer $TOK --data heldout-12k.txt --ctx 256 --kl-reference ft.gguf --json > eval-$v.log 2>&1
done
echo done > eval.done

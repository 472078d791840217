#!/usr/bin/env bash
# The quality bar of docs/finetuning.md: trains a LoRA with `chorus finetune` on the stories260K
# "things" text (rank 8, all seven linears) and evaluates it, the base and the reference adapter
# (things/lora) with `chorus eval` on the held-out text: perplexity in llama.cpp windows and the
# greedy task hit rate (beach / kite / cat in the continuations of the three task prompts, as
# tools/delta_fidelity.sh computes it).
# Usage: tools/finetune_quality.sh [OUT_DIR]     (env THREADS=2; FINETUNE_ARGS to override)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${CHORUS:-$ROOT/build/release/apps/chorus/chorus}
M=${MODELS:-$ROOT/../shared/models}
T=$M/stories260K-finetunes/things
BASE=$M/stories260K/stories260K.bin
TOK=$M/stories260K/tok512.bin
OUT=${1:-/tmp/finetune-quality}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
read -r -a ARGS <<< "${FINETUNE_ARGS:---targets q,k,v,o,gate,up,down --rank 8 --alpha 16 --lr 2e-3 --steps 200 --warmup 10 --batch 16 --seq-len 256 --save-every 50}"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)" > "$OUT/load.txt"
"$B" finetune --model "$BASE" --tokenizer "$TOK" --data "$T/data/train.txt" \
  --eval "$T/data/heldout.txt" "${ARGS[@]}" --threads "$THREADS" --output "$OUT/adapter" \
  > "$OUT/finetune.out" 2> "$OUT/finetune.err"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/load.txt"
python3 "$ROOT/tools/plot.py" loss "$OUT/adapter/loss.csv" -o "$OUT/loss.png" >/dev/null || true
EVAL=(--model "$BASE" --tokenizer "$TOK" --data "$T/data/heldout.txt" --threads "$THREADS"
      --greedy-prompt "They went to the" --greedy-prompt "She played with her" --greedy-prompt "He had a pet")
"$B" eval "${EVAL[@]}" > "$OUT/base.eval" 2>/dev/null
"$B" eval "${EVAL[@]}" --variant "$T/lora" > "$OUT/reference.eval" 2>/dev/null
"$B" eval "${EVAL[@]}" --variant "$OUT/adapter" > "$OUT/finetuned.eval" 2>/dev/null
hits() {
  local f=$1 n=0
  grep -q '^greedy "They went to the" -> .*beach' "$f" && n=$((n+1))
  grep -q '^greedy "She played with her" -> .*kite' "$f" && n=$((n+1))
  grep -q '^greedy "He had a pet" -> .*cat' "$f" && n=$((n+1))
  python3 -c "print(f'{$n/3:.2f}')"
}
{
  echo "| variant | held-out perplexity (chorus eval) | task hit rate |"
  echo "| --- | --- | --- |"
  for v in base reference finetuned; do
    echo "| $v | $(sed -n 's/^perplexity //p' "$OUT/$v.eval") | $(hits "$OUT/$v.eval") |"
  done
} | tee "$OUT/table.md"

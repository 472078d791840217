#!/usr/bin/env bash
# The fidelity table of docs/deltas.md: compresses the real full fine-tune of stories260K
# ("things", ../shared/models/stories260K-finetunes/things) with every method and setting, and
# evaluates each delta (dense reconstruction) on the held-out text against the fine-tune.
# Usage: tools/delta_fidelity.sh [OUT_DIR]   (raw outputs and table.md land in OUT_DIR)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${CHORUS:-$ROOT/build/release/apps/chorus/chorus}
M=${MODELS:-$ROOT/../shared/models}
T=$M/stories260K-finetunes/things
BASE=$M/stories260K/stories260K.bin
TOK=$M/stories260K/tok512.bin
OUT=${1:-/tmp/delta-fidelity}
mkdir -p "$OUT"
EVAL=(--tokenizer "$TOK" --data "$T/data/heldout.txt" --kl-reference "$T/full.bin" --json
      --greedy-prompt "They went to the" --greedy-prompt "She played with her" --greedy-prompt "He had a pet")
COMMON=(--base "$BASE" --finetuned "$T/full.bin" --tokenizer "$TOK" --calib "$T/data/train.txt")

hits() {  # task hit rate from the greedy lines: beach / kite / cat in the matching continuation
  local f=$1 n=0
  grep -q '^greedy "They went to the" -> .*beach' "$f" && n=$((n+1))
  grep -q '^greedy "She played with her" -> .*kite' "$f" && n=$((n+1))
  grep -q '^greedy "He had a pet" -> .*cat' "$f" && n=$((n+1))
  python3 -c "print(f'{$n/3:.2f}')"
}

run() {  # name, compress args...
  local name=$1; shift
  if [ "$name" = base ]; then
    "$B" eval --model "$BASE" "${EVAL[@]}" > "$OUT/$name.eval" 2>/dev/null
    echo "- -" > "$OUT/$name.ratio"
  elif [ "$name" = lora ]; then
    "$B" eval --model "$BASE" --variant "$T/lora" "${EVAL[@]}" > "$OUT/$name.eval" 2>/dev/null
    echo "- -" > "$OUT/$name.ratio"
  elif [ "$name" = full ]; then
    "$B" eval --model "$T/full.bin" "${EVAL[@]}" > "$OUT/$name.eval" 2>/dev/null
    echo "1.00 -" > "$OUT/$name.ratio"
  else
    "$B" compress "${COMMON[@]}" "$@" --output "$OUT/$name.safetensors" > "$OUT/$name.compress" 2> "$OUT/$name.compress.log"
    "$B" eval --model "$BASE" --variant "$OUT/$name.safetensors" "${EVAL[@]}" > "$OUT/$name.eval" 2>/dev/null
    local m w
    m=$(sed -n 's/^matrices: .*: \([0-9.]*\)x smaller$/\1/p' "$OUT/$name.compress")
    w=$(sed -n 's/^whole file: .*: \([0-9.]*\)x smaller$/\1/p' "$OUT/$name.compress")
    echo "$m $w" > "$OUT/$name.ratio"
  fi
  echo "done $name" >&2
}

run base
run full
run lora
run rtn-4-24     --method rtn --bits 4 --sparsity 2:4
run rtn-2-24     --method rtn --bits 2 --sparsity 2:4
run rtn-4-dense  --method rtn --bits 4 --sparsity none
run bitdelta-0   --method bitdelta --distill-steps 0 --calib-tokens 8192
run bitdelta     --method bitdelta --distill-steps 200 --calib-tokens 8192
run dz-4-24      --method deltazip --bits 4 --sparsity 2:4 --calib-tokens 0 --calib-seq-len 256
run dz-3-24      --method deltazip --bits 3 --sparsity 2:4 --calib-tokens 0 --calib-seq-len 256
run dz-2-24      --method deltazip --bits 2 --sparsity 2:4 --calib-tokens 0 --calib-seq-len 256
run dz-4-dense   --method deltazip --bits 4 --sparsity none --calib-tokens 0 --calib-seq-len 256

base_kl=$(python3 -c "import json;print(json.loads(open('$OUT/base.eval').read().strip().splitlines()[-1])['kl_divergence'])")
{
  echo "| variant | matrices ratio | file ratio | KL to full.bin | KL / base KL | same top token | held-out ppl | task hit rate |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for name in base full lora rtn-4-24 rtn-2-24 rtn-4-dense bitdelta-0 bitdelta dz-4-24 dz-3-24 dz-2-24 dz-4-dense; do
    read -r mr wr < "$OUT/$name.ratio"
    python3 - "$OUT/$name.eval" "$name" "$mr" "$wr" "$base_kl" "$(hits "$OUT/$name.eval")" <<'PY'
import json, sys
f, name, mr, wr, base_kl, hit = sys.argv[1:]
j = json.loads(open(f).read().strip().splitlines()[-1])
kl = j["kl_divergence"]
print(f"| {name} | {mr} | {wr} | {kl:.5f} | {kl/float(base_kl):.4f} | {j['same_top_token']*100:.2f} % | {j['perplexity']:.4f} | {hit} |")
PY
  done
} > "$OUT/table.md"
cat "$OUT/table.md"

#!/usr/bin/env bash
# `chorus serve --swap-full-models` through the real binary (docs/deltas.md, "Swapping full
# models"): two synthetic fine-tunes of stories260K as whole GGUF models, one resident at a time;
# /v1/models lists them with kind "full"; each answers over HTTP with the greedy text of a server
# whose only model is that file; /metrics counts the swaps; bad input ends the server at start
# naming the flag or the model.
# Usage: cli_swap_test.sh CHORUS MODELS_DIR
# Exit 77 (skip) when MODELS_DIR is missing, unless CHORUS_REQUIRE_MODELS=1 (CI): then it fails.
set -euo pipefail
chorus=$1
models=$2
source "$(dirname "$0")/serve_lib.sh"

for i in 1 2; do
  "$chorus" convert --model "$base" --tokenizer "$tok" --finetune-delta 0.3:0.5 --seed $i \
    --output "$tmp/ft$i.gguf" 2>/dev/null
done

complete() {
  curl -sf "$url/v1/completions" -d "{\"model\":\"$1\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}

declare -A alone
for i in 1 2; do
  serve --model "$tmp/ft$i.gguf" --tokenizer "$tok" --served-model-name "ft$i"
  alone[$i]=$(complete "ft$i")
  stop
done
[[ ${alone[1]} != "${alone[2]}" ]] || fail "the two fine-tunes answer alike"

serve --model "$base" --tokenizer "$tok" --served-model-name base --swap-full-models \
  --full-model ft1="$tmp/ft1.gguf" --full-model ft2="$tmp/ft2.gguf"
curl -sf "$url/v1/models" | python3 -c '
import json, sys
m = {d["id"]: d for d in json.load(sys.stdin)["data"]}
assert m["ft1"]["kind"] == "full" and m["ft2"]["kind"] == "full", m
' || fail "/v1/models: $(curl -s "$url/v1/models")"
for i in 1 2 1; do
  got=$(complete "ft$i")
  [[ $got == "${alone[$i]}" ]] || fail "ft$i swapped: '$got' != alone: '${alone[$i]}'"
done
[[ $(complete base) != "${alone[1]}" ]] || fail "the base answers as ft1"
swaps=$(curl -sf "$url/metrics" | awk '$1 == "chorus_full_model_swaps_total" { print $2 }')
[[ $swaps == 3 ]] || fail "swaps: '$swaps' (want 3)"
stop

# Bad input: exit non-zero at start, naming the problem.
set +e
"$chorus" serve --model "$base" --tokenizer "$tok" --port 0 --full-model x="$tmp/ft1.gguf" 2>"$tmp/e"
[[ $? == 2 ]] && grep -q "needs --swap-full-models" "$tmp/e" || fail "--full-model alone: $(cat "$tmp/e")"
"$chorus" serve --model "$base" --tokenizer "$tok" --port 0 --swap-full-models 2>"$tmp/e"
[[ $? == 2 ]] && grep -q "needs at least one --full-model" "$tmp/e" || fail "no models: $(cat "$tmp/e")"
"$chorus" serve --model "$base" --tokenizer "$tok" --port 0 --swap-full-models \
  --full-model x="$tmp/missing.gguf" 2>"$tmp/e"
[[ $? != 0 ]] && grep -q "missing.gguf: no such file" "$tmp/e" || fail "missing: $(cat "$tmp/e")"
"$chorus" convert --shape tiny --output "$tmp/tiny.gguf" 2>/dev/null
"$chorus" serve --model "$base" --tokenizer "$tok" --port 0 --swap-full-models \
  --full-model tiny="$tmp/tiny.gguf" 2>"$tmp/e"
[[ $? != 0 ]] && grep -q "full model 'tiny'.*not the base model's shape" "$tmp/e" ||
  fail "other shape: $(cat "$tmp/e")"
set -e
echo PASS

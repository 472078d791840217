#!/usr/bin/env bash
# `chorus finetune` through the real binary (docs/finetuning.md): a short run on JSONL prints a
# progress line per step (loss, tokens/s, ETA), writes loss.csv, checkpoints and a PEFT adapter
# that `chorus eval --variant` and `chorus serve --lora` load and serve; bad input exits non-zero
# naming the line (invalid JSON, missing field, non-UTF-8), the flag or the file.
# Usage: cli_finetune_test.sh CHORUS MODELS_DIR
# Exit 77 (skip) when MODELS_DIR is missing, unless CHORUS_REQUIRE_MODELS=1 (CI): then it fails.
set -euo pipefail
chorus=$1
models=$2
base=$models/stories260K/stories260K.bin
tok=$models/stories260K/tok512.bin
heldout=$models/stories260K-finetunes/things/data/heldout.txt
if [[ ! -f $base || ! -f $tok || ! -f $heldout ]]; then
  echo "shared models not found under $models"
  [[ ${CHORUS_REQUIRE_MODELS:-0} == 1 ]] && exit 1
  exit 77
fi
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }

for i in $(seq 1 12); do
  echo '{"prompt": "Once upon a time, there was a dog named Max.", "completion": " Max went to the beach with his kite."}'
done > "$tmp/train.jsonl"
ft() { "$chorus" finetune --model "$base" --tokenizer "$tok" --threads 2 "$@"; }

ft --data "$tmp/train.jsonl" --eval "$tmp/train.jsonl" --targets q,v,down --rank 4 --lr 5e-3 \
  --steps 4 --batch 2 --seq-len 64 --save-every 2 --output "$tmp/out" >"$tmp/ft.out" 2>"$tmp/ft.err" ||
  fail "finetune: $(cat "$tmp/ft.err")"
grep -q "^step 4/4 | epoch .* | loss [0-9.]* | lr .* tok/s | .* ETA .* | eval [0-9.]* (ppl" "$tmp/ft.err" ||
  fail "progress line: $(cat "$tmp/ft.err")"
[[ $(wc -l < "$tmp/out/loss.csv") == 5 ]] || fail "loss.csv: $(cat "$tmp/out/loss.csv")"
for f in adapter_config.json adapter_model.safetensors checkpoint-2/optimizer.safetensors \
         checkpoint-4/trainer_state.json; do
  [[ -f $tmp/out/$f ]] || fail "missing $f"
done
python3 -c "import json,sys; c=json.load(open('$tmp/out/adapter_config.json')); \
assert c['peft_type']=='LORA' and c['r']==4 and sorted(c['target_modules'])==['down_proj','q_proj','v_proj'], c" ||
  fail "adapter_config.json"

"$chorus" eval --model "$base" --tokenizer "$tok" --data "$heldout" --variant "$tmp/out" >"$tmp/eval.out" 2>/dev/null ||
  fail "eval --variant did not load the adapter"
grep -q "^perplexity" "$tmp/eval.out" || fail "eval output: $(cat "$tmp/eval.out")"

# Served under a name, at once.
"$chorus" serve --port 0 --model "$base" --tokenizer "$tok" --lora "ft=$tmp/out" >"$tmp/serve.out" 2>"$tmp/serve.err" &
pids+=($!)
port=""
for _ in $(seq 1 100); do
  port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$tmp/serve.err" | grep -o '[0-9]*$' || true)
  [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
  sleep 0.1
done
[[ -n $port ]] || fail "server did not start: $(cat "$tmp/serve.err")"
body=$(curl -sf "http://127.0.0.1:$port/v1/completions" -H 'content-type: application/json' \
  -d '{"model": "ft", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}') ||
  fail "completion with the trained adapter failed"
python3 -c "import json,sys; j=json.loads(sys.argv[1]); assert j['choices'][0]['text'], j" "$body" ||
  fail "completion: $body"

# Resume continues after the latest checkpoint (nothing left to do: exits 0, adapter kept).
ft --data "$tmp/train.jsonl" --eval "$tmp/train.jsonl" --targets q,v,down --rank 4 --lr 5e-3 \
  --steps 4 --batch 2 --seq-len 64 --save-every 2 --output "$tmp/out" --resume >/dev/null 2>"$tmp/r.err" ||
  fail "resume: $(cat "$tmp/r.err")"

# Bad input: non-zero exit, the message names the problem.
expect_fail() {  # pattern, args...
  local pat=$1; shift
  if ft "$@" --output "$tmp/bad" >/dev/null 2>"$tmp/e"; then fail "accepted: $*"; fi
  grep -q -- "$pat" "$tmp/e" || fail "message for $*: $(cat "$tmp/e") (wanted $pat)"
}
printf '%s\n{"prompt": "a", "completion": "b"\n' "$(head -1 "$tmp/train.jsonl")" > "$tmp/bad1.jsonl"
expect_fail "bad1.jsonl: line 2: invalid JSON" --data "$tmp/bad1.jsonl"
printf '{"prompt": "a"}\n' > "$tmp/bad2.jsonl"
expect_fail 'line 1: missing field "completion"' --data "$tmp/bad2.jsonl"
printf '{"prompt": "a", "completion": "\xff"}\n' > "$tmp/bad3.jsonl"
expect_fail "line 1: not valid UTF-8" --data "$tmp/bad3.jsonl"
expect_fail "flag --targets: unknown module 'qq'" --data "$tmp/train.jsonl" --targets qq
expect_fail "longer than --seq-len 8" --data "$tmp/train.jsonl" --seq-len 8
expect_fail "data files are limited to 100 bytes" --data "$tmp/train.jsonl" --max-data-bytes 100
[[ ! -e $tmp/bad/adapter_model.safetensors ]] || fail "an adapter was written by a failed run"
echo "cli_finetune_test: all checks passed"

#!/usr/bin/env bash
# `chorus compress` and `chorus eval` through the real binary (docs/deltas.md, docs/eval.md):
# a delta of a synthetic fine-tune of stories260K round-trips into `chorus eval`, whose --json
# last line parses and puts the delta much closer to the fine-tune than the base; bad input
# (a truncated delta, a delta for another base, a fine-tune of another architecture, bad flags —
# also `chorus serve --delta-activations`)
# exits non-zero naming the problem.
# Usage: cli_deltas_test.sh CHORUS MODELS_DIR
# Exit 77 (skip) when MODELS_DIR is missing, unless CHORUS_REQUIRE_MODELS=1 (CI): then it fails.
set -euo pipefail
chorus=$1
models=$2
base=$models/stories260K/stories260K.bin
tok=$models/stories260K/tok512.bin
data=$models/stories260K-finetunes/things/data/heldout.txt
if [[ ! -f $base || ! -f $tok || ! -f $data ]]; then
  echo "shared models not found under $models"
  [[ ${CHORUS_REQUIRE_MODELS:-0} == 1 ]] && exit 1
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$chorus" convert --model "$base" --tokenizer "$tok" --finetune-delta 0.03:0.05 --output "$tmp/ft.gguf" 2>/dev/null
"$chorus" compress --base "$base" --finetuned "$tmp/ft.gguf" --method rtn --bits 4 \
  --output "$tmp/d" > "$tmp/compress.out" 2>"$tmp/compress.err" || fail "compress: $(cat "$tmp/compress.err")"
grep -q "x smaller" "$tmp/compress.out" || fail "no size ratio printed"
grep -q "layer 5/5" "$tmp/compress.err" || fail "no per-layer progress"
[[ -f $tmp/d/delta.safetensors ]] || fail "no delta.safetensors in the output directory"

# A fine-tune of a GGUF file (read, not loaded) keeps the file's own tokenizer (the converter
# once looked for it under the fine-tune's name and failed).
"$chorus" convert --model "$tmp/ft.gguf" --finetune-delta 0.01:0.02 --output "$tmp/ft2.gguf" 2>"$tmp/e" ||
  fail "convert --finetune-delta of a GGUF file: $(cat "$tmp/e")"
"$chorus" eval --model "$tmp/ft2.gguf" --data "$data" --ctx 128 --kl-reference "$tmp/ft.gguf" --json 2>"$tmp/e" | tail -1 > "$tmp/ft2.json" ||
  fail "eval of the fine-tune's fine-tune (its tokenizer): $(cat "$tmp/e")"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); sys.exit(0 if 0 < j['kl_divergence'] < 1 else 1)" "$tmp/ft2.json" ||
  fail "fine-tune of a GGUF: $(cat "$tmp/ft2.json")"

ev() { "$chorus" eval --model "$base" --tokenizer "$tok" --data "$data" --ctx 128 --kl-reference "$tmp/ft.gguf" --json "$@" 2>/dev/null | tail -1; }
kl() { python3 -c 'import json,sys; j=json.loads(sys.stdin.read()); assert set(j)=={"perplexity","kl_divergence","same_top_token","tokens"}; print(j["kl_divergence"])'; }
base_kl=$(ev | kl)
delta_kl=$(ev --variant "$tmp/d" | kl)
python3 -c "import sys; b,d=$base_kl,$delta_kl; sys.exit(0 if d < 0.2*b else 1)" || fail "delta KL $delta_kl not far below base KL $base_kl"
# The same delta served (base matmuls + the delta term through DeltaHook, int16 activations
# where the CPU has the kernel) against its dense reconstruction: the same figures up to the
# activations' rounding.
dense_json=$(ev --variant "$tmp/d") served_json=$(ev --variant "$tmp/d" --delta-mode served)
python3 -c "
import json, sys
d, s = json.loads(sys.argv[1]), json.loads(sys.argv[2])
ok = (s['tokens'] == d['tokens'] and abs(s['perplexity'] / d['perplexity'] - 1) < 1e-3
      and abs(s['kl_divergence'] - d['kl_divergence']) <= 0.02 * d['kl_divergence'] + 1e-6
      and abs(s['same_top_token'] - d['same_top_token']) <= 0.01)
sys.exit(0 if ok else 1)" "$dense_json" "$served_json" || fail "served delta $served_json vs dense $dense_json"
if "$chorus" eval --model "$base" --tokenizer "$tok" --data "$data" --variant "$tmp/d" --delta-mode merged 2>"$tmp/e"; then
  fail "--delta-mode merged accepted"
fi
grep -q "delta-mode.*merged" "$tmp/e" || fail "delta-mode: $(cat "$tmp/e")"

# The evaluated model over a bf16 KV cache against the same model over f32 (--kl-reference
# always runs f32): a small but non-zero KL; an unknown element type is refused by name.
self_kl() { "$chorus" eval --model "$base" --tokenizer "$tok" --data "$data" --ctx 128 --kl-reference "$base" --json "$@" 2>/dev/null | tail -1 | kl; }
f32_kl=$(self_kl) bf16_kl=$(self_kl --kv-dtype bf16)
python3 -c "import sys; f,b=$f32_kl,$bf16_kl; sys.exit(0 if f == 0 and 0 < b < 0.01 else 1)" ||
  fail "self KL with f32 / bf16 KV: $f32_kl / $bf16_kl"
if "$chorus" eval --model "$base" --tokenizer "$tok" --data "$data" --kv-dtype fp8 2>"$tmp/e"; then
  fail "--kv-dtype fp8 accepted"
fi
grep -q "kv-dtype.*fp8" "$tmp/e" || fail "kv-dtype: $(cat "$tmp/e")"

# A truncated delta: non-zero exit naming the file.
head -c 3000 "$tmp/d/delta.safetensors" > "$tmp/trunc.safetensors"
if "$chorus" eval --model "$base" --tokenizer "$tok" --data "$data" --variant "$tmp/trunc.safetensors" 2>"$tmp/e"; then
  fail "truncated delta accepted"
fi
grep -q "trunc.safetensors" "$tmp/e" || fail "truncated: $(cat "$tmp/e")"
# A delta for another base: both hashes named.
if "$chorus" eval --model "$tmp/ft.gguf" --data "$data" --variant "$tmp/d" 2>"$tmp/e"; then
  fail "delta for another base accepted"
fi
grep -q "was made against base weights fnv1a64:.*is fnv1a64:" "$tmp/e" || fail "other base: $(cat "$tmp/e")"
if "$chorus" eval --model "$tmp/ft.gguf" --data "$data" --variant "$tmp/d" --delta-mode served 2>"$tmp/e"; then
  fail "delta for another base accepted (served)"
fi
grep -q "made against base weights fnv1a64:.*fnv1a64:" "$tmp/e" || fail "other base (served): $(cat "$tmp/e")"
# A fine-tune of another architecture.
"$chorus" convert --shape tiny --output "$tmp/tiny.gguf" 2>/dev/null
if "$chorus" compress --base "$base" --finetuned "$tmp/tiny.gguf" --method rtn --output "$tmp/x" 2>"$tmp/e"; then
  fail "another architecture accepted"
fi
grep -q "another architecture" "$tmp/e" || fail "architecture: $(cat "$tmp/e")"
# Bad flags: exit 2.
set +e
"$chorus" compress --base "$base" --finetuned "$tmp/ft.gguf" --bits 5 --output "$tmp/y" 2>/dev/null
[[ $? == 2 ]] || fail "--bits 5 did not exit 2"
"$chorus" compress --base "$base" --finetuned "$tmp/ft.gguf" --method deltazip --output "$tmp/y" 2>"$tmp/e"
[[ $? != 0 ]] && grep -q "calib" "$tmp/e" || fail "deltazip without --calib: $(cat "$tmp/e")"
"$chorus" serve --model "$base" --tokenizer "$tok" --delta d="$tmp/d" --delta-activations int8 \
  --port 0 2>"$tmp/e" </dev/null
[[ $? != 0 ]] && grep -q "delta-activations must be auto, int16 or f32" "$tmp/e" ||
  fail "--delta-activations int8: $(cat "$tmp/e")"
set -e
echo PASS

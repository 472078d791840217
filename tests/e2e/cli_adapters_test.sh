#!/usr/bin/env bash
# `chorus convert --lora-count` and `chorus inspect` on adapters, through the real binary:
# synthetic sets (round-robin ranks, hard links), inspection output, validation against a base
# (--model) that fits and one that does not, and bad files (non-zero exit, clear message).
# usage: cli_adapters_test.sh CHORUS STORIES260K_BIN
set -euo pipefail
chorus=$1
other_base=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

"$chorus" convert --shape tiny --dtype f32 --output "$tmp/tiny.gguf" 2>/dev/null
"$chorus" convert --shape tiny --lora-count 6 --lora-distinct 4 --lora-ranks 8,16 \
  --lora-targets q,k,v,o,down --output "$tmp/set" 2>"$tmp/convert.err"
[[ $(ls "$tmp/set" | wc -l) == 6 ]] || fail "expected 6 adapter directories"
[[ $(stat -c %i "$tmp/set/lora-0/adapter_model.safetensors") == $(stat -c %i "$tmp/set/lora-4/adapter_model.safetensors") ]] \
  || fail "lora-4 should hard-link lora-0"

out=$("$chorus" inspect "$tmp/set/lora-3")
grep -q "PEFT" <<<"$out" || fail "format: $out"
grep -q "targets:      q_proj, k_proj, v_proj, o_proj, down_proj" <<<"$out" || fail "targets: $out"
grep -q "r=16, lora_alpha=32" <<<"$out" || fail "config: $out"
grep -Eq "down_proj +4 layers  rank 16 .*\[128 <- 352\]  bf16" <<<"$out" || fail "down_proj row: $out"

out=$("$chorus" inspect --adapter "$tmp/set/lora-2" --model "$tmp/tiny.gguf")
grep -q "validation:   OK" <<<"$out" || fail "validation against the right base: $out"

if "$chorus" inspect "$tmp/set/lora-2" --model "$other_base" >"$tmp/o" 2>"$tmp/e"; then
  fail "validation against another base should fail"
fi
grep -q "hint: adapter for another base model?" "$tmp/e" || fail "mismatch message: $(cat "$tmp/e")"

if "$chorus" inspect "$tmp/set/lora-2" --model "$tmp/tiny.gguf" --max-lora-rank 4 >"$tmp/o" 2>"$tmp/e"; then
  fail "rank above --max-lora-rank should fail"
fi
grep -qi "rank" "$tmp/e" || fail "rank message: $(cat "$tmp/e")"

mkdir "$tmp/trunc"
cp "$tmp/set/lora-1/adapter_config.json" "$tmp/trunc/"
head -c 1000 "$tmp/set/lora-1/adapter_model.safetensors" >"$tmp/trunc/adapter_model.safetensors"
if "$chorus" inspect "$tmp/trunc" >"$tmp/o" 2>"$tmp/e"; then fail "truncated file accepted"; fi
grep -q "adapter_model.safetensors" "$tmp/e" || fail "truncated message: $(cat "$tmp/e")"

mkdir "$tmp/pickle"
echo junk >"$tmp/pickle/adapter_model.bin"
if "$chorus" inspect "$tmp/pickle" >"$tmp/o" 2>"$tmp/e"; then fail "pickle accepted"; fi
grep -q "pickle" "$tmp/e" || fail "pickle message: $(cat "$tmp/e")"

if "$chorus" inspect --adapter "$tmp/tiny.gguf" >"$tmp/o" 2>"$tmp/e"; then fail "base model accepted as adapter"; fi
grep -q "expected 'adapter'" "$tmp/e" || fail "gguf message: $(cat "$tmp/e")"

if "$chorus" convert --shape tiny --lora-count 3 --lora-ranks 8,0 --output "$tmp/badset" 2>"$tmp/e"; then
  fail "rank 0 accepted"
fi
grep -q "bad LoRA rank" "$tmp/e" || fail "rank message: $(cat "$tmp/e")"
echo PASS

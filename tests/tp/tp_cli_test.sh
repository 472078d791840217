#!/usr/bin/env bash
# `chorus generate --tp 2` and `chorus bench --tp 2` under mpirun (docs/scaleout.md): the same
# greedy text as one process, the bench's table, and the error of --tp without mpirun.
# Usage: tp_cli_test.sh CHORUS "MPIRUN ARGS..."   (exit 77 = skipped: stories260K missing)
set -uo pipefail
CHORUS=$1
read -r -a MPIRUN <<<"$2"
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
M=$ROOT/../shared/models/stories260K
if [ ! -f "$M/stories260K.bin" ]; then
  if [ "${CHORUS_REQUIRE_MODELS:-}" = "1" ]; then echo "FAIL: $M missing"; exit 1; fi
  echo "SKIP: $M not found"; exit 77
fi
fail() { echo "FAIL: $*"; exit 1; }
GEN=(generate --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --prompt "Once upon a time"
     --max-tokens 60 --temperature 0 --threads 1 --quiet)

one=$("$CHORUS" "${GEN[@]}") || fail "generate (one process) failed"
two=$("${MPIRUN[@]}" "$CHORUS" "${GEN[@]}" --tp 2) || fail "mpirun generate --tp 2 failed"
[ -n "$one" ] || fail "empty output"
[ "$one" = "$two" ] || fail "TP=2 text differs from TP=1:
--- TP=1: $one
--- TP=2: $two"
echo "PASS generate: TP=2 greedy text equals TP=1 (${#one} bytes)"

# --tp 2 without mpirun: refused, naming the fix.
err=$("$CHORUS" "${GEN[@]}" --tp 2 2>&1) && fail "--tp 2 without mpirun succeeded"
grep -q "mpirun -np 2" <<<"$err" || fail "--tp 2 without mpirun: unexpected message: $err"
echo "PASS refusal without mpirun: $err"

# mpirun -np 2 with --tp 3: the rank count is checked.
err=$("${MPIRUN[@]}" "$CHORUS" "${GEN[@]}" --tp 3 2>&1) && fail "--tp 3 under -np 2 succeeded"
grep -q "this job has 2 MPI processes" <<<"$err" || fail "--tp 3 under -np 2: unexpected: $err"
echo "PASS rank-count check"

# With --adapters, every batch also runs with its rows on LoRA adapters (q,k,v,o), each rank
# holding its part: per layer an all-gather of the q|k|v shrink and an all-reduce of o's beside
# the base's two all-reduces (stories260K: 5 layers, 10 collectives per base step, 20 with LoRA).
out=$("${MPIRUN[@]}" "$CHORUS" bench --tp 2 --threads 1 --model "$M/stories260K.bin" \
      --batches 1,4 --context 8 --decode-steps 4 --repeats 1 --adapters 3 --lora-ranks 4,5 \
      2>/dev/null) || fail "mpirun bench --tp 2 --adapters 3 failed"
grep -q "tp 2" <<<"$out" || fail "bench table lacks 'tp 2': $out"
rows=$(grep -cE '^(1|4) +base +[0-9]' <<<"$out")
[ "$rows" = 2 ] || fail "bench table: expected 2 base rows: $out"
lora=$(grep -E '^(1|4) +lora +[0-9]' <<<"$out" | awk '{print $NF}' | sort -u)
[ "$lora" = 20 ] || fail "bench table: expected 20 collectives per LoRA step: $out"
echo "PASS bench --tp 2 with adapters (10 collectives per base step, 20 with LoRA rows)"
echo "PASS bench --tp 2:"
echo "$out"

# serve --tp 2: rank 0 serves HTTP; greedy completions of the base, of an adapter given with
# --lora, of one loaded through the API and of a delta (BitDelta of a synthetic fine-tune: one
# scale per matrix, so stories260K's 172-wide MLP splits) equal one process's; SIGTERM to rank 0
# ends every rank (the workers leave when rank 0's engine stops) and mpirun exits 0.
complete() {  # complete PORT MODEL : the greedy completion's text
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$2\", \"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
# A prompt of several KV blocks (16 tokens each), asked twice: the second time its blocks come from
# the prefix cache; with n = 2 the choices share the prompt's blocks and copy the last one on
# write — pages every rank must copy alike.
LONG="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends and her big red ball."
complete_long() {  # complete_long PORT MODEL N : the texts of the N greedy choices, one per line
  curl -sf "http://127.0.0.1:$1/v1/completions" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$2\", \"prompt\": \"$LONG\", \"max_tokens\": 24, \"temperature\": 0, \"n\": $3}" |
    python3 -c 'import json,sys; [print(c["text"]) for c in sorted(json.load(sys.stdin)["choices"], key=lambda c: c["index"])]'
}
embed() {  # embed PORT MODEL OUT : /v1/embeddings of two inputs, the response saved to OUT
  curl -sf "http://127.0.0.1:$1/v1/embeddings" -H 'Content-Type: application/json' \
    -d "{\"model\": \"$2\", \"input\": [\"Once upon a time\", \"$LONG\"]}" >"$3"
}
serve_texts() {  # serve_texts TAG TP [mpirun...] : the texts of base, a, b, d, a, base, then the
                 # long prompt's: base, base again, a with n = 2; embeddings of base, a and d in
                 # $TMP/emb-TAG-MODEL.json
  # --port 0: the kernel picks a free port, read back from rank 0's "listening on" line. (A
  # random fixed port could be another test's server, whose /health would answer for ours.)
  # --kv-dtype f32: a bf16 cache rounds K and V after the all-reduce, so TP's last-bit
  # difference can cross a bf16 boundary and flip a near-tie of a random adapter's greedy text
  # (docs/scaleout.md "Exactness"); the comparison here needs the f32 cache's 1e-4.
  local tag=$1 tp=$2; shift 2
  local log="$TMP/serve-$tag.log"
  "$@" "$CHORUS" serve --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --threads 1 \
    --port 0 --host 127.0.0.1 --tp "$tp" --served-model-name base --kv-dtype f32 \
    --lora "a=$TMP/loras/lora-0" --delta "d=$TMP/d.safetensors" --adapter-root "$TMP/loras" \
    --registry "$TMP/reg-$tag.json" \
    --no-finetune >"$log" 2>&1 &
  local pid=$! port=
  for _ in $(seq 1 300); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | head -1 | grep -o '[0-9]*$')
    [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $pid 2>/dev/null || { cat "$log"; return 1; }
    sleep 0.1
  done
  [ -n "$port" ] || { echo "no 'listening on' line"; cat "$log"; kill $pid; return 1; }
  curl -sf "http://127.0.0.1:$port/v1/load_lora_adapter" -H 'Content-Type: application/json' \
    -d "{\"lora_name\": \"b\", \"lora_path\": \"$TMP/loras/lora-1\"}" >/dev/null ||
    { echo "load_lora_adapter failed"; cat "$log"; kill $pid; return 1; }
  local m
  for m in base a b d a base; do
    complete "$port" "$m" || { echo "completion of $m failed"; cat "$log"; kill $pid; return 1; }
  done
  { complete_long "$port" base 1 && complete_long "$port" base 1 && complete_long "$port" a 2; } ||
    { echo "long completions failed"; cat "$log"; kill $pid; return 1; }
  for m in base a d; do
    embed "$port" "$m" "$TMP/emb-$tag-$m.json" ||
      { echo "embeddings of $m failed"; cat "$log"; kill $pid; return 1; }
  done
  local hits
  hits=$(curl -sf "http://127.0.0.1:$port/metrics" | awk '/^chorus_prefix_cache_hit_tokens_total/ {print $2}')
  [ "${hits%.*}" -gt 0 ] 2>/dev/null ||
    { echo "no prefix-cache hits (chorus_prefix_cache_hit_tokens_total=$hits)"; kill $pid; return 1; }
  # SIGTERM to the process that listens (rank 0): it drains and exits 0, and its engine's stop
  # message ends the other ranks. (mpirun itself would forward the signal to every rank and
  # report the job as killed.)
  local listener
  listener=$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  [ -n "$listener" ] || { echo "no process listens on $port"; kill $pid; return 1; }
  kill -TERM "$listener"
  wait $pid || { echo "serve exited with $?"; cat "$log"; return 1; }
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
"$CHORUS" convert --model "$M/stories260K.bin" --lora-count 2 --lora-ranks 8,16 \
  --lora-targets q,k,v,o,gate,up,down --output "$TMP/loras" 2>/dev/null ||
  fail "chorus convert --lora-count failed"
"$CHORUS" convert --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --finetune-delta 0.15:0.2 \
  --output "$TMP/ft.gguf" 2>/dev/null || fail "chorus convert --finetune-delta failed"
"$CHORUS" compress --base "$M/stories260K.bin" --finetuned "$TMP/ft.gguf" --method bitdelta \
  --distill-steps 0 --output "$TMP/d.safetensors" >/dev/null 2>"$TMP/compress.err" ||
  fail "chorus compress failed: $(cat "$TMP/compress.err")"
s1=$(serve_texts one 1) || fail "serve (one process): $s1"
s2=$(serve_texts tp2 2 "${MPIRUN[@]}") || fail "mpirun serve --tp 2: $s2"
[ "$(wc -l <<<"$s1")" = 10 ] || fail "serve: expected 10 completions: $s1"
[ "$s1" = "$s2" ] || fail "serve --tp 2 texts differ from one process's:
--- TP=1:
$s1
--- TP=2:
$s2"
mapfile -t t <<<"$s1"
[ "${t[0]}" != "${t[1]}" ] && [ "${t[1]}" != "${t[2]}" ] && [ "${t[0]}" != "${t[3]}" ] ||
  fail "the variants do not change the text (a test that cannot fail): $s1"
[ "${t[6]}" = "${t[7]}" ] && [ "${t[8]}" = "${t[9]}" ] ||
  fail "a cached prefix or n = 2 changed a greedy text: $s1"
echo "PASS serve --tp 2: the same greedy completions as one process (base, --lora adapter, adapter"
echo "     loaded through the API, delta; a prompt from the prefix cache; n = 2), SIGTERM to rank 0"
echo "     ends every rank"
# Embeddings (last-token pooling, normalized) of the base, the adapter and the delta: TP=2 within
# the logits' 1e-4 of one process's, and each variant's its own (not the base's).
python3 - "$TMP" <<'PY' || fail "serve --tp 2 embeddings differ from one process's"
import json, sys
tmp = sys.argv[1]
def vecs(tag, model):
    with open(f"{tmp}/emb-{tag}-{model}.json") as f:
        data = json.load(f)["data"]
    return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
for model in ("base", "a", "d"):
    one, two = vecs("one", model), vecs("tp2", model)
    assert len(one) == len(two) == 2 and all(len(v) == 64 for v in one + two), model
    diff = max(abs(p - q) for u, v in zip(one, two) for p, q in zip(u, v))
    print(f"embeddings of {model}: max |TP=2 - TP=1| = {diff:.2e}")
    assert diff <= 1e-4, (model, diff)
base = vecs("one", "base")
for model in ("a", "d"):
    moved = max(abs(p - q) for u, v in zip(vecs("one", model), base) for p, q in zip(u, v))
    assert moved > 1e-3, f"{model}'s embeddings equal the base's: {moved}"
PY
echo "PASS serve --tp 2: /v1/embeddings of base, adapter and delta equal one process's within 1e-4"

# What TP does not serve yet is refused at start, naming it.
err=$("${MPIRUN[@]}" "$CHORUS" serve --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" \
      --threads 1 --port 0 --tp 2 --finetune-dir "$TMP/ft" 2>&1) &&
  fail "--finetune-dir under --tp 2 started"
grep -q "fine-tuning (--finetune-dir) is not supported under tensor parallelism" <<<"$err" ||
  fail "--finetune-dir under --tp 2: unexpected message: $err"
echo "PASS --finetune-dir under --tp 2 refused"

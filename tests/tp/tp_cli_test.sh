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

out=$("${MPIRUN[@]}" "$CHORUS" bench --tp 2 --threads 1 --model "$M/stories260K.bin" \
      --batches 1,4 --context 8 --decode-steps 4 --repeats 1 2>/dev/null) ||
  fail "mpirun bench --tp 2 failed"
grep -q "tp 2" <<<"$out" || fail "bench table lacks 'tp 2': $out"
rows=$(grep -cE '^(1|4) +[0-9]' <<<"$out")
[ "$rows" = 2 ] || fail "bench table: expected 2 batch rows: $out"
echo "PASS bench --tp 2:"
echo "$out"

# serve --tp 2: rank 0 serves HTTP; a greedy completion equals one process's; SIGTERM to rank 0
# ends every rank (the workers leave when rank 0's engine stops) and mpirun exits 0.
serve_text() {  # serve_text PORT TP [mpirun...] : the completion's text
  local port=$1 tp=$2; shift 2
  "$@" "$CHORUS" serve --model "$M/stories260K.bin" --tokenizer "$M/tok512.bin" --threads 1 \
    --port "$port" --host 127.0.0.1 --tp "$tp" >"$TMP/serve-$port.log" 2>&1 &
  local pid=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$port/health" >/dev/null && break
    kill -0 $pid 2>/dev/null || { cat "$TMP/serve-$port.log"; return 1; }
    sleep 0.1
  done
  curl -sf "http://127.0.0.1:$port/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0}' >"$TMP/out-$port.json" ||
    { cat "$TMP/serve-$port.log"; kill $pid; return 1; }
  # SIGTERM to the process that listens (rank 0): it drains and exits 0, and its engine's stop
  # message ends the other ranks. (mpirun itself would forward the signal to every rank and
  # report the job as killed.)
  local listener
  listener=$(ss -ltnpH "sport = :$port" | grep -o 'pid=[0-9]*' | head -1 | cut -d= -f2)
  [ -n "$listener" ] || { echo "no process listens on $port"; kill $pid; return 1; }
  kill -TERM "$listener"
  wait $pid || { echo "serve exited with $?"; cat "$TMP/serve-$port.log"; return 1; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' \
    "$TMP/out-$port.json"
}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
P=$((20000 + RANDOM % 20000))
s1=$(serve_text $P 1) || fail "serve (one process): $s1"
s2=$(serve_text $((P + 1)) 2 "${MPIRUN[@]}") || fail "mpirun serve --tp 2: $s2"
[ -n "$s1" ] && [ "$s1" = "$s2" ] || fail "serve --tp 2 text differs: '$s1' vs '$s2'"
echo "PASS serve --tp 2: the same greedy completion as one process, SIGTERM to rank 0 ends every rank"

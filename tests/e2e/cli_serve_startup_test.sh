#!/usr/bin/env bash
# What a supervisor (systemd, Kubernetes, a shell script) and a new user meet first, through the
# real binary: every startup error exits non-zero within 10 s naming the flag and the path (each
# 20 times); SIGTERM/SIGINT end a server that is still loading within 5 s; a second server on a
# bound port exits naming the port while the first keeps answering; `chorus serve` with no
# arguments stays under 512 MiB resident; `chorus inspect` checks the tokenizer's vocabulary
# against the model's; `chorus generate --max-tokens` beyond the context clamps with a note.
# usage: cli_serve_startup_test.sh CHORUS MODELS_DIR
# Exit 77 (skip) when MODELS_DIR is missing, unless CHORUS_REQUIRE_MODELS=1 (CI): then it fails.
set -euo pipefail
chorus=$1
models=$2
if [[ ! -f $models/stories260K/stories260K.bin ]]; then
  echo "skip: $models/stories260K/stories260K.bin not found" >&2
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
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME=$tmp/home CHORUS_CACHE_DIR=$tmp/cache
mkdir -p "$HOME"
stories=$models/stories260K/stories260K.bin
tok=$models/stories260K/tok512.bin

# expect_startup_error TIMES "PATTERN..." -- ARGS: `chorus serve ARGS` exits non-zero within 10 s,
# and its stderr contains every pattern (fixed strings).
expect_startup_error() {
  local times=$1
  shift
  local patterns=()
  while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
  shift
  for ((i = 0; i < times; i++)); do
    local rc=0
    timeout -s KILL 10 "$chorus" serve --port 0 "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
    [[ $rc != 0 ]] || fail "serve $* exited 0"
    [[ $rc != 137 ]] || fail "serve $* still running after 10 s (try $i)"
    for p in "${patterns[@]}"; do
      grep -qF -- "$p" "$tmp/err" || fail "serve $*: stderr lacks '$p': $(cat "$tmp/err")"
    done
  done
}

expect_startup_error 20 "flag --model" "/nonexistent/model.gguf" -- --model /nonexistent/model.gguf
# Scheduling flags (docs/scheduling.md): the bad value is named.
expect_startup_error 1 "policy must be one of fcfs, cluster, slo" "'lifo'" -- --policy lifo
expect_startup_error 1 "flag --slo-mode" "'lax'" -- --slo-mode lax
expect_startup_error 1 "ttft-slo-ms must be in" -- --ttft-slo-ms -5
echo '{"format":"chorus-cost-model","models":[{"kind":"linear"}]}' > "$tmp/cost.json"
expect_startup_error 1 "flag --cost-model" "$tmp/cost.json" "seconds_per_term" -- \
  --policy slo --cost-model "$tmp/cost.json"
expect_startup_error 20 "flag --adapter-root" "/nonexistent/root" -- \
  --model "$stories" --tokenizer "$tok" --adapter-root /nonexistent/root
expect_startup_error 20 "flag --lora x" "/nonexistent/l" -- \
  --model "$stories" --tokenizer "$tok" --lora x=/nonexistent/l
expect_startup_error 20 "flag --lora-dir" "/nonexistent/dir" -- \
  --model "$stories" --tokenizer "$tok" --lora-dir /nonexistent/dir
expect_startup_error 20 "flag --tokenizer" "$stories" -- --model "$stories"
expect_startup_error 20 "flag --tokenizer" "/nonexistent/tok.bin" -- \
  --model "$stories" --tokenizer /nonexistent/tok.bin
mkdir -p "$tmp/root"
echo '{"version": 1, "adapters": [' >"$tmp/broken-registry.json"
expect_startup_error 20 "flag --registry" "$tmp/broken-registry.json" -- \
  --model "$stories" --tokenizer "$tok" --adapter-root "$tmp/root" --registry "$tmp/broken-registry.json"

# A load that never finishes (a FIFO nobody writes blocks the model's open, like a hung network
# mount): SIGTERM and SIGINT end the process within 5 s, with a non-zero status.
mkfifo "$tmp/hung.gguf"
for sig in TERM INT; do
  "$chorus" serve --port 0 --model "$tmp/hung.gguf" >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 100); do grep -q "loading" "$tmp/err" && break; sleep 0.05; done
  grep -q "loading" "$tmp/err" || fail "the hung server never said it was loading: $(cat "$tmp/err")"
  kill -"$sig" "$pid"
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  if kill -0 "$pid" 2>/dev/null; then fail "SIG$sig did not end a loading server within 5 s"; fi
  rc=0
  wait "$pid" || rc=$?
  [[ $rc != 0 ]] || fail "SIG$sig while loading exited 0"
  grep -q "SIG$sig while loading" "$tmp/err" || fail "no message for SIG$sig: $(cat "$tmp/err")"
done

# wait_ready LOG -> the port a server started with --port 0 listens on, once /health is 200.
wait_ready() {
  local log=$1 port=""
  for _ in $(seq 200); do
    port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    if [[ -n $port ]] && curl -sf "http://127.0.0.1:$port/health" >/dev/null; then
      echo "$port"
      return 0
    fi
    sleep 0.1
  done
  fail "server not ready: $(cat "$log")"
}

# `chorus serve` with no arguments (the embedded default model): small resident memory.
"$chorus" serve --port 0 >"$tmp/default.out" 2>"$tmp/default.err" &
first=$!
pids+=("$first")
port=$(wait_ready "$tmp/default.err")
rss_kib=$(awk '/^VmRSS:/{print $2}' "/proc/$first/status")
echo "default server: VmRSS $((rss_kib / 1024)) MiB" >&2
((rss_kib <= 512 * 1024)) || fail "default server holds $((rss_kib / 1024)) MiB resident (> 512)"
grep -q "pool .* MiB (auto" "$tmp/default.err" || fail "chosen pool size not printed: $(cat "$tmp/default.err")"

# A second server on the same port: refused, naming the port; the first keeps answering.
rc=0
timeout -s KILL 10 "$chorus" serve --port "$port" >"$tmp/out" 2>"$tmp/err" || rc=$?
[[ $rc != 0 && $rc != 137 ]] || fail "a second server on port $port: rc=$rc"
grep -q "port $port is already in use" "$tmp/err" || fail "port message: $(cat "$tmp/err")"
[[ $(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/health") == 200 ]] ||
  fail "the first server stopped answering"
for _ in 1 2 3; do  # every request reaches the first server (no second listener took a share)
  body=$(curl -sf "http://127.0.0.1:$port/v1/models")
  grep -q chorus-default <<<"$body" || fail "/v1/models: $body"
done
kill -TERM "$first"
wait "$first" || fail "the first server did not exit 0 on SIGTERM"

# chorus inspect: the tokenizer's vocabulary against the model's.
if "$chorus" inspect --model "$stories" --tokenizer "$models/llama2-tokenizer/tokenizer.bin" \
  >"$tmp/out" 2>"$tmp/err"; then
  fail "inspect should fail on a 32000-token tokenizer for a 512-row model"
fi
grep -q "MISMATCH: the tokenizer has 32000 tokens, the model 512" "$tmp/out" || fail "inspect: $(cat "$tmp/out")"
"$chorus" inspect --model "$stories" --tokenizer "$tok" >"$tmp/out"
grep -q "vocabulary:   tokenizer and model agree (512 tokens)" "$tmp/out" || fail "inspect: $(cat "$tmp/out")"

# chorus generate: --max-tokens beyond the context is clamped, with a note.
"$chorus" generate --model "$stories" --tokenizer "$tok" --prompt "" --temperature 0 \
  --max-tokens 100000 --ignore-eos --quiet >"$tmp/out" 2>"$tmp/err" || fail "generate: $(cat "$tmp/err")"
grep -q "note: --max-tokens 100000 does not fit the context (512 tokens, prompt 1); generating at most 511" \
  "$tmp/err" || fail "generate note: $(cat "$tmp/err")"
# --tenants: a malformed file is refused at start naming its line; SIGHUP reloads it, and a
# broken file at reload keeps the tenants in force.
printf '{"tenants": {\n  "a": {"keys": ["sk-aaaa-0001"],}\n}}\n' >"$tmp/bad-tenants.json"
expect_startup_error 1 "flag --tenants" "bad-tenants.json: line 2" -- --tenants "$tmp/bad-tenants.json"
printf '{"tenants": {"a": {"keys": ["sk-aaaa-0001"]}}}\n' >"$tmp/tenants.json"
"$chorus" serve --port 0 --tenants "$tmp/tenants.json" >"$tmp/out" 2>"$tmp/tenants.err" &
tpid=$!
pids+=("$tpid")
tport=$(wait_ready "$tmp/tenants.err")
code() { curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $1" "http://127.0.0.1:$tport/v1/models"; }
[[ $(code sk-aaaa-0001) == 200 && $(code sk-bbbb-0001) == 401 ]] || fail "tenant keys before reload"
printf '{"tenants": {"b": {"keys": ["sk-bbbb-0001"]}}}\n' >"$tmp/tenants.json"
kill -HUP "$tpid"
for _ in $(seq 1 100); do grep -q "SIGHUP: reloaded" "$tmp/tenants.err" && break; sleep 0.05; done
[[ $(code sk-bbbb-0001) == 200 && $(code sk-aaaa-0001) == 401 ]] || fail "tenant keys after reload"
printf 'not json' >"$tmp/tenants.json"
kill -HUP "$tpid"
for _ in $(seq 1 100); do grep -q "kept the tenants in force" "$tmp/tenants.err" && break; sleep 0.05; done
grep -q "kept the tenants in force: .*tenants.json: line 1" "$tmp/tenants.err" ||
  fail "bad reload not reported: $(cat "$tmp/tenants.err")"
[[ $(code sk-bbbb-0001) == 200 ]] || fail "a bad reload dropped the tenants"
kill -TERM "$tpid"
wait "$tpid" || fail "tenants server did not exit 0"

echo "cli_serve_startup_test: all checks passed"

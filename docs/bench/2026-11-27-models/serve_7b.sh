#!/bin/bash
# (As run on 2026-11-27 the first request named the base `llama2-7b-q4_k_m` — the served name is the
# file name — and a bare `wait` also waited for the server; serve_run.txt shows the rest was sent
# by hand. This copy has both fixed.)
# Serve the 7B Q4_K_M file with 4 LoRA adapters, send requests (base + each adapter, concurrently,
# then sequentially), record peak RSS of the server (VmHWM) and per-request latency.
cd /root/.cache/chorus-7b
PORT=18097
echo "start $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
./chorus-models serve --model llama2-7b-q4_k_m.gguf --port $PORT --threads 2 --max-running 4 \
  --pool-size 4096 --lora a0=loras/lora-0 --lora a1=loras/lora-1 --lora a2=loras/lora-2 \
  --lora a3=loras/lora-3 > serve.log 2>&1 &
SPID=$!
for i in $(seq 1 600); do curl -sf http://127.0.0.1:$PORT/health >/dev/null && break; sleep 1; done
echo "healthy $(date -u +%H:%M:%S) after ${i}s; RSS $(grep VmRSS /proc/$SPID/status)"
req() {  # model, max_tokens
  local t0=$(date +%s.%N)
  local out=$(curl -s http://127.0.0.1:$PORT/v1/completions -H 'Content-Type: application/json' \
    -d "{\"model\":\"$1\",\"prompt\":\"Once upon a time, in a small village by the sea, there lived\",\"max_tokens\":$2,\"temperature\":0}")
  local t1=$(date +%s.%N)
  echo "$1: $(echo "$t1 - $t0" | bc) s, usage $(echo "$out" | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d.get("usage"), repr(d["choices"][0]["text"][:40]) if "choices" in d else d)')"
}
echo "--- concurrent: base + 4 adapters, 8 tokens each"
pids=(); for m in llama2-7b-q4_k_m.gguf a0 a1 a2 a3; do req $m 8 & pids+=($!); done; wait "${pids[@]}"  # not the server
echo "--- sequential: 8 tokens"
for m in a3; do req $m 8; done
echo "RSS $(grep -E 'VmRSS|VmHWM' /proc/$SPID/status | tr '\n' ' ')"
curl -s http://127.0.0.1:$PORT/metrics | grep -E "^chorus_(kv_blocks|adapters_resident|pool)" | head
kill $SPID; wait $SPID 2>/dev/null
echo "end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"

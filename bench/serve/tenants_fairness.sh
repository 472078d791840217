#!/usr/bin/env bash
# Tenant isolation under a token-rate limit (docs/api.md "Tenants"; docs/benchmarks.md):
# tenant "calm" sends a steady load alone, then the same load while tenant "flood" sends far more
# than its tokens_per_second allows. Reports calm's TTFT p50 in both runs and how many of flood's
# requests were refused with 429.
#
#   bench/serve/tenants_fairness.sh        # env: BUILD, WORK (/tmp/chorus-tenants-bench), PORT (18480)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$here/build/release}
CHORUS=$BUILD/apps/chorus/chorus
LOADGEN=$BUILD/bench/serve/chorus_bench_serve
WORK=${WORK:-/tmp/chorus-tenants-bench}
PORT=${PORT:-18480}
TOKENIZER=${TOKENIZER:-$here/../shared/models/llama2-tokenizer/tokenizer.model}
mkdir -p "$WORK"
model=$WORK/tinyllama-q4_0.gguf
[[ -f $model ]] || "$CHORUS" convert --shape tinyllama-1.1b --dtype q4_0 --tokenizer "$TOKENIZER" --output "$model"
cat >"$WORK/tenants.json" <<'JSON'
{"tenants": {"calm": {"keys": ["sk-calm-000001"]},
             "flood": {"keys": ["sk-flood-00001"], "tokens_per_second": 20}}}
JSON
"$CHORUS" serve --model "$model" --port "$PORT" --threads 2 --max-running 32 --tenants "$WORK/tenants.json" \
  >"$WORK/serve.log" 2>&1 &
pid=$!
trap 'kill -TERM $pid 2>/dev/null || true; wait $pid 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.2; done
calm=(--url "http://127.0.0.1:$PORT" --api-key sk-calm-000001 --rate 0.5 --num-requests 24 --input-min 16
      --input-max 64 --output-min 16 --output-max 32 --token-id-max 30000 --seed 3)
"$LOADGEN" "${calm[@]}" --num-requests 6 --out "$WORK/warmup" >/dev/null 2>&1  # first-use costs
"$LOADGEN" "${calm[@]}" --out "$WORK/calm-solo" >/dev/null 2>&1
"$LOADGEN" --url "http://127.0.0.1:$PORT" --api-key sk-flood-00001 --rate 8 --num-requests 400 \
  --input-min 64 --input-max 128 --output-min 32 --output-max 64 --token-id-max 30000 --seed 9 \
  --out "$WORK/flood" >/dev/null 2>&1 &
flood=$!
sleep 2
"$LOADGEN" "${calm[@]}" --out "$WORK/calm-shared" >/dev/null 2>&1
wait $flood || true
python3 - "$WORK" <<'PY'
import json, sys
w = sys.argv[1]
solo, shared, flood = (json.load(open(f"{w}/{n}.json")) for n in ("calm-solo", "calm-shared", "flood"))
refused = sum(1 for line in open(f"{w}/flood.csv").read().splitlines()[1:] if ",429," in line)
print("calm ttft p50 solo %.3f s, with flood %.3f s (%.1f %% of solo); calm ok %d/%d; "
      "flood: %d sent, %d refused with 429, %d ok" % (
      solo["ttft_s"]["p50"], shared["ttft_s"]["p50"], 100 * shared["ttft_s"]["p50"] / solo["ttft_s"]["p50"],
      shared["requests_ok"], shared["requests_sent"], flood["requests_sent"], refused, flood["requests_ok"]))
PY

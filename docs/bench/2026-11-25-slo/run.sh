#!/usr/bin/env bash
# The script that produced workload-*.json (docs/benchmarks.md "Cost model and SLO scheduling");
# paths as on the machine it ran on (cost model: cost-tiny-2threads.json here).
# usage: run.sh POLICY RATE TAG
set -u
B=/work/wt/slo/build/release
POLICY=$1 RATE=$2 TAG=$3
PORT=18731
extra=""
[[ $POLICY == slo ]] && extra="--cost-model /tmp/slo/tiny.json"
$B/apps/chorus/chorus serve --port $PORT --threads 2 --max-running 8 --max-batch-tokens 256 \
  --policy $POLICY $extra --ttft-slo-ms ${TTFT:-1000} --tpot-slo-ms ${TPOT:-200} > /tmp/slo/wl/serve_$TAG.log 2>&1 &
pid=$!
for i in $(seq 1 100); do curl -sf localhost:$PORT/health >/dev/null && break; sleep 0.2; done
echo "load: $(cat /proc/loadavg)"
$B/bench/serve/chorus_bench_serve --url http://127.0.0.1:$PORT --rate $RATE --num-requests ${NUM:-120} \
  --input-min 32 --input-max 256 --output-min 8 --output-max 64 --seed 3 --metrics-interval 0 \
  --out /tmp/slo/wl/$TAG > /tmp/slo/wl/lg_$TAG.log 2>&1
curl -s localhost:$PORT/metrics | grep -E "^chorus_slo_" 
python3 - "$TAG" <<'PY'
import json,sys
j=json.load(open(f"/tmp/slo/wl/{sys.argv[1]}.json"))
print({k:j[k] for k in ("duration_s","requests_ok","requests_sent","throughput_req_s","errors")}, "ttft", j["ttft_s"])
PY
kill $pid; wait $pid 2>/dev/null

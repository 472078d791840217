#!/usr/bin/env bash
# Issue-4 adapter workloads over real HTTP (docs/benchmarks.md, "Adapter workloads (issue 4)").
#
#   bench/serve/adapter_workloads.sh slora     # slora for n = $NS registered adapters + throughput-vs-n plot
#   bench/serve/adapter_workloads.sh eight     # 8 concurrent requests, 8 adapters vs none
#   bench/serve/adapter_workloads.sh many      # n = 1000 registered, batch 32, every request on an adapter vs none
#
# Every run starts a fresh `chorus serve` (synthetic TinyLlama-1.1B q4_0, --threads 2,
# --max-running 32) with a fresh registry holding exactly the adapters of that run, so "cold"
# (first use of an adapter in the run) means not yet in the host tier. Adapters are written once
# by `chorus convert --lora-count` (ranks round-robin 8/16/32/64 on q,k,v,o, bf16); only
# $DISTINCT weight files are distinct, the other adapter directories hard-link them (disk: 5000
# distinct TinyLlama adapters would need ~85 GB) — each directory is still registered, loaded,
# cached and evicted as a separate adapter.
#
# Environment: BUILD (build/release), WORK (/tmp/chorus-adapter-bench: models, adapters, logs),
# OUT (WORK/results), NS ("100 1000 5000"), RATE, NUM, IN_MIN/IN_MAX, OUT_MIN/OUT_MAX, ALPHA,
# DISTINCT (64), PORT (18400).
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$here/build/release}
CHORUS=$BUILD/apps/chorus/chorus
LOADGEN=$BUILD/bench/serve/chorus_bench_serve
WORK=${WORK:-/tmp/chorus-adapter-bench}
OUT=${OUT:-$WORK/results}
NS=${NS:-"100 1000 5000"}
RATE=${RATE:-1.0}
NUM=${NUM:-60}
IN_MIN=${IN_MIN:-8}
IN_MAX=${IN_MAX:-64}
OUT_MIN=${OUT_MIN:-8}
OUT_MAX=${OUT_MAX:-64}
ALPHA=${ALPHA:-1}
DISTINCT=${DISTINCT:-64}
PORT=${PORT:-18400}
TOKENIZER=${TOKENIZER:-$here/../shared/models/llama2-tokenizer/tokenizer.model}
mkdir -p "$WORK" "$OUT"

model=$WORK/tinyllama-q4_0.gguf
if [[ ! -f $model ]]; then
  "$CHORUS" convert --shape tinyllama-1.1b --dtype q4_0 --tokenizer "$TOKENIZER" --output "$model"
fi

# adapters N -> directory holding exactly N adapters.
adapters() {
  local n=$1 dir=$WORK/loras-n$1
  if [[ ! -f $dir/.complete ]]; then
    rm -rf "$dir"
    local distinct=$DISTINCT
    (( distinct > n )) && distinct=$n
    "$CHORUS" convert --shape tinyllama-1.1b --lora-count "$n" --lora-distinct "$distinct" \
      --lora-ranks 8,16,32,64 --lora-targets q,k,v,o --dtype bf16 --output "$dir" >&2
    touch "$dir/.complete"
  fi
  echo "$dir"
}

server_pid=""
stop_server() {
  if [[ -n $server_pid ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap stop_server EXIT

# start_server LOG [--lora-dir DIR]: a fresh server (new registry state), waits for /health.
start_server() {
  local log=$1
  shift
  # tmpfs: the registry rewrites and fsyncs its state file on every registration (n of them).
  local state=/dev/shm/chorus-bench-registry-$$.json
  rm -f "$state" "$state.lock"
  local t0=$(date +%s.%N)
  "$CHORUS" serve --model "$model" --port "$PORT" --threads 2 --max-running 32 --max-batch-tokens 256 \
    --pool-size 2048 --registry "$state" --adapter-root "$WORK" "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 3600); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
      local t1=$(date +%s.%N)
      echo "server ready after $(echo "$t1 - $t0" | bc) s ($(grep -o '[0-9]* adapters registered' "$log" || echo 'no adapters'))" >&2
      return 0
    fi
    if ! kill -0 "$server_pid" 2>/dev/null; then
      echo "server exited; log:" >&2
      tail -20 "$log" >&2
      return 1
    fi
    sleep 0.5
  done
  echo "server not ready" >&2
  return 1
}

loadgen() { "$LOADGEN" --url "http://127.0.0.1:$PORT" --token-id-max 30000 "$@"; }

case ${1:-} in
  slora)
    csv=$OUT/slora_vs_n.csv
    echo "n,requests_ok,errors,req_s,output_tok_s,ttft_p50,ttft_p99,tpot_p50,tpot_p99,ttft_cold_p50,ttft_warm_p50,cold_over_warm_p50,distinct_used,load_avg" >"$csv"
    for n in $NS; do
      dir=$(adapters "$n")
      start_server "$OUT/serve-slora-n$n.log" --lora-dir "$dir"
      load=$(cut -d' ' -f1 /proc/loadavg)
      loadgen --adapters "$n" --alpha "$ALPHA" --rate "$RATE" --cv 1 --num-requests "$NUM" \
        --input-min "$IN_MIN" --input-max "$IN_MAX" --output-min "$OUT_MIN" --output-max "$OUT_MAX" \
        --out "$OUT/slora-n$n" >/dev/null || true
      curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/slora-n$n.metrics.txt" || true
      stop_server
      python3 - "$OUT/slora-n$n.json" "$n" "$load" >>"$csv" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1])); a = j.get("adapters", {})
g = lambda d, k: (d or {}).get(k, float("nan"))
print(",".join(str(x) for x in [sys.argv[2], j["requests_ok"], j["errors"], round(j["throughput_req_s"], 3),
      round(j["output_tokens_s"], 2), round(g(j["ttft_s"], "p50"), 3), round(g(j["ttft_s"], "p99"), 3),
      round(g(j["tpot_s"], "p50"), 4), round(g(j["tpot_s"], "p99"), 4), round(g(a.get("ttft_cold_s"), "p50"), 3),
      round(g(a.get("ttft_warm_s"), "p50"), 3), round(a.get("ttft_cold_over_warm_p50", float("nan")), 2),
      a.get("distinct_used", 0), sys.argv[3]]))
EOF
    done
    cat "$csv"
    if command -v gnuplot >/dev/null 2>&1; then
      gnuplot <<EOF
set terminal pngcairo size 900,600 noenhanced
set output '$OUT/slora_vs_n.png'
set datafile separator ','
set title 'slora over HTTP: throughput vs registered adapters n (alpha=$ALPHA, R=$RATE req/s)'
set logscale x
set xlabel 'registered adapters n'
set ylabel 'output tokens/s'
set y2label 'TTFT p50 (s)'
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set grid
plot '$csv' every ::1 using 1:5 with linespoints pt 7 lw 2 title 'output tokens/s', \
     '' every ::1 using 1:6 axes x1y2 with linespoints pt 5 title 'TTFT p50 (s)', \
     '' every ::1 using 1:10 axes x1y2 with linespoints pt 4 title 'TTFT p50 cold (s)', \
     '' every ::1 using 1:11 axes x1y2 with linespoints pt 6 title 'TTFT p50 warm (s)'
EOF
      echo "plot: $OUT/slora_vs_n.png"
    fi
    ;;
  eight)
    # 8 concurrent requests (all sent at t≈0), 8 different adapters, then the same 8 without
    # adapters. One warm-up pass first, so the adapters are in the host tier (llama.cpp's
    # comparison had its adapters loaded at start).
    dir=$(adapters 100)
    start_server "$OUT/serve-eight.log" --lora-dir "$dir"
    common=(--rate 1000 --num-requests 8 --input-min 16 --input-max 17 --output-min 128 --output-max 129
            --adapters 8 --adapter-assign round-robin)
    loadgen "${common[@]}" --output-min 2 --output-max 3 --out "$OUT/eight-warmup" >/dev/null || true
    for r in 1 2 3; do
      loadgen "${common[@]}" --compare-base --out "$OUT/eight-$r" >/dev/null || true
      python3 -c "import json;j=json.load(open('$OUT/eight-$r.json'));print('eight run $r: adapters %.1f tok/s, base %.1f tok/s, ratio %.3f' % (j['output_tokens_s'], j['base_only']['output_tokens_s'], j['output_tokens_s_vs_base']))"
    done
    stop_server
    ;;
  many)
    # n = 1000 registered; 64 requests sent at t≈0 (batch up to 32), each on an adapter (power
    # popularity, alpha 1), fixed lengths; then the same plan on the base model.
    dir=$(adapters 1000)
    start_server "$OUT/serve-many.log" --lora-dir "$dir"
    for r in 1 2 3; do
      loadgen --rate 1000 --num-requests 64 --input-min 16 --input-max 17 --output-min 64 --output-max 65 \
        --adapters 1000 --alpha 1 --seed "$r" --compare-base --out "$OUT/many-$r" >/dev/null || true
      python3 -c "import json;j=json.load(open('$OUT/many-$r.json'));print('many run $r: adapters %.1f tok/s, base %.1f tok/s, ratio %.3f, distinct adapters %d' % (j['output_tokens_s'], j['base_only']['output_tokens_s'], j['output_tokens_s_vs_base'], j['adapters']['distinct_used']))"
    done
    curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/many.metrics.txt" || true
    stop_server
    ;;
  *)
    echo "usage: $0 slora|eight|many" >&2
    exit 2
    ;;
esac

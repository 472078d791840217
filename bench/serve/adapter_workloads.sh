#!/usr/bin/env bash
# Adapter workloads over real HTTP (docs/benchmarks.md, "Adapters").
#
#   bench/serve/adapter_workloads.sh setup     # once: adapters + registries (n = 5000: ~20 min)
#   bench/serve/adapter_workloads.sh slora     # slora for n = $NS registered adapters + throughput-vs-n plot
#   bench/serve/adapter_workloads.sh eight     # 8 concurrent requests, 8 adapters vs none
#   bench/serve/adapter_workloads.sh many      # n = 1000 registered, batch 32, every request on an adapter vs none
#   bench/serve/adapter_workloads.sh coldwarm  # cold vs warm TTFT below saturation (fresh server)
#   bench/serve/adapter_workloads.sh prefix    # chat: 80 % share a 512-token system prompt, 8 adapters,
#                                              # with the prefix cache vs --no-prefix-cache
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
# DISTINCT (64), PORT (18400), RUNS (3: repeats of eight / many), MANY_NUM (64), MANY_OUT (64),
# EIGHT_OUT (128), SERVE_FLAGS (extra `chorus serve` flags), PREFIX_RATE (0.3), PREFIX_NUM (40).
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
RUNS=${RUNS:-3}
MANY_NUM=${MANY_NUM:-64}
MANY_OUT=${MANY_OUT:-64}
EIGHT_OUT=${EIGHT_OUT:-128}
SERVE_FLAGS=${SERVE_FLAGS:-}  # extra `chorus serve` flags for every run, e.g. "--loader-threads 4"
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
trap 'stop_server; rm -f /dev/shm/chorus-bench-registry-$$.json /dev/shm/chorus-bench-registry-$$.json.lock' EXIT

# registry N: a registry state file holding exactly the N adapters of adapters(N). Registration
# validates every adapter (reads and converts ~17 MB each: ~0.2 s on a busy 2-core machine) and
# rewrites the state file each time, so n = 5000 takes ~20 minutes — done once, by a throw-away
# server, and reused: a server opening an existing state re-checks entries by size and mtime only.
registry() {
  local n=$1 state=$WORK/registry-n$1.json
  if [[ ! -f $state.complete ]]; then
    local dir
    dir=$(adapters "$n")
    local tmp=/dev/shm/chorus-bench-setup-$$-n$n.json  # tmpfs: no fsync per registration
    rm -f "$tmp" "$tmp.lock"
    echo "registering $n adapters (one-time)..." >&2
    start_server "$OUT/register-n$n.log" "$tmp" --lora-dir "$dir"
    stop_server
    cp "$tmp" "$state"
    rm -f "$tmp" "$tmp.lock"
    touch "$state.complete"
  fi
  echo "$state"
}

# start_server LOG STATE [flags]: a fresh server process on a copy of registry STATE ("" = a
# new empty one), waits for /health.
# With --prefault (in SERVE_FLAGS) the server prefaults its host arena in the background after it is ready
# (docs/adapters.md); measuring during those seconds would charge that start-up work to whichever
# run comes first. Waits (up to 60 s) until /metrics reports the arena resident.
wait_host_arena() {
  local t0 m total done_
  # Only a server started with --prefault makes its arena resident up front; by default pages
  # become resident as loads first use them, which the measured runs then include.
  [[ " $SERVE_FLAGS " == *" --prefault "* ]] || return 0
  t0=$(date +%s.%N)
  for _ in $(seq 1 240); do
    m=$(curl -sf "http://127.0.0.1:$PORT/metrics" || true)
    total=$(awk '/^chorus_adapter_host_arena_bytes /{print $2}' <<<"$m")
    done_=$(awk '/^chorus_adapter_host_arena_prefaulted_bytes /{print $2}' <<<"$m")
    if [[ -z $total || $total == 0 || $total == "$done_" ]]; then
      echo "host arena resident after $(echo "$(date +%s.%N) - $t0" | bc) s more" >&2
      return 0
    fi
    sleep 0.25
  done
  echo "host arena still prefaulting after 60 s; measuring anyway" >&2
}

start_server() {
  local log=$1 src=$2
  shift 2
  local state=/dev/shm/chorus-bench-registry-$$.json
  if [[ $src != "$state" && $src == /dev/shm/chorus-bench-setup-* ]]; then
    state=$src
  else
    rm -f "$state" "$state.lock"
    [[ -n $src ]] && cp "$src" "$state"
  fi
  local t0
  t0=$(date +%s.%N)
  "$CHORUS" serve --model "$model" --port "$PORT" --threads 2 --max-running 32 --max-batch-tokens 256 \
    --pool-size 2048 --registry "$state" --adapter-root "$WORK" $SERVE_FLAGS "$@" >"$log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 7200); do
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
      echo "server ready after $(echo "$(date +%s.%N) - $t0" | bc) s ($(grep -o '[0-9]* adapters registered' "$log" || echo 'no adapters'))" >&2
      wait_host_arena
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
  prefix)
    # The same plan (seeded) against a fresh server with the prefix cache and one without.
    state=$(registry 8)
    common=(--adapters 8 --adapter-assign round-robin --shared-prefix 512 --shared-fraction 0.8
            --rate "${PREFIX_RATE:-0.3}" --num-requests "${PREFIX_NUM:-40}" --input-min 16
            --input-max 64 --output-min 16 --output-max 48)
    for arm in cache nocache; do
      flags=()
      [[ $arm == nocache ]] && flags=(--no-prefix-cache)
      start_server "$OUT/serve-prefix-$arm.log" "$state" "${flags[@]}"
      load=$(cut -d' ' -f1 /proc/loadavg)
      loadgen "${common[@]}" --out "$OUT/prefix-$arm" >/dev/null || true
      curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/prefix-$arm.metrics.txt" || true
      stop_server
      python3 -c "import json;j=json.load(open('$OUT/prefix-$arm.json'));print('prefix $arm: ttft p50 %.3f s p90 %.3f s, %.2f output tok/s, %.3f req/s, ok %d, load %s' % (j['ttft_s']['p50'], j['ttft_s']['p90'], j['output_tokens_s'], j['throughput_req_s'], j['requests_ok'], '$load'))"
    done
    python3 -c "import json;a=json.load(open('$OUT/prefix-cache.json'));b=json.load(open('$OUT/prefix-nocache.json'));print('prefix: ttft p50 without/with cache %.2fx, output tok/s with/without %.3fx' % (b['ttft_s']['p50']/a['ttft_s']['p50'], a['output_tokens_s']/b['output_tokens_s']))"
    ;;
  slora)
    # One row per n (slora-nN.row); the CSV and plot hold every n measured into $OUT so far, so
    # NS can also be run one value at a time.
    csv=$OUT/slora_vs_n.csv
    for n in $NS; do
      state=$(registry "$n")
      start_server "$OUT/serve-slora-n$n.log" "$state"
      load=$(cut -d' ' -f1 /proc/loadavg)
      loadgen --adapters "$n" --alpha "$ALPHA" --rate "$RATE" --cv 1 --num-requests "$NUM" \
        --input-min "$IN_MIN" --input-max "$IN_MAX" --output-min "$OUT_MIN" --output-max "$OUT_MAX" \
        --out "$OUT/slora-n$n" >/dev/null || true
      curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/slora-n$n.metrics.txt" || true
      stop_server
      python3 - "$OUT/slora-n$n.json" "$n" "$load" >"$OUT/slora-n$n.row" <<'EOF'
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
    { echo "n,requests_ok,errors,req_s,output_tok_s,ttft_p50,ttft_p99,tpot_p50,tpot_p99,ttft_cold_p50,ttft_warm_p50,cold_over_warm_p50,distinct_used,load_avg"
      cat "$OUT"/slora-n*.row | sort -t, -k1,1n; } >"$csv"
    cat "$csv"
    python3 "$here/tools/plot.py" slora-vs-n "$csv" -o "$OUT/slora_vs_n.png" \
      --title "slora over HTTP: throughput vs registered adapters n (alpha=$ALPHA, R=$RATE req/s)" || true
    ;;
  eight)
    # 8 concurrent requests (all sent at t≈0), 8 different adapters, then the same 8 without
    # adapters. One warm-up pass first, so the adapters are in the host tier (llama.cpp's
    # comparison had its adapters loaded at start).
    start_server "$OUT/serve-eight.log" "$(registry 100)"
    common=(--rate 1000 --num-requests 8 --input-min 16 --input-max 17
            --output-min "$EIGHT_OUT" --output-max "$((EIGHT_OUT + 1))" --adapters 8 --adapter-assign round-robin)
    loadgen "${common[@]}" --output-min 2 --output-max 3 --out "$OUT/eight-warmup" >/dev/null || true
    for r in $(seq 1 "$RUNS"); do
      loadgen "${common[@]}" --compare-base --out "$OUT/eight-$r" >/dev/null || true
      python3 -c "import json;j=json.load(open('$OUT/eight-$r.json'));print('eight run $r: adapters %.1f tok/s, base %.1f tok/s, ratio %.3f' % (j['output_tokens_s'], j['base_only']['output_tokens_s'], j['output_tokens_s_vs_base']))"
    done
    stop_server
    ;;
  many)
    # n = 1000 registered; $MANY_NUM requests sent at t≈0 (batch up to 32), each on an adapter
    # (power popularity, alpha 1), $MANY_OUT output tokens each; then the same plan on the base.
    start_server "$OUT/serve-many.log" "$(registry 1000)"
    for r in $(seq 1 "$RUNS"); do
      loadgen --rate 1000 --num-requests "$MANY_NUM" --input-min 16 --input-max 17 \
        --output-min "$MANY_OUT" --output-max "$((MANY_OUT + 1))" \
        --adapters 1000 --alpha 1 --seed "$r" --compare-base --out "$OUT/many-$r" >/dev/null || true
      python3 -c "import json;j=json.load(open('$OUT/many-$r.json'));print('many run $r: adapters %.1f tok/s, base %.1f tok/s, ratio %.3f, distinct adapters %d' % (j['output_tokens_s'], j['base_only']['output_tokens_s'], j['output_tokens_s_vs_base'], j['adapters']['distinct_used']))"
    done
    curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/many.metrics.txt" || true
    stop_server
    ;;
  coldwarm)
    # Cold vs warm TTFT below saturation: a fresh server (n = 100 registered), 4 adapters
    # round-robin, 16 requests at 0.2 req/s with equal lengths: the first request of each adapter
    # is cold (not in the host tier: loaded from disk before it is queued), the other 12 warm.
    start_server "$OUT/serve-coldwarm.log" "$(registry 100)"
    loadgen --adapters 4 --adapter-assign round-robin --rate 0.2 --num-requests 16 --input-min 32 \
      --input-max 33 --output-min 8 --output-max 9 --out "$OUT/coldwarm" >/dev/null || true
    curl -s "http://127.0.0.1:$PORT/metrics" >"$OUT/coldwarm.metrics.txt" || true
    stop_server
    python3 -c "import json;a=json.load(open('$OUT/coldwarm.json'))['adapters'];print('coldwarm: TTFT p50 cold %.3f s (%d), warm %.3f s (%d), cold/warm %.2f' % (a['ttft_cold_s']['p50'], a['cold_requests'], a['ttft_warm_s']['p50'], a['warm_requests'], a['ttft_cold_over_warm_p50']))"
    ;;
  setup)
    # Adapters and registries for every n of $NS (and 100, 1000 for eight / many), once.
    for n in $(echo "$NS 100 1000" | tr ' ' '\n' | sort -un); do registry "$n" >/dev/null; done
    ;;
  *)
    echo "usage: $0 setup|slora|eight|many|coldwarm" >&2
    exit 2
    ;;
esac

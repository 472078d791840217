#!/usr/bin/env bash
# The router's pass-through cost (docs/router.md; docs/benchmarks.md "Router"): the same
# open-loop streaming loads against one `chorus serve` replica directly and through `chorus
# router` in front of it, alternating ROUNDS times: a saturating load (arrivals far above
# capacity: output tokens/s is the server's capacity as each path delivers it) and a light one
# (TTFT p50 without queueing). Reports the ratio of throughputs and the TTFT difference. The replica serves the embedded default model, so the router's
# per-token work is a large share of each token's time (a pessimistic case).
#
#   bench/serve/router_overhead.sh     # env: BUILD, WORK (/tmp/chorus-router-bench), PORT (18490), ROUNDS (3)
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$here/build/release}
CHORUS=$BUILD/apps/chorus/chorus
LOADGEN=$BUILD/bench/serve/chorus_bench_serve
WORK=${WORK:-/tmp/chorus-router-bench}
PORT=${PORT:-18490}
ROUNDS=${ROUNDS:-3}
mkdir -p "$WORK"
export CHORUS_CACHE_DIR=$WORK/cache HOME=$WORK
"$CHORUS" serve --port "$PORT" --registry "$WORK/registry.json" >"$WORK/serve.log" 2>&1 &
spid=$!
"$CHORUS" router --port $((PORT + 1)) --replica "http://127.0.0.1:$PORT" >"$WORK/router.log" 2>&1 &
rpid=$!
trap 'kill -TERM $spid $rpid 2>/dev/null || true; wait $spid $rpid 2>/dev/null || true' EXIT
for _ in $(seq 600); do curl -sf "http://127.0.0.1:$((PORT + 1))/health" >/dev/null && break; sleep 0.2; done
common=(--input-min 16 --input-max 64 --output-min 32 --output-max 64 --token-id-max 500 --seed 5
        --metrics-interval 0)
heavy=(--rate 200 --num-requests 200 "${common[@]}")
light=(--rate 4 --num-requests 40 "${common[@]}")
"$LOADGEN" --url "http://127.0.0.1:$PORT" "${light[@]}" --num-requests 10 --out "$WORK/warmup" >/dev/null 2>&1
for r in $(seq "$ROUNDS"); do
  for path in direct router; do
    port=$PORT; [[ $path == router ]] && port=$((PORT + 1))
    "$LOADGEN" --url "http://127.0.0.1:$port" "${heavy[@]}" --out "$WORK/$path-heavy-$r" >/dev/null 2>&1
    "$LOADGEN" --url "http://127.0.0.1:$port" "${light[@]}" --out "$WORK/$path-light-$r" >/dev/null 2>&1
  done
done
python3 - "$WORK" "$ROUNDS" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def get(name):
    j = json.load(open(f"{work}/{name}.json"))
    return j["output_tokens_s"], j["ttft_s"]["p50"], j["errors"]
rows = []
for r in range(1, rounds + 1):
    dh, th = get(f"direct-heavy-{r}"), get(f"router-heavy-{r}")
    dl, tl = get(f"direct-light-{r}"), get(f"router-light-{r}")
    rows.append((th[0] / dh[0], (tl[1] - dl[1]) * 1000))
    print(f"round {r}: saturated direct {dh[0]:.1f} / router {th[0]:.1f} output tok/s "
          f"({dh[2]} / {th[2]} errors); light TTFT p50 direct {dl[1]*1000:.2f} / router "
          f"{tl[1]*1000:.2f} ms ({dl[2]} / {tl[2]} errors)")
print(f"median throughput ratio router/direct {statistics.median(x for x, _ in rows):.3f}, "
      f"median added TTFT p50 {statistics.median(y for _, y in rows):+.2f} ms")
PY

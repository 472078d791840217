#!/usr/bin/env bash
# Base + 32 compressed deltas in one server vs `--swap-full-models` (docs/benchmarks.md,
# "Deltas vs swapping full models"; Chorus issue 13 bar (b), DeltaZip §6 against vLLM-SCB).
#
#   bench/serve/delta_vs_swap.sh setup           # once: base, 32 fine-tunes (q4_0) and 32 deltas
#   bench/serve/delta_vs_swap.sh run SYSTEM POP  # SYSTEM delta|swap, POP zipf|uniform: one run
#   bench/serve/delta_vs_swap.sh plot            # summary table + PNG from the runs in OUT
#
# setup: a synthetic TinyLlama-1.1B base in q4_0 (the serving dtype of both systems). Each
# fine-tune is `chorus convert --finetune-delta 0.02:0.06` (seed i): every linear matrix of the
# base plus Gaussian noise of relative norm 2–6 %, stored in q4_0 like the base — the file the
# swap baseline serves — and `chorus compress --method rtn` makes its delta against the base
# (BITS bits + 2:4, groups of 64: DeltaZip's 2-bit layout by default). Both systems thus serve
# the same fine-tune F = q4_0(B + noise): the swap baseline exactly, the delta server as
# B + rtn(F − B) (the delta also holds F's q4_0 rounding, so it is larger than the noise).
# METHOD=bitdelta makes BitDelta deltas instead (sign + one scale per matrix, the scale the
# mean |Δ|: `--distill-steps 0`, since a synthetic fine-tune has no text to distill on; the
# layout, bytes and kernel are those of a distilled BitDelta file). No
# bf16 copies are written. Making one fine-tune takes minutes on this 2-core machine (1.1 B
# Gaussian draws, quantization, compression), so only DISTINCT (3) weight sets are made and the
# 32 names hard-link them round-robin: every name is still a separate variant to both servers —
# its own registration, host copy and delta term in the delta server, its own swap-in (the file
# read again) in the swap server. Every run starts a fresh server with --threads 2 and sends the
# same seeded open-loop plan (Poisson arrivals, popularity zipf-1.5 or uniform over the 32).
#
# Environment: BUILD (build/release), WORK (/tmp/chorus-swap-bench), OUT (WORK/results), N (32),
# DISTINCT (3), LOCK (a file: each setup command runs under `flock -s LOCK nice -n 19`),
# METHOD (rtn | bitdelta), BITS (2; rtn), RATE, NUM, IN_MIN/IN_MAX, OUT_MIN/OUT_MAX, SEED (1), PORT (18500), K (1: the swap
# baseline's --max-resident-models), HOST_CACHE (16384: the delta server's --host-cache-size in
# MiB), SERVE_FLAGS (extra `chorus serve` flags, both systems), RUN_TAG. With --prefault in
# SERVE_FLAGS a run starts once the server's host arena is resident (its start-up, not the
# measured window); give the delta server a HOST_CACHE that fits its deltas (4096 for 32
# BitDelta deltas) rather than the default, or it makes 16 GiB resident.
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$here/build/release}
CHORUS=$BUILD/apps/chorus/chorus
LOADGEN=$BUILD/bench/serve/chorus_bench_serve
WORK=${WORK:-/tmp/chorus-swap-bench}
OUT=${OUT:-$WORK/results}
N=${N:-32}
DISTINCT=${DISTINCT:-3}
METHOD=${METHOD:-rtn}
BITS=${BITS:-2}
RATE=${RATE:-1.0}
NUM=${NUM:-60}
IN_MIN=${IN_MIN:-16}
IN_MAX=${IN_MAX:-128}
OUT_MIN=${OUT_MIN:-16}
OUT_MAX=${OUT_MAX:-128}
SEED=${SEED:-1}
PORT=${PORT:-18500}
K=${K:-1}
HOST_CACHE=${HOST_CACHE:-16384}
SERVE_FLAGS=${SERVE_FLAGS:-}
RUN_TAG=${RUN_TAG:-r1}
TOKENIZER=${TOKENIZER:-$here/../shared/models/llama2-tokenizer/tokenizer.model}
mkdir -p "$WORK" "$OUT"

base=$WORK/base-q4_0.gguf
# rtn deltas keep the old directory name, so earlier setups stay usable.
if [[ $METHOD == rtn ]]; then deltas_dir=$WORK/deltas; else deltas_dir=$WORK/deltas-$METHOD; fi
ft_name() { printf 'ft%02d' "$1"; }
# Setup commands are CPU-heavy: with LOCK set, each runs under a shared lock, niced (the
# machine's measurement protocol), so that timing runs wait for at most one of them.
heavy() {
  if [[ -n ${LOCK:-} ]]; then flock -s "$LOCK" nice -n 19 "$@"; else "$@"; fi
}

setup() {
  if [[ ! -f $base ]]; then
    heavy "$CHORUS" convert --shape tinyllama-1.1b --dtype q4_0 --tokenizer "$TOKENIZER" \
      --output "$base.tmp"
    mv "$base.tmp" "$base"
  fi
  local compress_flags
  case $METHOD in
    rtn) compress_flags=(--method rtn --bits "$BITS" --sparsity 2:4) ;;
    bitdelta) compress_flags=(--method bitdelta --distill-steps 0) ;;
    *) echo "METHOD must be rtn or bitdelta" >&2; exit 2 ;;
  esac
  mkdir -p "$WORK/full" "$deltas_dir"
  for ((i = 0; i < DISTINCT; i++)); do
    local name full delta
    name=$(ft_name "$i")
    full=$WORK/full/$name.gguf
    delta=$deltas_dir/$name.safetensors
    [[ -f $full && -f $delta ]] && continue
    local t0=$SECONDS
    if [[ ! -f $full ]]; then
      heavy "$CHORUS" convert --model "$base" --tokenizer "$TOKENIZER" --dtype q4_0 \
        --finetune-delta 0.02:0.06 --seed $((i + 1)) --output "$full.tmp.gguf" >/dev/null
      mv "$full.tmp.gguf" "$full"
    fi
    local t1=$SECONDS
    heavy "$CHORUS" compress --base "$base" --finetuned "$full" "${compress_flags[@]}" \
      --output "$delta.tmp.safetensors" >"$deltas_dir/$name.log"
    mv "$delta.tmp.safetensors" "$delta"
    echo "$name: fine-tune $((t1 - t0)) s, compress $((SECONDS - t1)) s;" \
      "$(grep -m1 '^matrices:' "$deltas_dir/$name.log")"
  done
  # Names DISTINCT..N-1 hard-link the distinct files round-robin (see the file comment).
  for ((i = DISTINCT; i < N; i++)); do
    local src=$(ft_name $((i % DISTINCT))) name=$(ft_name "$i")
    ln -f "$WORK/full/$src.gguf" "$WORK/full/$name.gguf"
    ln -f "$deltas_dir/$src.safetensors" "$deltas_dir/$name.safetensors"
  done
  ls -la "$WORK/full" "$deltas_dir"
}

server_pid=""
stop_server() {
  if [[ -n $server_pid ]]; then
    kill -TERM "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
    server_pid=""
  fi
}
trap 'stop_server' EXIT

# meminfo KEY -> kB
meminfo() { awk -v k="$1:" '$1 == k { print $2 }' /proc/meminfo; }

# run SYSTEM POP: one fresh server, one seeded plan; raw files in OUT/SYSTEM-POP-RUN_TAG.*
run() {
  local system=$1 pop=$2
  local tag=$OUT/$system-$pop-$RUN_TAG
  local args=(serve --model "$base" --port "$PORT" --host 127.0.0.1 --threads 2
              --max-running 32 --max-batch-tokens 512 --max-queue 4096 --drain-timeout 5)
  case $system in
    delta)
      rm -f "$WORK/registry-run.json" "$WORK/registry-run.json.lock"
      args+=(--registry "$WORK/registry-run.json" --no-finetune --host-cache-size "$HOST_CACHE")
      for ((i = 0; i < N; i++)); do
        args+=(--delta "$(ft_name "$i")=$deltas_dir/$(ft_name "$i").safetensors")
      done ;;
    swap)
      args+=(--swap-full-models --max-resident-models "$K")
      for ((i = 0; i < N; i++)); do
        args+=(--full-model "$(ft_name "$i")=$WORK/full/$(ft_name "$i").gguf")
      done ;;
    *) echo "SYSTEM must be delta or swap" >&2; exit 2 ;;
  esac
  local assign=()
  case $pop in
    zipf) assign=(--adapter-assign zipf --zipf-s 1.5) ;;
    uniform) assign=(--adapter-assign power --alpha 1) ;;
    *) echo "POP must be zipf or uniform" >&2; exit 2 ;;
  esac
  # shellcheck disable=SC2086
  "$CHORUS" "${args[@]}" $SERVE_FLAGS >"$tag.server.log" 2>&1 &
  server_pid=$!
  local t0=$SECONDS
  until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
    kill -0 "$server_pid" 2>/dev/null || { echo "server died; see $tag.server.log" >&2; exit 1; }
    sleep 1
  done
  # --prefault: the host arena is made resident by a background thread after /health answers.
  if [[ " $SERVE_FLAGS " == *" --prefault "* ]]; then
    until curl -s "http://127.0.0.1:$PORT/metrics" | awk '
        $1 == "chorus_adapter_host_arena_bytes" { size = $2 }
        $1 == "chorus_adapter_host_arena_prefaulted_bytes" { done = $2 }
        END { exit !(size == done) }'; do
      sleep 1
    done
  fi
  local startup=$((SECONDS - t0))
  {
    echo "system=$system popularity=$pop run=$RUN_TAG rate=$RATE num=$NUM seed=$SEED k=$K method=$METHOD bits=$BITS"
    echo "startup_s=$startup"
    echo "start $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)"
    echo "start Cached_kB $(meminfo Cached) MemAvailable_kB $(meminfo MemAvailable)"
    echo "start server_io $(tr '\n' ' ' </proc/$server_pid/io)"
  } >"$tag.env"
  "$LOADGEN" --url "http://127.0.0.1:$PORT" --rate "$RATE" --cv 1 --num-requests "$NUM" \
    --duration 100000 --input-min "$IN_MIN" --input-max "$IN_MAX" --output-min "$OUT_MIN" \
    --output-max "$OUT_MAX" --seed "$SEED" --adapters "$N" "${assign[@]}" --timeout 1800 \
    --out "$tag" >"$tag.loadgen.log" 2>&1
  {
    echo "end $(date -u +%FT%TZ) loadavg $(cat /proc/loadavg)"
    echo "end Cached_kB $(meminfo Cached) MemAvailable_kB $(meminfo MemAvailable)"
    echo "end server_io $(tr '\n' ' ' </proc/$server_pid/io)"
    echo "server_rss_kB $(awk '$1 == "VmHWM:" { print $2 }' /proc/$server_pid/status)"
  } >>"$tag.env"
  curl -s "http://127.0.0.1:$PORT/metrics" >"$tag.metrics"
  stop_server
  python3 - "$tag" <<'PY'
import json, sys
tag = sys.argv[1]
s = json.load(open(tag + ".json"))
m = {}
for line in open(tag + ".metrics"):
    if line.startswith("#") or " " not in line:
        continue
    k, v = line.rsplit(" ", 1)
    m[k] = float(v)
def ttft(p):
    return s["ttft_s"][p] if "ttft_s" in s else float("nan")
print(f"{tag}: {s.get('requests_ok')} ok, {s.get('errors')} errors, "
      f"{s.get('throughput_req_s', 0):.3f} req/s, {s.get('output_tokens_s', 0):.1f} output tok/s, TTFT p50 {ttft('p50'):.2f} s p90 {ttft('p90'):.2f} s; "
      f"swaps {m.get('chorus_full_model_swaps_total', 0):.0f} "
      f"({m.get('chorus_full_model_swap_seconds_sum', 0):.1f} s, "
      f"{m.get('chorus_full_model_swap_file_bytes_total', 0) / 1e9:.2f} GB files, "
      f"{m.get('chorus_full_model_swap_read_bytes_total', 0) / 1e9:.2f} GB from storage)")
PY
}

# plot: runs.csv (one row per run), summary.csv (medians per system, popularity and offered
# rate), PNG.
plot() {
  python3 - "$OUT" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
runs = []
for path in sorted(glob.glob(os.path.join(out, "*-*-*.json"))):
    system, pop, tag = os.path.basename(path)[:-5].split("-", 2)
    s = json.load(open(path))
    m = {}
    mpath = path[:-5] + ".metrics"
    if os.path.exists(mpath):
        for line in open(mpath):
            if not line.startswith("#") and " " in line:
                k, v = line.rsplit(" ", 1)
                m[k] = float(v)
    t = s.get("ttft_s") or {}
    # Runs at different offered rates are summarized apart: "zipf@0.12", "zipf@2".
    pop = f"{pop}@{s['rate']:g}"
    runs.append(dict(system=system, popularity=pop, run=tag, ok=s["requests_ok"],
                     errors=s["errors"], duration_s=s["duration_s"],
                     req_s=s["throughput_req_s"], output_tok_s=s["output_tokens_s"],
                     ttft_p50=t.get("p50", float("nan")), ttft_p90=t.get("p90", float("nan")),
                     swaps=m.get("chorus_full_model_swaps_total", 0),
                     swap_s=m.get("chorus_full_model_swap_seconds_sum", 0),
                     swap_file_gb=m.get("chorus_full_model_swap_file_bytes_total", 0) / 1e9,
                     swap_read_gb=m.get("chorus_full_model_swap_read_bytes_total", 0) / 1e9))
cols = list(runs[0].keys()) if runs else []
with open(os.path.join(out, "runs.csv"), "w") as f:
    f.write(",".join(cols) + "\n")
    for r in runs:
        f.write(",".join(f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in cols) + "\n")
groups = {}
for r in runs:
    groups.setdefault((r["system"], r["popularity"]), []).append(r)
with open(os.path.join(out, "summary.csv"), "w") as f:
    f.write("system,popularity,runs,req_s,output_tok_s,ttft_p50,ttft_p90,swaps\n")
    for (system, pop), rs in sorted(groups.items()):
        med = lambda k: statistics.median(r[k] for r in rs)
        f.write(f"{system},{pop},{len(rs)},{med('req_s'):.4f},{med('output_tok_s'):.2f},"
                f"{med('ttft_p50'):.3f},{med('ttft_p90'):.3f},{med('swaps'):.0f}\n")
print(open(os.path.join(out, "summary.csv")).read(), end="")
for pop in sorted({p for _, p in groups}):
    d, w = groups.get(("delta", pop)), groups.get(("swap", pop))
    if d and w:
        dr = statistics.median(r["req_s"] for r in d); wr = statistics.median(r["req_s"] for r in w)
        dt = statistics.median(r["ttft_p90"] for r in d); wt = statistics.median(r["ttft_p90"] for r in w)
        print(f"{pop}: throughput delta/swap {dr / wr:.2f}x, p90 TTFT delta {dt:.2f} s vs swap {wt:.2f} s")
PY
  python3 "$here/tools/plot.py" delta-vs-swap "$OUT/summary.csv" -o "$OUT/delta_vs_swap.png" \
    --title "TinyLlama-1.1B q4_0, 32 fine-tunes, 2 threads: base + deltas vs --swap-full-models"
}

case ${1:-} in
  setup) setup ;;
  run) run "$2" "$3" ;;
  plot) plot ;;
  *) echo "usage: $0 setup|run SYSTEM POP|plot" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Training speed of `chorus finetune` against PyTorch CPU (bench/train/torch_lora.py, Debian's
# python3-torch) on the same shape, LoRA and sequence length, run one after the other in one
# invocation (docs/finetuning.md, "Speed"; docs/benchmarks.md). Also runs bench/micro
# train_bench's PeakFma for the machine's FLOP/s. Records /proc/loadavg around each run.
#
# Debian's torch calls the system BLAS (the libblas.so.3 alternative): install
# libopenblas0-pthread first, or PyTorch runs on the netlib reference BLAS and is not a fair
# baseline; the BLAS in use is recorded in OUT_DIR/blas.txt and, as the process loaded it
# (OpenBLAS's openblas_get_config / openblas_get_corename), in torch.json's "blas". Both
# packages (apt-get install python3-torch libopenblas0-pthread) are benchmark-only dependencies,
# deliberately not installed by scripts/setup.sh.
#
# OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE are unset for the PyTorch command alone: some hosts set
# them as a workaround for old OpenBLAS builds, and a current OpenBLAS forced to an older core
# (e.g. Haswell on an AVX-512 machine) runs slower, so PyTorch would not get its best.
#
#   bench/train/finetune_vs_torch.sh [OUT_DIR]     env: DTYPES="f32 q4_0" STEPS=4 THREADS=2
set -euo pipefail
ROOT=${CHORUS_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
B=${CHORUS:-$ROOT/build/release/apps/chorus/chorus}
TB=${TRAIN_BENCH:-$ROOT/build/release/bench/train_bench}
M=${MODELS:-$ROOT/../shared/models}
OUT=${1:-/tmp/finetune-vs-torch}
DTYPES=${DTYPES:-f32 q4_0}
STEPS=${STEPS:-4}
THREADS=${THREADS:-2}
mkdir -p "$OUT"
# Data: the stories text as one document, so every packed sequence is a full 256 tokens.
grep -v '^$' "$M/stories260K-finetunes/things/data/train.txt" > "$OUT/train.txt"
load() { echo "$1 $(cut -d' ' -f1-3 /proc/loadavg)" >> "$OUT/loadavg.txt"; }
: > "$OUT/loadavg.txt"
for dt in $DTYPES; do
  gguf=$OUT/tinyllama-$dt.gguf
  [ -f "$gguf" ] || "$B" convert --shape tinyllama-1.1b --dtype "$dt" --output "$gguf" >/dev/null 2>&1
  load "chorus-$dt-start"
  # One warm-up step (page faults of the mmap'd weights), then STEPS measured steps.
  "$B" finetune --model "$gguf" --tokenizer "$M/stories260K/tok512.bin" --data "$OUT/train.txt" \
    --rank 16 --targets q,k,v,o --seq-len 256 --batch 1 --steps $((STEPS + 1)) \
    --threads "$THREADS" --output "$OUT/run-$dt" > "$OUT/chorus-$dt.out" 2> "$OUT/chorus-$dt.err"
  load "chorus-$dt-end"
done
readlink -f /usr/lib/x86_64-linux-gnu/libblas.so.3 > "$OUT/blas.txt" 2>/dev/null || true
load "torch-start"
env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OPENBLAS_NUM_THREADS="$THREADS" \
/usr/bin/python3 "$ROOT/bench/train/torch_lora.py" --shape tinyllama-1.1b --rank 16 --targets q,k,v,o \
  --seq-len 256 --threads "$THREADS" --steps "$STEPS" --warmup-steps 1 > "$OUT/torch.json" 2> "$OUT/torch.err"
load "torch-end"
"$TB" --benchmark_filter='PeakFma' --benchmark_repetitions=3 --benchmark_min_time=0.3 \
  --benchmark_format=json > "$OUT/peak.json" 2>/dev/null
load "peak-end"
python3 - "$OUT" "$DTYPES" "$THREADS" <<'PY'
import csv, json, statistics, sys
out, dtypes, threads = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
peak = [b["FLOP/s"] for b in json.load(open(f"{out}/peak.json"))["benchmarks"]
        if b.get("run_type") == "iteration" and b["name"].startswith(f"PeakFma/{threads}")]
peak = statistics.median(peak)
# FLOPs per trained token at TinyLlama-1.1B: forward 2·(linear params) + backward dx through every
# linear (2·params again, minus layer 0's q/k/v) + the LoRA terms; attention excluded (< 2 %).
d, L, ff, kv, vocab, r = 2048, 22, 5632, 256, 32000, 16
lin = d * d * 2 + d * kv * 2 + 3 * d * ff
per_tok = 2 * (L * lin + vocab * d) + 2 * (L * lin - (d * d + 2 * d * kv) + vocab * d)
per_tok += L * 6 * r * (6 * d + 2 * kv)  # q,k,v,o: forward 2r(in+out), backward 4r(in+out)
torch = json.load(open(f"{out}/torch.json"))
print(f"peak FMA FLOP/s ({threads} threads): {peak / 1e9:.1f} GFLOP/s; FLOPs per trained token {per_tok / 1e9:.2f} G")
blas = torch.get("blas", {})
print(f"torch BLAS: {blas.get('openblas_config', ', '.join(blas.get('libraries', [])) or '?')}"
      f" (core {blas.get('openblas_core', '?')})")
print(f"torch {torch['torch']}: {torch['tokens_per_s_median']:.2f} tokens/s "
      f"({torch['tokens_per_s_median'] * per_tok / peak * 100:.1f} % of peak)")
for dt in dtypes:
    rows = list(csv.DictReader(open(f"{out}/run-{dt}/loss.csv")))
    # Per-step times from the elapsed column, the first (warm-up) step dropped.
    times = [float(b["elapsed_s"]) - float(a["elapsed_s"]) for a, b in zip(rows, rows[1:])]
    tps = 256 / statistics.median(times)
    print(f"chorus {dt}: {tps:.2f} tokens/s ({tps * per_tok / peak * 100:.1f} % of peak), "
          f"{tps / torch['tokens_per_s_median']:.2f}x torch")
PY
cat "$OUT/loadavg.txt"

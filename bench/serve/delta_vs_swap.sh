#!/usr/bin/env bash
# Base + 32 compressed deltas in one server vs `--swap-full-models` (docs/benchmarks.md,
# "Deltas vs swapping full models"; Chorus issue 13 bar (b), DeltaZip §6 against vLLM-SCB).
#
#   bench/serve/delta_vs_swap.sh setup           # once: base, 32 fine-tunes (q4_0) and 32 deltas
#   bench/serve/delta_vs_swap.sh run SYSTEM POP  # SYSTEM delta|swap, POP zipf|uniform: one run
#   bench/serve/delta_vs_swap.sh plot            # summary table + PNG from the runs in OUT
#
# setup: a synthetic TinyLlama-1.1B base in q4_0 (the serving dtype of both systems); for each of
# the 32 fine-tunes, `chorus convert --finetune-delta 0.02:0.06` writes base + Gaussian noise of
# relative norm 2–6 % per matrix in bf16 (seed i), `chorus compress --method rtn` makes its delta
# against the q4_0 base (LAYOUT bits + 2:4, groups of 64: DeltaZip's 2-bit layout by default),
# `chorus convert --dtype q4_0` writes the whole fine-tune as the swap baseline serves it, and the
# bf16 copy is deleted (disk). Every run starts a fresh server with --threads 2 and sends the
# same seeded open-loop plan (Poisson arrivals, popularity zipf-1.5 or uniform over the 32).
#
# Environment: BUILD (build/release), WORK (/tmp/chorus-swap-bench), OUT (WORK/results), N (32),
# BITS (2), RATE, NUM, IN_MIN/IN_MAX, OUT_MIN/OUT_MAX, SEED (1), PORT (18500), K (1: the swap
# baseline's --max-resident-models), SERVE_FLAGS (extra `chorus serve` flags), RUN_TAG.
set -euo pipefail

here=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$here/build/release}
CHORUS=$BUILD/apps/chorus/chorus
LOADGEN=$BUILD/bench/serve/chorus_bench_serve
WORK=${WORK:-/tmp/chorus-swap-bench}
OUT=${OUT:-$WORK/results}
N=${N:-32}
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
SERVE_FLAGS=${SERVE_FLAGS:-}
RUN_TAG=${RUN_TAG:-r1}
TOKENIZER=${TOKENIZER:-$here/../shared/models/llama2-tokenizer/tokenizer.model}
mkdir -p "$WORK" "$OUT"

base=$WORK/base-q4_0.gguf
ft_name() { printf 'ft%02d' "$1"; }

setup() {
  if [[ ! -f $base ]]; then
    "$CHORUS" convert --shape tinyllama-1.1b --dtype q4_0 --tokenizer "$TOKENIZER" --output "$base.tmp"
    mv "$base.tmp" "$base"
  fi
  mkdir -p "$WORK/full" "$WORK/deltas"
  for ((i = 0; i < N; i++)); do
    local name full delta tmp
    name=$(ft_name "$i")
    full=$WORK/full/$name.gguf
    delta=$WORK/deltas/$name.safetensors
    [[ -f $full && -f $delta ]] && continue
    tmp=$WORK/$name-bf16.gguf
    local t0=$SECONDS
    "$CHORUS" convert --model "$base" --tokenizer "$TOKENIZER" --dtype bf16 \
      --finetune-delta 0.02:0.06 --seed $((i + 1)) \
      --output "$tmp" >/dev/null
    "$CHORUS" compress --base "$base" --finetuned "$tmp" --method rtn --bits "$BITS" \
      --sparsity 2:4 --output "$delta" >"$WORK/deltas/$name.log"
    "$CHORUS" convert --model "$tmp" --dtype q4_0 --output "$full.tmp" >/dev/null
    mv "$full.tmp" "$full"
    rm -f "$tmp"
    echo "$name: $((SECONDS - t0)) s; $(tail -n 2 "$WORK/deltas/$name.log" | head -n 1)"
  done
}

case ${1:-} in
  setup) setup ;;
  *) echo "usage: $0 setup|run SYSTEM POP|plot" >&2; exit 2 ;;
esac

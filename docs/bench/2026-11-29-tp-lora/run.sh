#!/usr/bin/env bash
# TP=2 vs TP=1 decode at batch 32 with every row on a different LoRA adapter (32 adapters,
# q/k/v/o, ranks 8/16/32/64, bf16), each rank of TP=2 holding its part of every adapter (S-LoRA
# §6's split); base rows and LoRA rows interleaved in each invocation (docs/benchmarks.md,
# "Tensor parallelism with LoRA rows"). Usage: bash run.sh OUT_DIR [ROUNDS] [BATCHES]
set -euo pipefail
out=${1:?usage: run.sh OUT_DIR [ROUNDS] [BATCHES]}
rounds=${2:-3}
batches=${3:-32}
chorus=${CHORUS:-build/release/apps/chorus/chorus}
mkdir -p "$out"
common=(--shape tinyllama-1.1b --dtypes q8_0 --batches "$batches" --context 32 --decode-steps 32
        --repeats 5 --adapters 32 --lora-ranks 8,16,32,64)
for i in $(seq "$rounds"); do
  uptime | tee -a "$out/loads.txt"
  "$chorus" bench --tp 1 --threads 2 "${common[@]}" --out "$out/tp1-run$i"
  mpirun -np 2 --bind-to none "$chorus" bench --tp 2 --threads 1 "${common[@]}" --out "$out/tp2-run$i"
done

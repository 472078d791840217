#!/bin/bash
# Peak resident memory of `chorus compress` before (OLD: main 88488f4) and after (NEW) the
# read-not-load change, at TinyLlama-1.1B shape (bf16 base.gguf and ft.gguf in the working
# directory), one after the other; each pair's deltas are compared byte for byte. deltazip runs
# with a shorter calibration (1,024 tokens, 1 refine sweep) than its default to keep the pair
# under 15 minutes: the peak does not depend on it.
#
# What actually ran (2026-12-01/02): OLD rtn (memory.out: 86.44 s, 9 381 044 KB) and NEW rtn
# (mem-rtn-NEW.log: 63.13 s, 781 064 KB; the two deltas identical byte for byte). The OLD deltazip
# run was stopped before it finished (its "before" figure in docs/deltas.md is the 10.7 GB of the
# full-calibration run, docs/bench/2026-12-01-deltazip-tinyllama/). NEW deltazip ran on
# 2026-12-02 by the same command (mem-dz-NEW.log; the OLD build no longer existed, and a CI run
# shared the machine, so its time is not comparable; its peak memory is).
# Binaries and M (the shared model assets) default to paths relative to a clone's root; run
# from the directory holding the models with absolute paths set.
set -e
OLD=${OLD:?set OLD to the old build chorus binary}
NEW=${NEW:-build/release/apps/chorus/chorus}
M=${M:-../shared/models}  # the shared model assets
T=$M/stories260K-finetunes/things
TOK=$M/llama2-tokenizer/tokenizer.model
run() {  # label, binary, args...
  local label=$1 bin=$2; shift 2
  /usr/bin/time -f "%e s %M KB" "$bin" compress --base base.gguf --finetuned ft.gguf "$@" \
      --output "mem-$label.safetensors" > "mem-$label.log" 2>&1
  tail -1 "mem-$label.log"
}
for v in OLD NEW; do
  bin=$OLD; [ $v = NEW ] && bin=$NEW
  run rtn-$v $bin --method rtn --bits 2 --sparsity 2:4
  run dz-$v $bin --method deltazip --bits 2 --sparsity 2:4 --calib $T/data/train.txt \
      --tokenizer $TOK --calib-tokens 1024 --refine-sweeps 1
done
cmp mem-rtn-OLD.safetensors mem-rtn-NEW.safetensors && echo "rtn: identical"
cmp mem-dz-OLD.safetensors mem-dz-NEW.safetensors && echo "deltazip: identical"

#!/bin/bash
# Usage: hold-slora.sh CVS  — one hold of the slora sweep (appends to the same OUT).
set -u
cd /work/main
out=OUT
echo "hold $1 start $(date -u +%T) load $(cat /proc/loadavg)"
python3 bench/serve/slo_sweep.py --chorus build/release/apps/chorus/chorus \
  --loadgen build/release/bench/serve/chorus_bench_serve --out $out --work WORK \
  --cvs "$1" --repeats "$2" --append
echo "hold $1 end $(date -u +%T) load $(cat /proc/loadavg) rc $?"

set -e
echo "hold1 start $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
/work/wt-slosweep/build/release/apps/chorus/chorus profile --threads 2 --csv tiny-median3.csv --out tiny-median3.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/work/wt-slosweep/build/release/apps/chorus/chorus profile --threads 2 --repeats 7 --timing min --csv tiny-min7.csv --out tiny-min7.json 2>/dev/null
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
python3 /work/wt-slosweep/bench/serve/slo_sweep.py --chorus /work/wt-slosweep/build/release/apps/chorus/chorus --loadgen /work/wt-slosweep/build/release/bench/serve/chorus_bench_serve   --out /tmp/h1/sweep --work /tmp/h1/work --cost-model /tmp/h1/tiny-min7.json --cvs 1,2,4   --duration 10 --min-requests 30 2>&1 || true
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
/work/wt-slosweep/build/release/apps/chorus/chorus profile --model /work/shared/models/stories260K/stories260K.bin --threads 2 --repeats 7 --timing min --csv s260-min7.csv --out s260-min7.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/work/wt-slosweep/build/release/apps/chorus/chorus profile --model /work/shared/models/stories260K/stories260K.bin --threads 2 --csv s260-median3.csv --out s260-median3.json 2>/dev/null
echo "hold1 end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"

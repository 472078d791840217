# Second hold: the cost model with the prefill-context term first (seconds), then the fixed slo
# policy over every sweep point, then the points of hold 1 that overlapped a build; the sweeps
# stop at 00:48 UTC (this helper's deadline is 00:55).
cd /tmp/h1
left() { echo $(( $(date -u -d 00:48 +%s) - $(date -u +%s) )); }
echo "hold2 start $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --threads 2 --csv tiny-split-median3.csv --out tiny-split-median3.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --threads 2 --repeats 5 --csv tiny-split-median5.csv --out tiny-split-median5.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --threads 2 --repeats 7 --timing min --csv tiny-split-min7.csv --out tiny-split-min7.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --model /work/shared/models/stories260K/stories260K.bin --tokenizer /work/shared/models/stories260K/tok512.bin --threads 2 --csv s260-split-median3.csv --out s260-split-median3.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --model /work/shared/models/stories260K/stories260K.bin --tokenizer /work/shared/models/stories260K/tok512.bin --threads 2 --repeats 7 --timing min --csv s260-split-min7.csv --out s260-split-min7.json 2>/dev/null
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
# The slo policy with the overload fix (chorus-v2), every point, into sweep-fixed/ beside the
# fcfs and cluster rows of hold 1 (same capacity, SLO and cost model).
rm -rf sweep-fixed; mkdir -p sweep-fixed
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open("sweep/slo_sweep.csv")))
with open("sweep-fixed/slo_sweep.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())); w.writeheader(); [w.writerow(r) for r in rows if r["policy"] != "slo"]
PY
cp sweep/slo_sweep.json sweep-fixed/
if [ $(left) -gt 60 ]; then
  timeout $(left) python3 /work/wt-slosweep/bench/serve/slo_sweep.py --chorus /tmp/h1/chorus-v2 --loadgen /work/wt-slosweep/build/release/bench/serve/chorus_bench_serve \
    --out /tmp/h1/sweep-fixed --work /tmp/h1/work --cost-model /tmp/h1/tiny-min7.json --cvs 1,2,4 \
    --policies slo --duration 10 --min-requests 30 --append 2>&1
fi
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
# Hold 1's points that overlapped its build (cv 1 from 1.0x, cv 2 up to 0.8x), all three policies
# as in hold 1 (chorus-v1), into sweep-hold2/.
rm -rf sweep-hold2; mkdir -p sweep-hold2
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open("sweep/slo_sweep.csv")))
bad = lambda r: (float(r["cv"]) == 1 and float(r["fraction"]) >= 1.0) or (float(r["cv"]) == 2 and float(r["fraction"]) <= 0.8)
with open("sweep-hold2/slo_sweep.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())); w.writeheader(); [w.writerow(r) for r in rows if not bad(r)]
PY
cp sweep/slo_sweep.json sweep-hold2/
if [ $(left) -gt 60 ]; then
  timeout $(left) python3 /work/wt-slosweep/bench/serve/slo_sweep.py --chorus /tmp/h1/chorus-v1 --loadgen /work/wt-slosweep/build/release/bench/serve/chorus_bench_serve \
    --out /tmp/h1/sweep-hold2 --work /tmp/h1/work --cost-model /tmp/h1/tiny-min7.json --cvs 1,2 \
    --duration 10 --min-requests 30 --append 2>&1
fi
echo "hold2 end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"

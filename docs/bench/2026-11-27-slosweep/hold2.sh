set -e
cd /tmp/h1
echo "hold2 start $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"
# The points measured while this helper's own build ran (cv 1 from 0.8x, cv 2 up to 0.5x) are
# measured again; their first runs are kept in runs-during-build/.
mkdir -p sweep/runs-during-build
python3 - <<'PY'
import csv, shutil, glob, os
p = "sweep/slo_sweep.csv"
rows = list(csv.DictReader(open(p)))
bad = lambda r: (float(r["cv"]) == 1 and float(r["fraction"]) >= 0.8) or (float(r["cv"]) == 2 and float(r["fraction"]) <= 0.5)
keep = [r for r in rows if not bad(r)]
for r in rows:
    if bad(r):
        for f in glob.glob("sweep/runs/%s-cv%g-f%g.*" % (r["policy"], float(r["cv"]), float(r["fraction"]))):
            shutil.move(f, "sweep/runs-during-build/" + os.path.basename(f))
with open("sweep/slo_sweep-during-build.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())); w.writeheader(); [w.writerow(r) for r in rows if bad(r)]
with open(p, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())); w.writeheader(); [w.writerow(r) for r in keep]
print("kept", len(keep), "re-measuring", len(rows) - len(keep))
PY
python3 /work/wt-slosweep/bench/serve/slo_sweep.py --chorus /tmp/h1/chorus-v1 --loadgen /work/wt-slosweep/build/release/bench/serve/chorus_bench_serve   --out /tmp/h1/sweep --work /tmp/h1/work --cost-model /tmp/h1/tiny-min7.json --cvs 1,2,4   --duration 10 --min-requests 30 --append 2>&1 || true
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
/tmp/h1/chorus-v1 profile --threads 2 --csv tiny-split-median3.csv --out tiny-split-median3.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v1 profile --threads 2 --repeats 7 --timing min --csv tiny-split-min7.csv --out tiny-split-min7.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v1 profile --threads 2 --repeats 5 --csv tiny-split-median5.csv --out tiny-split-median5.json 2>/dev/null
echo "load $(cat /proc/loadavg)"
echo "load $(cat /proc/loadavg)"
# The slo policy with the overload fix (chorus-v2), every point, into sweep-fixed/ next to the
# fcfs and cluster rows measured before.
rm -rf sweep-fixed; mkdir -p sweep-fixed
python3 - <<'PY'
import csv
rows = list(csv.DictReader(open("sweep/slo_sweep.csv")))
with open("sweep-fixed/slo_sweep.csv", "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(rows[0].keys())); w.writeheader(); [w.writerow(r) for r in rows if r["policy"] != "slo"]
PY
cp sweep/slo_sweep.json sweep-fixed/
python3 /work/wt-slosweep/bench/serve/slo_sweep.py --chorus /tmp/h1/chorus-v2 --loadgen /work/wt-slosweep/build/release/bench/serve/chorus_bench_serve   --out /tmp/h1/sweep-fixed --work /tmp/h1/work --cost-model /tmp/h1/tiny-min7.json --cvs 1,2,4   --duration 10 --min-requests 30 --append 2>&1 || true
echo "load $(cat /proc/loadavg) $(date -u +%H:%M:%S)"
/tmp/h1/chorus-v2 profile --model /work/shared/models/stories260K/stories260K.bin --tokenizer /work/shared/models/stories260K/tok512.bin --threads 2 --csv s260-split-median3.csv --out s260-split-median3.json 2>/dev/null || true
echo "load $(cat /proc/loadavg)"
/tmp/h1/chorus-v2 profile --model /work/shared/models/stories260K/stories260K.bin --tokenizer /work/shared/models/stories260K/tok512.bin --threads 2 --repeats 7 --timing min --csv s260-split-min7.csv --out s260-split-min7.json 2>/dev/null || true
echo "hold2 end $(date -u +%H:%M:%S) load $(cat /proc/loadavg)"

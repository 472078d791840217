#!/usr/bin/env bash
# bench/serve/slo_sweep.py with a tiny budget (a few seconds of load), so the sweep tool cannot
# rot: setup (adapters + registry), a quick profile, the capacity run, every policy at two rates,
# the CSV with its columns and sane values, the JSON summary with the bar checks, and the plot.
# No timing is asserted: the figures depend on the machine and whatever else runs on it.
# Bad arguments are refused naming the problem.
# usage: slo_sweep_test.sh CHORUS LOADGEN REPO_ROOT
set -euo pipefail
chorus=$1
loadgen=$2
root=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
sweep() { python3 "$root/bench/serve/slo_sweep.py" --chorus "$chorus" --loadgen "$loadgen" "$@"; }

# Repeat r runs a point's policies rotated by r, so none always runs first or last.
python3 - "$root/bench/serve" <<'PY' || fail "run order"
import sys
sys.path.insert(0, sys.argv[1])
from slo_sweep import run_order
p = ["fcfs", "cluster", "slo"]
assert [run_order(p, r) for r in range(4)] == [p, p[1:] + p[:1], p[2:] + p[:2], p], "rotation"
PY

# Refusals first (no server is started for them).
if sweep --out "$tmp/bad" --policies fcfs,lifo 2>"$tmp/err"; then fail "unknown policy accepted"; fi
grep -q "unknown policy 'lifo'" "$tmp/err" || fail "unknown policy: $(cat "$tmp/err")"
if sweep --out "$tmp/bad" --fractions 0.5,x 2>"$tmp/err"; then fail "bad --fractions accepted"; fi
grep -q "fractions" "$tmp/err" || fail "bad fractions: $(cat "$tmp/err")"

sweep --out "$tmp/out" --adapters 12 --cvs 1 --fractions 0.5,1.5 --duration 1 --min-requests 6 \
  --max-requests 30 \
  --capacity-requests 16 --capacity-seconds 2 --input-min 8 --input-max 64 --output-min 4 --output-max 16 \
  --profile-quick --ttft-slo-ms 2000 --timeout 60 --idle-wait 0 || fail "the sweep failed"

python3 - "$tmp/out" <<'PY' || fail "sweep output"
import csv, json, os, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "slo_sweep.csv"))))
need = ["policy", "cv", "fraction", "rate", "capacity_req_s", "ttft_slo_ms", "requests",
        "admitted", "rejected_429", "failed", "met_slo", "attainment", "attainment_admitted",
        "satisfaction", "throughput_req_s", "goodput_req_s", "server_aborted", "loadgen_cpu_s",
        "load_before", "load_after"]
missing = [c for c in need if c not in rows[0]]
assert not missing, "missing columns %s" % missing
assert len(rows) == 6, "want 3 policies x 2 rates, got %d rows" % len(rows)
assert sorted({r["policy"] for r in rows}) == ["cluster", "fcfs", "slo"]
for r in rows:
    n, adm, rej, met = (int(r[k]) for k in ("requests", "admitted", "rejected_429", "met_slo"))
    att, atta, sat = (float(r[k]) for k in ("attainment", "attainment_admitted", "satisfaction"))
    assert n >= 6 and adm + rej == n and 0 <= met <= adm, r
    assert int(r["failed"]) == 0, "failed requests: %s" % r
    assert abs(att - met / n) < 1e-3 and (adm == 0 or abs(atta - met / adm) < 1e-3), r
    assert 0 <= sat <= att + 1e-9, "satisfaction is at most the attainment: %s" % r
    assert float(r["capacity_req_s"]) > 0 and float(r["rate"]) > 0, r
    assert float(r["ttft_slo_ms"]) == 2000.0, r
    if r["policy"] != "slo":  # only slo answers 429 (the queue bound is above any backlog)
        assert rej == 0 and int(r["server_aborted"]) == 0, r
    else:
        assert int(r["server_aborted"]) == rej, "429s = the server's early aborts: %s" % r
s = json.load(open(os.path.join(out, "slo_sweep.json")))
assert s["ttft_slo_ms"] == 2000.0 and s["capacity"]["capacity_req_s"] > 0
# The capacity is the open-loop run's (the closed estimate is kept beside it).
assert s["capacity"]["mode"] == "open" and s["capacity"]["open"]["completions_in_window"] >= 10
assert s["capacity"]["capacity_req_s"] == s["capacity"]["open"]["capacity_req_s"]
assert s["capacity"]["closed"]["capacity_req_s"] > 0
assert len(s["rows"]) == 6 and isinstance(s["bar"], list) and s["bar"]
assert all(isinstance(c["ok"], bool) for c in s["bar"])
# Each slo-vs-fcfs check carries the per-repeat paired difference (one repeat here: no error).
ge = [c for c in s["bar"] if c["check"].startswith("slo >= fcfs")]
assert len(ge) == 4 and all(len(c["paired"]["paired_diffs"]) == 1 for c in ge), ge
for c in ge:
    assert abs(c["paired"]["mean_diff"] - (c["slo"] - c["fcfs"])) < 2e-3, c
# Repeat 0 runs the policies in their listed order (repeat r rotates it by r).
runs = list(csv.DictReader(open(os.path.join(out, "runs.csv"))))
assert {(r["policy"], r["position"]) for r in runs} == {("fcfs", "0"), ("cluster", "1"),
                                                         ("slo", "2")}, runs
assert os.path.exists(os.path.join(out, "runs", "slo-cv1-f1.5.csv"))
png = open(os.path.join(out, "slo_sweep.png"), "rb").read(8)
assert png == b"\x89PNG\r\n\x1a\n", "no PNG"
print("slo_sweep output ok:", [(r["policy"], r["fraction"], r["attainment"]) for r in rows])
PY

# A sweep split over several invocations: --append skips the runs done and reuses the
# capacity and the SLO; with --repeats 2, fcfs at 0.5 gets its second run, pooled with the first.
sweep --out "$tmp/out" --append --repeats 2 --adapters 12 --cvs 1 --fractions 0.5,1 --policies fcfs \
  --duration 1 --min-requests 6 --max-requests 30 --input-min 8 --input-max 64 --output-min 4 \
  --output-max 16 --timeout 60 --idle-wait 0 --no-plot || fail "the appended sweep failed"
python3 - "$tmp/out" <<'PY' || fail "appended output"
import csv, json, os, sys
out = sys.argv[1]
rows = list(csv.DictReader(open(os.path.join(out, "slo_sweep.csv"))))
assert len(rows) == 7, "want the 6 rows and fcfs at 1.0, got %d" % len(rows)
runs = list(csv.DictReader(open(os.path.join(out, "runs.csv"))))
assert len(runs) == 9, "want 6 + fcfs 0.5 r1 + fcfs 1.0 r0, r1 runs, got %d" % len(runs)
f05 = [r for r in rows if r["policy"] == "fcfs" and float(r["fraction"]) == 0.5][0]
rs = [r for r in runs if r["policy"] == "fcfs" and float(r["fraction"]) == 0.5]
assert f05["repeats"] == "2" and len(rs) == 2, (f05, rs)
assert int(f05["requests"]) == sum(int(r["requests"]) for r in rs), "repeats not pooled"
assert os.path.exists(os.path.join(out, "runs", "fcfs-cv1-f0.5-r1.csv"))
assert len({r["capacity_req_s"] for r in rows}) == 1, "capacity not reused"
assert {r["ttft_slo_ms"] for r in rows} == {"2000.0"}, "SLO not reused"
s = json.load(open(os.path.join(out, "slo_sweep.json")))
assert len(s["rows"]) == 7 and len(s["runs"]) == 9 and len(s["invocations"]) == 2
PY
echo PASS

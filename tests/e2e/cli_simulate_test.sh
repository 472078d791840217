#!/usr/bin/env bash
# `chorus simulate` through the real binary (docs/router.md, "Simulating a cluster"): a
# generated sweep prints one JSON object per policy and load point with attainments in [0, 1]
# and every request completed; the same seed gives the same output; a written trace read back
# with --trace gives the same figures; the CSV plots with tools/plot.py; bad input (a malformed
# trace line, an unknown policy, a missing or malformed cost model, a bad rate) exits non-zero
# naming the problem.
# Usage: cli_simulate_test.sh CHORUS REPO_ROOT
set -euo pipefail
chorus=$1
root=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# A cost model with known coefficients (the format `chorus profile` writes): 2 ms per step,
# 20 µs per prefill token, 100 µs per decode row, 1 µs per rank unit of the step's adapters.
cat >"$tmp/cm.json" <<'JSON'
{"format": "chorus-cost-model", "version": 1, "model": "test", "threads": 1, "loadavg": "0",
 "use": "linear", "models": [{"kind": "linear", "seconds_per_term": {"1": 0.002,
 "prefill_tokens": 2e-5, "decode_rows": 1e-4, "sum_ranks": 1e-6, "adapters": 0, "deltas": 0,
 "context_tokens": 0}}]}
JSON
sim() { "$chorus" simulate --cost-model "$tmp/cm.json" --replicas 6 --requests 600 \
  --prompt-tokens uniform:16:128 --output-tokens uniform:4:32 --tpot-slo-ms 4 --ttft-slo-ms 100 "$@"; }

sim --rates 50,400 --json --seed 3 --csv "$tmp/a.csv" --write-trace "$tmp/trace.jsonl" >"$tmp/a.json" \
  || fail "simulate failed"
python3 - "$tmp/a.json" <<'PY' || fail "JSON output: $(cat "$tmp/a.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6, len(rows)  # 3 policies x 2 rates
assert {r["policy"] for r in rows} == {"rank-aware", "random", "least-loaded"}
for r in rows:
    assert r["completed"] == r["requests"] == 600, r
    for k in ("attainment", "ttft_attainment", "tpot_attainment"):
        assert 0 <= r[k] <= 1, r
    assert r["attainment"] <= min(r["ttft_attainment"], r["tpot_attainment"]) + 1e-12, r
    assert 0 < r["ttft_p50_s"] <= r["ttft_p90_s"], r
    assert abs(r["throughput_rps"] - r["rate"]) < 0.5 * r["rate"], r
low = [r for r in rows if r["rate"] == 50]
assert all(r["attainment"] == 1 for r in low), low  # light load meets every SLO
PY
sim --rates 50,400 --json --seed 3 >"$tmp/b.json"
cmp -s "$tmp/a.json" "$tmp/b.json" || fail "the same seed gave different output"
# The trace written at the first rate, read back, gives the same figures for that rate.
sim --trace "$tmp/trace.jsonl" --json --seed 3 >"$tmp/c.json" || fail "--trace run failed"
python3 - "$tmp/a.json" "$tmp/c.json" <<'PY' || fail "trace round trip differs"
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if json.loads(l)["rate"] == 50]
c = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(c) == 3
for x, y in zip(a, c):
    assert x["policy"] == y["policy"] and x["attainment"] == y["attainment"], (x, y)
    assert abs(x["tpot_mean_s"] - y["tpot_mean_s"]) < 1e-9, (x, y)
PY
# --shed: every policy refuses what its chosen replica is predicted to serve late; at 400/s
# some requests are shed, none is both shed and served, and at 50/s nothing is.
sim --rates 50,400 --json --seed 3 --shed >"$tmp/shed.json" || fail "--shed run failed"
python3 - "$tmp/shed.json" <<'PY' || fail "--shed output: $(cat "$tmp/shed.json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 6, len(rows)
for r in rows:
    assert r["completed"] + r["shed"] == r["requests"], r
    assert r["shed"] == 0 if r["rate"] == 50 else r["shed"] > 0, r
PY
sim --rates 50 >"$tmp/table.txt"
grep -q "rank-aware" "$tmp/table.txt" || fail "no table"
python3 "$root/tools/plot.py" simulate "$tmp/a.csv" -o "$tmp/a.png" >/dev/null || fail "plot"
[[ $(head -c 4 "$tmp/a.png" | od -An -tx1 | tr -d ' \n') == 89504e47 ]] || fail "not a PNG"

expect_error() {  # expect_error MESSAGE ARGS...: non-zero exit, MESSAGE on stderr
  local want=$1
  shift
  if "$chorus" simulate "$@" >/dev/null 2>"$tmp/err"; then fail "accepted: $*"; fi
  grep -q -- "$want" "$tmp/err" || fail "for $*: expected '$want', got: $(cat "$tmp/err")"
}
printf '{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 2}\n{"arrival_s": 1, "prompt_tokens": "x", "output_tokens": 2}\n' >"$tmp/bad.jsonl"
expect_error "trace line 2: field 'prompt_tokens' is not a number" --cost-model "$tmp/cm.json" --trace "$tmp/bad.jsonl"
expect_error "unknown routing policy 'fastest'" --cost-model "$tmp/cm.json" --rates 5 --policy rank-aware,fastest
expect_error "no-such.json" --cost-model "$tmp/no-such.json" --rates 5
echo '{"format": "chorus-cost-model", "models": []}' >"$tmp/badcm.json"
expect_error "models" --cost-model "$tmp/badcm.json" --rates 5
expect_error "flag --cost-model is required" --rates 5
expect_error "flag --rates: 'x'" --cost-model "$tmp/cm.json" --rates 5,x
expect_error "flag --rates is required" --cost-model "$tmp/cm.json"
expect_error "length distribution" --cost-model "$tmp/cm.json" --rates 5 --prompt-tokens uniform:9:1
expect_error "flag --admission\|unknown.*policy\|nonesuch" --cost-model "$tmp/cm.json" --rates 5 --admission nonesuch
echo "cli_simulate_test: all checks passed"

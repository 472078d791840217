#!/usr/bin/env python3
"""The simulation bar of docs/benchmarks.md "Cluster simulation": rank-aware routing must reach
at least random's and least-loaded's SLO attainment at every load point, at 60 replicas.

Runs the 12 sweeps the bar is judged on — two cost models (the embedded tiny model and the
TinyLlama-1.1B shape, both profiled on this project's machine and kept in
docs/bench/2026-11-25-simulate/) x Poisson and gamma cv 2 arrivals x seeds 1-3 — through
`chorus simulate`, prints one line per sweep (attainment per rate: rank-aware/random/least-loaded)
and says which load points miss. Extra arguments go to every `chorus simulate` run (e.g.
`--shed`). With --out DIR, each sweep's JSON lines are kept there.

usage: tools/simulate_bar.py --chorus build/release/apps/chorus/chorus [--out DIR] [-- FLAGS...]
Exit status: 0 when the bar is met in every sweep, 1 when some load point misses, 2 on errors.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILES = os.path.join(ROOT, "docs", "bench", "2026-11-25-simulate")
MODELS = {
    # name: (cost model, requests per point, rates, TPOT SLO ms, TTFT SLO ms)
    "tiny": ("cost-model-tiny-cpu.json", 20000, "600,900,1200,1500,1800,2100,2400", 5, 100),
    "tl": ("cost-model-tinyllama-1.1b-q4_0-cpu.json", 6000, "4,8,12,16,20,24,28", 400, 5000),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("flags", nargs="*", help="extra `chorus simulate` flags (after --)")
    a = ap.parse_args()
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    met = 0
    total = 0
    for name, (profile, requests, rates, tpot, ttft) in MODELS.items():
        for cv in (1, 2):
            for seed in (1, 2, 3):
                tag = f"{name}-cv{cv}-s{seed}"
                cmd = [a.chorus, "simulate", "--cost-model", os.path.join(PROFILES, profile),
                       "--replicas", "60", "--requests", str(requests), "--rates", rates,
                       "--tpot-slo-ms", str(tpot), "--ttft-slo-ms", str(ttft), "--cv", str(cv),
                       "--seed", str(seed), "--json"] + a.flags
                p = subprocess.run(cmd, capture_output=True, text=True)
                if p.returncode != 0:
                    print(f"{tag}: chorus simulate failed: {p.stderr[-500:]}", file=sys.stderr)
                    return 2
                if a.out:
                    with open(os.path.join(a.out, tag + ".json"), "w") as f:
                        f.write(p.stdout)
                by_rate = {}
                for line in p.stdout.splitlines():
                    if line.startswith("{"):
                        r = json.loads(line)
                        by_rate.setdefault(r["rate"], {})[r["policy"]] = r
                misses, cells = [], []
                for rate in sorted(by_rate):
                    att = {k: v["attainment"] for k, v in by_rate[rate].items()}
                    ra, rd, ll = att["rank-aware"], att["random"], att["least-loaded"]
                    if ra + 1e-12 < rd or ra + 1e-12 < ll:
                        misses.append(rate)
                    shed = by_rate[rate]["rank-aware"].get("shed", 0)
                    cells.append(f"{rate:g}:{ra:.3f}/{rd:.3f}/{ll:.3f}" +
                                 (f"[shed {shed}]" if shed else ""))
                total += 1
                met += not misses
                print(f"{tag} " + ("MET" if not misses else f"MISSED at {misses}"))
                print("   " + " ".join(cells), flush=True)
    print(f"bar met in {met} of {total} sweeps (rank-aware/random/least-loaded attainment)")
    return 0 if met == total else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""What a soak window's latency tail is made of: reads requests.csv and events.csv of
`tools/soak.py --out DIR` and prints, per window, p50/p99 latency, the requests at or above the
p99 (the tail): how many overlapped an adapter churn call (load / unload / replace) against the
share of all requests that did, how many ran with n = 3, their mean max_tokens; then the tail's
clumps — tail requests that ended within 0.3 s of each other, the mark of a pause that held
every running request — with the nearest churn call and SIGHUP.

    python3 tools/soak_tail.py DIR [--window 60] [--warmup 2]
"""
import argparse
import csv
import os
import statistics


def load(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir")
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--warmup", type=int, default=2, help="windows left out of the clump list")
    a = ap.parse_args()
    reqs = load(os.path.join(a.dir, "requests.csv"))
    events = load(os.path.join(a.dir, "events.csv"))
    churn = sorted((float(e["t_start_s"]), float(e["seconds"]), e["op"]) for e in events
                   if e["op"] != "sighup")
    sighups = sorted(float(e["t_start_s"]) for e in events if e["op"] == "sighup")

    def span(r):
        end = float(r["t_end_s"])
        return end - float(r["latency_ms"]) / 1000, end

    def overlaps_churn(r):
        start, end = span(r)
        return any(t <= end and t + sec >= start for t, sec, _ in churn)

    for op in ("load", "unload", "replace"):
        secs = sorted(sec for _, sec, o in churn if o == op)
        if secs:
            print("churn %-7s %4d calls: median %.1f ms, p99 %.1f ms, max %.1f ms" % (
                op, len(secs), 1000 * secs[len(secs) // 2], 1000 * secs[int(0.99 * (len(secs) - 1))],
                1000 * secs[-1]))
    by_window = {}
    for r in reqs:
        by_window.setdefault(int(float(r["t_end_s"]) // a.window), []).append(r)
    clumps = []
    for w in sorted(by_window):
        rs = by_window[w]
        lat = sorted(float(r["latency_ms"]) for r in rs)
        p99 = lat[int(0.99 * (len(lat) - 1))]
        tail = sorted((r for r in rs if float(r["latency_ms"]) >= p99),
                      key=lambda r: float(r["t_end_s"]))
        sample = rs[::10]
        print("window %3d  %5d finished  p50 %6.1f  p99 %6.1f ms | tail %3d: %2d overlap a churn "
              "call (all requests: %2.0f %%), %2d with n=3, mean max_tokens %.0f" % (
                  w, len(rs), lat[len(lat) // 2], p99, len(tail), sum(map(overlaps_churn, tail)),
                  100.0 * sum(map(overlaps_churn, sample)) / len(sample),
                  sum(r["n"] == "3" for r in tail),
                  statistics.mean(int(r["max_tokens"]) for r in tail)))
        if w < a.warmup:
            continue
        i = 0
        while i < len(tail):
            j = i
            while j + 1 < len(tail) and float(tail[j + 1]["t_end_s"]) - float(tail[i]["t_end_s"]) < 0.3:
                j += 1
            if j > i:
                clumps.append(tail[i:j + 1])
            i = j + 1
    print("\n%d clumps of tail requests ending within 0.3 s of each other (after warm-up):" % len(clumps))
    near = 0
    for c in clumps:
        start = min(span(r)[0] for r in c)
        t, sec, op = min(churn, key=lambda e: abs(e[0] - start)) if churn else (float("nan"), 0, "-")
        near += abs(t - start) < 0.1
        s = min(sighups, key=lambda x: abs(x - start)) if sighups else float("nan")
        print("  t %8.2f s  %d requests, %s ms | nearest churn %-7s %+.2f s (%.0f ms) | SIGHUP %+.1f s" % (
            start, len(c), "/".join("%.0f" % float(r["latency_ms"]) for r in c), op, t - start,
            1000 * sec, s - start))
    if clumps and churn:
        print("%d of %d clumps began within 0.1 s of a churn call" % (near, len(clumps)))


if __name__ == "__main__":
    main()

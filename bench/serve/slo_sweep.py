#!/usr/bin/env python3
"""The `slora` SLO sweep (docs/scheduling.md, "The slora sweep"; docs/benchmarks.md).

S-LoRA §7's synthetic workload over real HTTP against `chorus serve`, for each admission policy
(fcfs, cluster, slo), each arrival burstiness cv and a range of rates given as fractions of the
server's measured capacity:

1. setup (once per --work directory): N synthetic PEFT adapters for the served model
   (`chorus convert --lora-count N --lora-ranks 8,16,32,64`, ranks round-robin) registered by a
   throw-away server into a registry state file that every run then starts from a copy of;
2. the cost model for `--policy slo` (`chorus profile --threads T`, unless --cost-model is given);
3. capacity, under the sweep's own arrivals: a first estimate from --capacity-requests requests
   at once (the same lengths and adapters as the sweep; requests completed per second between
   the 10th and the 90th percentile of their completion times), then (--capacity-mode open, the
   default) a fresh fcfs server gets Poisson arrivals at --capacity-overload × that estimate for
   --capacity-seconds, and capacity = the requests it completes per second while the arrivals
   still come, after the first 30 % of them (the backlog only grows then, so the server is
   saturated: its throughput under open-loop arrivals, which is what the sweep's x axis means);
4. the sweep: for each cv and rate fraction, each policy in turn against a fresh server (same
   flags, a fresh copy of the registry) with the same seeded plan: `chorus_bench_serve --rate
   F·capacity --cv CV --adapters N --alpha A` (gamma arrivals; adapter id = floor(u·N),
   u ~ power(A)); input and output lengths uniform in [--input-min, --input-max) and
   [--output-min, --output-max) (S-LoRA: [8, 512)). Every request carries the TTFT SLO (the
   server's --ttft-slo-ms). With --repeats R every point runs R times, each repeat with its own
   seeded plan (seed + repeat) shared by the policies; a point's figures pool its repeats.

Per run, from the load generator's per-request CSV (TTFT measured by the client, from sending
the request to the first streamed token):
  * attainment: requests whose first token came within the SLO / all requests sent;
  * attainment_admitted: the same / requests not answered 429 (the slo policy's early abort
    answers 429 at once; fcfs and cluster never do, as --max-queue is set above any backlog);
  * satisfaction: S-LoRA's user satisfaction (App. B; the reward of its benchmark code): the mean
    over all requests sent of r(t) = 1 − (t / SLO)² for a first-token latency t < SLO, and 0 for
    t ≥ SLO, for a refused (429) or failed request;
  * throughput (requests answered in full per second of the run), goodput (those within the
    SLO per second), output tokens/s, TTFT p50/p99 of the admitted;
  * the server's own counters (chorus_slo_aborted_total, chorus_slo_ttft_met/missed_total) and
    the CPU seconds the load generator and the server used (the generator shares the cores).

Output (--out): slo_sweep.csv (one row per policy × cv × rate, repeats pooled), runs.csv (one
row per run), slo_sweep.json (the setup, the
capacity measurement, the SLO and why, the rows, the bar checks), runs/ (every run's per-request
CSV and summary JSON, server log), and slo_sweep.png (tools/plot.py slo-sweep).

usage: bench/serve/slo_sweep.py --chorus build/release/apps/chorus/chorus
       --loadgen build/release/bench/serve/chorus_bench_serve [--out DIR] [--work DIR]
Run it under the measurement lock (flock /tmp/chorus-measure.lock ...): every figure depends on
the machine's speed.
"""

import argparse
import csv
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tools"))
from soak import launch_server, local_get, metric, wait_healthy  # noqa: E402

POLICIES = ("fcfs", "cluster", "slo")
COLUMNS = ["policy", "cv", "fraction", "repeats", "rate", "capacity_req_s", "ttft_slo_ms", "requests",
           "admitted", "rejected_429", "failed", "met_slo", "attainment", "attainment_admitted",
           "satisfaction", "throughput_req_s", "goodput_req_s", "output_tok_s",
           "ttft_p50_admitted_s", "ttft_p99_admitted_s", "server_aborted", "server_held_back",
           "server_ttft_met",
           "server_ttft_missed", "distinct_adapters", "run_s", "loadgen_cpu_s", "server_cpu_s",
           "load_before", "load_after"]


def log(msg):
    print("slo_sweep: " + msg, file=sys.stderr, flush=True)


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def reward(ttft_s, slo_s):
    """S-LoRA's user satisfaction of one request (App. B): a reward in [0, 1] of the first-token
    latency with r' ≤ 0 — the degree-2 polynomial 1 − (t/SLO)² of S-LoRA's benchmark code — and
    0 at or past the SLO (the user gave up)."""
    if ttft_s is None or ttft_s < 0 or ttft_s >= slo_s:
        return 0.0
    return 1.0 - (ttft_s / slo_s) ** 2


def pct(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    pos = q / 100.0 * (len(s) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (pos - lo) * (s[hi] - s[lo])


def proc_cpu_s(pid):
    """utime + stime of a live process (seconds), or None."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


class Server:
    """A fresh `chorus serve` on a copy of the adapter registry."""

    def __init__(self, a, work, registry, log_path, extra):
        self.state = os.path.join(work, "run-registry.json")
        for p in (self.state, self.state + ".lock"):
            if os.path.exists(p):
                os.remove(p)
        if registry:
            shutil.copyfile(registry, self.state)
        cmd = [a.chorus, "serve", "--port", "0", "--host", "127.0.0.1", "--threads",
               str(a.threads), "--max-running", str(a.max_running), "--max-batch-tokens",
               str(a.max_batch_tokens), "--max-queue", str(a.max_queue), "--max-connections",
               str(a.max_connections), "--registry", self.state, "--adapter-root", work,
               "--no-finetune", "--drain-timeout", "2"]
        if a.model:
            cmd += ["--model", a.model]
        if a.tokenizer:
            cmd += ["--tokenizer", a.tokenizer]
        self.cmd = cmd + extra + a.serve_arg
        self.proc, self.log, self.port, deadline = launch_server(self.cmd, dict(os.environ),
                                                                 log_path, 600)
        wait_healthy(self.get, deadline, log_path)
        self.url = "http://127.0.0.1:%d" % self.port

    def get(self, path):
        return local_get(self.port, path)

    def metrics(self):
        try:
            st, text = self.get("/metrics")
            return text if st == 200 else ""
        except OSError:
            return ""

    def stop(self):
        cpu = proc_cpu_s(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
        return cpu


def setup_adapters(a, work):
    """N adapters (ranks round-robin) and a registry state file holding them, made once."""
    adir = os.path.join(work, "loras-n%d" % a.adapters)
    if not os.path.exists(os.path.join(adir, ".complete")):
        shutil.rmtree(adir, ignore_errors=True)
        cmd = [a.chorus, "convert", "--lora-count", str(a.adapters), "--lora-ranks", a.ranks,
               "--lora-targets", a.targets, "--output", adir]
        cmd += ["--model", a.model] if a.model else ["--shape", a.shape]
        log("writing %d adapters: %s" % (a.adapters, " ".join(cmd)))
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        open(os.path.join(adir, ".complete"), "w").close()
    reg = os.path.join(work, "registry-n%d.json" % a.adapters)
    if not os.path.exists(reg + ".complete"):
        log("registering %d adapters (once)" % a.adapters)
        t0 = time.time()
        srv = Server(a, work, None, os.path.join(work, "register.log"), ["--lora-dir", adir])
        srv.stop()
        shutil.copyfile(srv.state, reg)
        open(reg + ".complete", "w").close()
        log("registered in %.1f s" % (time.time() - t0))
    return reg


def cost_model(a, work):
    if a.cost_model:
        return a.cost_model
    out = os.path.join(work, "cost-model.json")
    cmd = [a.chorus, "profile", "--threads", str(a.threads), "--out", out]
    if a.model:
        cmd += ["--model", a.model]
    if a.profile_quick:
        cmd.append("--quick")
    log("profiling the step cost for --policy slo: " + " ".join(cmd))
    subprocess.run(cmd, check=True, stdout=sys.stderr)
    return out


def run_loadgen(a, url, out_prefix, rate, cv, n, seed):
    """chorus_bench_serve with the sweep's workload; returns (per-request rows, summary, CPU s)."""
    cmd = [a.loadgen, "--url", url, "--rate", "%.4f" % rate, "--cv", str(cv), "--num-requests",
           str(n), "--input-min", str(a.input_min), "--input-max", str(a.input_max),
           "--output-min", str(a.output_min), "--output-max", str(a.output_max),
           "--adapters", str(a.adapters), "--alpha", str(a.alpha), "--seed", str(seed),
           "--metrics-interval", "0", "--timeout", str(a.timeout), "--token-id-max",
           str(a.token_id_max), "--out", out_prefix]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, ru = os.wait4(p.pid, 0)
    err = p.stderr.read().decode("utf-8", "replace")
    p.stderr.close()
    p.returncode = os.waitstatus_to_exitcode(status)
    if not os.path.exists(out_prefix + ".csv"):
        raise RuntimeError("chorus_bench_serve wrote no CSV (exit %d): %s" %
                           (p.returncode, err.strip()[-500:]))
    with open(out_prefix + ".csv", newline="") as f:
        rows = list(csv.DictReader(f))
    with open(out_prefix + ".json") as f:
        summary = json.load(f)
    return rows, summary, ru.ru_utime + ru.ru_stime


def completion_times(rows):
    return sorted(float(r["arrival_s"]) + float(r["latency_s"]) for r in rows
                  if r["status"] == "200" and not r["error"] and float(r["latency_s"]) >= 0)


def measure_capacity(a, work, runs):
    """The server's throughput in requests/s: closed (all at once), then under open-loop
    overload (--capacity-mode open); the latter is the sweep's capacity."""
    srv = Server(a, work, a.registry, os.path.join(runs, "capacity.serve.log"), [])
    try:
        t0 = time.time()
        rows, _, lg_cpu = run_loadgen(a, srv.url, os.path.join(runs, "capacity"), 1000.0, 1.0,
                                      a.capacity_requests, a.seed + 1000)
        wall = time.time() - t0
    finally:
        srv_cpu = srv.stop()
    ends = completion_times(rows)
    if len(ends) < 10:
        raise RuntimeError("capacity run: only %d of %d requests completed" %
                           (len(ends), len(rows)))
    lo, hi = int(0.1 * len(ends)), int(0.9 * len(ends)) - 1
    if ends[hi] <= ends[lo]:
        raise RuntimeError("capacity run: the completions are not spread in time; raise "
                           "--capacity-requests")
    cap = (hi - lo) / (ends[hi] - ends[lo])
    info = {"closed": {"requests": len(rows), "completed": len(ends),
                       "window_s": ends[hi] - ends[lo], "completions_in_window": hi - lo,
                       "capacity_req_s": cap, "all_completed_over_wall_req_s": len(ends) / wall,
                       "loadgen_cpu_s": lg_cpu, "server_cpu_s": srv_cpu, "wall_s": wall},
            "mode": a.capacity_mode}
    log("capacity, all at once: %.2f req/s (%d completions in %.1f s; %d requests)" %
        (cap, hi - lo, ends[hi] - ends[lo], len(rows)))
    if a.capacity_mode == "open":
        rate = a.capacity_overload * cap
        n = max(a.min_requests, int(round(rate * a.capacity_seconds)))
        srv = Server(a, work, a.registry, os.path.join(runs, "capacity-open.serve.log"), [])
        load0 = loadavg()
        try:
            rows, _, lg_cpu = run_loadgen(a, srv.url, os.path.join(runs, "capacity-open"), rate,
                                          1.0, n, a.seed + 2000)
        finally:
            srv_cpu = srv.stop()
        arrivals = sorted(float(r["arrival_s"]) for r in rows)
        t_lo, t_hi = 0.3 * arrivals[-1], arrivals[-1]
        done = [t for t in completion_times(rows) if t_lo <= t <= t_hi]
        if len(done) < 10 or t_hi <= t_lo:
            raise RuntimeError("open-loop capacity run: %d completions while the arrivals came; "
                               "raise --capacity-seconds" % len(done))
        cap = len(done) / (t_hi - t_lo)
        info["open"] = {"offered_req_s": rate, "requests": len(rows),
                        "window_s": [t_lo, t_hi], "completions_in_window": len(done),
                        "capacity_req_s": cap, "loadgen_cpu_s": lg_cpu, "server_cpu_s": srv_cpu,
                        "load_before": load0, "load_after": loadavg()}
        log("capacity under open-loop arrivals at %.2f req/s: %.2f req/s (%d completions in "
            "%.1f s of arrivals)" % (rate, cap, len(done), t_hi - t_lo))
    info["capacity_req_s"] = cap
    return cap, info


def run_order(policies, repeat):
    """The policies' order at a point in repeat `repeat`: rotated by one per repeat."""
    k = repeat % len(policies)
    return policies[k:] + policies[:k]


def cpu_busy_share(interval=1.0):
    """The share of the host's CPU time spent outside idle/iowait over `interval` seconds."""
    def snap():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]
    t0, i0 = snap()
    time.sleep(interval)
    t1, i1 = snap()
    return 1.0 - (i1 - i0) / max(1, t1 - t0)


def wait_idle(limit_s, busy_below=0.10):
    """Before a run: wait (at most limit_s) until the host is idle for a second, so that the
    previous run's server and anything else winding down does not share this run's cores."""
    if limit_s <= 0:
        return
    t0, busy = time.time(), 1.0
    while time.time() - t0 < limit_s:
        busy = cpu_busy_share()
        if busy < busy_below:
            return
    log("host still %.0f %% busy after %.0f s; running anyway" % (100 * busy, limit_s))


def one_run(a, work, runs, policy, cv, frac, cap, slo_ms, cm_path, repeat):
    rate = frac * cap
    n = min(a.max_requests, max(a.min_requests, int(round(rate * a.duration))))
    name = "%s-cv%g-f%g" % (policy, cv, frac) + ("-r%d" % repeat if repeat else "")
    extra = ["--policy", policy, "--ttft-slo-ms", "%.1f" % slo_ms]
    if policy == "slo":
        extra += ["--cost-model", cm_path]
    if policy == "cluster" and a.cluster_d:
        extra += ["--max-adapters-per-step", str(a.cluster_d)]
    srv = Server(a, work, a.registry, os.path.join(runs, name + ".serve.log"), extra)
    load0 = loadavg()
    t0 = time.time()
    try:
        rows, summary, lg_cpu = run_loadgen(a, srv.url, os.path.join(runs, name), rate, cv, n,
                                            a.seed + repeat)
        run_s = time.time() - t0
        m = srv.metrics()
    finally:
        srv_cpu = srv.stop()
    load1 = loadavg()
    slo_s = slo_ms / 1000.0
    sent = len(rows)
    rejected = sum(1 for r in rows if r["status"] == "429")
    ok = [r for r in rows if r["status"] == "200" and not r["error"]]
    failed = sent - rejected - len(ok)
    ttfts = [float(r["ttft_s"]) for r in ok if float(r["ttft_s"]) >= 0]
    met = sum(1 for t in ttfts if t <= slo_s)
    sat = sum(reward(t, slo_s) for t in ttfts) / sent if sent else 0.0
    admitted = sent - rejected
    # The run's length for rates: from the first send to the last request's end.
    span = max((float(r["arrival_s"]) + max(0.0, float(r["latency_s"])) for r in rows),
               default=0.0)
    span = max(span, summary.get("duration_s", 0.0) or 0.0) or 1e-9
    out_tokens = sum(int(r["completion_tokens"]) for r in ok)
    row = {
        "policy": policy, "cv": cv, "fraction": frac, "repeat": repeat, "rate": round(rate, 4),
        "capacity_req_s": round(cap, 4), "ttft_slo_ms": round(slo_ms, 1), "requests": sent,
        "admitted": admitted, "rejected_429": rejected, "failed": failed, "met_slo": met,
        "attainment": round(met / sent, 4) if sent else 0.0,
        "attainment_admitted": round(met / admitted, 4) if admitted else 1.0,
        "satisfaction": round(sat, 4),
        "throughput_req_s": round(len(ok) / span, 4), "goodput_req_s": round(met / span, 4),
        "output_tok_s": round(out_tokens / span, 2),
        "ttft_p50_admitted_s": round(pct(ttfts, 50), 4) if ttfts else "",
        "ttft_p99_admitted_s": round(pct(ttfts, 99), 4) if ttfts else "",
        "server_aborted": int(metric(m, "chorus_slo_aborted_total") or 0),
        "server_held_back": int(metric(m, "chorus_slo_held_back_total") or 0),
        "server_ttft_met": int(metric(m, "chorus_slo_ttft_met_total") or 0),
        "server_ttft_missed": int(metric(m, "chorus_slo_ttft_missed_total") or 0),
        "distinct_adapters": (summary.get("adapters") or {}).get("distinct_used", 0),
        "run_s": round(run_s, 2), "loadgen_cpu_s": round(lg_cpu, 2),
        "server_cpu_s": round(srv_cpu, 2) if srv_cpu is not None else "",
        "load_before": load0, "load_after": load1,
        "satisfaction_sum": sat * sent, "out_tokens": out_tokens, "span_s": span,
        "ttfts": ttfts,
    }
    log("%-7s cv %g %.2fx r%d (%.2f req/s, %d req): attainment %.3f, of admitted %.3f (%d x 429), "
        "satisfaction %.3f, %.1f s, load %s -> %s" % (
            policy, cv, frac, repeat, rate, sent, row["attainment"], row["attainment_admitted"],
            rejected, row["satisfaction"], run_s, load0.split()[0], load1.split()[0]))
    return row


RUN_COLUMNS = (["policy", "cv", "fraction", "repeat", "position"] + COLUMNS[4:] +
               ["satisfaction_sum", "out_tokens", "span_s", "ttfts"])


def pool(runs):
    """One row per policy × cv × rate: its repeats' requests pooled (attainment = all met / all
    sent, satisfaction = the mean over every request sent, rates = totals / summed run spans,
    TTFT percentiles over every admitted request)."""
    groups = {}
    for r in runs:
        groups.setdefault((r["policy"], r["cv"], r["fraction"]), []).append(r)
    out = []
    for (policy, cv, frac), rs in groups.items():
        tot = lambda k: sum(int(r[k]) for r in rs)  # noqa: E731
        sent, admitted, rejected, failed, met = (tot(k) for k in (
            "requests", "admitted", "rejected_429", "failed", "met_slo"))
        span = sum(float(r["span_s"]) for r in rs) or 1e-9
        ttfts = [t for r in rs for t in r["ttfts"]]
        out.append({
            "policy": policy, "cv": cv, "fraction": frac, "repeats": len(rs),
            "rate": rs[0]["rate"], "capacity_req_s": rs[0]["capacity_req_s"],
            "ttft_slo_ms": rs[0]["ttft_slo_ms"], "requests": sent, "admitted": admitted,
            "rejected_429": rejected, "failed": failed, "met_slo": met,
            "attainment": round(met / sent, 4) if sent else 0.0,
            "attainment_admitted": round(met / admitted, 4) if admitted else 1.0,
            "satisfaction": round(sum(float(r["satisfaction_sum"]) for r in rs) / sent, 4)
            if sent else 0.0,
            "throughput_req_s": round((sent - rejected - failed) / span, 4),
            "goodput_req_s": round(met / span, 4),
            "output_tok_s": round(sum(int(r["out_tokens"]) for r in rs) / span, 2),
            "ttft_p50_admitted_s": round(pct(ttfts, 50), 4) if ttfts else "",
            "ttft_p99_admitted_s": round(pct(ttfts, 99), 4) if ttfts else "",
            "server_aborted": tot("server_aborted"),
            "server_held_back": sum(int(r.get("server_held_back") or 0) for r in rs),
            "server_ttft_met": tot("server_ttft_met"),
            "server_ttft_missed": tot("server_ttft_missed"),
            "distinct_adapters": max(int(r["distinct_adapters"]) for r in rs),
            "run_s": round(sum(float(r["run_s"]) for r in rs), 2),
            "loadgen_cpu_s": round(sum(float(r["loadgen_cpu_s"]) for r in rs), 2),
            "server_cpu_s": round(sum(float(r["server_cpu_s"]) for r in rs
                                      if r["server_cpu_s"] != ""), 2),
            "load_before": rs[0]["load_before"], "load_after": rs[-1]["load_after"],
        })
    out.sort(key=lambda r: (r["cv"], r["fraction"], POLICIES.index(r["policy"])))
    return out


def paired(runs, cv, f, key):
    """slo − fcfs in `key` per repeat at one point (the two ran the same seeded plan), with the
    mean and its standard error: how far apart the policies are beside how much repeats move."""
    by = {(r["policy"], int(r["repeat"])): float(r[key]) for r in runs
          if r["cv"] == cv and r["fraction"] == f}
    diffs = [round(by[("slo", k)] - by[("fcfs", k)], 4) for (p, k) in sorted(by)
             if p == "slo" and ("fcfs", k) in by]
    if not diffs:
        return {}
    mean = statistics.mean(diffs)
    se = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else None
    return {"paired_diffs": diffs, "mean_diff": round(mean, 4),
            "se": round(se, 4) if se is not None else None,
            # Not worse beyond noise: the mean difference is within two standard errors of 0.
            "within_noise": se is not None and mean + 2 * se >= 0}


def bar_checks(rows, runs=(), admitted_until=0.8, top=1.5):
    """The issue's bar, point by point: slo ≥ fcfs (attainment and satisfaction) at every point;
    slo's admitted requests ≥ 95 % within the SLO up to 0.8× capacity; at 1.5×, slo's admitted
    requests meet the SLO while fcfs's attainment collapses. `ok` compares the pooled figures
    strictly; the ≥ checks also carry the per-repeat paired differences (`paired`)."""
    by = {(r["policy"], r["cv"], r["fraction"]): r for r in rows}
    checks = []
    for (p, cv, f), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        if p != "slo":
            continue
        fc = by.get(("fcfs", cv, f))
        if fc:
            for key in ("attainment", "satisfaction"):
                checks.append({"check": "slo >= fcfs " + key, "cv": cv, "fraction": f,
                               "slo": r[key], "fcfs": fc[key], "ok": r[key] >= fc[key],
                               "paired": paired(runs, cv, f, key)})
        if f <= admitted_until + 1e-9:
            checks.append({"check": "slo admitted attainment >= 0.95", "cv": cv, "fraction": f,
                           "slo": r["attainment_admitted"],
                           "ok": r["attainment_admitted"] >= 0.95})
        if abs(f - top) < 1e-9:
            checks.append({"check": "slo admitted attainment at the top rate (>= 0.95)",
                           "cv": cv, "fraction": f, "slo": r["attainment_admitted"],
                           "fcfs": fc["attainment"] if fc else None,
                           "ok": r["attainment_admitted"] >= 0.95})
    return checks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chorus", required=True, help="the chorus binary")
    ap.add_argument("--loadgen", required=True, help="the chorus_bench_serve binary")
    ap.add_argument("--out", default="slo_sweep_out", help="output directory")
    ap.add_argument("--work", default="",
                    help="directory for adapters, the registry and the cost model, reused "
                         "between invocations (default: OUT/work)")
    ap.add_argument("--model", default="", help="model file (default: the embedded tiny model)")
    ap.add_argument("--tokenizer", default="")
    ap.add_argument("--shape", default="tiny",
                    help="synthetic shape the adapters are made for when --model is not given "
                         "(the embedded default model is the tiny shape)")
    ap.add_argument("--adapters", type=int, default=1000)
    ap.add_argument("--ranks", default="8,16,32,64", help="adapter ranks, round-robin")
    ap.add_argument("--targets", default="q,k,v,o")
    ap.add_argument("--alpha", type=float, default=0.5,
                    help="adapter popularity: id = floor(u·N), u ~ power(alpha)")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--cvs", default="1,2,4")
    ap.add_argument("--fractions", default="0.25,0.5,0.8,1.0,1.25,1.5",
                    help="arrival rates as fractions of the measured capacity")
    ap.add_argument("--duration", type=float, default=15.0,
                    help="seconds of arrivals per run (requests = rate × duration)")
    ap.add_argument("--min-requests", type=int, default=50)
    ap.add_argument("--max-requests", type=int, default=5000)
    ap.add_argument("--input-min", type=int, default=8)
    ap.add_argument("--input-max", type=int, default=512)
    ap.add_argument("--output-min", type=int, default=8)
    ap.add_argument("--output-max", type=int, default=512)
    ap.add_argument("--token-id-max", type=int, default=200)
    ap.add_argument("--capacity", type=float, default=0,
                    help="take this as the capacity (req/s) instead of measuring it")
    ap.add_argument("--capacity-requests", type=int, default=200,
                    help="requests sent at once for the first (closed) capacity estimate")
    ap.add_argument("--capacity-mode", choices=("open", "closed"), default="open",
                    help="open (default): capacity = throughput under Poisson arrivals at "
                         "--capacity-overload × the closed estimate; closed: the estimate")
    ap.add_argument("--capacity-overload", type=float, default=1.25,
                    help="offered load of the open-loop capacity run over the closed estimate: "
                         "just above capacity. Far above it the server completes less (on "
                         "2026-11-28, 14.4 req/s at 2× against fcfs keeping up at 18; "
                         "docs/scheduling.md)")
    ap.add_argument("--capacity-seconds", type=float, default=20.0,
                    help="seconds of arrivals of the open-loop capacity run")
    ap.add_argument("--idle-wait", type=float, default=10.0,
                    help="before each run, wait up to this many seconds for a second in which "
                         "the host is under 10 %% busy (0: don't wait)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs per point, each with its own seeded plan (seed + repeat), "
                         "shared by the policies; a point's figures pool them")
    ap.add_argument("--ttft-slo-ms", type=float, default=0,
                    help="the TTFT SLO (default: --slo-completions / capacity)")
    ap.add_argument("--slo-completions", type=float, default=12,
                    help="default SLO = the time the saturated server takes to complete this "
                         "many requests: S-LoRA's 6 s is 12 arrivals at the default rate of its "
                         "A10G setting (2 req/s), so the SLO is 12 / capacity here "
                         "(docs/scheduling.md)")
    ap.add_argument("--cost-model", default="", help="cost model for slo (default: profile)")
    ap.add_argument("--profile-quick", action="store_true", help="profile with --quick")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-running", type=int, default=32)
    ap.add_argument("--max-batch-tokens", type=int, default=512)
    ap.add_argument("--max-queue", type=int, default=100000,
                    help="the server's queue bound: above any backlog, so that only the slo "
                         "policy answers 429")
    ap.add_argument("--max-connections", type=int, default=4096)
    ap.add_argument("--cluster-d", type=int, default=0,
                    help="--max-adapters-per-step for cluster (0: the server's default, 4)")
    ap.add_argument("--timeout", type=int, default=600, help="per-request timeout (s)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra chorus serve flag")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--setup-only", action="store_true",
                    help="only write and register the adapters (nothing timed: no lock needed)")
    ap.add_argument("--append", action="store_true",
                    help="add to OUT's runs.csv: runs already there are skipped, and the "
                         "capacity, SLO and cost model of OUT's slo_sweep.json are reused (a "
                         "sweep split over several holds of the measurement lock)")
    a = ap.parse_args()
    try:
        policies = [p for p in a.policies.split(",") if p]
        cvs = [float(x) for x in a.cvs.split(",") if x]
        fractions = [float(x) for x in a.fractions.split(",") if x]
    except ValueError as e:
        ap.error("--cvs and --fractions are comma-separated numbers: %s" % e)
    for p in policies:
        if p not in POLICIES:
            ap.error("--policies: unknown policy '%s' (known: %s)" % (p, ", ".join(POLICIES)))
    if not cvs or not fractions or min(cvs) <= 0 or min(fractions) <= 0:
        ap.error("--cvs and --fractions need positive values")
    if (a.adapters < 1 or a.duration <= 0 or a.min_requests < 1 or
            a.max_requests < a.min_requests or a.capacity_requests < 10 or a.repeats < 1 or
            a.capacity_overload <= 1 or a.capacity_seconds <= 0):
        ap.error("need --adapters >= 1, --duration > 0, 1 <= --min-requests <= --max-requests, "
                 "--capacity-requests >= 10, --repeats >= 1, --capacity-overload > 1, "
                 "--capacity-seconds > 0")
    if not (1 <= a.input_min < a.input_max) or not (1 <= a.output_min < a.output_max):
        ap.error("need 1 <= --input-min < --input-max and 1 <= --output-min < --output-max")
    for b in (a.chorus, a.loadgen):
        if not os.access(b, os.X_OK):
            ap.error("not an executable: " + b)

    os.makedirs(a.out, exist_ok=True)
    runs = os.path.join(a.out, "runs")
    os.makedirs(runs, exist_ok=True)
    work = a.work or os.path.join(a.out, "work")
    os.makedirs(work, exist_ok=True)
    t_start = time.time()
    load_start = loadavg()
    runs_list = []  # one row per run
    csv_path = os.path.join(a.out, "slo_sweep.csv")
    runs_csv_path = os.path.join(a.out, "runs.csv")
    json_path = os.path.join(a.out, "slo_sweep.json")
    prev = {}
    if a.append and os.path.exists(runs_csv_path):
        with open(runs_csv_path, newline="") as f:
            for r in csv.DictReader(f):
                for k in ("cv", "fraction"):
                    r[k] = float(r[k])
                r["repeat"] = int(r["repeat"])
                r["ttfts"] = [float(t) for t in r["ttfts"].split(";") if t]
                runs_list.append(r)
        if os.path.exists(json_path):
            with open(json_path) as f:
                prev = json.load(f)
        if not a.capacity and prev.get("capacity", {}).get("capacity_req_s"):
            a.capacity = prev["capacity"]["capacity_req_s"]
        if not a.ttft_slo_ms and prev.get("ttft_slo_ms"):
            a.ttft_slo_ms = prev["ttft_slo_ms"]
        if not a.cost_model and prev.get("cost_model") and os.path.exists(prev["cost_model"]):
            a.cost_model = prev["cost_model"]  # the same cost model in every hold
        log("appending to %d runs (capacity %s req/s, SLO %s ms)" %
            (len(runs_list), a.capacity, a.ttft_slo_ms))
    done = {(r["policy"], r["cv"], r["fraction"], r["repeat"]) for r in runs_list}
    a.registry = setup_adapters(a, work)
    if a.setup_only:
        return 0
    cm_path = cost_model(a, work) if "slo" in policies else ""
    if a.capacity > 0 and prev.get("capacity"):
        cap, cap_info = a.capacity, prev["capacity"]
    elif a.capacity > 0:
        cap, cap_info = a.capacity, {"given": True, "capacity_req_s": a.capacity}
    else:
        cap, cap_info = measure_capacity(a, work, runs)
    if a.ttft_slo_ms > 0 and prev.get("ttft_slo_why"):
        slo_ms, slo_why = a.ttft_slo_ms, prev["ttft_slo_why"]
    elif a.ttft_slo_ms > 0:
        slo_ms = a.ttft_slo_ms
        slo_why = "given (--ttft-slo-ms)"
    else:
        slo_ms = 1000.0 * a.slo_completions / cap
        slo_why = ("the time of %g completions at the measured capacity (%.2f req/s): "
                   "S-LoRA's 6 s SLO is %g arrivals at the 2 req/s default rate of its A10G "
                   "setting (docs/scheduling.md)" % (a.slo_completions, cap, 6 * 2))
    log("TTFT SLO %.0f ms (%s)" % (slo_ms, slo_why))

    def write_csv():
        with open(runs_csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=RUN_COLUMNS, extrasaction="ignore")
            w.writeheader()
            for r in runs_list:
                w.writerow(dict(r, ttfts=";".join("%.5f" % t for t in r["ttfts"])))
        with open(csv_path, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            for r in pool(runs_list):
                w.writerow(r)

    # Policies interleaved per point (and repeats per point), so that a drift in the machine's
    # speed hits all alike; the order rotates with the repeat, so that no policy always runs
    # first or last at a point (the runs before one leave the host warmer and its load higher).
    for cv in cvs:
        for frac in fractions:
            for rep in range(a.repeats):
                for position, p in enumerate(run_order(policies, rep)):
                    if (p, cv, frac, rep) in done:
                        continue
                    wait_idle(a.idle_wait)
                    run = one_run(a, work, runs, p, cv, frac, cap, slo_ms, cm_path, rep)
                    run["position"] = position
                    runs_list.append(run)
                    write_csv()
    write_csv()
    rows = pool(runs_list)
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    cvs = sorted({r["cv"] for r in rows})
    fractions = sorted({r["fraction"] for r in rows})

    checks = bar_checks(rows, runs_list)
    lg = sum(r["loadgen_cpu_s"] for r in rows)
    sv = sum(r["server_cpu_s"] for r in rows if r["server_cpu_s"] != "")
    wall = sum(r["run_s"] for r in rows)
    summary = {
        "workload": "slora", "adapters": a.adapters, "ranks": a.ranks, "alpha": a.alpha,
        "input_len": [a.input_min, a.input_max], "output_len": [a.output_min, a.output_max],
        "model": a.model or "embedded tiny default model", "threads": a.threads,
        "max_running": a.max_running, "max_batch_tokens": a.max_batch_tokens,
        "capacity": cap_info, "ttft_slo_ms": slo_ms, "ttft_slo_why": slo_why,
        "satisfaction": "mean over requests sent of r(t) = 1 - (t/SLO)^2 for TTFT t < SLO, "
                        "0 otherwise and for 429 / failed requests (S-LoRA App. B; the reward of "
                        "its benchmark code)",
        "cost_model": cm_path, "policies": policies, "cvs": cvs, "fractions": fractions,
        "duration_s": a.duration, "min_requests": a.min_requests, "seed": a.seed,
        "repeats": a.repeats,
        "loadgen_cpu_share": round(lg / wall, 4) if wall else None,
        "server_cpu_share": round(sv / wall, 4) if wall else None,
        "load_start": prev.get("load_start", load_start), "load_end": loadavg(),
        "elapsed_s": round(time.time() - t_start + prev.get("elapsed_s", 0), 1),
        "invocations": prev.get("invocations", []) + [
            {"start": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t_start)),
             "load_start": load_start, "load_end": loadavg(), "argv": sys.argv[1:]}],
        "rows": rows,
        "runs": [{k: v for k, v in r.items() if k != "ttfts"} for r in runs_list],
        "bar": checks,
        "bar_met": all(c["ok"] for c in checks) if checks else None,
    }
    with open(json_path, "w") as f:
        json.dump(summary, f, indent=1)
    log("loadgen used %.1f %% of a core on average, the server %.1f %%" %
        (100 * (summary["loadgen_cpu_share"] or 0), 100 * (summary["server_cpu_share"] or 0)))
    for c in checks:
        if not c["ok"]:
            log("bar not met: %s" % json.dumps(c))
    if not a.no_plot:
        r = subprocess.run([sys.executable, os.path.join(ROOT, "tools", "plot.py"), "slo-sweep",
                            csv_path, "-o", os.path.join(a.out, "slo_sweep.png"), "--title",
                            "slora sweep: %d adapters, TTFT SLO %.0f ms, capacity %.2f req/s" %
                            (a.adapters, slo_ms, cap)])
        if r.returncode != 0:
            log("plot failed")
            return 1
    log("wrote %s, slo_sweep.json (%.0f s)" % (csv_path, time.time() - t_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())

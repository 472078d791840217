#!/usr/bin/env python3
"""Overload test of `chorus serve` (docs/hardening.md, "Overload").

Starts a real server with the `slo` policy (`--policy slo --ttft-slo-ms S`, docs/scheduling.md)
and a bounded queue (`--max-queue`), then:

1. baseline: --probes requests one at a time: the normal latency (median);
2. capacity: --max-running clients back to back for --capacity-seconds: requests/s finished;
3. overload: open-loop Poisson arrivals at --factor (3) × capacity for --seconds, each request
   on its own thread whatever the server does, RSS sampled every 0.25 s;
4. recovery: from the moment arrivals stop, probes one at a time until --stable (3) in a row
   are back to normal (≤ --normal (1.5) × the baseline median): the recovery time is when the
   first of them was sent.

What must hold (exit 1 otherwise):
* every answer is 200, 429 or 503, and every 429/503 has a Retry-After header;
* memory is bounded: peak RSS during the overload ≤ RSS before it + --rss-slack-mib (64);
* admitted requests keep the server's bound: the `slo` policy answers 429 at once a request
  that would miss its TTFT SLO (it has waited too long, or its predicted prefill would take it
  past the SLO), so the TTFT of the streamed requests answered 200 must be within the SLO, up to
  the cost model's prediction error: p99 ≤ S × (1 + --ttft-tolerance (0.1)) × the measured
  slowdown (capacity before the overload / requests served per second during it, at least 1:
  the policy's predictions assume the speed profiled at start). The maximum and
  the share within S are reported, and the server's own counters chorus_slo_ttft_met_total /
  _missed_total / chorus_slo_aborted_total;
* no 200 stream carries an error event (an aborted request must be a real 429);
* recovery to normal latency within --recovery-bar (10) s.

The requests are streamed (and --nonstream-share non-streamed) completions of random token ids
(--input tokens) with ignore_eos and --output tokens, so every request costs the same.

usage: tools/overload.py --chorus build/release/apps/chorus/chorus [--seconds 30] [--factor 3]
       [--ttft-slo-ms 1500] [--out FILE.json]
"""

import argparse
import http.client
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import (add_keep_work_flag, finish_work_dir, launch_server, local_get, metric,  # noqa: E402
                  pct, rss_kib, wait_healthy)


class Server:
    def __init__(self, a, work):
        env = dict(os.environ, CHORUS_CACHE_DIR=os.path.join(work, "cache"),
                   HOME=os.path.join(work, "home"))
        os.makedirs(env["HOME"], exist_ok=True)
        self.log_path = os.path.join(work, "serve.log")
        self.cmd = [a.chorus, "serve", "--port", "0", "--host", "127.0.0.1",
                    "--served-model-name", "base", "--policy", "slo", "--ttft-slo-ms",
                    str(a.ttft_slo_ms), "--max-running", str(a.max_running), "--max-queue",
                    str(a.max_queue), "--threads", str(a.threads), "--pool-size",
                    str(a.pool_mib), "--prefault", "--drain-timeout", "5"] + a.serve_arg
        # --policy slo profiles the model first
        self.proc, self.log, self.port, deadline = launch_server(self.cmd, env, self.log_path, 600)
        self.pid = self.proc.pid
        wait_healthy(self.get, deadline, self.log_path)

    def get(self, path):
        return local_get(self.port, path)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


class Client:
    def __init__(self, a, srv):
        self.a = a
        self.srv = srv
        self.lock = threading.Lock()
        self.results = []

    def body(self, rng, stream):
        b = {"model": "base", "prompt": [rng.randrange(10, 200) for _ in range(self.a.input)],
             "max_tokens": self.a.output, "ignore_eos": True, "temperature": 0}
        if stream:
            b["stream"] = True
        return b

    def request(self, rng, stream=True):
        """(status, retry_after, ttft_s, latency_s, error)."""
        t0 = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", self.srv.port, timeout=self.a.timeout)
        ttft = None
        try:
            c.request("POST", "/v1/completions", body=json.dumps(self.body(rng, stream)),
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            ra = r.getheader("Retry-After")
            if r.status == 200 and stream:
                done = False
                while True:
                    line = r.fp.readline()
                    if not line:
                        break
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:].strip()
                    if data == b"[DONE]":
                        done = True
                        break
                    ev = json.loads(data)
                    if "error" in ev:
                        return r.status, ra, ttft, None, "error event: %s" % data[:200]
                    if ttft is None and any(x.get("text") for x in ev.get("choices") or []):
                        ttft = time.monotonic() - t0
                if not done:
                    return r.status, ra, ttft, None, "stream ended without [DONE]"
            else:
                r.read()
            return r.status, ra, ttft, time.monotonic() - t0, None
        except (OSError, http.client.HTTPException, ValueError) as e:
            return None, None, ttft, None, repr(e)
        finally:
            c.close()

    def closed_loop(self, n, seconds, seed):
        """n clients back to back for `seconds`: requests finished per second."""
        stop = time.monotonic() + seconds
        done = [0]

        def run(i):
            rng = random.Random(seed * 100 + i)
            while time.monotonic() < stop:
                st, _, _, _, err = self.request(rng)
                if st == 200 and not err:
                    with self.lock:
                        done[0] += 1

        ts = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        t0 = time.monotonic()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return done[0] / (time.monotonic() - t0)

    def open_loop(self, rate, seconds, seed):
        """Poisson arrivals at `rate` for `seconds`; returns when all have been sent."""
        rng = random.Random(seed)
        threads = []
        t0 = time.monotonic()
        t = 0.0
        i = 0
        while True:
            t += rng.expovariate(rate)
            if t >= seconds:
                break
            delay = t0 + t - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            stream = rng.random() >= self.a.nonstream_share
            th = threading.Thread(target=self.one_open, args=(random.Random(seed * 7919 + i),
                                                              stream, time.monotonic()))
            th.start()
            threads.append(th)
            i += 1
        return threads, time.monotonic() - t0

    def one_open(self, rng, stream, sent):
        st, ra, ttft, lat, err = self.request(rng, stream)
        with self.lock:
            self.results.append({"status": st, "retry_after": ra, "ttft": ttft, "latency": lat,
                                 "error": err, "stream": stream, "sent": sent,
                                 "end": time.monotonic()})


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--seconds", type=float, default=30, help="length of the overload")
    ap.add_argument("--factor", type=float, default=3.0, help="offered load / capacity")
    ap.add_argument("--capacity-seconds", type=float, default=20)
    ap.add_argument("--capacity", type=float, default=0,
                    help="requests/s to take as the capacity instead of measuring it")
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--ttft-slo-ms", type=float, default=1500)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--pool-mib", type=int, default=128)
    ap.add_argument("--input", type=int, default=128, help="prompt tokens")
    ap.add_argument("--output", type=int, default=64, help="generated tokens")
    ap.add_argument("--ttft-tolerance", type=float, default=0.1,
                    help="admitted TTFT p99 may exceed the SLO by this fraction (prediction error)")
    ap.add_argument("--nonstream-share", type=float, default=0.2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--normal", type=float, default=1.5,
                    help="a probe is normal at ≤ this × the baseline median latency")
    ap.add_argument("--stable", type=int, default=3, help="normal probes in a row = recovered")
    ap.add_argument("--recovery-bar", type=float, default=10.0)
    ap.add_argument("--rss-slack-mib", type=float, default=64)
    ap.add_argument("--serve-arg", action="append", default=[], help="extra chorus serve flag")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default="")
    add_keep_work_flag(ap)
    a = ap.parse_args()
    if a.seconds <= 0 or a.factor <= 0 or a.probes < 1:
        ap.error("--seconds, --factor and --probes must be positive")
    work = tempfile.mkdtemp(prefix="chorus-overload-")
    srv = Server(a, work)
    cl = Client(a, srv)
    rng = random.Random(a.seed)
    failures = []
    print("overload: server pid %d port %d (%s)" % (srv.pid, srv.port, work), flush=True)

    # 1. Baseline latency, one request at a time (after a few warm-up requests).
    for _ in range(3):
        cl.request(rng)
    base = []
    for _ in range(a.probes):
        st, _, _, lat, err = cl.request(rng)
        if st != 200 or err:
            failures.append("baseline probe: %r %s" % (st, err))
        elif lat is not None:
            base.append(lat)
    base_med = statistics.median(base)
    print("overload: baseline latency median %.1f ms (%d probes)" % (base_med * 1e3, len(base)),
          flush=True)

    # 2. Capacity.
    cap = a.capacity or cl.closed_loop(a.max_running, a.capacity_seconds, a.seed)
    rate = a.factor * cap
    print("overload: capacity %.2f req/s; offering %.2f req/s for %.0f s" % (cap, rate, a.seconds),
          flush=True)
    m0 = srv.get("/metrics")[1]
    rss_before = rss_kib(srv.pid)

    # 3. Overload, RSS sampled meanwhile.
    rss = []
    sampling = threading.Event()

    def sampler():
        while not sampling.wait(0.25):
            r = rss_kib(srv.pid)
            if r:
                rss.append(r)

    smp = threading.Thread(target=sampler)
    smp.start()
    t_start = time.monotonic()
    threads, sent_for = cl.open_loop(rate, a.seconds, a.seed + 1)
    t_stop = time.monotonic()

    # 4. Recovery: probes one at a time from the moment arrivals stop.
    probes = []
    run_start = None
    recovered_at = None
    while time.monotonic() - t_stop < 60:
        ts = time.monotonic()
        st, ra, _, lat, err = cl.request(rng)
        probes.append({"t": round(ts - t_stop, 3), "status": st,
                       "latency_ms": round(lat * 1e3, 1) if lat else None})
        if st == 200 and not err and lat <= a.normal * base_med:
            if run_start is None:
                run_start = ts - t_stop
            if sum(1 for p in probes[-a.stable:] if p["status"] == 200 and p["latency_ms"] and
                   p["latency_ms"] <= a.normal * base_med * 1e3) == a.stable:
                recovered_at = run_start
                break
        else:
            run_start = None
            if st == 429 or st == 503:
                time.sleep(0.05)
    for t in threads:
        t.join()
    sampling.set()
    smp.join()
    m1 = srv.get("/metrics")[1]

    res = cl.results
    by = {}
    for r in res:
        by[str(r["status"])] = by.get(str(r["status"]), 0) + 1
    bad_status = [r for r in res if r["status"] not in (200, 429, 503)]
    no_ra = [r for r in res if r["status"] in (429, 503) and not r["retry_after"]]
    errs = [r for r in res if r["error"]]
    ttft = [r["ttft"] for r in res if r["status"] == 200 and r["stream"] and r["ttft"] is not None]
    slo = a.ttft_slo_ms / 1e3
    ttft_p99 = pct(ttft, 99)
    within = sum(1 for x in ttft if x <= slo) / len(ttft) if ttft else None
    rss_peak = max(rss) if rss else None
    # What the server finished while saturated: its capacity then (the machine is shared, so
    # the capacity measured before may differ); offered / served is the real overload factor.
    served = sum(1 for r in res if r["status"] == 200 and not r["error"] and
                 t_start + 2 <= r["end"] <= t_stop) / max(1e-9, t_stop - t_start - 2)

    # The slo policy predicts each prefill from the cost model profiled at the server's start,
    # scaled by how long its steps have been taking (chorus_slo_cost_correction, reported); the
    # correction follows the steps, not the client's view of them, and when the machine serves
    # slower during the overload than the capacity measured before it (2 cores shared with this
    # load generator's threads, which grow with the offered rate) the time between the steps
    # grows too. The bound scales with that measured slowdown (never below the SLO's own bound).
    slowdown = max(1.0, cap / served) if served > 0 else 1.0
    ttft_bound = slo * (1 + a.ttft_tolerance) * slowdown

    def delta(name):
        x0, x1 = metric(m0, name), metric(m1, name)
        return None if x0 is None or x1 is None else int(x1 - x0)

    summary = {
        "capacity_req_s": round(cap, 2), "offered_req_s": round(rate, 2), "factor": a.factor,
        "overload_s": round(sent_for, 1), "requests": len(res), "by_status": by,
        "served_req_s_during_overload": round(served, 2),
        "effective_factor": round(rate / served, 2) if served > 0 else None,
        "admitted_share": round(by.get("200", 0) / len(res), 3) if res else None,
        "not_200_429_503": len(bad_status), "429_503_without_retry_after": len(no_ra),
        "client_errors": len(errs),
        "ttft_slo_ms": a.ttft_slo_ms, "admitted_streams": len(ttft),
        "admitted_ttft_p50_ms": round(pct(ttft, 50) * 1e3, 1) if ttft else None,
        "admitted_ttft_p99_ms": round(ttft_p99 * 1e3, 1) if ttft else None,
        "admitted_ttft_max_ms": round(max(ttft) * 1e3, 1) if ttft else None,
        "admitted_ttft_within_slo_share": round(within, 4) if within is not None else None,
        "slowdown_during_overload": round(slowdown, 3),
        "admitted_ttft_p99_bound_ms": round(ttft_bound * 1e3, 1),
        "server_slo_ttft_met": delta("chorus_slo_ttft_met_total"),
        "server_slo_ttft_missed": delta("chorus_slo_ttft_missed_total"),
        "server_slo_aborted": delta("chorus_slo_aborted_total"),
        "server_queue_rejected": delta("chorus_engine_requests_rejected_total"),
        "server_cost_correction": metric(m1, "chorus_slo_cost_correction"),
        "rss_mib_before": round(rss_before / 1024, 1) if rss_before else None,
        "rss_mib_peak": round(rss_peak / 1024, 1) if rss_peak else None,
        "baseline_latency_ms": round(base_med * 1e3, 1),
        "recovery_s": round(recovered_at, 2) if recovered_at is not None else None,
        "recovery_probes": probes[:40],
        "loadavg": open("/proc/loadavg").read().split()[:3],
        "serve_command": " ".join(srv.cmd),
    }
    for r in bad_status[:10]:
        failures.append("status %r: %s" % (r["status"], r["error"]))
    if no_ra:
        failures.append("%d answers 429/503 without Retry-After" % len(no_ra))
    for r in errs[:10]:
        if r["status"] is not None:
            failures.append("status %r with %s" % (r["status"], r["error"]))
    if rss_peak is None or rss_before is None or rss_peak > rss_before + a.rss_slack_mib * 1024:
        failures.append("RSS not bounded: %s KiB before, peak %s KiB" % (rss_before, rss_peak))
    if not ttft:
        failures.append("no streamed request was admitted")
    elif ttft_p99 > ttft_bound:
        failures.append("admitted TTFT p99 %.0f ms over the SLO of %.0f ms (+%.0f %%, x %.2f "
                        "measured slowdown: %.0f ms)" %
                        (ttft_p99 * 1e3, a.ttft_slo_ms, a.ttft_tolerance * 100, slowdown,
                         ttft_bound * 1e3))
    if recovered_at is None or recovered_at > a.recovery_bar:
        failures.append("latency not back to normal within %.0f s (recovery: %r)" %
                        (a.recovery_bar, recovered_at))
    st, _ = srv.get("/health")
    if st != 200:
        failures.append("/health %d after the run" % st)
    rc = srv.stop()
    summary["server_exit"] = rc
    if rc != 0:
        failures.append("server exit status %r" % rc)
    summary["failures"] = failures
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    for f_ in failures:
        print("FAIL:", f_)
    print(json.dumps({k: v for k, v in summary.items() if k != "recovery_probes"}))
    print("overload: capacity %.2f req/s, %.1f× offered (%s× what it served meanwhile): %s; admitted TTFT p99 %s ms (SLO %.0f), "
          "RSS %s -> peak %s MiB, recovery %s s: %s" % (
              cap, a.factor, summary["effective_factor"], json.dumps(by),
              summary["admitted_ttft_p99_ms"], a.ttft_slo_ms,
              summary["rss_mib_before"], summary["rss_mib_peak"], summary["recovery_s"],
              "PASS" if not failures else "FAIL"))
    finish_work_dir(work, not failures, a.keep_work)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

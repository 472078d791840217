#!/usr/bin/env python3
"""The concurrency bar of docs/finetuning.md: a fine-tuning job through the API while a Poisson
inference load runs (bench/serve's chorus_bench_serve), under --finetune-policy immediate and
deferred, same load and seed. Reports fine-tuning tokens/min during the load window and the
deferral-bound attainment (the share of requests whose TTFT, measured by the client, is within
the bound), and the ratio deferred / immediate.

The server also gets `--ttft-slo-ms` equal to the bound: the deferral bound of a request is its
TTFT SLO, so the scheduling is the same, and the engine then counts each request's TTFT against
it from the moment the engine received it (`chorus_slo_ttft_met_total` / `_missed_total`) — the
engine's own attainment, next to the client's, which adds the HTTP path. Each run also reports
the training iterations granted during the window (count, mean wall time from
`chorus_finetune_busy_seconds_total`) and, for the requests over the bound, by how much.

Usage: tools/finetune_concurrency.py [--rate R] [--requests N] [--bound MS] [--threads T]
                                     [--out DIR] [--policies immediate,deferred] [--repeats N]
                                     [--sweep bound:200,500,1000 | --sweep rate:4,8,16]
With --repeats N, N invocations of both policies one after the other (run1/, run2/, … under DIR)
and the median of the ratios. With --sweep, one run of each policy per value; DIR/sweep.csv (x,
and per policy tokens/min and attainment) is what `tools/plot.py finetune-sweep` draws
(FineInfer's Fig. 4/5 shape).
"""
import argparse
import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def req(url, method="GET", body=None, headers=None):
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    h = dict(headers or {})
    if isinstance(body, dict):
        h["Content-Type"] = "application/json"
    r = urllib.request.Request(url, data=data, method=method, headers=h)
    with urllib.request.urlopen(r, timeout=120) as resp:
        return json.loads(resp.read())


def metrics(url):
    """The server's Prometheus counters of interest, by name."""
    text = urllib.request.urlopen(url + "/metrics", timeout=60).read().decode()
    out = {}
    for name in ("chorus_slo_ttft_met_total", "chorus_slo_ttft_missed_total",
                 "chorus_finetune_iterations_total", "chorus_finetune_busy_seconds_total",
                 "chorus_finetune_iteration_seconds"):
        m = re.search(r"^" + name + r" ([0-9.eE+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def things_jsonl(models):
    text = open(os.path.join(models, "stories260K-finetunes/things/data/train.txt"),
                encoding="utf-8").read()
    docs = [d.strip("\n") for d in re.split(r"\n[ \t]*\n", text) if d.strip()]
    return b"".join(json.dumps({"text": d}).encode() + b"\n" for d in docs)


def run_policy(args, policy, work):
    state = tempfile.mkdtemp(prefix=f"ftconc-{policy}-", dir=work)
    log = open(os.path.join(state, "server.log"), "w")
    cmd = [args.chorus, "serve", "--model", os.path.join(args.models, "stories260K/stories260K.bin"),
           "--tokenizer", os.path.join(args.models, "stories260K/tok512.bin"),
           "--served-model-name", "stories260K", "--port", "0", "--threads", str(args.threads),
           "--registry", os.path.join(state, "registry.json"), "--finetune-dir",
           os.path.join(state, "ft"), "--finetune-policy", policy, "--deferral-bound",
           str(args.bound), "--ttft-slo-ms", str(args.bound), "--max-running", "64",
           "--max-queue", "4096"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    url = None
    for line in proc.stdout:
        m = re.search(r"at (http://\S+)/v1", line)
        if m:
            url = m.group(1)
            break
    assert url, "server did not start"
    try:
        boundary = uuid.uuid4().hex
        body = (f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
                f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="t.jsonl"\r\n'
                f'\r\n').encode() + things_jsonl(args.models) + f"\r\n--{boundary}--\r\n".encode()
        f = req(url + "/v1/files", "POST", body,
                {"Content-Type": "multipart/form-data; boundary=" + boundary})
        job = req(url + "/v1/fine_tuning/jobs", "POST",
                  {"model": "stories260K", "training_file": f["id"], "seed": 1,
                   "hyperparameters": {"n_steps": 1000000, "batch_size": args.batch,
                                       "lora_rank": 8, "lora_targets": "q,k,v,o,gate,up,down",
                                       "checkpoint_every": 0, "learning_rate_multiplier": 10}})
        jid = job["id"]
        while req(url + "/v1/fine_tuning/jobs/" + jid)["chorus"].get("step", 0) < 5:
            time.sleep(0.2)
        j0 = req(url + "/v1/fine_tuning/jobs/" + jid)
        m0 = metrics(url)
        t0 = time.time()
        prefix = os.path.join(args.out, f"{policy}")
        bench = [args.bench, "--url", url, "--rate", str(args.rate), "--num-requests",
                 str(args.requests), "--input-min", "16", "--input-max", "128",
                 "--output-min", "16", "--output-max", "128", "--token-id-max", "500",
                 "--seed", "1", "--out", prefix, "--metrics-interval", "0"]
        subprocess.run(bench, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        j1 = req(url + "/v1/fine_tuning/jobs/" + jid)
        t1 = time.time()
        m1 = metrics(url)
        req(url + f"/v1/fine_tuning/jobs/{jid}/cancel", "POST", b"")
        tokens = j1["chorus"]["trained_tokens"] - j0["chorus"]["trained_tokens"]
        steps = j1["chorus"]["step"] - j0["chorus"]["step"]
        ttfts = []
        with open(prefix + ".csv") as fh:
            for row in csv.DictReader(fh):
                if row["status"] == "200" and float(row["ttft_s"]) >= 0:
                    ttfts.append(float(row["ttft_s"]))
                else:
                    ttfts.append(float("inf"))
        ttfts.sort()
        within = sum(1 for t in ttfts if t * 1000 <= args.bound)
        over = sorted(t * 1000 - args.bound for t in ttfts if t * 1000 > args.bound)
        d = {k: m1[k] - m0[k] for k in m0}
        met, missed = d["chorus_slo_ttft_met_total"], d["chorus_slo_ttft_missed_total"]
        iters = d["chorus_finetune_iterations_total"]
        return {"policy": policy, "bound_ms": args.bound, "rate": args.rate,
                "window_s": t1 - t0, "train_steps": steps,
                "train_tokens": tokens, "train_tokens_per_min": tokens / (t1 - t0) * 60,
                "requests": len(ttfts), "attainment": within / max(1, len(ttfts)),
                "engine_attainment": met / max(1.0, met + missed),
                "ttft_p50_ms": ttfts[len(ttfts) // 2] * 1000,
                "ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))] * 1000,
                # Requests within the last 10 % of the bound: how close to it the policy serves.
                "near_bound": sum(1 for t in ttfts if 0.9 * args.bound < t * 1000 <= args.bound),
                "missed": len(over),
                "miss_over_ms_median": over[len(over) // 2] if over else 0.0,
                "miss_over_ms_max": over[-1] if over else 0.0,
                "iterations": iters,
                "iteration_ms_mean": d["chorus_finetune_busy_seconds_total"] / iters * 1000
                if iters else 0.0,
                "iteration_ms_ema_end": m1["chorus_finetune_iteration_seconds"] * 1000}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chorus", default=os.path.join(ROOT, "build/release/apps/chorus/chorus"))
    p.add_argument("--bench", default=os.path.join(ROOT, "build/release/bench/serve/chorus_bench_serve"))
    p.add_argument("--models", default=os.path.join(ROOT, "../shared/models"))
    p.add_argument("--rate", type=float, default=8)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--bound", type=float, default=500)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--policies", default="immediate,deferred")
    p.add_argument("--out", default="/tmp/finetune-concurrency")
    p.add_argument("--sweep", default="", help="bound:MS,MS,... or rate:R,R,...")
    p.add_argument("--repeats", type=int, default=1, help="invocations of both policies")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.sweep:
        what, _, values = args.sweep.partition(":")
        if what not in ("bound", "rate") or not values:
            p.error("--sweep must be bound:V,V,... or rate:V,V,...")
        rows, runs = [], []
        for v in values.split(","):
            setattr(args, what, float(v))
            row = {"x": float(v)}
            for policy in ("immediate", "deferred"):
                load0 = open("/proc/loadavg").read().split()[0]
                r = run_policy(args, policy, args.out)
                row[policy + "_tokens_per_min"] = r["train_tokens_per_min"]
                row[policy + "_attainment"] = r["attainment"]
                row[policy + "_load"] = load0
                runs.append({what: float(v), "load_before": load0, **r})
                print(json.dumps(runs[-1]), flush=True)
            rows.append(row)
        with open(os.path.join(args.out, "sweep.csv"), "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        json.dump(runs, open(os.path.join(args.out, "sweep.json"), "w"), indent=1)
        print("wrote " + os.path.join(args.out, "sweep.csv") + f" (x = {what})")
        return 0
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    root, ratios = args.out, []
    for rep in range(args.repeats):
        args.out = root if args.repeats == 1 else os.path.join(root, f"run{rep + 1}")
        os.makedirs(args.out, exist_ok=True)
        results = []
        for policy in args.policies.split(","):
            load0 = open("/proc/loadavg").read().split()[:3]
            r = run_policy(args, policy, args.out)
            r["load_before"] = " ".join(load0)
            r["load_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
            results.append(r)
            print(json.dumps(r), flush=True)
        by = {r["policy"]: r for r in results}
        if "immediate" in by and "deferred" in by and by["immediate"]["train_tokens_per_min"] > 0:
            ratios.append(by["deferred"]["train_tokens_per_min"] /
                          by["immediate"]["train_tokens_per_min"])
            print(json.dumps({"deferred_over_immediate": ratios[-1]}), flush=True)
        json.dump(results, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    if len(ratios) > 1:
        ratios.sort()
        n = len(ratios)
        med = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
        print(json.dumps({"ratios": ratios, "median_ratio": med}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
`chorus_finetune_busy_seconds_total`), the mean tokens generated per engine step (how large the
decode batches were), and, for the requests over the bound, by how much.

Model: stories260K by default; `--model FILE --tokenizer FILE` for another (e.g. the synthetic
TinyLlama-1.1B shape `chorus convert --shape tinyllama-1.1b --dtype q4_0` writes, whose decode
step is memory-bound). The job trains on the stories260K "things" text, cut into JSONL `text`
samples of --sample-words words, packed into --seq-len sequences, --batch per iteration.
Requests: --requests, or with --window S, rate × S of them (at least 12), so each run's load
window lasts about S seconds whatever the rate.

Usage: tools/finetune_concurrency.py [--rate R] [--requests N | --window S] [--bound MS]
                                     [--threads T] [--out DIR] [--policies immediate,deferred]
                                     [--repeats N] [--sweep bound:200,500,1000 | --sweep rate:4,8,16]
                                     [--model F --tokenizer F] [--seq-len L] [--batch B]
                                     [--input-min/--input-max/--output-min/--output-max N]
With --repeats N, N invocations of both policies one after the other (run1/, run2/, … under DIR)
and the median of the ratios. With --sweep, --repeats runs of each policy per value (alternating
immediate, deferred); DIR/sweep.csv (x, and per policy the median tokens/min and attainment over
the repeats) is what `tools/plot.py finetune-sweep` draws (FineInfer's Fig. 4/5 shape), and
DIR/sweep.json holds every run with /proc/loadavg before and after it.
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
                 "chorus_engine_steps_total", "chorus_generation_tokens_total",
                 "chorus_finetune_iterations_total", "chorus_finetune_busy_seconds_total",
                 "chorus_finetune_iteration_seconds"):
        m = re.search(r"^" + name + r" ([0-9.eE+-]+)$", text, re.M)
        out[name] = float(m.group(1)) if m else 0.0
    return out


def things_jsonl(models, sample_words):
    text = open(os.path.join(models, "stories260K-finetunes/things/data/train.txt"),
                encoding="utf-8").read()
    docs = [d.strip("\n") for d in re.split(r"\n[ \t]*\n", text) if d.strip()]
    if sample_words > 0:  # short samples, so that they fit a short --seq-len
        words = " ".join(docs).split()
        docs = [" ".join(words[i:i + sample_words]) for i in range(0, len(words), sample_words)]
    return b"".join(json.dumps({"text": d}).encode() + b"\n" for d in docs)


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def median(xs):
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def run_policy(args, policy, work):
    state = tempfile.mkdtemp(prefix=f"ftconc-{policy}-", dir=work)
    log = open(os.path.join(state, "server.log"), "w")
    cmd = [args.chorus, "serve", "--model", args.model, "--tokenizer", args.tokenizer,
           "--served-model-name", args.served_name, "--port", "0", "--threads", str(args.threads),
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
                f'\r\n').encode() + things_jsonl(args.models, args.sample_words) + \
            f"\r\n--{boundary}--\r\n".encode()
        f = req(url + "/v1/files", "POST", body,
                {"Content-Type": "multipart/form-data; boundary=" + boundary})
        job = req(url + "/v1/fine_tuning/jobs", "POST",
                  {"model": args.served_name, "training_file": f["id"], "seed": 1,
                   "hyperparameters": {"n_steps": 1000000, "batch_size": args.batch,
                                       "seq_len": args.seq_len, "lora_rank": args.rank,
                                       "lora_targets": args.targets,
                                       "checkpoint_every": 0, "learning_rate_multiplier": 10}})
        jid = job["id"]
        while True:
            j = req(url + "/v1/fine_tuning/jobs/" + jid)
            if j["status"] in ("failed", "cancelled"):
                raise RuntimeError(f"fine-tuning job {j['status']}: {j.get('error')}")
            if j["chorus"].get("step", 0) >= 5:
                break
            time.sleep(0.2)
        j0 = req(url + "/v1/fine_tuning/jobs/" + jid)
        m0 = metrics(url)
        t0 = time.time()
        prefix = os.path.join(args.out, getattr(args, "tag", "") + policy)
        n_requests = args.requests if args.window <= 0 else max(12, round(args.rate * args.window))
        bench = [args.bench, "--url", url, "--rate", str(args.rate), "--num-requests",
                 str(n_requests), "--input-min", str(args.input_min), "--input-max",
                 str(args.input_max), "--output-min", str(args.output_min), "--output-max",
                 str(args.output_max), "--token-id-max", "500",
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
                # Tokens generated per engine step in the window: the mean decode batch (prefill
                # steps count too, so it is a lower bound).
                "tokens_per_step": d["chorus_generation_tokens_total"] /
                max(1.0, d["chorus_engine_steps_total"]),
                "iterations": iters,
                "iteration_ms_mean": d["chorus_finetune_busy_seconds_total"] / iters * 1000
                if iters else 0.0,
                "iteration_ms_ema_end": m1["chorus_finetune_iteration_seconds"] * 1000}
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()


def sweep_rows(runs, what):
    """Per swept value, the medians over its runs of each policy (sweep.csv's rows)."""
    rows = []
    for v in sorted({r[what] for r in runs}):
        got = {p: [r for r in runs if r[what] == v and r["policy"] == p]
               for p in ("immediate", "deferred")}
        row = {"x": v, "swept": what}
        for policy in ("immediate", "deferred"):
            row[policy + "_tokens_per_min"] = median(
                [r["train_tokens_per_min"] for r in got[policy]] or [0.0])
            row[policy + "_attainment"] = median([r["attainment"] for r in got[policy]] or [0.0])
        # Ratio of each repeat's pair (same repeat number), then their median.
        pairs = [(i, d) for i in got["immediate"] for d in got["deferred"]
                 if i.get("repeat") == d.get("repeat") and i.get("src") == d.get("src")]
        row["ratio"] = median([d["train_tokens_per_min"] / i["train_tokens_per_min"]
                               for i, d in pairs if i["train_tokens_per_min"] > 0] or [0.0])
        row["runs"] = min(len(got["immediate"]), len(got["deferred"]))
        rows.append(row)
    return rows


def write_sweep(out, rows, runs):
    with open(os.path.join(out, "sweep.csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    json.dump(runs, open(os.path.join(out, "sweep.json"), "w"), indent=1)


def merge_sweeps(dirs, out):
    runs = []
    for d in dirs:
        for r in json.load(open(os.path.join(d, "sweep.json"))):
            runs.append({**r, "src": os.path.basename(os.path.normpath(d))})
    what = "bound" if "bound" in runs[0] else "rate"  # a rate sweep's runs have bound_ms
    os.makedirs(out, exist_ok=True)
    rows = sweep_rows(runs, what)
    write_sweep(out, rows, runs)
    for row in rows:
        print(json.dumps(row))
    print("wrote " + os.path.join(out, "sweep.csv") + f" (x = {what}, {len(runs)} runs)")
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chorus", default=os.path.join(ROOT, "build/release/apps/chorus/chorus"))
    p.add_argument("--bench", default=os.path.join(ROOT, "build/release/bench/serve/chorus_bench_serve"))
    p.add_argument("--models", default=os.path.join(ROOT, "../shared/models"))
    p.add_argument("--model", default="", help="default: MODELS/stories260K/stories260K.bin")
    p.add_argument("--tokenizer", default="", help="default: MODELS/stories260K/tok512.bin")
    p.add_argument("--served-name", default="", help="default: the model file's stem")
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--targets", default="q,k,v,o,gate,up,down")
    p.add_argument("--sample-words", type=int, default=0,
                   help="cut the training text into samples of this many words (0: documents)")
    p.add_argument("--input-min", type=int, default=16)
    p.add_argument("--input-max", type=int, default=128)
    p.add_argument("--output-min", type=int, default=16)
    p.add_argument("--output-max", type=int, default=128)
    p.add_argument("--window", type=float, default=0,
                   help="requests = max(12, rate x WINDOW) instead of --requests")
    p.add_argument("--rate", type=float, default=8)
    p.add_argument("--requests", type=int, default=240)
    p.add_argument("--bound", type=float, default=500)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--policies", default="immediate,deferred")
    p.add_argument("--out", default="/tmp/finetune-concurrency")
    p.add_argument("--sweep", default="", help="bound:MS,MS,... or rate:R,R,...")
    p.add_argument("--repeats", type=int, default=1, help="invocations of both policies")
    p.add_argument("--merge", default="",
                   help="DIR,DIR,...: combine the sweep.json of sweeps run separately (e.g. one "
                        "repeat per invocation, to keep each measurement short) into OUT's "
                        "sweep.csv / sweep.json, medians over all their runs")
    args = p.parse_args()
    args.model = args.model or os.path.join(args.models, "stories260K/stories260K.bin")
    args.tokenizer = args.tokenizer or os.path.join(args.models, "stories260K/tok512.bin")
    args.served_name = args.served_name or re.sub(r"\.[^.]*$", "", os.path.basename(args.model))
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        return merge_sweeps(args.merge.split(","), args.out)
    if args.sweep:
        what, _, values = args.sweep.partition(":")
        if what not in ("bound", "rate") or not values:
            p.error("--sweep must be bound:V,V,... or rate:V,V,...")
        runs = []
        for v in values.split(","):
            setattr(args, what, float(v))
            for rep in range(args.repeats):
                for policy in ("immediate", "deferred"):
                    args.tag = f"{what}{v}-run{rep + 1}-"
                    load0 = loadavg()
                    r = run_policy(args, policy, args.out)
                    runs.append({what: float(v), "repeat": rep + 1, "load_before": load0,
                                 "load_after": loadavg(), **r})
                    print(json.dumps(runs[-1]), flush=True)
            rows = sweep_rows(runs, what)
            print(json.dumps(next(r for r in rows if r["x"] == float(v))), flush=True)
            write_sweep(args.out, rows, runs)  # after every value: a cut sweep keeps its data
        print("wrote " + os.path.join(args.out, "sweep.csv") + f" (x = {what})")
        return 0
    root, ratios = args.out, []
    for rep in range(args.repeats):
        args.out = root if args.repeats == 1 else os.path.join(root, f"run{rep + 1}")
        os.makedirs(args.out, exist_ok=True)
        results = []
        for policy in args.policies.split(","):
            load0 = loadavg()
            r = run_policy(args, policy, args.out)
            r["load_before"] = load0
            r["load_after"] = loadavg()
            results.append(r)
            print(json.dumps(r), flush=True)
        by = {r["policy"]: r for r in results}
        if "immediate" in by and "deferred" in by and by["immediate"]["train_tokens_per_min"] > 0:
            ratios.append(by["deferred"]["train_tokens_per_min"] /
                          by["immediate"]["train_tokens_per_min"])
            print(json.dumps({"deferred_over_immediate": ratios[-1]}), flush=True)
        json.dump(results, open(os.path.join(args.out, "results.json"), "w"), indent=1)
    if len(ratios) > 1:
        print(json.dumps({"ratios": sorted(ratios), "median_ratio": median(ratios)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

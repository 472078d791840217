#!/usr/bin/env python3
"""The quality bar through the API (docs/finetuning.md, "Quality"): the run of
tools/finetune_quality.sh (stories260K "things" text, rank 8 on all seven linears, 200 steps,
batch 16, seq 256, lr 2e-3, warm-up 10, seed 1) as a /v1/fine_tuning/jobs job on a running
`chorus serve`. The training text is uploaded as JSONL, one {"text"} line per blank-line separated
document (the samples the plain-text reader makes of it when no document is longer than
seq_len), the held-out text as the validation file. Checks that the ft: model is listed in
/v1/models and answers a completion the moment the job reads "succeeded", then evaluates the
adapter with `chorus eval` exactly as finetune_quality.sh does, and compares it with the CLI
adapter when one is given (--cli-adapter DIR: same adapter_model.safetensors bytes?).

Usage: tools/finetune_quality_api.py [--out DIR] [--cli-adapter DIR] [--threads N]
"""
import argparse
import filecmp
import json
import os
import re
import signal
import subprocess
import sys
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
    with urllib.request.urlopen(r, timeout=300) as resp:
        return json.loads(resp.read())


def as_jsonl(path):
    text = open(path, encoding="utf-8").read()
    docs = [d.strip("\n") for d in re.split(r"\n[ \t]*\n", text) if d.strip()]
    return b"".join(json.dumps({"text": d}).encode() + b"\n" for d in docs)


def upload(url, name, content):
    b = uuid.uuid4().hex
    body = (f'--{b}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nfine-tune\r\n'
            f'--{b}\r\nContent-Disposition: form-data; name="file"; filename="{name}"\r\n\r\n'
            ).encode() + content + f"\r\n--{b}--\r\n".encode()
    return req(url + "/v1/files", "POST", body, {"Content-Type": "multipart/form-data; boundary=" + b})


def hits(text):
    n = 0
    for prompt, word in (("They went to the", "beach"), ("She played with her", "kite"),
                         ("He had a pet", "cat")):
        m = re.search(r'^greedy "' + re.escape(prompt) + r'" -> (.*)$', text, re.M)
        n += bool(m and word in m.group(1))
    return n / 3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--chorus", default=os.path.join(ROOT, "build/release/apps/chorus/chorus"))
    p.add_argument("--models", default=os.path.join(ROOT, "../shared/models"))
    p.add_argument("--out", default="/tmp/finetune-quality-api")
    p.add_argument("--cli-adapter", default="")
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    base = os.path.join(a.models, "stories260K/stories260K.bin")
    tok = os.path.join(a.models, "stories260K/tok512.bin")
    things = os.path.join(a.models, "stories260K-finetunes/things")
    log = open(os.path.join(a.out, "server.log"), "w")
    proc = subprocess.Popen(
        [a.chorus, "serve", "--model", base, "--tokenizer", tok, "--served-model-name",
         "stories260K", "--port", "0", "--threads", str(a.threads), "--registry",
         os.path.join(a.out, "registry.json"), "--finetune-dir", os.path.join(a.out, "ft")],
        stdout=subprocess.PIPE, stderr=log, text=True)
    url = None
    for line in proc.stdout:
        m = re.search(r"at (http://\S+)/v1", line)
        if m:
            url = m.group(1)
            break
    assert url, "server did not start"
    load = ["load before: " + open("/proc/loadavg").read().strip()]
    try:
        tf = upload(url, "train.jsonl", as_jsonl(os.path.join(things, "data/train.txt")))
        vf = upload(url, "heldout.jsonl", as_jsonl(os.path.join(things, "data/heldout.txt")))
        t0 = time.time()
        job = req(url + "/v1/fine_tuning/jobs", "POST", {
            "model": "stories260K", "training_file": tf["id"], "validation_file": vf["id"],
            "suffix": "things", "seed": 1,
            "hyperparameters": {"n_steps": 200, "batch_size": 16, "learning_rate_multiplier": 10,
                                "lora_rank": 8, "lora_alpha": 16,
                                "lora_targets": "q,k,v,o,gate,up,down", "seq_len": 256,
                                "warmup_steps": 10, "checkpoint_every": 50}})
        assert job["status"] == "validating_files", job  # the files are read after the answer
        while True:
            job = req(url + "/v1/fine_tuning/jobs/" + job["id"])
            if job["status"] in ("succeeded", "failed", "cancelled"):
                break
            time.sleep(0.05)
        assert job["status"] == "succeeded", job
        name = job["fine_tuned_model"]
        listed = name in [m["id"] for m in req(url + "/v1/models")["data"]]
        c = req(url + "/v1/completions", "POST",
                {"model": name, "prompt": "They went to the", "max_tokens": 16, "temperature": 0})
        load.append("load after: " + open("/proc/loadavg").read().strip())
        print(f"job {job['id']} succeeded in {time.time() - t0:.1f} s; {name} listed in "
              f"/v1/models: {listed}; completion at once: {c['choices'][0]['text']!r}")
        adapter = os.path.join(a.out, "ft/jobs", job["id"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        log.close()
    ev = [a.chorus, "eval", "--model", base, "--tokenizer", tok, "--data",
          os.path.join(things, "data/heldout.txt"), "--threads", str(a.threads),
          "--greedy-prompt", "They went to the", "--greedy-prompt", "She played with her",
          "--greedy-prompt", "He had a pet", "--variant", adapter]
    out = subprocess.run(ev, check=True, capture_output=True, text=True).stdout
    open(os.path.join(a.out, "api.eval"), "w").write(out)
    ppl = re.search(r"^perplexity (\S+)", out, re.M).group(1)
    print(f"| API job ({name.split(':')[-1]}) | {ppl} | {hits(out):.2f} |")
    if a.cli_adapter:
        same = filecmp.cmp(os.path.join(adapter, "adapter_model.safetensors"),
                           os.path.join(a.cli_adapter, "adapter_model.safetensors"), shallow=False)
        print(f"adapter_model.safetensors identical to {a.cli_adapter}: {same}")
    print("; ".join(load))
    return 0


if __name__ == "__main__":
    sys.exit(main())

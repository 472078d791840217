#!/usr/bin/env python3
"""What scoring a prompt costs over a plain prefill, through a running `chorus serve`.

Sends, alternately, prompts of --tokens random token ids (a fresh prompt each time, so the
prefix cache never helps) as a plain completion of one token and as lm-evaluation-harness's
loglikelihood call (echo, logprobs 1, max_tokens 1), one at a time, and prints the median
latency of each and their ratio (docs/benchmarks.md, "Prompt logprobs").

    python3 tools/prompt_logprobs_bench.py --port 8000 --tokens 512 --repeats 6
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        out = json.load(r)
    return time.time() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--tokens", type=int, default=512, help="prompt length (BOS included)")
    ap.add_argument("--repeats", type=int, default=6)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    a = ap.parse_args()
    rng = random.Random(time.time())
    times = {"plain": [], "scored": []}
    for rep in range(a.repeats):
        order = ["plain", "scored"] if rep % 2 == 0 else ["scored", "plain"]
        for kind in order:
            prompt = [1] + [rng.randrange(100, a.vocab - 1) for _ in range(a.tokens - 1)]
            body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
            if kind == "scored":
                body.update(echo=True, logprobs=1)
            dt, out = post(a.port, body)
            if kind == "scored":
                got = len(out["choices"][0]["logprobs"]["token_logprobs"])
                assert got == a.tokens + 1, f"{got} logprobs for {a.tokens} + 1 tokens"
            times[kind].append(dt)
    for kind, v in times.items():
        print(f"{kind}: median {statistics.median(v):.3f} s  runs " +
              " ".join(f"{x:.3f}" for x in v))
    print(f"scored / plain: {statistics.median(times['scored']) / statistics.median(times['plain']):.2f}")


if __name__ == "__main__":
    main()

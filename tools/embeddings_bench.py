#!/usr/bin/env python3
"""What an embedding costs against the same prompts' prefill, through a running `chorus serve`.

Sends, alternately, --inputs fresh prompts of --tokens random token ids (fresh each time, so the
prefix cache never helps) as one /v1/embeddings request and as one /v1/completions request of
one token per prompt, and prints the median latency of each, the prompt tokens per second and
their ratio (docs/benchmarks.md, "Embeddings").

    python3 tools/embeddings_bench.py --port 8000 --inputs 16 --tokens 64 --repeats 4
"""
import argparse
import json
import random
import statistics
import time
import urllib.request


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.time()
    with urllib.request.urlopen(req) as r:
        out = json.load(r)
    return time.time() - t0, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--inputs", type=int, default=16, help="prompts per request (≤ 64)")
    ap.add_argument("--tokens", type=int, default=64, help="prompt length (BOS included)")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=32000, help="token ids are drawn below this")
    a = ap.parse_args()
    rng = random.Random(time.time())
    times = {"completion": [], "embedding": []}
    for rep in range(a.repeats):
        order = ["completion", "embedding"] if rep % 2 == 0 else ["embedding", "completion"]
        for kind in order:
            prompts = [[1] + [rng.randrange(100, a.vocab - 1) for _ in range(a.tokens - 1)]
                       for _ in range(a.inputs)]
            if kind == "embedding":
                dt, out = post(a.port, "/v1/embeddings", {"input": prompts})
                assert len(out["data"]) == a.inputs and out["usage"]["prompt_tokens"] == a.inputs * a.tokens
            else:
                dt, out = post(a.port, "/v1/completions",
                               {"prompt": prompts, "max_tokens": 1, "temperature": 0})
                assert len(out["choices"]) == a.inputs
            times[kind].append(dt)
    tokens = a.inputs * a.tokens
    for kind, v in times.items():
        m = statistics.median(v)
        print(f"{kind}: median {m:.3f} s ({tokens / m:.1f} prompt tok/s)  runs " +
              " ".join(f"{x:.3f}" for x in v))
    print(f"embedding / completion: "
          f"{statistics.median(times['embedding']) / statistics.median(times['completion']):.2f}")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""`chorus router` over two real `chorus serve` replicas (docs/router.md), through the binary.

Checks: completions, chat and embeddings pass through, streamed and not; /v1/models is the union (an adapter
loaded through the router is on both replicas); requests spread over both (least-loaded); a
replica killed with SIGKILL while it streams ends only that stream, with an error event, while
the other replica's streams complete; new requests succeed within one health interval; the
router's /health and /metrics tell it; a restarted replica is readmitted; bad flags are refused.

usage: router_e2e_test.py CHORUS_BINARY
"""
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

CHORUS = sys.argv[1]
HEALTH_MS = 300
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL:", msg, flush=True)


def start(args, log):
    return subprocess.Popen([CHORUS] + args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def wait_port(log, proc, what, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited: {open(log).read()[-2000:]}")
        m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", open(log).read())
        if m:
            port = int(m.group(1))
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return port
            except OSError:
                pass
        time.sleep(0.1)
    raise SystemExit(f"{what} did not become ready: {open(log).read()[-2000:]}")


def request(port, method, path, body=None, timeout=60):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    return r.status, r.read().decode(), dict(r.getheaders())


def stream(port, body, timeout=120):
    """Returns (status, list of SSE data payloads)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    events = []
    buf = b""
    while True:
        try:
            chunk = r.read1(65536) if hasattr(r, "read1") else r.read(1)
        except (http.client.IncompleteRead, ConnectionError) as e:
            events.append(f"<transport error {e}>")
            break
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            for line in ev.decode().split("\n"):
                if line.startswith("data: "):
                    events.append(line[6:])
    return r.status, events


def metric(text, name, labels=""):
    m = re.search(re.escape(name + labels) + r" (\S+)", text)
    return float(m.group(1)) if m else None


tmp = tempfile.mkdtemp(prefix="router_e2e_")
env_home = os.path.join(tmp, "home")
os.makedirs(env_home)
os.environ["HOME"] = env_home
os.environ["CHORUS_CACHE_DIR"] = os.path.join(tmp, "cache")

# Bad flags first: no replica, a bad URL, an unknown policy, a missing cost model.
for args, needle in ((["router"], "--replica"),
                     (["router", "--replica", "localhost:1"], "http://"),
                     (["router", "--replica", "http://127.0.0.1:1", "--policy", "fastest"],
                      "fastest"),
                     (["router", "--replica", "http://127.0.0.1:1", "--policy", "rank-aware",
                       "--cost-model", os.path.join(tmp, "no-such-cost-model.json")],
                      "no-such-cost-model.json"),
                     (["router", "--replica", "http://127.0.0.1:1", "--shed"],
                      "--shed needs --cost-model")):
    p = subprocess.run([CHORUS] + args, capture_output=True, text=True, timeout=30)
    if p.returncode == 0 or needle not in p.stderr:
        fail(f"{args}: rc {p.returncode}, stderr {p.stderr[:300]!r}")

procs = []
try:
    replicas = []
    root = os.path.join(tmp, "adapters")  # both replicas may load adapters from here
    os.makedirs(root)
    for i in range(2):
        log = os.path.join(tmp, f"replica{i}.log")
        p = start(["serve", "--port", "0", "--adapter-root", root, "--threads", "1", "--registry",
                   os.path.join(tmp, f"registry{i}.json")], log)
        procs.append(p)
        replicas.append((p, log, root))
    ports = [wait_port(log, p, f"replica {i}") for i, (p, log, _) in enumerate(replicas)]
    rlog = os.path.join(tmp, "router.log")
    router = start(["router", "--port", "0", "--health-interval-ms", str(HEALTH_MS)] +
                   sum((["--replica", f"http://127.0.0.1:{pt}"] for pt in ports), []), rlog)
    procs.append(router)
    rport = wait_port(rlog, router, "router")

    # Pass-through, not streamed and streamed; chat too.
    st, body, _ = request(rport, "POST", "/v1/completions",
                          {"model": "chorus-default", "prompt": "Once upon a time", "max_tokens": 8,
                           "temperature": 0})
    direct = request(ports[0], "POST", "/v1/completions",
                     {"model": "chorus-default", "prompt": "Once upon a time", "max_tokens": 8,
                      "temperature": 0})[1]
    if st != 200 or json.loads(body)["choices"][0]["text"] != json.loads(direct)["choices"][0]["text"]:
        fail(f"completion through the router: {st} {body[:300]}")
    st, events = stream(rport, {"model": "chorus-default", "prompt": "Hello", "max_tokens": 8})
    if st != 200 or events[-1:] != ["[DONE]"]:
        fail(f"stream through the router: {st} {events[-3:]}")
    st, body, _ = request(rport, "POST", "/v1/chat/completions",
                          {"model": "chorus-default", "messages": [{"role": "user", "content": "Hi"}],
                           "max_tokens": 4})
    if st != 200 or "choices" not in json.loads(body):
        fail(f"chat through the router: {st} {body[:300]}")
    st, body, _ = request(rport, "POST", "/v1/embeddings",
                          {"model": "chorus-default", "input": ["Once upon a time", "Hi"]})
    direct = request(ports[0], "POST", "/v1/embeddings",
                     {"model": "chorus-default", "input": ["Once upon a time", "Hi"]})[1]
    if st != 200 or json.loads(body)["data"] != json.loads(direct)["data"]:
        fail(f"embeddings through the router: {st} {body[:300]}")
    # A bad request: the replica's 400 comes back unchanged.
    st, body, _ = request(rport, "POST", "/v1/completions", {"model": "chorus-default", "max_tokens": -1})
    if st != 400 or "error" not in json.loads(body):
        fail(f"a bad request: {st} {body[:200]}")
    st, body, _ = request(rport, "POST", "/v1/completions", {"model": "nope", "prompt": "x"})
    if st != 404:
        fail(f"unknown model: {st} {body[:200]}")

    # --shed (rank-aware with a cost model): a request every replica is predicted to serve past
    # its TTFT SLO gets 429 with Retry-After and never reaches a replica; one that fits, 200.
    cm = os.path.join(tmp, "cm.json")
    with open(cm, "w") as f:  # 2 ms per step, 20 us per prefill token, 100 us per decode row
        json.dump({"format": "chorus-cost-model", "version": 1, "model": "test", "threads": 1,
                   "loadavg": "0", "use": "linear",
                   "models": [{"kind": "linear", "seconds_per_term": {
                       "1": 0.002, "prefill_tokens": 2e-5, "decode_rows": 1e-4, "sum_ranks": 0,
                       "adapters": 0, "deltas": 0, "context_tokens": 0}}]}, f)
    slog = os.path.join(tmp, "router-shed.log")
    shedder = start(["router", "--port", "0", "--policy", "rank-aware", "--cost-model", cm,
                     "--shed"] + sum((["--replica", f"http://127.0.0.1:{pt}"] for pt in ports), []),
                    slog)
    procs.append(shedder)
    sport = wait_port(slog, shedder, "router --shed")
    def completions_served():  # every replica's /v1/completions answers, any status
        return [sum(float(v) for v in re.findall(
            r'^chorus_http_requests_total\{route="/v1/completions",[^}]*\} (\S+)$',
            request(pt, "GET", "/metrics")[1], re.M)) for pt in ports]
    before = completions_served()
    st, body, hdr = request(sport, "POST", "/v1/completions",
                            {"model": "chorus-default", "prompt": "Once upon a time",
                             "max_tokens": 8, "ttft_slo_ms": 0.5})
    if st != 429 or "Retry-After" not in hdr or "slo_unattainable" not in body:
        fail(f"--shed: an unattainable TTFT SLO gave {st} {hdr} {body[:300]}")
    after = completions_served()
    if before != after:
        fail(f"--shed: the shed request reached a replica ({before} -> {after})")
    st, body, _ = request(sport, "POST", "/v1/completions",
                          {"model": "chorus-default", "prompt": "Once upon a time",
                           "max_tokens": 8, "ttft_slo_ms": 5000, "tpot_slo_ms": 1000})
    if st != 200:
        fail(f"--shed: an attainable request gave {st} {body[:300]}")
    if not re.search(r"^chorus_router_shed_total 1$", request(sport, "GET", "/metrics")[1], re.M):
        fail("--shed: chorus_router_shed_total is not 1")
    shedder.terminate()
    shedder.wait(timeout=30)

    # An adapter loaded through the router lands on both replicas; /v1/models is the union.
    p = subprocess.run([CHORUS, "convert", "--shape", "tiny", "--lora-count", "1", "--lora-ranks",
                        "8", "--output", os.path.join(root, "set")],
                       capture_output=True, text=True, timeout=120)
    lora = os.path.join(root, "set", "lora-0")
    if p.returncode != 0:
        fail(f"convert --lora-count: {p.stderr[-300:]}")
    else:
        st, body, _ = request(rport, "POST", "/v1/load_lora_adapter",
                              {"lora_name": "ad", "lora_path": lora})
        if st != 200:
            fail(f"load through the router: {st} {body[:300]}")
        for pt in ports:
            ids = [m["id"] for m in json.loads(request(pt, "GET", "/v1/models")[1])["data"]]
            if "ad" not in ids:
                fail(f"replica {pt} lacks the adapter loaded through the router: {ids}")
        ids = [m["id"] for m in json.loads(request(rport, "GET", "/v1/models")[1])["data"]]
        if sorted(ids) != ["ad", "chorus-default"]:
            fail(f"router /v1/models: {ids}")

    # Spread: concurrent requests reach both replicas (least-loaded).
    def one():
        request(rport, "POST", "/v1/completions",
                {"model": "chorus-default", "prompt": "Once", "max_tokens": 16})
    ts = [threading.Thread(target=one) for _ in range(8)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    m = request(rport, "GET", "/metrics")[1]
    per = [metric(m, "chorus_router_requests_total", f'{{replica="http://127.0.0.1:{pt}"}}')
           for pt in ports]
    if None in per or min(per) < 2:
        fail(f"requests per replica: {per}")

    # Kill replica 0 with SIGKILL while both stream: only its streams end, with an error event.
    results = []
    def long_stream(i):
        results.append(stream(rport, {"model": "chorus-default", "prompt": f"Story {i}",
                                      "max_tokens": 1000, "ignore_eos": True}))
    ts = [threading.Thread(target=long_stream, args=(i,)) for i in range(4)]
    [t.start() for t in ts]
    # Kill once both replicas have streams in flight.
    deadline = time.time() + 20
    while time.time() < deadline:
        in_flight = [metric(request(rport, "GET", "/metrics")[1], "chorus_router_in_flight",
                            f'{{replica="http://127.0.0.1:{pt}"}}') for pt in ports]
        if all(in_flight):
            break
        time.sleep(0.05)
    in_flight = [metric(request(rport, "GET", "/metrics")[1], "chorus_router_in_flight",
                        f'{{replica="http://127.0.0.1:{pt}"}}') for pt in ports]
    replicas[0][0].send_signal(signal.SIGKILL)
    killed_at = time.time()
    [t.join() for t in ts]
    errored = [ev for st, ev in results if any('"replica_failed"' in e for e in ev)]
    completed = [ev for st, ev in results if ev[-1:] == ["[DONE]"]]
    print(f"kill -9 under load: in flight {in_flight}, {len(errored)} streams ended with an error "
          f"event, {len(completed)} completed", flush=True)
    if not all(in_flight):
        fail(f"streams were not in flight on both replicas at the kill: {in_flight}")
    if in_flight[0] and not errored:
        fail(f"no stream of the killed replica ended with an error event: {[e[-2:] for _, e in results]}")
    if len(errored) + len(completed) != len(results):
        fail(f"streams neither completed nor ended with an error event: {[e[-2:] for _, e in results]}")
    if in_flight[1] and not completed:
        fail("the surviving replica's streams did not complete")
    # New requests succeed within one health interval of the kill (and at once: a failed
    # connection is retried on the other replica).
    time.sleep(max(0.0, HEALTH_MS / 1000 - (time.time() - killed_at)))
    for _ in range(4):
        st, body, _ = request(rport, "POST", "/v1/completions",
                              {"model": "chorus-default", "prompt": "After", "max_tokens": 4})
        if st != 200:
            fail(f"a request after the kill: {st} {body[:200]}")
    st, body, _ = request(rport, "GET", "/health")
    if st != 200 or json.loads(body).get("healthy_replicas") != 1:
        fail(f"router health after the kill: {st} {body}")
    m = request(rport, "GET", "/metrics")[1]
    if metric(m, "chorus_router_replica_healthy", f'{{replica="http://127.0.0.1:{ports[0]}"}}') != 0:
        fail("the killed replica is still admitted")

    # The replica comes back on the same port: readmitted by the health checks.
    log = os.path.join(tmp, "replica0b.log")
    p = start(["serve", "--port", str(ports[0]), "--adapter-root", replicas[0][2], "--threads",
               "1", "--registry", os.path.join(tmp, "registry0.json")], log)
    procs.append(p)
    wait_port(log, p, "restarted replica")
    time.sleep(3 * HEALTH_MS / 1000)
    st, body, _ = request(rport, "GET", "/health")
    if json.loads(body).get("healthy_replicas") != 2:
        fail(f"restarted replica not readmitted: {body}")
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()

if failures:
    print(f"router e2e: {len(failures)} failures", flush=True)
    sys.exit(1)
shutil.rmtree(tmp, ignore_errors=True)  # kept when a check fails, for its logs
print("router e2e: all checks passed")

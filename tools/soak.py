#!/usr/bin/env python3
"""Soak test of `chorus serve` under mixed load with churn (docs/hardening.md, "Soak").

Starts a real server (or attaches to one with --attach), registers --adapters synthetic LoRA
adapters of mixed ranks and --deltas full fine-tunes served as compressed deltas (made here from
the server's base by `chorus convert --finetune-delta` and `chorus compress`: rtn 4-bit 2:4,
rtn 2-bit 2:4, rtn 8-bit and BitDelta signs, round-robin) through the API, and for --duration
seconds runs:

* --concurrency client processes (threads with --client-threads) sending valid requests: the
  base model or an adapter, completions or chat, streamed or not, n of 1-3, stop strings,
  shared prompt prefixes, and clients that hang up mid-stream or while waiting for a
  non-streamed answer;
* a churn thread unloading, loading back and replacing variants (another rank's files, or a
  file of the other kind: a LoRA name replaced by a delta and back);
* a thread rewriting the --tenants file and sending SIGHUP (a second tenant's limits change,
  and a small client of that tenant meets its limits: 429 with Retry-After);
* a sampler reading the server's VmRSS (/proc/PID/status) and /metrics every --sample seconds.

At the end it waits for idle (0 running, 0 waiting, 0 KV blocks in use), checks that the KV pages
left in the pool are exactly the prefix cache's, unloads every adapter and checks that the
adapter pages, resident copies and host-cache entries (LoRA and delta copies) go back to 0.

Reported per --window: requests, answers by status, client hang-ups, p50/p99 TTFT (streamed)
and total latency (finished 200s), RSS, and what the engine's steps cost per row computed in the
window (from its own /metrics counters: the same work at the host's speed of the moment; the
summary gives its correlation with the windows' p50 and p99 latency). Summary: RSS growth
after warm-up (the first --warmup windows: max RSS afterwards over the RSS at the end of
warm-up), the p99 spread across the full windows after warm-up, leaked pages, 5xx count. With --out, requests.csv lists every
finished request (model, route, stream, n, max_tokens, TTFT, latency), to see what a window's
tail is made of, and events.csv every churn call and SIGHUP (start, op, name, seconds), to see
whether the tail follows them.

Exit 1 when a bar fails: any 5xx or error event in a stream, an unexpected status, the server
dead or not idle at the end, a leaked page, RSS growth above --rss-bar (2 %), and — unless
--no-latency-bar — a post-warm-up window whose p99 latency is more than 20 % from the median
window's p99.

usage: tools/soak.py --chorus build/release/apps/chorus/chorus [--duration 3600] [--window 60]
       [--concurrency 6] [--adapters 100] [--deltas 8] [--out DIR] [--plot]
"""

import argparse
import atexit
import http.client
import json
import multiprocessing
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

KEY = "sk-soak-load"
AUX_KEYS = ["sk-aux-main"]
WORDS = ("the of and a to in is you that it he was for on are as with his they I at be this have "
         "from or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could people "
         "my than first water been call who oil its now find long down day did get come made may "
         "part river city stone cloud").split()
SYSTEM = ("You are a careful assistant. Answer briefly and precisely, and cite the passage "
          "you rely on. Keep a neutral tone. ") * 3


def metric(text, name, labels=None):
    pat = r"^%s%s ([0-9.eE+-]+)$" % (re.escape(name),
                                      r"\{" + re.escape(labels) + r"\}" if labels else r"(?:\{[^}]*\})?")
    m = re.search(pat, text, re.M)
    return float(m.group(1)) if m else None


def pct(xs, q):
    if not xs:
        return None
    s = sorted(xs)
    k = min(len(s) - 1, max(0, int(round(q / 100.0 * (len(s) - 1)))))
    return s[k]


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def child_of(ppid):
    """The `chorus serve` child of `ppid` (the server under a --wrap profiler), or None."""
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open("/proc/%s/stat" % d) as f:
                    if int(f.read().rpartition(")")[2].split()[1]) != ppid:
                        continue
                with open("/proc/%s/cmdline" % d, "rb") as f:
                    if b"\0serve\0" in f.read():
                        return int(d)
            except (OSError, ValueError, IndexError):
                pass
    return None


def tenants_json(generation):
    """Tenant "soak" (the load, no limits) and "aux", whose limits and keys change each reload."""
    aux = {"keys": AUX_KEYS + (["sk-aux-gen-%d" % generation] if generation % 2 else []),
           "max_concurrent": 1 + generation % 3, "tokens_per_second": 200 + 100 * (generation % 4)}
    return json.dumps({"tenants": {"soak": {"keys": [KEY]}, "aux": aux}})


def launch_server(cmd, env, log_path, timeout):
    """Starts `chorus serve` (`cmd`) with its output in `log_path` and waits until the log names
    its port. Returns (process, log file, port, deadline) — the deadline for wait_healthy()."""
    log = open(log_path, "wb")
    # Its own session: a Ctrl-C at the terminal ends the load early (Soak.run) but leaves the
    # server to the final checks; atexit stops it if this script dies first.
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    atexit.register(lambda: proc.poll() is None and proc.kill())
    deadline = time.time() + timeout
    while time.time() < deadline:
        time.sleep(0.1)
        with open(log_path, "rb") as f:
            m = re.search(rb"http://127\.0\.0\.1:(\d+)", f.read())
        if m:
            return proc, log, int(m.group(1)), deadline
        if proc.poll() is not None:
            raise RuntimeError("server exited at start; see " + log_path)
    raise RuntimeError("server named no port within %d s; see %s" % (timeout, log_path))


DELTA_METHODS = (["--method", "rtn", "--bits", "4", "--sparsity", "2:4"],
                 ["--method", "rtn", "--bits", "2", "--sparsity", "2:4"],
                 ["--method", "rtn", "--bits", "8", "--sparsity", "none"],
                 ["--method", "bitdelta", "--distill-steps", "0"])


def make_deltas(a, env, work, count, base=""):
    """Writes min(count, 4) delta directories for the served base under work/deltas, each from
    its own synthetic full fine-tune (convert --finetune-delta with another seed) compressed by
    another method (DELTA_METHODS); returns their paths. The base is the server's own model
    file: the embedded default model's, as `chorus inspect` names it under the same cache
    directory, unless given (--delta-base, with --attach)."""
    if count <= 0:
        return []
    if not base:
        out = subprocess.run([a.chorus, "inspect"], env=env, check=True, capture_output=True,
                             text=True).stdout
        m = re.search(r"^source:\s*(\S+)", out, re.M)
        if not m:
            raise RuntimeError("chorus inspect named no source model:\n" + out)
        base = m.group(1)
    root = os.path.join(work, "deltas")
    os.makedirs(root, exist_ok=True)
    dirs = []
    def chorus(args):  # a failure names the command and carries chorus's own message
        r = subprocess.run([a.chorus] + args, env=env, capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError("chorus %s: %s" % (" ".join(args), r.stderr.strip()))

    for i in range(min(count, len(DELTA_METHODS))):
        ft = os.path.join(root, "ft-%d.gguf" % i)
        chorus(["convert", "--model", base, "--finetune-delta", "0.02:0.06", "--seed",
                str(101 + i), "--output", ft])
        d = os.path.join(root, "delta-%d" % i)
        chorus(["compress", "--base", base, "--finetuned", ft, "--output", d] + DELTA_METHODS[i])
        os.remove(ft)  # the fine-tune itself is not served
        dirs.append(d)
    return dirs


def local_get(port, path, timeout=30):
    """GET `path` from a server on 127.0.0.1:`port` without credentials: (status, body text)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request("GET", path)
        r = c.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        c.close()


def wait_healthy(get, deadline, log_path):
    """Polls GET /health through `get(path) -> (status, body)` until 200 or the deadline."""
    while time.time() < deadline:
        try:
            if get("/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server not healthy in time; see " + log_path)


class Server:
    """A `chorus serve` started here (or attached to with --attach HOST:PORT --pid PID)."""

    def __init__(self, a, work):
        self.work = work
        self.proc = None
        self.tenants_path = os.path.join(work, "tenants.json")
        env = dict(os.environ, CHORUS_CACHE_DIR=os.path.join(work, "cache"),
                   HOME=os.path.join(work, "home"))
        os.makedirs(env["HOME"], exist_ok=True)
        self.adapter_dir = os.path.join(work, "adapters")
        subprocess.run([a.chorus, "convert", "--shape", "tiny", "--lora-count", str(a.adapters),
                        "--lora-ranks", a.ranks, "--output", self.adapter_dir], check=True,
                       env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if a.attach:
            host, _, port = a.attach.rpartition(":")
            self.host, self.port, self.pid = host or "127.0.0.1", int(port), a.pid
            self.tenants_path = a.tenants_file
            self.delta_dirs = make_deltas(a, env, work, a.deltas, base=a.delta_base)
            return
        with open(self.tenants_path, "w") as f:
            f.write(tenants_json(0))
        self.log_path = os.path.join(work, "serve.log")
        cmd = [a.chorus, "serve", "--port", "0", "--host", "127.0.0.1", "--served-model-name",
               "base", "--adapter-root", work, "--registry", os.path.join(work, "registry.json"),
               "--tenants", self.tenants_path, "--max-running", str(a.max_running),
               "--max-queue", str(a.max_queue), "--threads", str(a.threads), "--pool-size",
               str(a.pool_mib), "--host-cache-size", str(a.host_cache_mib), "--drain-timeout", "5"]
        if a.prefault:
            cmd.append("--prefault")
        cmd += a.serve_arg
        self.cmd = cmd
        if a.wrap:  # e.g. "heaptrack -o FILE": the server runs under a memory profiler
            cmd = a.wrap.split() + cmd
        self.proc, self.log, self.port, deadline = launch_server(cmd, env, self.log_path, 300)
        self.host, self.pid = "127.0.0.1", self.proc.pid
        if a.wrap:  # the profiler's script is the parent: signals and RSS go to the server
            self.pid = child_of(self.proc.pid) or self.pid
        wait_healthy(self.get, deadline, self.log_path)
        self.delta_dirs = make_deltas(a, env, work, a.deltas)

    def alive(self):
        if self.proc is not None:
            return self.proc.poll() is None
        return rss_kib(self.pid) is not None

    def conn(self, timeout=120):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def get(self, path, key=KEY):
        c = self.conn(30)
        try:
            c.request("GET", path, headers={"Authorization": "Bearer " + key})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace")
        finally:
            c.close()

    def post(self, path, body, key=KEY, timeout=120):
        c = self.conn(timeout)
        try:
            c.request("POST", path, body=json.dumps(body),
                      headers={"Content-Type": "application/json", "Authorization": "Bearer " + key})
            r = c.getresponse()
            return r.status, r.read().decode("utf-8", "replace"), r.getheader("Retry-After")
        finally:
            c.close()

    def metrics(self):
        st, text = self.get("/metrics")
        return text if st == 200 else ""

    def stop(self):
        if self.proc is None:
            return None
        os.kill(self.pid, signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.log.close()
        return rc


class Soak:
    def __init__(self, a, srv):
        self.a = a
        self.srv = srv
        self.lock = threading.Lock()
        self.stop = multiprocessing.Event()  # seen by client threads and client processes
        self.records = []  # (t_end, kind, status, ttft, latency)
        self.details = []  # per finished request: (t_end, model, path, stream, n, max_tokens, ...)
        self.sink = None   # in a client process: a queue to the parent instead of the lists
        self.failures = []
        self.samples = []  # dicts
        self.names = ["lora-%02d" % i if a.adapters <= 100 else "lora-%03d" % i
                      for i in range(a.adapters)]
        lora_paths = [os.path.join(srv.adapter_dir, d) for d in sorted(os.listdir(srv.adapter_dir))]
        # Variant i is registered from paths[i]: LoRA adapters, then the deltas (their files
        # round-robin); churn loads and replaces from any of the files, of either kind.
        self.paths = lora_paths[:a.adapters]
        for j in range(a.deltas if srv.delta_dirs else 0):
            self.names.append("delta-%02d" % j)
            self.paths.append(srv.delta_dirs[j % len(srv.delta_dirs)])
        self.all_files = lora_paths + list(srv.delta_dirs)
        self.delta_files = set(srv.delta_dirs)
        self.kind_changes = 0  # churn replaces that changed a name's kind (LoRA <-> delta)
        self.path_of = dict(zip(self.names, self.paths))
        self.loaded = set()
        # Which adapters are loaded, shared with client processes (the churn thread writes it).
        self.loaded_flags = multiprocessing.Array("b", len(self.names), lock=False)
        self.churn_ops = {"unload": 0, "load": 0, "replace": 0}
        self.events = []  # (t_start_s, op, name, seconds): churn calls and SIGHUPs, for events.csv
        self.sighups = 0
        self.aux = {}
        self.t0 = None

    def add(self, kind, x):
        """Appends x to the records, details or failures — through the queue to the parent when
        this is a client process."""
        if self.sink is not None:
            self.sink.put((kind, x))
            return
        with self.lock:
            {"record": self.records, "detail": self.details, "fail": self.failures}[kind].append(x)

    def fail(self, msg):
        self.add("fail", msg)

    def set_loaded(self, name, on):
        with self.lock:
            (self.loaded.add if on else self.loaded.discard)(name)
            self.loaded_flags[self.names.index(name)] = 1 if on else 0

    def loaded_names(self):
        if self.sink is not None:  # a client process: the parent's flags
            return [n for n, f in zip(self.names, self.loaded_flags) if f]
        with self.lock:
            return sorted(self.loaded)

    # -- setup ----------------------------------------------------------------------------
    def register_all(self):
        for i, name in enumerate(self.names):
            st, body, _ = self.srv.post("/v1/load_lora_adapter", {
                "lora_name": name, "lora_path": self.paths[i], "replace": True})
            if st != 200:
                raise RuntimeError("registering %s: %d %s" % (name, st, body[:200]))
            self.set_loaded(name, True)

    # -- load -----------------------------------------------------------------------------
    def body(self, rng):
        loaded = self.loaded_names()
        model = "base" if rng.random() < self.a.base_share or not loaded else rng.choice(loaded)
        chat = rng.random() < 0.5
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randrange(3, 60)))
        shared = rng.random() < 0.4  # a common prefix: the prefix cache shares its blocks
        b = {"model": model, "max_tokens": rng.randrange(4, 49), "n": rng.choice([1, 1, 1, 2, 3]),
             "temperature": rng.choice([0, 0.7, 1.0]), "seed": rng.randrange(1 << 30)}
        if chat:
            msgs = [{"role": "user", "content": words}]
            if shared:
                msgs.insert(0, {"role": "system", "content": SYSTEM})
            b["messages"] = msgs
        else:
            b["prompt"] = (SYSTEM + words) if shared else words
        if rng.random() < 0.25:
            b["stop"] = rng.choice(["\n", [".", " the"], ["and", "x", "!"]])
        stream = rng.random() < 0.5
        if stream:
            b["stream"] = True
            if rng.random() < 0.5:
                b["stream_options"] = {"include_usage": True}
        return ("/v1/chat/completions" if chat else "/v1/completions"), b, stream

    def one(self, rng):
        path, body, stream = self.body(rng)
        hang = rng.random() < (0.08 if stream else 0.03) * self.a.hangup_share
        kind = ("base" if body["model"] == "base" else "adapter") + ("-stream" if stream else "")
        t0 = time.monotonic()
        ttft = None
        c = self.srv.conn(self.a.request_timeout)
        status = None
        try:
            c.request("POST", path, body=json.dumps(body),
                      headers={"Content-Type": "application/json", "Authorization": "Bearer " + KEY})
            if hang and not stream:
                time.sleep(rng.uniform(0.0, 0.3))
                c.sock.shutdown(2)
                self.record(t0, kind, "hung-up", None, None)
                return
            r = c.getresponse()
            status = r.status
            if status == 200 and stream:
                events = 0
                stop_after = rng.randrange(1, 6) if hang else None
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
                        self.fail("%s %s: error event in the stream: %s" % (path, body["model"],
                                                                            data[:300]))
                        break
                    ch = ev.get("choices") or []
                    if ttft is None and any((x.get("text") or (x.get("delta") or {}).get("content"))
                                            for x in ch):
                        ttft = time.monotonic() - t0
                    events += 1
                    if stop_after is not None and events >= stop_after:
                        c.sock.shutdown(2)
                        self.record(t0, kind, "hung-up", ttft, None)
                        return
                if not done:
                    self.fail("%s %s: stream ended without [DONE]" % (path, body["model"]))
                    self.record(t0, kind, "broken", ttft, None)
                    return
            else:
                data = r.read()
                if status == 200:
                    j = json.loads(data)
                    if len(j.get("choices", [])) != body["n"]:
                        self.fail("%s: %d choices for n=%d" % (path, len(j["choices"]), body["n"]))
                elif status == 404 and b"model_not_found" in data and body["model"] != "base":
                    pass  # the churn thread unloaded the adapter meanwhile
                elif status == 429 and r.getheader("Retry-After"):
                    pass  # the bounded queue
                else:
                    self.fail("%s %s: %d %r" % (path, body["model"], status, data[:300]))
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.fail("%s %s: %r (status %r)" % (path, body["model"], e, status))
            self.record(t0, kind, "broken", ttft, None)
            return
        finally:
            c.close()
        latency = time.monotonic() - t0 if status == 200 else None
        self.record(t0, kind, status, ttft, latency)
        if latency is not None:
            self.add("detail", (round(time.monotonic() - self.t0, 3), body["model"], path,
                                int(stream), body["n"], body["max_tokens"],
                                round(ttft * 1000, 2) if ttft else "", round(latency * 1000, 2)))

    def record(self, t0, kind, status, ttft, latency):
        self.add("record", (time.monotonic() - self.t0, kind, status, ttft, latency))

    def worker(self, i):
        rng = random.Random(self.a.seed * 1000 + i)
        while not self.stop.is_set():
            self.one(rng)
            time.sleep(rng.uniform(0, self.a.think))

    def worker_process(self, i, sink):
        # A client process: its own interpreter, so the clients' latencies do not include
        # waiting for one another's Python (the GIL hands over every 5 ms). A Ctrl-C is the
        # parent's to handle: it sets self.stop.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        self.sink = sink
        self.worker(i)

    def drain(self, sink):
        while True:
            kind, x = sink.get()
            if kind == "end":
                return
            self.add(kind, x)  # this thread's sink is None: straight into the lists

    # -- churn ----------------------------------------------------------------------------
    def churn(self):
        rng = random.Random(self.a.seed * 7 + 1)
        keep = max(1, int(len(self.names) * 0.8))
        while not self.stop.wait(rng.uniform(0.5, 1.5) * self.a.churn_interval):
            with self.lock:
                loaded = sorted(self.loaded)
                unloaded = sorted(set(self.names) - self.loaded)
            k = rng.random()
            t_start = time.monotonic()
            if (k < 0.4 and len(loaded) > keep) or not unloaded and k < 0.6:
                name = rng.choice(loaded)
                self.set_loaded(name, False)  # workers stop picking it before it goes
                st, body, _ = self.srv.post("/v1/unload_lora_adapter", {"lora_name": name})
                op = "unload"
            elif k < 0.7 and unloaded:
                name = rng.choice(unloaded)
                path = rng.choice(self.all_files)
                st, body, _ = self.srv.post("/v1/load_lora_adapter", {
                    "lora_name": name, "lora_path": path})
                op = "load"
                if st == 200:
                    self.set_loaded(name, True)
                    self.path_of[name] = path
            else:
                # Another variant's files: another rank most often, sometimes the other kind.
                name = rng.choice(loaded)
                path = rng.choice(self.all_files)
                st, body, _ = self.srv.post("/v1/load_lora_adapter", {
                    "lora_name": name, "replace": True, "lora_path": path})
                op = "replace"
                if st == 200:
                    if (path in self.delta_files) != (self.path_of.get(name) in self.delta_files):
                        self.kind_changes += 1
                    self.path_of[name] = path
            self.churn_ops[op] += 1
            with self.lock:
                self.events.append((round(t_start - self.t0, 3), op, name,
                                    round(time.monotonic() - t_start, 4)))
            if st != 200:
                self.fail("churn %s %s: %d %s" % (op, name, st, body[:200]))

    # -- SIGHUP: the tenants file again ---------------------------------------------------
    def sighup(self):
        gen = 0
        while not self.stop.wait(self.a.sighup_interval):
            gen += 1
            tmp = self.srv.tenants_path + ".tmp"
            with open(tmp, "w") as f:
                f.write(tenants_json(gen))
            os.replace(tmp, self.srv.tenants_path)
            os.kill(self.srv.pid, signal.SIGHUP)
            self.sighups += 1
            with self.lock:
                self.events.append((round(time.monotonic() - self.t0, 3), "sighup", gen, 0))

    def aux_client(self, i):
        """The limited tenant: small requests back to back; 200 or 429 with Retry-After."""
        rng = random.Random(self.a.seed * 13 + i)
        while not self.stop.wait(rng.uniform(0.05, 0.3)):
            try:
                st, body, ra = self.srv.post("/v1/completions", {
                    "model": "base", "prompt": "aux " + rng.choice(WORDS), "max_tokens": 4},
                    key=AUX_KEYS[0], timeout=self.a.request_timeout)
            except (OSError, http.client.HTTPException) as e:
                self.fail("aux tenant: %r" % e)
                continue
            with self.lock:
                self.aux[st] = self.aux.get(st, 0) + 1
            if st == 429 and not ra:
                self.fail("aux tenant: 429 without Retry-After")
            elif st not in (200, 429):
                self.fail("aux tenant: %d %s" % (st, body[:200]))
            with self.lock:
                self.records.append((time.monotonic() - self.t0, "aux", st, None, None))

    # -- sampling -------------------------------------------------------------------------
    def sample(self):
        try:
            text = self.srv.metrics()
        except (OSError, http.client.HTTPException):
            text = ""
        s = {"t": round(time.monotonic() - self.t0, 2), "rss_kib": rss_kib(self.srv.pid)}
        for k, name, labels in [
                ("running", "chorus_running_sequences", None),
                ("waiting", "chorus_queue_length", None),
                ("kv_used", "chorus_kv_blocks_used", None),
                ("kv_pages", "chorus_pool_pages", 'kind="kv"'),
                ("adapter_pages", "chorus_pool_pages", 'kind="adapter"'),
                ("free_pages", "chorus_pool_pages", 'kind="free"'),
                ("prefix_blocks", "chorus_prefix_cache_blocks", None),
                ("resident", "chorus_adapters_resident", None),
                ("registered", "chorus_adapters_registered", None),
                ("host_entries", "chorus_adapter_host_cache_entries", None),
                ("host_bytes", "chorus_adapter_host_cache_bytes", None),
                # The engine's own clock: what its steps cost per row, per window (window()).
                ("step_s", "chorus_step_seconds_sum", None),
                ("steps", "chorus_step_seconds_count", None),
                ("gen_tokens", "chorus_generation_tokens_total", None),
                ("prompt_tokens", "chorus_prompt_tokens_total", None)]:
            s[k] = metric(text, name, labels)
        return s

    def sampler(self, out_csv):
        cols = None
        while True:
            s = self.sample()
            with self.lock:
                self.samples.append(s)
            if out_csv:
                if cols is None:
                    cols = list(s)
                    out_csv.write(",".join(cols) + "\n")
                out_csv.write(",".join("" if s[c] is None else str(s[c]) for c in cols) + "\n")
                out_csv.flush()
            if self.stop.wait(self.a.sample):
                return

    # -- the end --------------------------------------------------------------------------
    def wait_for(self, pred, seconds):
        deadline = time.time() + seconds
        s = self.sample()
        while not pred(s) and time.time() < deadline:
            time.sleep(0.5)
            s = self.sample()
        return pred(s), s

    def final_checks(self):
        out = {}
        idle, s = self.wait_for(lambda s: s["running"] == 0 and s["waiting"] == 0 and
                                s["kv_used"] == 0, 60)
        out["idle_after_load"] = {k: s[k] for k in ("running", "waiting", "kv_used")}
        if not idle:
            self.fail("not idle 60 s after the load: %r" % out["idle_after_load"])
        # KV pages still held once nothing runs must all be the prefix cache's.
        leaked_kv = (s["kv_pages"] or 0) - (s["prefix_blocks"] or 0)
        out["kv_pages_held_idle"] = s["kv_pages"]
        out["prefix_cache_blocks_idle"] = s["prefix_blocks"]
        out["adapter_pages_idle"] = s["adapter_pages"]
        out["resident_idle"] = s["resident"]
        # Every adapter unloaded: pool copies, resident count, host copies back to 0.
        with self.lock:
            names = sorted(self.loaded)
        for name in names:
            st, body, _ = self.srv.post("/v1/unload_lora_adapter", {"lora_name": name})
            if st != 200:
                self.fail("final unload %s: %d %s" % (name, st, body[:200]))
        with self.lock:
            self.loaded.clear()
        ok, s = self.wait_for(lambda s: s["adapter_pages"] == 0 and s["resident"] == 0 and
                              s["host_entries"] == 0 and s["registered"] == 0, 30)
        out["after_unload_all"] = {k: s[k] for k in ("adapter_pages", "resident", "host_entries",
                                                      "host_bytes", "registered", "kv_pages",
                                                      "prefix_blocks", "kv_used")}
        leaked_adapter = int((s["adapter_pages"] or 0))
        if not ok:
            self.fail("adapter state not back to 0 after unloading every adapter: %r" %
                      out["after_unload_all"])
        leaked_kv = max(leaked_kv, (s["kv_pages"] or 0) - (s["prefix_blocks"] or 0))
        out["leaked_kv_pages"] = int(leaked_kv)
        out["leaked_adapter_pages"] = leaked_adapter
        if leaked_kv != 0:
            self.fail("%d KV pages held at idle beyond the prefix cache's" % leaked_kv)
        # Still serving afterwards.
        st, body, _ = self.srv.post("/v1/completions", {"model": "base", "prompt": "after",
                                                         "max_tokens": 4})
        if st != 200:
            self.fail("after the soak a base request got %d %s" % (st, body[:200]))
        return out

    def run(self):
        a = self.a
        self.t0 = time.monotonic()
        out_csv = open(os.path.join(a.out, "samples.csv"), "w") if a.out else None
        procs, threads = [], []
        if a.client_threads:
            threads = [threading.Thread(target=self.worker, args=(i,))
                       for i in range(a.concurrency)]
        else:
            # Forked before any thread of this process starts.
            ctx = multiprocessing.get_context("fork")
            sink = ctx.Queue()
            procs = [ctx.Process(target=self.worker_process, args=(i, sink))
                     for i in range(a.concurrency)]
            for p in procs:
                p.start()
            drainer = threading.Thread(target=self.drain, args=(sink,))
            drainer.start()
        if not a.no_churn:
            threads.append(threading.Thread(target=self.churn))
        if self.srv.tenants_path and not a.no_sighup:
            threads.append(threading.Thread(target=self.sighup))
            # Three clients of the limited tenant, so that its max_concurrent (1-3) is met.
            threads += [threading.Thread(target=self.aux_client, args=(i,)) for i in range(3)]
        sampler = threading.Thread(target=self.sampler, args=(out_csv,))
        sampler.start()
        for t in threads:
            t.start()
        next_report = a.window
        interrupted = []
        signal.signal(signal.SIGINT, lambda *_: interrupted.append(True))
        while time.monotonic() - self.t0 < a.duration:
            time.sleep(1)
            if interrupted:
                print("soak: interrupted — ending the load now and reporting what ran", flush=True)
                break
            if not self.srv.alive():
                self.fail("the server died")
                break
            if time.monotonic() - self.t0 >= next_report:
                w = int(next_report // a.window) - 1
                print(self.window_line(self.window(w)), flush=True)
                next_report += a.window
        self.load_seconds = time.monotonic() - self.t0
        self.stop.set()
        for t in threads:
            t.join()
        for p in procs:
            p.join()
        if procs:
            sink.put(("end", None))
            drainer.join()
        sampler.join()
        if out_csv:
            out_csv.close()

    # -- report ---------------------------------------------------------------------------
    def window(self, w):
        a = self.a
        lo, hi = w * a.window, (w + 1) * a.window
        rec = [r for r in self.records if lo <= r[0] < hi and r[1] != "aux"]
        by = {}
        for r in rec:
            by[str(r[2])] = by.get(str(r[2]), 0) + 1
        ttft = [r[3] for r in rec if r[3] is not None and r[2] == 200]
        lat = [r[4] for r in rec if r[4] is not None]
        rss = [s["rss_kib"] for s in self.samples if lo <= s["t"] < hi and s["rss_kib"]]
        # The engine's step time per row computed (prompt and generated tokens) over the window,
        # from its own counters: the same work at the host's speed of the moment. A window whose
        # latency rose with it slowed because the machine did, not the server's scheduling.
        eng = [s for s in self.samples if lo <= s["t"] < hi and s.get("step_s") is not None
               and s.get("gen_tokens") is not None and s.get("prompt_tokens") is not None]
        step_us_per_row = rows_per_step = None
        if len(eng) >= 2:
            rows = (eng[-1]["gen_tokens"] + eng[-1]["prompt_tokens"] -
                    eng[0]["gen_tokens"] - eng[0]["prompt_tokens"])
            steps = eng[-1]["steps"] - eng[0]["steps"]
            if rows > 0 and steps > 0:
                step_us_per_row = round((eng[-1]["step_s"] - eng[0]["step_s"]) / rows * 1e6, 1)
                rows_per_step = round(rows / steps, 2)
        return {"window": w, "start_s": lo, "requests": len(rec), "by_status": by,
                "ttft_p50_ms": ms(pct(ttft, 50)), "ttft_p99_ms": ms(pct(ttft, 99)),
                "latency_p50_ms": ms(pct(lat, 50)), "latency_p99_ms": ms(pct(lat, 99)),
                "rss_mib": round(max(rss) / 1024, 1) if rss else None,
                "step_us_per_row": step_us_per_row, "rows_per_step": rows_per_step}

    @staticmethod
    def window_line(w):
        return ("window %3d  %5d req  %-44s ttft p50/p99 %6s/%6s ms  latency p50/p99 %6s/%6s ms  "
                "rss %s MiB  step %s us/row (%s rows/step)" % (
                    w["window"], w["requests"], json.dumps(w["by_status"]), w["ttft_p50_ms"],
                    w["ttft_p99_ms"], w["latency_p50_ms"], w["latency_p99_ms"], w["rss_mib"],
                    w["step_us_per_row"], w["rows_per_step"]))

    def report(self, final):
        a = self.a
        n_windows = int(self.load_seconds // a.window)  # full windows only
        windows = [self.window(w) for w in range(n_windows)]
        warm_end = a.warmup * a.window
        after = [s for s in self.samples if s["t"] >= warm_end and s["rss_kib"] and
                 s["t"] <= self.load_seconds]
        rss_ref = after[0]["rss_kib"] if after else None
        rss_max = max(s["rss_kib"] for s in after) if after else None
        rss_end = after[-1]["rss_kib"] if after else None
        growth = (rss_max - rss_ref) / rss_ref if rss_ref else None
        steady = [w for w in windows if w["window"] >= a.warmup and w["latency_p99_ms"]]
        p99 = [w["latency_p99_ms"] for w in steady]
        t99 = [w["ttft_p99_ms"] for w in steady if w["ttft_p99_ms"]]
        med = statistics.median(p99) if p99 else None
        spread = max(abs(x / med - 1) for x in p99) if p99 else None
        all_by = {}
        for r in self.records:
            if r[1] != "aux":
                all_by[str(r[2])] = all_by.get(str(r[2]), 0) + 1
        five = sum(v for k, v in all_by.items() if k.isdigit() and int(k) >= 500)
        five += sum(v for k, v in self.aux.items() if k >= 500)
        summary = {
            "duration_s": round(self.load_seconds, 1), "window_s": a.window,
            "warmup_windows": a.warmup, "concurrency": a.concurrency, "adapters": a.adapters,
            "deltas": len(self.names) - a.adapters, "delta_files": len(self.delta_files),
            "churn_kind_changes": self.kind_changes,
            "requests": sum(all_by.values()), "by_status": all_by, "status_5xx": five,
            "aux_tenant_by_status": {str(k): v for k, v in sorted(self.aux.items())},
            "churn_ops": self.churn_ops, "sighups": self.sighups,
            "rss_mib_at_warmup_end": kib_mib(rss_ref), "rss_mib_max_after_warmup": kib_mib(rss_max),
            "rss_mib_end": kib_mib(rss_end),
            "rss_growth_after_warmup_pct": round(growth * 100, 2) if growth is not None else None,
            "latency_p99_ms_windows_median": med,
            "latency_p99_max_over_min": round(max(p99) / min(p99), 3) if p99 else None,
            "latency_p99_max_deviation_from_median_pct": round(spread * 100, 1) if p99 else None,
            "ttft_p99_max_over_min": round(max(t99) / min(t99), 3) if t99 else None,
            "failures": len(self.failures), "loadavg": open("/proc/loadavg").read().split()[:3],
        }
        # Does a window's latency follow what the engine's steps cost per row in it (the host's
        # speed of the moment)? Pearson r over the windows after warm-up.
        eng = [w for w in steady if w["step_us_per_row"]]
        if len(eng) >= 3:
            step = [w["step_us_per_row"] for w in eng]
            summary["step_us_per_row_min_max"] = [min(step), max(step)]
            summary["corr_step_cost_vs_latency_p50"] = pearson(
                step, [w["latency_p50_ms"] for w in eng])
            summary["corr_step_cost_vs_latency_p99"] = pearson(
                step, [w["latency_p99_ms"] for w in eng])
        summary.update(final)
        bars = {"no_5xx": five == 0,
                "no_failures": not self.failures,
                "no_leaked_pages": final.get("leaked_kv_pages", 1) == 0 and
                final.get("leaked_adapter_pages", 1) == 0,
                "rss_growth": growth is not None and growth <= a.rss_bar / 100.0,
                "p99_within_20pct": spread is not None and spread <= 0.2}
        summary["bars"] = bars
        return windows, summary, bars


def ms(x):
    return None if x is None else round(x * 1000, 1)


def pearson(xs, ys):
    try:
        return round(statistics.correlation(xs, ys), 3)
    except statistics.StatisticsError:  # fewer than two values, or one series constant
        return None


def kib_mib(x):
    return None if x is None else round(x / 1024, 1)


def add_keep_work_flag(ap):
    ap.add_argument("--keep-work", action="store_true",
                    help="keep the work directory (server log, registry, adapters) after a "
                    "passing run; a failing run always keeps it")


def finish_work_dir(work, passed, keep):
    """Removes the run's temporary work directory after a passing run (each run makes one, and
    CI and soak loops would fill /tmp with them); a failing run keeps it, for its server log."""
    if passed and not keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print("work directory kept: %s" % work, flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--duration", type=float, default=3600)
    ap.add_argument("--window", type=float, default=60)
    ap.add_argument("--warmup", type=int, default=2, help="windows of warm-up (default 2)")
    ap.add_argument("--concurrency", type=int, default=6)
    ap.add_argument("--think", type=float, default=0.05, help="max seconds between a client's requests")
    ap.add_argument("--adapters", type=int, default=100)
    ap.add_argument("--ranks", default="4,8,16,32")
    ap.add_argument("--deltas", type=int, default=8,
                    help="full fine-tunes served as compressed deltas besides the adapters "
                    "(0 = none)")
    ap.add_argument("--delta-base", default="",
                    help="with --attach: the attached server's base model file, to make the "
                    "deltas against (without it, --attach runs no deltas)")
    ap.add_argument("--churn-interval", type=float, default=1.0)
    ap.add_argument("--sighup-interval", type=float, default=20.0)
    ap.add_argument("--sample", type=float, default=2.0, help="seconds between samples")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-running", type=int, default=16)
    ap.add_argument("--max-queue", type=int, default=64)
    ap.add_argument("--pool-mib", type=int, default=128)
    ap.add_argument("--host-cache-mib", type=int, default=64)
    ap.add_argument("--no-prefault", dest="prefault", action="store_false",
                    help="do not pass --prefault (RSS then grows as the pool is first touched)")
    ap.add_argument("--serve-arg", action="append", default=[], help="extra chorus serve flag")
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--rss-bar", type=float, default=2.0, help="max RSS growth after warm-up, %%")
    ap.add_argument("--no-rss-bar", action="store_true",
                    help="report the RSS growth but do not fail on it (a sanitized server: ASan's "
                    "quarantine keeps freed memory resident; LeakSanitizer checks leaks instead)")
    ap.add_argument("--no-latency-bar", action="store_true",
                    help="report the p99 spread but do not fail on it (CI on a shared machine)")
    ap.add_argument("--no-churn", action="store_true", help="no adapter unload/load/replace")
    ap.add_argument("--no-sighup", action="store_true",
                    help="no tenants-file reloads (and no limited-tenant client)")
    ap.add_argument("--base-share", type=float, default=0.3,
                    help="share of requests for the base model (the rest name adapters)")
    ap.add_argument("--hangup-share", type=float, default=1.0,
                    help="scales the client hang-up rates (8 %% of streams, 3 %% of others)")
    ap.add_argument("--wrap", default="", help="command prefix for the server (a profiler)")
    ap.add_argument("--attach", default="", help="HOST:PORT of a running server (with --pid)")
    ap.add_argument("--pid", type=int, default=0)
    ap.add_argument("--tenants-file", default="", help="with --attach: its --tenants file")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--client-threads", action="store_true",
                    help="run the --concurrency clients as threads of this process, not as "
                    "processes (their latencies then include waiting for each other's Python)")
    ap.add_argument("--out", default="", help="directory for summary.json, windows.csv, "
                    "samples.csv, requests.csv, events.csv (churn calls and SIGHUPs)")
    ap.add_argument("--plot", action="store_true", help="with --out: samples.png via tools/plot.py")
    add_keep_work_flag(ap)
    a = ap.parse_args()
    if a.duration <= 0 or a.window <= 0 or a.concurrency < 1 or a.adapters < 1:
        ap.error("--duration, --window, --concurrency and --adapters must be positive")
    if a.deltas < 0:
        ap.error("--deltas must be 0 or more")
    if a.attach and not a.delta_base:
        a.deltas = 0
    if a.duration < (a.warmup + 1) * a.window:
        ap.error("--duration must cover the warm-up and at least one window more")
    if a.attach and not a.pid:
        ap.error("--attach needs --pid (the server's RSS is read from /proc)")
    if a.out:
        os.makedirs(a.out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="chorus-soak-")
    srv = Server(a, work)
    print("soak: server pid %d port %d, work dir %s" % (srv.pid, srv.port, work), flush=True)
    soak = Soak(a, srv)
    soak.register_all()
    soak.run()
    final = soak.final_checks() if srv.alive() else {}
    windows, summary, bars = soak.report(final)
    if srv.proc is not None:
        with open(srv.log_path, "rb") as f:
            log = f.read()
        summary["sighup_reloads_logged"] = log.count(b"SIGHUP: reloaded")
        if summary["sighup_reloads_logged"] != soak.sighups:
            soak.failures.append("%d SIGHUPs sent, %d reloads logged" %
                                 (soak.sighups, summary["sighup_reloads_logged"]))
            bars["no_failures"] = False
        rc = srv.stop()
        summary["server_exit"] = rc
        if rc != 0:
            soak.failures.append("server exit status %r after SIGTERM" % rc)
            bars["no_failures"] = False
        summary["serve_command"] = " ".join(srv.cmd)
    summary["failures"] = len(soak.failures)
    for f_ in soak.failures[:30]:
        print("FAIL:", f_)
    if a.out:
        with open(os.path.join(a.out, "summary.json"), "w") as f:
            json.dump({"summary": summary, "windows": windows,
                       "failures": soak.failures[:200]}, f, indent=1)
        with open(os.path.join(a.out, "requests.csv"), "w") as f:
            f.write("t_end_s,model,path,stream,n,max_tokens,ttft_ms,latency_ms\n")
            for d in sorted(soak.details):
                f.write(",".join(str(x) for x in d) + "\n")
        with open(os.path.join(a.out, "events.csv"), "w") as f:
            f.write("t_start_s,op,name,seconds\n")
            for e in sorted(soak.events):
                f.write(",".join(str(x) for x in e) + "\n")
        with open(os.path.join(a.out, "windows.csv"), "w") as f:
            f.write("window,start_s,requests,ttft_p50_ms,ttft_p99_ms,latency_p50_ms,"
                    "latency_p99_ms,rss_mib,step_us_per_row,rows_per_step\n")
            for w in windows:
                f.write(",".join(str(w[k]) if w[k] is not None else "" for k in (
                    "window", "start_s", "requests", "ttft_p50_ms", "ttft_p99_ms",
                    "latency_p50_ms", "latency_p99_ms", "rss_mib", "step_us_per_row",
                    "rows_per_step")) + "\n")
        if a.plot:
            subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "plot.py"),
                            "soak", os.path.join(a.out, "samples.csv")])
    print(json.dumps(summary))
    gate = dict(bars)
    if a.no_latency_bar:
        gate.pop("p99_within_20pct")
    if a.no_rss_bar:
        gate.pop("rss_growth")
    failed = [k for k, v in gate.items() if not v]
    print("soak: %d requests, %d 5xx, leaked pages kv %s adapter %s, RSS growth %s %%, p99 "
          "max/min %s (max deviation from median %s %%): %s" % (
              summary["requests"], summary["status_5xx"], summary.get("leaked_kv_pages"),
              summary.get("leaked_adapter_pages"), summary["rss_growth_after_warmup_pct"],
              summary["latency_p99_max_over_min"],
              summary["latency_p99_max_deviation_from_median_pct"],
              "PASS" if not failed else "FAIL " + ",".join(failed)))
    if summary.get("step_us_per_row_min_max"):
        print("soak: engine step cost %s-%s us per row across windows; correlation with the "
              "windows' latency p50 %s, p99 %s" % (
                  summary["step_us_per_row_min_max"][0], summary["step_us_per_row_min_max"][1],
                  summary["corr_step_cost_vs_latency_p50"],
                  summary["corr_step_cost_vs_latency_p99"]), flush=True)
    finish_work_dir(work, not failed, a.keep_work)
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())

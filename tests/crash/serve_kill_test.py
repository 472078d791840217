#!/usr/bin/env python3
"""Crash consistency through the real server (docs/adapters.md, "Durability").

Each round starts `chorus serve` on the registry of the previous round, checks that it lists
exactly the adapters the acknowledged operations left (the one request in flight at the kill
may or may not have landed), then sends POST /v1/load_lora_adapter (new names and replacements)
and /v1/unload_lora_adapter with real PEFT adapter files from a client thread and SIGKILLs the
server after a random delay. No temp file may survive a restart. Finally a corrupt registry
file must stop the server with a clear error and be left as it is, and --recover-corrupt-state
must move it aside and start empty.

Usage: serve_kill_test.py --chorus build/release/apps/chorus/chorus [--rounds 10] [--seed 1]
"""

import argparse
import http.client
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time


def request(port, method, path, body=None, timeout=30):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    return resp.status, out


class Server:
    def __init__(self, chorus, workdir, env, round_no, extra=()):
        self.log_path = os.path.join(workdir, "serve-%d.log" % round_no)
        self.log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [chorus, "serve", "--port", "0", "--host", "127.0.0.1", "--served-model-name", "base",
             "--adapter-root", os.path.join(workdir, "adapters"), "--registry",
             os.path.join(workdir, "state", "registry.json"), "--threads", "1"] + list(extra),
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None and self.proc.poll() is None:
            time.sleep(0.05)
            with open(self.log_path, "rb") as f:
                m = re.search(rb"http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            raise RuntimeError("server did not start; see " + self.log_path)
        while time.time() < deadline:
            try:
                if request(self.port, "GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError("server not healthy within 120 s; see " + self.log_path)

    def adapters(self):
        status, body = request(self.port, "GET", "/v1/models")
        assert status == 200, body
        return {m["id"]: m["root"] for m in json.loads(body)["data"] if m["id"] != "base"}

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.log.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    workdir = tempfile.mkdtemp(prefix="chorus_serve_kill_")
    env = dict(os.environ, CHORUS_CACHE_DIR=os.path.join(workdir, "cache"),
               HOME=os.path.join(workdir, "home"))
    os.makedirs(env["HOME"])
    os.makedirs(os.path.join(workdir, "state"))
    adapters_dir = os.path.join(workdir, "adapters")
    subprocess.run([args.chorus, "convert", "--shape", "tiny", "--lora-count", "4",
                    "--lora-ranks", "4,8", "--output", adapters_dir], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    paths = sorted(os.path.realpath(os.path.join(adapters_dir, d)) for d in os.listdir(adapters_dir))
    names = ["a0", "a1", "a2", "a3", "org/a4"]

    state = {}  # name -> path: what the acknowledged operations left
    consistent = 0
    in_flight_landed = 0
    t0 = time.time()
    for rnd in range(args.rounds):
        srv = Server(args.chorus, workdir, env, rnd)
        got = srv.adapters()
        if got != state:
            print("round %d: the restarted server lists %s, expected %s" % (rnd, got, state))
            srv.kill()
            return 1
        leftovers = [f for f in os.listdir(os.path.join(workdir, "state"))
                     if re.search(r"\.tmp\.\d+$", f) or ".corrupt-" in f]
        if leftovers:
            print("round %d: leftover files after the restart: %s" % (rnd, leftovers))
            srv.kill()
            return 1
        consistent += 1

        # Operations from a client thread until the kill; `pending` is the one in flight.
        lock = threading.Lock()
        shared = {"state": dict(state), "pending": None}
        stop = threading.Event()

        def client():
            while not stop.is_set():
                with lock:
                    cur = dict(shared["state"])
                present = sorted(cur)
                absent = [n for n in names if n not in cur]
                r = rng.random()
                if present and (r < 0.25 or not absent):
                    name = rng.choice(present)
                    op = ("unload", name, None)
                    body = {"lora_name": name}
                    route = "/v1/unload_lora_adapter"
                else:
                    name = rng.choice(absent) if absent and r < 0.6 else rng.choice(present or absent)
                    path = rng.choice(paths)
                    op = ("load", name, path)
                    body = {"lora_name": name, "lora_path": path, "replace": True}
                    route = "/v1/load_lora_adapter"
                with lock:
                    shared["pending"] = op
                try:
                    status, out = request(srv.port, "POST", route, body)
                except OSError:
                    return  # the server died with this request in flight
                if status != 200:
                    print("round %d: %s answered %d: %s" % (rnd, route, status, out[:200]))
                    os._exit(1)
                with lock:
                    if op[0] == "unload":
                        shared["state"].pop(name, None)
                    else:
                        shared["state"][name] = op[2]
                    shared["pending"] = None

        th = threading.Thread(target=client)
        th.start()
        time.sleep(rng.uniform(0.02, 1.0))
        srv.kill()
        stop.set()
        th.join()
        # Acknowledged operations must be there; the one in flight may be.
        state = shared["state"]
        pending = shared["pending"]
        if pending is not None:
            after = dict(state)
            if pending[0] == "unload":
                after.pop(pending[1], None)
            else:
                after[pending[1]] = pending[2]
            srv = Server(args.chorus, workdir, env, 1000 + rnd)
            got = srv.adapters()
            srv.kill()
            if got == after and after != state:
                state = after
                in_flight_landed += 1
            elif got != state:
                print("round %d: after the kill the server lists %s: neither %s nor %s" %
                      (rnd, got, state, after))
                return 1
    # A corrupt state file: the server refuses to start, naming the problem, and leaves the file;
    # --recover-corrupt-state moves it aside (byte for byte) and starts with an empty registry.
    reg = os.path.join(workdir, "state", "registry.json")
    with open(reg, "rb") as f:
        good = f.read()
    torn = good[:len(good) // 2]
    with open(reg, "wb") as f:
        f.write(torn)
    r = subprocess.run([args.chorus, "serve", "--port", "0", "--registry", reg, "--adapter-root",
                        adapters_dir], env=env, capture_output=True, timeout=120)
    err = r.stderr.decode(errors="replace")
    if r.returncode == 0 or "not valid JSON" not in err or "--recover-corrupt-state" not in err:
        print("a corrupt registry: exit %d, stderr: %s" % (r.returncode, err[-500:]))
        return 1
    with open(reg, "rb") as f:
        if f.read() != torn:
            print("a refused start changed the corrupt registry file")
            return 1
    srv = Server(args.chorus, workdir, env, 2000, ["--recover-corrupt-state"])
    got = srv.adapters()
    srv.kill()
    moved = [f for f in os.listdir(os.path.join(workdir, "state")) if ".corrupt-" in f]
    with open(srv.log_path, "rb") as f:
        log = f.read().decode(errors="replace")
    if got or len(moved) != 1 or moved[0] not in log or "not valid JSON" not in log:
        print("--recover-corrupt-state: adapters %s, quarantined %s, log: %s" % (got, moved, log[-800:]))
        return 1
    with open(os.path.join(workdir, "state", moved[0]), "rb") as f:
        if f.read() != torn:
            print("the quarantined copy differs from the corrupt file")
            return 1
    print("serve kill test: %d/%d restarts consistent in %.1f s (%d in-flight operations had "
          "landed before the kill); a corrupt registry refused, then quarantined as %s" %
          (consistent, args.rounds, time.time() - t0, in_flight_landed, moved[0]))
    shutil.rmtree(workdir, ignore_errors=True)  # kept when a check fails, for its logs
    return 0


if __name__ == "__main__":
    sys.exit(main())

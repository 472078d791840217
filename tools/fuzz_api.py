#!/usr/bin/env python3
"""Generated API fuzzing of `chorus serve` over real HTTP (docs/fuzzing.md, "API fuzzing").

Starts a server (the embedded default model plus two synthetic LoRA adapters, so every route
has something to act on), then sends --requests requests generated from a schema of every
route — completions, chat completions (with tools, tool_choice and tool turns), embeddings, models, adapter load/unload, /tokenize, /detokenize,
/apply-template, files and fine-tuning jobs (multipart uploads, job bodies with broken
hyperparameters, unknown ids), metrics, health, unknown routes and methods — each valid or broken in one of many ways: wrong types, out-of-range
numbers, NaN/Infinity, huge strings and arrays, deep nesting, invalid UTF-8 and lone
surrogates, truncated bodies, wrong content types, chunked bodies, slow senders, clients that
hang up mid-stream, duplicate keys, unknown fields.

What must hold, for every request: the answer is 2xx or 4xx (never 5xx), a 4xx body is an
OpenAI-shaped error ({"error": {"message", "type", ...}}), and the server never drops a
connection without answering unless the client hung up first. Afterwards the server is alive
and idle: /health is 200 and /metrics shows 0 running, 0 waiting, 0 KV blocks in use.

usage: tools/fuzz_api.py --chorus build/release/apps/chorus/chorus [--requests 20000]
       [--seed 1] [--workers 8] [--out FILE.json]
Exit status 0 when every check held; 1 otherwise (the first failures are printed).
"""

import argparse
import json
import os
import random
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from soak import add_keep_work_flag, finish_work_dir  # noqa: E402

ROUTES_GET = ["/health", "/metrics", "/v1/models", "/v1/models/", "/v1/models/{m}"]
GEN_ROUTES = ["/v1/completions", "/v1/chat/completions"]
ADMIN_ROUTES = ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
TEMPLATE_ROUTES = ["/tokenize", "/detokenize", "/apply-template"]
FT_IDS = ["file-nope", "ftjob-nope", "", "%00", "x" * 300, "file-000000000000000000000001",
          "ftjob-000000000000000000000001", "..%2f..%2fetc"]
FT_GET = ["/v1/files", "/v1/files/{f}", "/v1/files/{f}/content", "/v1/fine_tuning/jobs",
          "/v1/fine_tuning/jobs/{j}", "/v1/fine_tuning/jobs/{j}/events",
          "/v1/fine_tuning/jobs/{j}/checkpoints"]
JUNK_ROUTES = ["/", "/v1", "/v1/embedding", "/v2/completions", "/v1/completions/x",
               "/%00", "/v1/models/%ff%fe", "/" + "a" * 3000]


# --tenants: the server runs with two tenants (one with limits); every request carries one of
# their keys, no key or a wrong one (401), and may be refused by a limit (429).
TENANT_KEYS = ["sk-fuzz-tenant-a", "sk-fuzz-tenant-b"]
TENANTS_JSON = ('{"tenants": {"a": {"keys": ["sk-fuzz-tenant-a"]}, "b": {"keys": ["sk-fuzz-tenant-b"],'
                ' "max_concurrent": 2, "tokens_per_second": 200}}}')


class Server:
    def __init__(self, chorus, workdir, tenants=False):
        self.workdir = workdir
        adapters = os.path.join(workdir, "adapters")
        env = dict(os.environ, CHORUS_CACHE_DIR=os.path.join(workdir, "cache"),
                   HOME=os.path.join(workdir, "home"))
        os.makedirs(env["HOME"], exist_ok=True)
        self.env = env
        subprocess.run([chorus, "convert", "--shape", "tiny", "--lora-count", "2",
                        "--lora-ranks", "4,8", "--output", adapters], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.adapter_dir = adapters
        self.log = open(os.path.join(workdir, "serve.log"), "wb")
        self.proc = subprocess.Popen(
            [chorus, "serve", "--port", "0", "--host", "127.0.0.1", "--served-model-name", "base",
             "--lora-dir", adapters, "--adapter-root", workdir, "--registry",
             os.path.join(workdir, "registry.json"), "--max-running", "8", "--max-queue", "64",
             "--threads", "2", "--drain-timeout", "2"] + self.tenant_flags(workdir, tenants),
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline and self.port is None:
            time.sleep(0.1)
            with open(os.path.join(workdir, "serve.log"), "rb") as f:
                m = re.search(rb"http://127\.0\.0\.1:(\d+)", f.read())
            if m:
                self.port = int(m.group(1))
        if self.port is None:
            raise RuntimeError("server did not print its address; see " + self.log.name)
        while time.time() < deadline:
            st, _, _ = raw(self.port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            if st == 200:
                return
            time.sleep(0.2)
        raise RuntimeError("server not healthy within 120 s")

    @staticmethod
    def tenant_flags(workdir, tenants):
        if not tenants:
            return []
        path = os.path.join(workdir, "tenants.json")
        with open(path, "w") as f:
            f.write(TENANTS_JSON)
        return ["--tenants", path]

    def alive(self):
        return self.proc.poll() is None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def raw(port, data, hang_up_after=None, slow=False, timeout=60):
    """Sends `data`, returns (status, body, note). status None: no answer."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        try:
            if slow:  # a slow sender: the request in small pieces with pauses
                for i in range(0, len(data), 7):
                    s.sendall(data[i:i + 7])
                    time.sleep(0.002)
            else:
                s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            # The server answered before reading the whole upload (e.g. 415 for a content type
            # it refuses) and closed: read its answer if the kernel kept it.
            try:
                resp = s.recv(65536)
            except OSError:
                resp = b""
            if not resp:
                if len(data) < 65536 and not slow:
                    return None, b"", "closed while a small request was being sent: %r" % data[:120]
                return "closed-early", b"", ""
            m = re.match(rb"HTTP/1\.[01] (\d{3})", resp)
            return (int(m.group(1)) if m else None), resp.partition(b"\r\n\r\n")[2], ""
        chunks = []
        got = 0
        while True:
            try:
                b = s.recv(65536)
            except socket.timeout:
                return None, b"".join(chunks), "timeout"
            except ConnectionResetError:
                break
            if not b:
                break
            chunks.append(b)
            got += len(b)
            if hang_up_after is not None and got >= hang_up_after:
                return "hung-up", b"", "client hung up"
        resp = b"".join(chunks)
    finally:
        s.close()
    m = re.match(rb"HTTP/1\.[01] (\d{3})", resp)
    if not m:
        return None, resp, "no status line"
    head, _, body = resp.partition(b"\r\n\r\n")
    if re.search(rb"(?i)transfer-encoding:\s*chunked", head):
        body = dechunk(body)
    return int(m.group(1)), body, ""


def dechunk(body):
    out = b""
    while body:
        line, _, rest = body.partition(b"\r\n")
        try:
            n = int(line.split(b";")[0], 16)
        except ValueError:
            return out
        if n == 0:
            break
        out += rest[:n]
        body = rest[n + 2:]
    return out


def http(method, path, body=b"", ctype="application/json", extra=b"", chunked=False):
    h = b"%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n" % (
        method.encode(), path.encode("latin-1", "replace"))
    if ctype is not None:
        h += b"Content-Type: " + ctype.encode() + b"\r\n"
    h += extra
    if chunked:
        parts = [body[i:i + 100] for i in range(0, len(body), 100)]
        payload = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
        return h + b"Transfer-Encoding: chunked\r\n\r\n" + payload
    return h + b"Content-Length: %d\r\n\r\n" % len(body) + body


class Gen:
    """Request bodies from the routes' schemas, valid or broken in one way."""

    def __init__(self, rng, adapters):
        self.r = rng
        self.adapters = adapters

    def weird_value(self):
        r = self.r
        return r.choice([
            None, True, False, -1, 0, 1, 2**63, -2**63, 1e308, -1e308, 1.5, -0.0, "",
            "x" * r.choice([1, 100, 5000]), [], {}, [1, 2, 3], {"a": 1}, "NaN", "\u0000",
            "\ud800", [[[[]]]], 3.14159, -7, 10**6, "16"])

    def prompt(self):
        r = self.r
        k = r.random()
        if k < 0.5:
            return r.choice(["Once upon a time", "Hello", "é漢字🙂", " ", "a\nb"])
        if k < 0.7:
            return [r.randrange(0, 512) for _ in range(r.randrange(1, 20))]
        if k < 0.8:
            return [r.choice(["x", "y z"]) for _ in range(r.randrange(1, 4))]
        if k < 0.9:
            return [[r.randrange(0, 512) for _ in range(3)] for _ in range(r.randrange(1, 3))]
        return self.weird_value()

    def messages(self):
        r = self.r
        roles = ["system", "user", "assistant", "tool", "developer", "robot", 7, None]
        msgs = []
        for _ in range(r.randrange(0, 5)):
            m = {"role": r.choice(roles[:3]) if r.random() < 0.8 else r.choice(roles),
                 "content": r.choice(["hi", "", "é🙂", ["parts"], [{"type": "text", "text": "t"}],
                                      None, 5, {"x": 1}])}
            if r.random() < 0.1:
                m["name"] = self.weird_value()
            msgs.append(m)
        if r.random() < 0.15:
            msgs[len(msgs) // 2:len(msgs) // 2] = self.tool_turns()
        if r.random() < 0.05:
            return self.weird_value()
        return msgs

    WEATHER = {"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}

    def tools_valid(self):
        return [[self.WEATHER], [self.WEATHER, {"type": "function", "function": {"name": "get_time"}}],
                [{"type": "function", "function": {"name": "f", "parameters": {}, "strict": True}}],
                # a keyword the grammar engine does not support: fine under auto, 400 when forced
                [{"type": "function", "function": {"name": "get_weather", "parameters": {
                    "type": "object", "patternProperties": {"x": {}}}}}]]

    def tools_invalid(self):
        r = self.r
        return [[{"type": "function"}], "t", [5], [{"type": "function", "function": {}}],
                [{"type": "function", "function": {"name": "a b"}}],
                [{"type": "function", "function": {"name": "f", "parameters": r.choice(["x", [], 3])}}],
                [{"type": "retrieval", "function": {"name": "f"}}],
                [self.WEATHER, self.WEATHER],
                [{"type": "function", "function": {"name": "n" * 65}}],
                [{"type": "function", "function": {"name": "f%d" % i}} for i in range(129)]]

    def tool_turns(self):
        """An assistant turn with tool_calls and the tool answers, valid or broken in one way."""
        r = self.r
        call = {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
        answer = {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}
        k = r.random()
        if k < 0.6:
            pass
        elif k < 0.7:
            call["function"]["arguments"] = r.choice(["{not json", 5, None, {"city": "x"}, "[]"])
        elif k < 0.8:
            del call["function"][r.choice(["name", "arguments"])]
        elif k < 0.85:
            call["type"] = self.weird_value()
        elif k < 0.9:
            del answer[r.choice(["tool_call_id", "content"])]
        else:
            answer["tool_call_id"] = self.weird_value()
        return [{"role": "assistant", "content": r.choice([None, "", "checking"]),
                 "tool_calls": r.choice([[call], [call, call], call, []])}, answer]

    def embed_body(self):
        """A /v1/embeddings body: OpenAI's and vLLM's fields, each valid or broken."""
        r = self.r
        b = {"model": self.model(), "input": self.prompt()}
        if r.random() < 0.05:
            b["input"] = ["Once upon a time %d" % i for i in range(r.choice([70, 2049]))]
        opts = {
            "encoding_format": (["float", "base64"], ["int8", 1, None]),
            "dimensions": ([64], [0, -1, 32, "64"]),
            "normalize": ([True, False], ["yes", 1]),
            "truncate_prompt_tokens": ([-1, 1, 4], [0, -2, 10**9, "4"]),
            "user": (["u"], [5]),
        }
        for k, (good, bad) in opts.items():
            if r.random() < 0.3:
                b[k] = r.choice(bad if r.random() < 0.15 else good)
        return b

    def model(self):
        if self.r.random() < 0.85:
            return self.r.choice(["base"] * 2 + self.adapters)
        return self.r.choice(["nope", "", 5, None, "../etc", "x" * 500])

    def schema(self, bad=False):
        """A JSON schema for response_format / json_schema: supported, or one that must get a 400."""
        r = self.r
        if bad:
            return r.choice([{"type": "object", "patternProperties": {}}, {"type": "strin"},
                             {"$ref": "#/$defs/none"}, {"type": "string", "pattern": "(a"},
                             {"type": "number", "minimum": 1}, {"not": {}}, False, [1], "x",
                             {"type": "string", "format": "ipv4"}, {"$ref": "#"}])
        leaf = r.choice([{"type": "integer", "minimum": -5, "maximum": 50}, {"type": "boolean"},
                         {"type": "string", "maxLength": 4}, {"enum": ["a", 1, None]},
                         {"type": "string", "pattern": "^[a-c]{2}$"}, {"type": "number"},
                         {"type": "string", "format": r.choice(["date", "uuid", "email"])}])
        k = r.random()
        if k < 0.3:
            return leaf
        if k < 0.6:
            return {"type": "object", "properties": {"a": leaf, "b": {"type": "null"}},
                    "required": ["a"]}
        if k < 0.8:
            return {"type": "array", "items": leaf, "minItems": 1, "maxItems": 3}
        return {"$defs": {"n": {"type": "object", "properties": {
            "k": {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2}}}},
                "$ref": "#/$defs/n"}

    def gen_body(self, chat):
        r = self.r
        b = {"model": self.model()}
        if chat:
            b["messages"] = self.messages()
        else:
            b["prompt"] = self.prompt()
        # 0: a completions request with echo scores its prompt; without echo it is a 400.
        b["max_tokens"] = r.choice([0, 1, 2, 3, 4]) if r.random() < 0.9 else self.weird_value()
        # option: (valid values, invalid values); an option is invalid 15 % of the time.
        opts = {
            "temperature": ([0, 0.5, 1.0, 2.0], [-1, 3, "hot"]),
            "top_p": ([0.1, 0.9, 1.0], [0, 1.5, -0.1]),
            "top_k": ([-1, 0, 5, 40], [1000000000000, 2.5, "k"]),
            "min_p": ([0, 0.1], [1.1, -1]),
            "n": ([1, 2, 3], [0, 17, -1]),
            "stream": ([True, False], ["yes", 1]),
            "stop": (["\n", ["a", "b"], [], "."], [["x"] * 20, 5, "s" * 2000]),
            "seed": ([0, 42, 7], [-5, 2**64, "s"]),
            "logprobs": ([True, False] if chat else [0, 1, 3], [21, -1, "x"]),
            "top_logprobs": ([0, 3], [21, -1]),
            "presence_penalty": ([0, 1.5, -1], [-3, 3]),
            "frequency_penalty": ([0, 0.5], [-2.5, 3]),
            "repetition_penalty": ([1, 1.2], [0, -1]),
            "echo": ([False] if chat else [True, False], [1, "x"]),
            "prompt_logprobs": ([0, 2], [21, -1, "x", 1.5]),
            "stream_options": ([{"include_usage": True}, {"include_usage": False}], [5, "x"]),
            "ignore_eos": ([True, False], ["no"]),
            "ttft_slo_ms": ([0, 50, 2000.5], [-1, "fast", True]),
            "tpot_slo_ms": ([0, 20, 100], [-0.5, "x", [1]]),
            "logit_bias": ([{}, {"5": 1}, {"300": -100}, None], [{"x": 1}, 3, {"5": 200},
                                                                 {"99999": 1}, {"5": "1"}]),
            "min_tokens": ([0, 1, 3], [-1, 10**6, "x"]),
            "user": (["u"], [5]),
            "response_format": ([{"type": "text"}, {"type": "json_object"},
                                 {"type": "json_schema", "json_schema": {
                                     "name": "s", "strict": True, "schema": self.schema()}}],
                                [{"type": "json_schema", "json_schema": {"schema": self.schema(bad=True)}},
                                 {"type": "json_schema"}, {"type": "xml"}, {"type": 5}, 1]),
            "grammar": (['root ::= "a" [0-9]{1,3}', 'root ::= ("x" | y)+\ny ::= [^\n]', ""],
                        ['root ::= undefined', 'root ::= "unterminated', "root := x",
                         'root ::= root "a"', 5, "x" * 300]),
            "json_schema": ([self.schema()], [self.schema(bad=True), "s", 3]),
            "guided_json": ([self.schema(), json.dumps(self.schema())],
                            [self.schema(bad=True), "{x", 3]),
            "guided_choice": ([["yes", "no"], ["a \"b\"\n", "ü"]], [[], "yes", [""], [1]]),
            "guided_grammar": (['root ::= [0-9]+'], ['root ::= nope', 5]),
            "guided_regex": (["[a-z]+", "\\d{1,3}(\\.\\d+)?", "(yes|no)!?", ".{0,5}", "[^a]\\s"],
                             ["(a", "a{3,1}", "(?=x)", "", 5, "\\1", "[z-a]"]),
            "tools": (self.tools_valid(), self.tools_invalid()),
            "tool_choice": (["none", "auto", "required",
                             {"type": "function", "function": {"name": "get_weather"}}],
                            ["always", 5, {"type": "function"}, {"type": "x"},
                             {"type": "function", "function": {"name": "nope"}}]),
            "parallel_tool_calls": ([True, False], ["no", 1]),
            "unknown_field_" + str(r.randrange(100)): ([1, "x", None], [self.weird_value()]),
        }
        picked = {}
        for k in r.sample(list(opts), r.randrange(0, 6)):
            valid, invalid = opts[k]
            if not valid or r.random() < 0.15:
                picked[k] = r.choice(invalid)
            else:
                picked[k] = r.choice(valid)
        if "stream_options" in picked and picked.get("stream") is not True:
            picked["stream"] = True if r.random() < 0.9 else picked.get("stream", False)
        b.update(picked)
        if r.random() < 0.05:
            b[r.choice(list(b))] = self.weird_value()
        return b

    def template_body(self, route):
        r = self.r
        if route == "/detokenize":
            b = {"tokens": r.choice([[1, 2, 3], [r.randrange(0, 600) for _ in range(8)], [],
                                     [-1], [2**40], "x", [[1]], [1.5]])}
        elif route == "/tokenize" and r.random() < 0.5:
            b = {"prompt": self.prompt(), "add_special_tokens": r.choice([True, False, 1]),
                 "return_token_strs": r.choice([True, False])}
        else:
            b = {"messages": self.messages(),
                 "add_generation_prompt": r.choice([True, False, "x"])}
            if r.random() < 0.2:
                b["chat_template"] = r.choice([
                    "{% for m in messages %}{{ m.content }}{% endfor %}", "{{ x | nosuchfilter }}",
                    "{% if %}", "{{ raise_exception('no') }}", 5, "{{ messages | tojson(indent=2) }}"])
            if r.random() < 0.2:
                b["chat_template_kwargs"] = r.choice([{"a": 1}, [], "x"])
            if r.random() < 0.2:
                b["tools"] = r.choice([[], [{"type": "function", "function": {"name": "f"}}], 3] +
                                      self.tools_valid() + self.tools_invalid())
            if r.random() < 0.1:
                b["tool_choice"] = r.choice(["none", "auto", "required", "x",
                                             {"type": "function", "function": {"name": "f"}}])
        if r.random() < 0.1:
            b["model"] = self.model()
        return b

    def admin_body(self, load):
        r = self.r
        b = {"lora_name": r.choice(["fz" + str(r.randrange(5)), "", "base", "a/b", 5, None,
                                    "x" * 300, "ok.name"])}
        if load:
            b["lora_path"] = r.choice([self.adapters_dir + "/" + r.choice(os.listdir(self.adapters_dir)),
                                       "/etc/passwd", "/nonexistent", "", "../..", 7,
                                       self.adapters_dir])
            if r.random() < 0.3:
                b["replace"] = r.choice([True, False, "yes"])
        return b


def encode(obj, rng):
    """JSON bytes, sometimes with NaN/Infinity, duplicate keys or deep nesting spliced in."""
    k = rng.random()
    s = json.dumps(obj, ensure_ascii=rng.random() < 0.5)
    if k < 0.03:
        s = s.replace("1", "NaN", 1) if "1" in s else s + "NaN"
    elif k < 0.06:
        s = s.replace("0", "Infinity", 1)
    elif k < 0.09 and s.startswith("{") and len(s) > 2:
        s = '{"max_tokens": 1, "max_tokens": "dup", ' + s[1:]
    elif k < 0.11:
        d = rng.choice([10, 63, 64, 65, 200, 5000])
        s = '{"prompt": ' + "[" * d + "1" + "]" * d + "}"
    return s.encode("utf-8", "surrogatepass")


def mutate_bytes(data, rng):
    k = rng.random()
    if k < 0.3:
        return data[: rng.randrange(0, max(1, len(data)))]  # truncated
    if k < 0.5:
        i = rng.randrange(0, max(1, len(data)))
        return data[:i] + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00", b"\xf8\x88"]) + data[i:]
    if k < 0.6:
        return b'{"prompt": "' + b"A" * rng.choice([100000, 1000000]) + b'", "max_tokens": 1}'
    if k < 0.7:
        return b"[" + b"1," * rng.choice([1000, 100000]) + b"1]"
    if k < 0.8:
        return b"not json at all"
    return b""


def check(status, body, note, stats, failures, what):
    if status == "hung-up":
        stats["hung_up"] += 1
        return
    if status == "closed-early":  # a large upload refused before it was read (see raw)
        stats["closed_early"] = stats.get("closed_early", 0) + 1
        return
    if status is None:
        failures.append("%s: no answer (%s) %r" % (what, note, body[:200]))
        return
    stats["by_status"][status] = stats["by_status"].get(status, 0) + 1
    if status >= 500:
        failures.append("%s: %d %r" % (what, status, body[:300]))
    elif 400 <= status < 500:
        try:
            e = json.loads(body)["error"]
            if not isinstance(e.get("message"), str) or "type" not in e:
                raise ValueError("shape")
        except Exception:  # noqa: BLE001 - any decoding problem is the finding
            failures.append("%s: %d with a non-OpenAI error body %r" % (what, status, body[:200]))


def with_key(data, rng):
    """Adds an Authorization header: a tenant's key mostly, sometimes none or a wrong one."""
    k = rng.random()
    if k < 0.05:
        return data
    key = rng.choice(TENANT_KEYS) if k < 0.9 else rng.choice(["sk-nobody-0000", "", "x" * 300])
    scheme = rng.choice([b"Bearer ", b"bearer ", b"Basic "]) if k > 0.97 else b"Bearer "
    return data.replace(b"Connection: close\r\n",
                        b"Connection: close\r\nAuthorization: " + scheme + key.encode() + b"\r\n", 1)


def ft_job_body(rng, file_ids):
    """A fine-tuning job body: mostly broken (unknown files, model, hyperparameters)."""
    hp_values = [0, -1, 1, 3, 51, 1e9, "auto", "x", None, [], {}, 0.5, float("nan")]
    hp = {k: rng.choice(hp_values) for k in rng.sample(
        ["n_epochs", "batch_size", "learning_rate_multiplier", "lora_rank", "lora_alpha",
         "lora_targets", "n_steps", "seq_len", "warmup_steps", "grad_accum", "checkpoint_every",
         "bogus"], rng.randrange(0, 5))}
    body = {"model": rng.choice(["base", "chorus-default", "nope", 7, None]),
            "training_file": rng.choice(file_ids + ["file-nope", None, 3, ""]),
            "hyperparameters": rng.choice([hp, hp, None, "auto", []])}
    if rng.random() < 0.3:
        body["validation_file"] = rng.choice(file_ids + ["file-nope", 1])
    if rng.random() < 0.3:
        body["suffix"] = rng.choice(["ok", "bad suffix", "x" * 100, 5, ""])
    if rng.random() < 0.2:
        body["seed"] = rng.choice([1, -1, "s", 2 ** 40])
    if rng.random() < 0.1:
        body["method"] = rng.choice([{"type": "dpo"}, {"type": "supervised"}, "x"])
    return body


def ft_upload(rng):
    """A multipart upload to /v1/files: tiny JSONL, or a broken form."""
    b = "b" + str(rng.randrange(1 << 30))
    parts = []
    if rng.random() < 0.85:
        parts.append('--%s\r\nContent-Disposition: form-data; name="purpose"\r\n\r\n%s\r\n' % (
            b, rng.choice(["fine-tune"] * 4 + ["assistants", "", "x" * 500])))
    if rng.random() < 0.85:
        content = rng.choice(['{"text": "Once upon a time"}\n', "", "not json\n", "\xff\xfe",
                              '{"prompt": "a", "completion": "b"}\n' * rng.randrange(1, 50)])
        name = rng.choice(["t.jsonl", "../../etc/passwd", "", "a/b.jsonl", "x" * 300])
        parts.append('--%s\r\nContent-Disposition: form-data; name="file"; filename="%s"\r\n'
                     '\r\n%s\r\n' % (b, name, content))
    body = ("".join(parts) + "--%s--\r\n" % b).encode("utf-8", "surrogateescape")
    if rng.random() < 0.1:
        body = mutate_bytes(body, rng)
    ctype = rng.choice(["multipart/form-data; boundary=" + b] * 5 + ["application/json", None])
    return body, ctype


def one(port, gen, rng, stats, failures, tenants=False):
    r = rng.random()
    if r >= 0.22 and r < 0.27:  # files and fine-tuning jobs (the state directory's routes)
        k = rng.random()
        f_id, j_id = rng.choice(FT_IDS), rng.choice(FT_IDS)
        if k < 0.4:
            path = rng.choice(FT_GET).replace("{f}", f_id).replace("{j}", j_id)
            if rng.random() < 0.3:
                path += rng.choice(["?limit=0", "?limit=2", "?limit=x", "?after=nope",
                                    "?limit=99999999999999999999", "?purpose=fine-tune"])
            data = http("GET", path, b"")
        elif k < 0.55:
            path = "/v1/files/" + f_id
            data = http("DELETE", path, b"")
        elif k < 0.65:
            path = "/v1/fine_tuning/jobs/%s/cancel" % j_id
            data = http("POST", path, b"")
        elif k < 0.8:
            path = "/v1/files"
            body, ctype = ft_upload(rng)
            data = http("POST", path, body, ctype)
        else:
            path = "/v1/fine_tuning/jobs"
            body = encode(ft_job_body(rng, ["file-000000000000000000000001"]), rng)
            if rng.random() < 0.1:
                body = mutate_bytes(body, rng)
            data = http("POST", path, body)
        what = "fine-tuning " + path[:60]
        if tenants:
            data = with_key(data, rng)
        status, resp, note = raw(port, data)
        check(status, resp, note, stats, failures, what)
        stats["sent"] += 1
        return
    if r < 0.08:
        path = rng.choice(ROUTES_GET).replace("{m}", rng.choice(["base"] + gen.adapters + ["nope"]))
        method = "GET" if rng.random() < 0.9 else rng.choice(["DELETE", "PUT", "PATCH", "POST"])
        data = http(method, path, b"" if method == "GET" else b"{}")
        what = method + " " + path
    elif r < 0.12:
        path = rng.choice(JUNK_ROUTES)
        data = http(rng.choice(["GET", "POST"]), path, b"{}")
        what = "junk " + path[:40]
    elif r < 0.16:
        path = rng.choice(TEMPLATE_ROUTES)
        body = encode(gen.template_body(path), rng)
        if rng.random() < 0.1:
            body = mutate_bytes(body, rng)
        data = http("POST", path, body)
        what = "POST " + path
    elif r < 0.18:
        path = "/v1/embeddings"
        body = encode(gen.embed_body(), rng)
        if rng.random() < 0.1:
            body = mutate_bytes(body, rng)
        data = http("POST", path, body)
        what = "POST " + path
    elif r < 0.22:
        load = rng.random() < 0.5
        path = ADMIN_ROUTES[0 if load else 1]
        data = http("POST", path, encode(gen.admin_body(load), rng))
        what = "POST " + path
    else:
        chat = rng.random() < 0.5
        path = GEN_ROUTES[1 if chat else 0]
        body = encode(gen.gen_body(chat), rng)
        if rng.random() < 0.12:
            body = mutate_bytes(body, rng)
        ctype = rng.choice(["application/json"] * 6 + [
            "application/x-www-form-urlencoded", "text/plain", None, "multipart/form-data",
            "application/json; charset=latin-1"])
        chunked = rng.random() < 0.05
        data = http("POST", path, body, ctype, chunked=chunked)
        if rng.random() < 0.02:  # the client hangs up in the middle of its upload
            data = data.replace(b"Content-Length: %d" % len(body),
                                b"Content-Length: %d" % (len(body) + 10))
            if tenants:
                data = with_key(data, rng)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            try:
                s.sendall(data)
                time.sleep(0.05)
            except (BrokenPipeError, ConnectionResetError):
                pass  # refused before the body was read (e.g. 401): the server closed first
            s.close()
            stats["truncated_uploads"] += 1
            return
        what = "POST " + path
        if tenants:
            data = with_key(data, rng)
        hang = rng.choice([None] * 19 + [rng.randrange(1, 400)])
        slow = rng.random() < 0.005 and len(data) < 4096  # slowloris, bounded in time
        status, resp, note = raw(port, data, hang_up_after=hang, slow=slow)
        check(status, resp, note, stats, failures, what)
        stats["sent"] += 1
        return
    if tenants:
        data = with_key(data, rng)
    status, resp, note = raw(port, data)
    check(status, resp, note, stats, failures, what)
    stats["sent"] += 1


def metric(text, name):
    m = re.search(r"^%s(?:\{[^}]*\})? ([0-9.eE+-]+)$" % re.escape(name), text, re.M)
    return float(m.group(1)) if m else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chorus", required=True)
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--out", default="")
    ap.add_argument("--tenants", action="store_true",
                    help="serve two tenants (--tenants FILE); requests carry their keys or bad ones")
    add_keep_work_flag(ap)
    a = ap.parse_args()
    if a.requests < 1 or a.workers < 1:
        ap.error("--requests and --workers must be positive")
    work = tempfile.mkdtemp(prefix="chorus-fuzz-api-")
    srv = Server(a.chorus, work, tenants=a.tenants)
    adapters = sorted(os.listdir(os.path.join(work, "adapters")))
    stats = {"sent": 0, "hung_up": 0, "truncated_uploads": 0, "closed_early": 0, "by_status": {}}
    failures = []
    lock = threading.Lock()
    counter = [0]
    t0 = time.time()

    def worker(i):
        rng = random.Random(a.seed * 1000 + i)
        gen = Gen(rng, adapters)
        gen.adapters_dir = srv.adapter_dir
        local = {"sent": 0, "hung_up": 0, "truncated_uploads": 0, "closed_early": 0,
                 "by_status": {}}
        local_fail = []
        while True:
            with lock:
                if counter[0] >= a.requests:
                    break
                counter[0] += 1
            try:
                one(srv.port, gen, rng, local, local_fail, tenants=a.tenants)
            except (ConnectionRefusedError, BrokenPipeError, ConnectionResetError) as e:
                local_fail.append("connection error: %r" % e)
        with lock:
            for k in ("sent", "hung_up", "truncated_uploads", "closed_early"):
                stats[k] += local[k]
            for k, v in local["by_status"].items():
                stats["by_status"][k] = stats["by_status"].get(k, 0) + v
            failures.extend(local_fail)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(a.workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.time() - t0
    alive = srv.alive()
    idle = {}
    if alive:
        deadline = time.time() + 30
        while time.time() < deadline:
            auth = b"Authorization: Bearer %s\r\n" % TENANT_KEYS[0].encode() if a.tenants else b""
            st, body, _ = raw(srv.port, http("GET", "/metrics", b"", None, extra=auth))
            text = body.decode("utf-8", "replace") if st == 200 else ""
            idle = {k: metric(text, k) for k in ("chorus_running_sequences", "chorus_queue_length",
                                                 "chorus_kv_blocks_used")}
            if all(v == 0 for v in idle.values()):
                break
            time.sleep(0.5)
        st, _, _ = raw(srv.port, http("GET", "/health", b"", None))
        if st != 200:
            failures.append("after the run /health answered %r" % st)
        if not all(v == 0 for v in idle.values()):
            failures.append("not idle after the run: %r" % idle)
    else:
        failures.append("the server died (exit %r); see %s" % (srv.proc.returncode, srv.log.name))
    srv.stop()
    five = sum(v for k, v in stats["by_status"].items() if k >= 500)
    summary = {"requests": stats["sent"] + stats["truncated_uploads"], "answers_by_status":
               {str(k): v for k, v in sorted(stats["by_status"].items())},
               "client_hang_ups": stats["hung_up"], "truncated_uploads": stats["truncated_uploads"],
               "large_uploads_refused_before_read": stats["closed_early"],
               "status_5xx": five, "failures": len(failures), "seconds": round(elapsed, 1),
               "server_alive": alive, "idle_after": idle, "seed": a.seed}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(summary, f, indent=1)
    for f_ in failures[:20]:
        print("FAIL:", f_)
    print(json.dumps(summary))
    print("fuzz_api: %d requests, %d 5xx, %d failures, %.1f s" %
          (summary["requests"], five, len(failures), elapsed))
    finish_work_dir(work, not failures, a.keep_work)
    return 0 if not failures else 1


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Structured outputs through the real `chorus serve` binary, validated independently.

For every schema of tests/data/structured_output_schemas.json, on stories260K and on the
embedded random-weight model (shape "tiny": TinyLlama's architecture at a small size), both of
which would otherwise emit anything: requests with response_format json_schema (chat and
completions, streaming and not, n = 2) and llama.cpp's json_schema field run concurrently, so
rows with different schemas share engine steps. Every choice that finishes with
finish_reason "stop" must parse as JSON and validate against its schema with Debian's
python3-jsonschema (Draft 2020-12, formats checked). json_object answers must parse as objects.
Bad constraints must get a 400 naming the field.

Usage: structured_outputs_e2e.py CHORUS_BINARY MODELS_DIR
Exit 77 (skip) when python3-jsonschema or the stories260K files are missing, unless
CHORUS_REQUIRE_MODELS=1.
"""
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

REQUIRED = os.environ.get("CHORUS_REQUIRE_MODELS") == "1"


def skip(msg):
    print("structured_outputs_e2e: " + msg, file=sys.stderr)
    sys.exit(1 if REQUIRED else 77)


try:
    import jsonschema
except ImportError:
    skip("python3-jsonschema is not installed (apt-get install python3-jsonschema)")


def post(base, path, body, timeout=300):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def choices_of(status, text, stream, chat):
    """[(index, text, finish_reason)] from a (possibly streamed) answer."""
    if status != 200:
        raise AssertionError("HTTP %d: %s" % (status, text[:300]))
    if not stream:
        out = []
        for c in json.loads(text)["choices"]:
            t = c["message"]["content"] if chat else c["text"]
            out.append((c["index"], t, c["finish_reason"]))
        return out
    texts, finish = {}, {}
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        ev = json.loads(line[6:])
        for c in ev.get("choices", []):
            i = c["index"]
            piece = (c.get("delta", {}).get("content") if chat else c.get("text")) or ""
            texts[i] = texts.get(i, "") + piece
            if c.get("finish_reason"):
                finish[i] = c["finish_reason"]
    return [(i, texts.get(i, ""), finish.get(i)) for i in sorted(set(texts) | set(finish))]


class Server:
    def __init__(self, chorus, args, env):
        self.proc = subprocess.Popen([chorus, "serve", "--port", "0", "--threads", "2"] + args,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env)
        out = ""
        for line in self.proc.stdout:
            out += line
            m = re.search(r"at (http://\S+)/v1", line)
            if m:
                self.base = m.group(1)
                break
        else:
            raise RuntimeError("chorus serve did not start:\n" + out)

    def close(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def run_model(label, server, schemas):
    jobs = []
    for i, s in enumerate(schemas):
        chat = i % 2 == 0
        stream = i % 3 == 0
        body = {"max_tokens": 300, "temperature": 1.0, "seed": 1000 + i, "n": 2, "stream": stream}
        if chat:
            body["messages"] = [{"role": "user", "content": "Answer in JSON."}]
        else:
            body["prompt"] = "Once upon a time"
        if not chat and i % 4 == 1:
            body["json_schema"] = s["schema"]  # llama.cpp's field
        else:
            body["response_format"] = {"type": "json_schema",
                                       "json_schema": {"name": s["name"], "strict": True,
                                                       "schema": s["schema"]}}
        jobs.append((s, chat, stream, body))
    for k in range(4):  # json_object
        jobs.append(({"name": "json_object", "schema": {"type": "object"}}, k % 2 == 0, k == 1,
                     {"max_tokens": 300, "seed": 7 + k, "n": 2, "stream": k == 1,
                      "response_format": {"type": "json_object"},
                      **({"messages": [{"role": "user", "content": "JSON please"}]} if k % 2 == 0
                         else {"prompt": "Data:"})}))

    def one(job):
        s, chat, stream, body = job
        status, text = post(server.base, "/v1/chat/completions" if chat else "/v1/completions",
                            body)
        return s, choices_of(status, text, stream, chat)

    answers = stops = 0
    bad = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as ex:
        for s, choices in ex.map(one, jobs):
            validator = jsonschema.Draft202012Validator(
                s["schema"], format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            assert len(choices) == 2, (s["name"], choices)
            for _, text, finish in choices:
                answers += 1
                assert finish in ("stop", "length"), (s["name"], finish)
                if finish != "stop":
                    continue
                stops += 1
                try:
                    value = json.loads(text)
                except ValueError as e:
                    bad.append("%s: does not parse (%s): %r" % (s["name"], e, text))
                    continue
                errors = [e.message for e in validator.iter_errors(value)]
                if errors:
                    bad.append("%s: %r: %s" % (s["name"], text, errors[0]))
    print("%s: %d answers, %d finished with stop, %d invalid" % (label, answers, stops, len(bad)))
    for b in bad[:20]:
        print("  INVALID " + b)
    return answers, stops, bad


def check_errors(server):
    cases = [
        ({"prompt": "a", "response_format": {"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object", "patternProperties": {}}}}},
         "/v1/completions", "response_format.json_schema.schema", "patternProperties"),
        ({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "yaml"}},
         "/v1/chat/completions", "response_format.type", "yaml"),
        ({"prompt": "a", "grammar": "root ::= missing"}, "/v1/completions", "grammar", "missing"),
        ({"prompt": "a", "json_schema": {"type": "integer", "exclusiveMaximum": 3}},
         "/v1/completions", "json_schema", "exclusiveMaximum"),
    ]
    for body, route, param, word in cases:
        status, text = post(server.base, route, body)
        err = json.loads(text).get("error", {})
        assert status == 400, (status, text)
        assert err.get("param") == param, (param, text)
        assert word in err.get("message", ""), (word, text)


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    chorus, models = sys.argv[1], sys.argv[2]
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "tests/data/structured_output_schemas.json")) as f:
        schemas = json.load(f)
    assert len(schemas) >= 50
    for s in schemas:  # the test set itself must be valid Draft 2020-12 schemas
        jsonschema.Draft202012Validator.check_schema(s["schema"])
    stories = os.path.join(models, "stories260K")
    if not os.path.exists(os.path.join(stories, "stories260K.bin")):
        skip("stories260K not found under " + models)
    configs = [
        ("stories260K", ["--model", os.path.join(stories, "stories260K.bin"),
                         "--tokenizer", os.path.join(stories, "tok512.bin")]),
        ("random-weight tiny llama (embedded default model)", []),
    ]
    failed = False
    total_answers = total_stops = 0
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, CHORUS_CACHE_DIR=os.environ.get("CHORUS_CACHE_DIR", cache))
        for label, args in configs:
            server = Server(chorus, args, env)
            try:
                check_errors(server)
                answers, stops, bad = run_model(label, server, schemas)
            finally:
                server.close()
            total_answers += answers
            total_stops += stops
            failed |= bool(bad)
            # Most schemas are bounded: a test where nearly nothing completes proves nothing.
            if stops * 2 < answers:
                print("%s: only %d of %d answers completed" % (label, stops, answers))
                failed = True
    print("structured_outputs_e2e: %d answers, %d with stop, all valid: %s" %
          (total_answers, total_stops, not failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

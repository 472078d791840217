#!/usr/bin/env python3
"""tool_choice "required" and named functions enforced by the grammar engine (docs/api.md,
"Tools"), end to end over HTTP on stories260K, a model that never calls a tool by itself.

For a set of tool lists (nested objects, arrays with bounds, enums, unions, integers with
ranges, bounded strings, no parameters at all) × tool_choice required / each named function ×
streamed and not × several seeds at temperature 1: every answer must end with finish_reason
"tool_calls", hold exactly one call of an allowed function, and its arguments must parse and
validate against that function's `parameters` (python3-jsonschema). Streamed answers are
reassembled from delta.tool_calls as the SDKs do.

usage: tool_choice_enforced_test.py CHORUS_BINARY MODELS_DIR
Exit 0 when every answer held, 1 otherwise; 77 (skip) when the model is missing, unless
CHORUS_REQUIRE_MODELS=1.
"""

import json
import os
import re
import subprocess
import sys
import urllib.request

import jsonschema

TOOLS = [
    [{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "minLength": 1, "maxLength": 12},
            "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
     {"type": "function", "function": {"name": "get_time"}}],
    [{"type": "function", "function": {
        "name": "add", "parameters": {"type": "object", "properties": {
            "a": {"type": "integer", "minimum": -5, "maximum": 5},
            "b": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["a", "b"]}}}],
    [{"type": "function", "function": {
        "name": "book", "parameters": {"type": "object", "properties": {
            "guests": {"type": "array", "items": {"type": "object", "properties": {
                "name": {"type": "string", "maxLength": 8},
                "age": {"type": ["integer", "null"]}}, "required": ["name"]},
                "minItems": 1, "maxItems": 3},
            "vip": {"type": "boolean"}}, "required": ["guests", "vip"]}}},
     {"type": "function", "function": {
         "name": "cancel", "parameters": {"type": "object", "properties": {
             "id": {"anyOf": [{"type": "integer"}, {"type": "string", "pattern": "^[a-z]{3}$"}]}},
             "required": ["id"]}}}],
]

HERE = os.path.dirname(os.path.abspath(__file__))


def skip(msg):
    print("tool_choice_enforced_test: " + msg, file=sys.stderr)
    sys.exit(1 if os.environ.get("CHORUS_REQUIRE_MODELS") == "1" else 77)


def post(url, body):
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return r.read().decode()


def answer(url, body):
    """(finish_reason, content, calls) of choice 0, streamed or not."""
    text = post(url, body)
    if not body.get("stream"):
        c = json.loads(text)["choices"][0]
        calls = [(t["function"]["name"], t["function"]["arguments"], t["id"])
                 for t in c["message"].get("tool_calls") or []]
        return c["finish_reason"], c["message"]["content"], calls
    finish, content, calls = None, "", []
    for line in text.split("\n\n"):
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        c = json.loads(line[6:])["choices"][0]
        finish = c["finish_reason"] or finish
        d = c["delta"]
        content += d.get("content") or ""
        for t in d.get("tool_calls") or []:
            if "id" in t:
                assert t["index"] == len(calls), t
                calls.append([t["function"]["name"], t["function"].get("arguments", ""), t["id"]])
            else:
                calls[t["index"]][1] += t["function"]["arguments"]
    return finish, content or None, [tuple(c) for c in calls]


# A template that reads `tools` but prints only their names (stories260K has a 512-token
# context; the generic form's full schemas fit only for small tool lists, so the default
# template gets those).
COMPACT = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
           "{% if tools %}<tools>{{ tools | map(attribute='function.name') | join(',') }}</tools>"
           "{% endif %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

# (serve flags, tool lists): the generic form of the default template, then every syntax.
CONFIGS = [
    ([], [TOOLS[1], [{"type": "function", "function": {"name": "get_time"}},
                     {"type": "function", "function": {"name": "stop"}}]]),
    (["--chat-template", COMPACT], TOOLS),
    (["--chat-template", COMPACT, "--tool-call-parser", "mistral"], TOOLS),
    (["--chat-template", COMPACT, "--tool-call-parser", "llama3_json"], TOOLS),
]


def start(chorus, models, flags):
    proc = subprocess.Popen(
        [chorus, "serve", "--model", os.path.join(models, "stories260K", "stories260K.bin"),
         "--tokenizer", os.path.join(models, "stories260K", "tok512.bin"), "--port", "0",
         "--threads", "2"] + flags,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        m = re.search(r"at (http://\S+)/v1", line)
        if m:
            return proc, m.group(1)
    raise SystemExit("server did not start: " + " ".join(flags))


def run_config(url, tool_lists, label, failures):
    n = 0
    for tools in tool_lists:
        names = [t["function"]["name"] for t in tools]
        params = {t["function"]["name"]: t["function"].get("parameters", {"type": "object"})
                  for t in tools}
        choices = ["required"] + [{"type": "function", "function": {"name": x}} for x in names]
        for choice in choices:
            allowed = names if choice == "required" else [choice["function"]["name"]]
            for stream in (False, True):
                for seed in range(3):
                    body = {"messages": [{"role": "user", "content": "Go"}], "tools": tools,
                            "tool_choice": choice, "temperature": 1.0, "seed": seed,
                            "stream": stream}
                    n += 1
                    finish, content, calls = answer(url + "/v1/chat/completions", body)
                    what = "%s: %s %s stream=%s seed=%d" % (label, names, choice, stream, seed)
                    if finish != "tool_calls" or len(calls) != 1:
                        failures.append("%s: finish %s, %d calls, content %r" %
                                        (what, finish, len(calls), content))
                        continue
                    name, args, cid = calls[0]
                    # Mistral's templates take back only 9-alphanumeric ids.
                    id_ok = (re.fullmatch(r"[A-Za-z0-9]{9}", cid) if "mistral" in label
                             else re.fullmatch(r"call_[A-Za-z0-9]{24}", cid))
                    if name not in allowed or not id_ok:
                        failures.append("%s: call of %s (id %s)" % (what, name, cid))
                        continue
                    try:
                        jsonschema.validate(json.loads(args), params[name])
                    except Exception as e:  # noqa: BLE001 - the failure is the finding
                        failures.append("%s: arguments %s: %s" % (what, args, e))
    return n


def main():
    chorus, models = sys.argv[1], sys.argv[2]
    if not os.path.exists(os.path.join(models, "stories260K", "stories260K.bin")):
        skip(os.path.join(models, "stories260K", "stories260K.bin") + " not found")
    n, failures = 0, []
    for flags, tool_lists in CONFIGS:
        proc, url = start(chorus, models, flags)
        try:
            label = " ".join(f for f in flags if f != COMPACT) or "default template"
            n += run_config(url, tool_lists, label, failures)
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    print("tool_choice_enforced_test: %d answers, %d failures" % (n, len(failures)))
    for f in failures[:10]:
        print("  " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

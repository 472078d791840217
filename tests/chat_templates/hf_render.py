#!/usr/bin/env python3
"""Renders chat templates with Jinja2 configured the way Hugging Face transformers configures it
(the reference for chorus/tokenizer/chat_template_diff_test.cc; docs/chat_templates.md).

Input (argv[1]): {"now": unix seconds, "cases": [{"template": str, "context": {...}}, ...]}.
Output (argv[2]): [{"ok": true, "out": str} | {"ok": false, "error": str}, ...], one per case.

The environment matches transformers' chat-template compiler: an ImmutableSandboxedEnvironment
with trim_blocks and lstrip_blocks, the loop-controls extension and a `generation` block tag,
transformers' `tojson` filter and the `raise_exception` and `strftime_now` globals. The clock of
`strftime_now` is pinned to `now` so both engines print the same date.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` renders its body (transformers' tracker tag)."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_render", [])
        return nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def make_env(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.fromtimestamp(now).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        req = json.load(f)
    env = make_env(req["now"])
    results = []
    for case in req["cases"]:
        try:
            out = env.from_string(case["template"]).render(**case["context"])
            results.append({"ok": True, "out": out})
        except Exception as e:  # every failure is "an error"; the kind is reported for humans
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        json.dump(results, f, ensure_ascii=False)


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Chat templates through the real binary (docs/chat_templates.md): no silent fallback — a model
# whose template does not compile, or a --chat-template that does not, stops `chorus serve` with
# a non-zero status naming the line, column and missing feature; --chat-template FILE|STRING
# replaces the model's template on serve and generate; a model without a template is served
# with ChatML and startup says so; POST /apply-template, /tokenize and /detokenize show what a
# request becomes, behind the API key like the other routes; a per-request chat_template is
# validated (400 naming the line), and a render error is a 400 naming the template line.
# Uses the embedded default model (no shared assets needed).
# usage: cli_chat_template_test.sh CHORUS
set -euo pipefail
chorus=$1
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME=$tmp/home CHORUS_CACHE_DIR=$tmp/cache
mkdir -p "$HOME"

# The default model as a Hugging Face directory whose tokenizer_config.json we can edit.
# (Running generate once writes the embedded default model into the cache directory.)
"$chorus" generate --prompt x --max-tokens 1 --quiet >/dev/null 2>&1
"$chorus" convert --model "$(ls "$CHORUS_CACHE_DIR"/chorus-default-*.gguf | head -1)" --format hf \
  --output "$tmp/m" >/dev/null 2>&1
[[ -f $tmp/m/tokenizer_config.json ]] || fail "could not write the default model as a HF directory"

set_template() {  # set_template DIR TEMPLATE|'' (empty: no template at all)
  rm -rf "$1"
  cp -r "$tmp/m" "$1"
  python3 - "$1/tokenizer_config.json" "$2" <<'EOF'
import json, sys
path, tmpl = sys.argv[1], sys.argv[2]
cfg = json.load(open(path))
if tmpl:
    cfg["chat_template"] = tmpl
else:
    cfg.pop("chat_template", None)
json.dump(cfg, open(path, "w"))
EOF
}

# expect_startup_error "PATTERN..." -- ARGS: `chorus serve ARGS` exits non-zero within 30 s with
# every pattern (fixed strings) on stderr.
expect_startup_error() {
  local patterns=()
  while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
  shift
  local rc=0
  timeout -s KILL 30 "$chorus" serve --port 0 "$@" >"$tmp/out" 2>"$tmp/err" || rc=$?
  [[ $rc != 0 ]] || fail "serve $* exited 0"
  [[ $rc != 137 ]] || fail "serve $* still running after 30 s"
  for p in "${patterns[@]}"; do
    grep -qF -- "$p" "$tmp/err" || fail "serve $*: stderr lacks '$p': $(cat "$tmp/err")"
  done
}

# 1. The model's own template does not compile (an unknown filter outside any `if`).
set_template "$tmp/broken" $'{% for m in messages %}\n{{ m.content | frobnicate }}{% endfor %}'
expect_startup_error "line 2, column 16" "no filter named 'frobnicate'" "--chat-template" -- \
  --model "$tmp/broken"
# ... and an unknown filter that only an untaken branch uses is fine (Jinja 3), as is --chat-template.
# 2. A --chat-template file that does not compile, and one that is neither file nor template.
printf 'ok\n{%% if true %%}\n{{ messages | batch }}{%% endif %%}{{ x | nope(1) }}\n' >"$tmp/bad.jinja"
expect_startup_error "flag --chat-template $tmp/bad.jinja" "line 3, column 41" "no filter named 'nope'" -- \
  --chat-template "$tmp/bad.jinja"
expect_startup_error "flag --chat-template" "not a template" -- --chat-template no-such-file.jinja

# start_server LOGPREFIX ARGS...: starts `chorus serve --port 0 ARGS`, waits for /health, sets $url.
start_server() {
  local log=$1
  shift
  # The files exist before the background job opens them: the first sed below may run first,
  # and under `set -e -o pipefail` a missing file would end the test.
  : >"$tmp/$log.out"
  : >"$tmp/$log.err"
  "$chorus" serve --port 0 "$@" >>"$tmp/$log.out" 2>>"$tmp/$log.err" &
  pids+=("$!")
  disown "$!"  # killed at exit without a job-control notice
  url=""
  for _ in $(seq 300); do
    url=$(sed -n 's/.*serving .* at \(http:[^ ]*\)\/v1 .*/\1/p' "$tmp/$log.out" | head -1)
    [[ -n $url ]] && break
    sleep 0.1
  done
  [[ -n $url ]] || fail "server ($*) did not start: $(cat "$tmp/$log.err")"
}
key=k
post() {  # post PATH BODY: prints "STATUS BODY" (with "Authorization: Bearer $key")
  local path=$1 body=$2
  curl -s -o "$tmp/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $key" -d "$body" "$url$path"
  echo " $(cat "$tmp/resp")"
}

# 3. The broken model served with --chat-template (a file), behind an API key.
cat >"$tmp/good.jinja" <<'EOF'
{%- for m in messages -%}
[{{ m.role | upper }}] {{ m.content }}
{% endfor -%}
{%- if tools %}TOOLS {{ tools | map(attribute='function.name') | join(',') }}
{% endif -%}
{%- if add_generation_prompt %}[ASSISTANT]{% endif -%}
{%- if messages[-1].content == 'boom' %}{{ raise_exception('no booms here') }}{% endif -%}
{%- if messages[-1].content == 'crash' %}{{ messages[-1].content + 1 }}{% endif -%}
EOF
start_server s1 --model "$tmp/broken" --chat-template "$tmp/good.jinja" --api-key k
grep -qF "chat template: --chat-template $tmp/good.jinja" "$tmp/s1.out" ||
  fail "startup does not name the template: $(cat "$tmp/s1.out")"
r=$(post /apply-template '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],
  "tools":[{"type":"function","function":{"name":"get_weather","parameters":{}}}]}')
[[ $r == 200* ]] || fail "/apply-template: $r"
want='[SYSTEM] Be brief.\n[USER] Hi\nTOOLS get_weather\n[ASSISTANT]'
got=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["prompt"]))' "${r#200 }")
[[ $got == "\"$want\"" ]] || fail "/apply-template prompt: $got, want \"$want\""
r=$(post /tokenize '{"messages":[{"role":"user","content":"Hi"}],"return_token_strs":true}')
[[ $r == 200*'"count":'*'"max_model_len":'*'"tokens":['*'"token_strs":['* ]] || fail "/tokenize messages: $r"
ids=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["tokens"]))' "${r#200 }")
r=$(post /detokenize "{\"tokens\":$ids}")
[[ $r == 200*'[USER] Hi'*'[ASSISTANT]'* ]] || fail "/detokenize of the rendered chat: $r"
r=$(post /tokenize '{"prompt":"hello world"}')
[[ $r == 200*'"count":'* ]] || fail "/tokenize prompt: $r"
r=$(post /detokenize '{"tokens":[999999]}')
[[ $r == 400*'outside the vocabulary'* ]] || fail "/detokenize bad id: $r"
for route in /tokenize /detokenize /apply-template; do
  r=$(key=wrong post $route '{"prompt":"x"}')
  [[ $r == 401* ]] || fail "$route with a wrong key: $r"
done
# A render error is a 400 naming the template line; raise_exception's message is passed on.
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"crash"}],"max_tokens":1}')
[[ $r == 400*'line 8'* ]] || fail "render error: $r"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"boom"}],"max_tokens":1}')
[[ $r == 400*'no booms here'* ]] || fail "raise_exception: $r"
# Per-request chat_template (vLLM): used when valid, a 400 naming line and column when not.
r=$(post /apply-template '{"messages":[{"role":"user","content":"Hi"}],"chat_template":"{{ messages[0].content | reverse }}!"}')
[[ $r == '200 {"prompt":"iH!"}' ]] || fail "per-request chat_template: $r"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"chat_template":"x\n{{ 1 | bogus }}","max_tokens":1}')
[[ $r == 400*'chat_template does not compile'*'line 2, column 8'*'bogus'* ]] ||
  fail "bad per-request chat_template: $r"
r=$(post /v1/chat/completions '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":2}')
[[ $r == 200*'"choices"'* ]] || fail "chat with --chat-template: $r"

# 4. A model that ships no template: ChatML, and startup says so.
set_template "$tmp/none" ""
start_server s2 --model "$tmp/none"
grep -qF "chat template: ChatML (the model ships no chat template" "$tmp/s2.out" ||
  fail "startup does not say ChatML: $(cat "$tmp/s2.out")"
r=$(post /apply-template '{"messages":[{"role":"user","content":"Hi"}]}')
[[ $r == '200 {"prompt":"<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"}' ]] ||
  fail "ChatML fallback: $r"

# 5. generate --chat-template STRING renders the prompt as serve would.
out=$("$chorus" generate --model "$tmp/broken" --chat-template '<{{ messages[0].content }}>' \
  --prompt hello --max-tokens 1 --show-prompt --quiet 2>&1 >/dev/null)
[[ $out == "<hello>" ]] || fail "generate --chat-template: $out"
rc=0
"$chorus" generate --model "$tmp/broken" --chat --prompt hi --max-tokens 1 >/dev/null 2>"$tmp/err" || rc=$?
[[ $rc != 0 ]] && grep -qF "no filter named 'frobnicate'" "$tmp/err" ||
  fail "generate --chat with a broken model template: rc=$rc $(cat "$tmp/err")"
echo "PASS"

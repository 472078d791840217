// Internal to chat templates (chat_template.h): the Jinja lexer.
//
// Splits a template into text and tag tokens and applies Jinja's whitespace control as
// Hugging Face configures it: `{%-`/`-%}`/`{{-`/`-}}`/`{#-`/`-#}` strip all whitespace on
// that side; trim_blocks drops the first newline after a block or comment tag; lstrip_blocks
// drops spaces/tabs between the start of a line and a block or comment tag; `{%+`/`+%}`
// disable the latter two. Newlines are normalised to "\n" and one trailing newline of the
// template is dropped (keep_trailing_newline=False). {% raw %} ... {% endraw %} is text.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::tokenizer::jinja {

enum class TokKind : uint8_t {
  kText,        // literal template text (after whitespace control)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,        // identifier or keyword
  kString,      // string literal (escapes decoded)
  kInt,
  kFloat,
  kOp,  // operator or punctuation: == != <= >= // ** + - * / % ~ < > ( ) [ ] { } , . : | =
  kEof,
};

struct Token {
  TokKind kind = TokKind::kEof;
  std::string text;  // text, name, decoded string, operator
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;  // 1-based position in the template
  int col = 1;
};

// Tokenizes `source`. Errors (unclosed tag/comment/string, bad character, malformed number)
// are kInvalidArgument with "line L, column C".
Result<std::vector<Token>> Lex(std::string_view source);

// "line L, column C: what" — the error format shared by lexer and parser.
Status SyntaxError(int line, int col, std::string_view what);

}  // namespace chorus::tokenizer::jinja

// Enforcing tool_choice "required" and a named function (docs/api.md, "Tools"): the reply is
// constrained to one call, in the request's tool-call syntax, of an allowed function whose
// arguments follow that function's `parameters` schema.
//
// The syntax's opening (hermes `<tool_call>\n`, mistral `[TOOL_CALLS]`; nothing for
// llama3_json) is appended to the prompt rather than generated: markers such as [TOOL_CALLS]
// are special tokens, which the grammar matcher never samples. The grammar then covers the call
// object (`{"name": "N", "arguments": <schema of N>}`, Llama: "parameters") and the closing
// (`\n</tool_call>` / `]`), after which only an end-of-generation token is allowed. The parser
// is fed the opening first, so it reads the same text as an unconstrained call.
//
// Thread-safety: reentrant; compiled grammars are cached in grammar::SharedGrammarCache().
#pragma once

#include <optional>
#include <string>

#include "chorus/base/status.h"
#include "chorus/grammar/grammar.h"
#include "chorus/server/api_error.h"
#include "chorus/server/tool_calls.h"

namespace chorus::server {

struct ToolConstraint {
  std::string opening;       // appended to the rendered prompt; fed to the parser first
  grammar::Grammar grammar;  // the rest of the reply
};

// The grammar AST of a forced call (tests read it back as GBNF-equivalent structure). Errors:
// a `parameters` schema the grammar engine does not support, naming the tool.
Result<grammar::GrammarAst> ToolCallAst(ToolSyntax syntax, const ToolsRequest& req);

// The constraint for a request whose tool_choice is required or named; a 400 naming
// `tools[i].function.parameters` when a schema is not supported.
std::optional<ApiError> BuildToolConstraint(ToolSyntax syntax, const ToolsRequest& req,
                                            ToolConstraint* out);

// Whether `req` asks for enforcement (required or named).
inline bool ToolChoiceForced(const ToolsRequest& req) {
  return !req.tools.empty() &&
         (req.choice == ToolChoice::kRequired || req.choice == ToolChoice::kNamed);
}

}  // namespace chorus::server

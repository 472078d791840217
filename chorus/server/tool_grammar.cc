#include "chorus/server/tool_grammar.h"

#include "chorus/grammar/json_schema.h"

namespace chorus::server {
namespace {

using grammar::Expr;
using grammar::GrammarAst;

// The allowed functions' indices in req.tools.
std::vector<size_t> Allowed(const ToolsRequest& req) {
  std::vector<size_t> out;
  for (size_t i = 0; i < req.tools.size(); ++i) {
    if (req.choice != ToolChoice::kNamed || req.tools[i].name == req.named) out.push_back(i);
  }
  return out;
}

// A function's arguments schema: `parameters`, an object when it names no type; absent or {}
// (OpenAI: a function without parameters) admits only the empty object.
nlohmann::json ArgumentsSchema(const ToolSpec& t) {
  if (t.parameters.empty()) {
    return {{"type", "object"},
            {"properties", nlohmann::json::object()},
            {"additionalProperties", false}};
  }
  nlohmann::json s = nlohmann::json::parse(t.parameters.dump());
  if (s.is_object() && !s.contains("type") && !s.contains("anyOf") && !s.contains("oneOf") &&
      !s.contains("$ref") && !s.contains("enum") && !s.contains("const")) {
    s["type"] = "object";
  }
  return s;
}

std::string Opening(ToolSyntax syntax) {
  switch (syntax) {
    case ToolSyntax::kHermes:
    case ToolSyntax::kGeneric:
      return "<tool_call>\n";
    case ToolSyntax::kMistral:
      return "[TOOL_CALLS]";
    case ToolSyntax::kLlama3Json:
      return "";
  }
  return "";
}

}  // namespace

Result<GrammarAst> ToolCallAst(ToolSyntax syntax, const ToolsRequest& req) {
  GrammarAst ast;
  const char* args_key = syntax == ToolSyntax::kLlama3Json ? "parameters" : "arguments";
  std::vector<Expr> calls;
  for (size_t i : Allowed(req)) {
    const ToolSpec& t = req.tools[i];
    auto args = grammar::JsonSchemaToAst(ArgumentsSchema(t));
    if (!args.ok()) {
      return InvalidArgumentError("tools[" + std::to_string(i) +
                                  "].function.parameters: " + args.status().message());
    }
    std::string prefix = "f";
    prefix += std::to_string(i);
    prefix += '-';
    const int root = ast.Embed(*args, prefix);
    // Tool names are [A-Za-z0-9_.:-] (ParseToolsRequest), so they need no JSON escaping.
    calls.push_back(
        Expr::Seq({Expr::Literal("{\"name\": \"" + t.name + "\", \"" + args_key + "\": "),
                   Expr::Ref(root), Expr::Literal("}")}));
  }
  Expr call = Expr::Alt(std::move(calls));
  Expr body;
  switch (syntax) {
    case ToolSyntax::kHermes:
    case ToolSyntax::kGeneric:
      body = Expr::Seq({std::move(call), Expr::Literal("\n</tool_call>")});
      break;
    case ToolSyntax::kMistral:
      body = Expr::Seq({Expr::Literal("["), std::move(call), Expr::Literal("]")});
      break;
    case ToolSyntax::kLlama3Json:
      body = std::move(call);
      break;
  }
  ast.root = ast.Define("tool-call-root", std::move(body));
  return ast;
}

std::optional<ApiError> BuildToolConstraint(ToolSyntax syntax, const ToolsRequest& req,
                                            ToolConstraint* out) {
  // The cache key: everything the grammar depends on.
  std::string key = std::string("tool_call:") + ToolSyntaxName(syntax) + ":";
  for (size_t i : Allowed(req)) {
    key += req.tools[i].name + "=" + req.tools[i].parameters.dump() + ";";
  }
  std::string param;
  auto g = grammar::SharedGrammarCache().GetOrCompile(key, [&]() -> Result<grammar::Grammar> {
    auto ast = ToolCallAst(syntax, req);
    if (!ast.ok()) return ast.status();
    return grammar::Grammar::FromAst(*ast);
  });
  if (!g.ok()) {
    const std::string& m = g.status().message();
    // "tools[i].function.parameters: ..." names its field.
    const size_t colon = m.find(": ");
    if (m.starts_with("tools[") && colon != std::string::npos) param = m.substr(0, colon);
    return BadRequest("a forced tool call cannot be built: " + m.substr(0, 300),
                      param.empty() ? "tools" : param);
  }
  out->opening = Opening(syntax);
  out->grammar = std::move(*g);
  return std::nullopt;
}

}  // namespace chorus::server

// Internal to chat templates (chat_template.h): the parsed template (expression and
// statement trees) and the parser entry point. Evaluation lives in jinja_interp.cc.
//
// Ownership: a Program owns its whole tree; nodes never change after parsing, so one
// Program is shared by concurrent renders.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/tokenizer/jinja_value.h"

namespace chorus::tokenizer::jinja {

class Interp;

using FilterFn = Result<Value> (*)(Interp& in, const Value& input, CallArgs& args);
using TestFn = Result<bool> (*)(Interp& in, const Value& input, CallArgs& args);

// Looks up a filter / test by name (nullptr when there is no such builtin).
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);
// Every builtin filter / test name (sorted), for tests that check their coverage.
std::vector<std::string> FilterNames();
std::vector<std::string> TestNames();

struct Node {
  int line = 0;
  int col = 0;
};

// ---------------------------------------------------------------- expressions

struct Expr : Node {
  virtual ~Expr() = default;
  virtual Result<Value> Eval(Interp& in) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct ArgList {
  std::vector<ExprPtr> pos;
  std::vector<std::pair<std::string, ExprPtr>> kw;
};

struct LiteralExpr : Expr {
  Value value;
  Result<Value> Eval(Interp& in) const override;
};
struct NameExpr : Expr {
  std::string name;
  Result<Value> Eval(Interp& in) const override;
};
struct ListExpr : Expr {  // [a, b] and tuples (a, b)
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  Result<Value> Eval(Interp& in) const override;
};
struct DictExpr : Expr {
  std::vector<std::pair<ExprPtr, ExprPtr>> items;
  Result<Value> Eval(Interp& in) const override;
};
struct AttrExpr : Expr {  // obj.name
  ExprPtr obj;
  std::string name;
  Result<Value> Eval(Interp& in) const override;
};
struct IndexExpr : Expr {  // obj[index]
  ExprPtr obj;
  ExprPtr index;
  Result<Value> Eval(Interp& in) const override;
};
struct SliceExpr : Expr {  // obj[start:stop:step], each part optional
  ExprPtr obj, start, stop, step;
  Result<Value> Eval(Interp& in) const override;
};
struct CallExpr : Expr {  // callee(args) — global functions and macros
  ExprPtr callee;
  ArgList args;
  Result<Value> Eval(Interp& in) const override;
};
struct MethodCallExpr : Expr {  // obj.name(args) — str/dict methods
  ExprPtr obj;
  std::string name;
  ArgList args;
  Result<Value> Eval(Interp& in) const override;
};
struct FilterExpr : Expr {  // obj | name(args)
  ExprPtr obj;
  std::string name;
  // Null for a name that is not a filter: as in Jinja 3, that is an error only when the
  // expression is evaluated (the parser rejects it outside `if` tests, bodies and `x if c`).
  FilterFn fn = nullptr;
  ArgList args;
  Result<Value> Eval(Interp& in) const override;
};
struct TestExpr : Expr {  // obj is [not] name(args)
  ExprPtr obj;
  std::string name;
  TestFn fn = nullptr;  // null: unknown test, an error when evaluated (see FilterExpr)
  ArgList args;
  bool negated = false;
  Result<Value> Eval(Interp& in) const override;
};
struct UnaryExpr : Expr {
  enum class Op : uint8_t { kNot, kNeg, kPos };
  Op op = Op::kNot;
  ExprPtr x;
  Result<Value> Eval(Interp& in) const override;
};
struct BinaryExpr : Expr {
  enum class Op : uint8_t {
    kOr,
    kAnd,
    kEq,
    kNe,
    kLt,
    kGt,
    kLe,
    kGe,
    kIn,
    kNotIn,
    kAdd,
    kSub,
    kMul,
    kDiv,
    kFloorDiv,
    kMod,
    kPow,
    kConcat,
  };
  Op op = Op::kAdd;
  ExprPtr a, b;
  Result<Value> Eval(Interp& in) const override;
};
// a < b < c: Python/Jinja chaining — (a < b) and (b < c), each operand evaluated once.
struct CompareChainExpr : Expr {
  ExprPtr first;
  std::vector<std::pair<BinaryExpr::Op, ExprPtr>> rest;
  Result<Value> Eval(Interp& in) const override;
};
// The value a {% filter %} block feeds into its filter chain.
struct BlockValueExpr : Expr {
  Result<Value> Eval(Interp& in) const override;
};
struct CondExpr : Expr {          // then if cond else otherwise
  ExprPtr cond, then, otherwise;  // otherwise may be null (→ undefined)
  Result<Value> Eval(Interp& in) const override;
};

// ---------------------------------------------------------------- statements

struct Stmt : Node {
  virtual ~Stmt() = default;
  virtual Status Exec(Interp& in) const = 0;
};
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct TextStmt : Stmt {
  std::string text;
  Status Exec(Interp& in) const override;
};
struct OutputStmt : Stmt {  // {{ expr }}
  ExprPtr expr;
  Status Exec(Interp& in) const override;
};
struct IfStmt : Stmt {
  std::vector<std::pair<ExprPtr, Body>> branches;  // if, elif...
  Body else_body;
  Status Exec(Interp& in) const override;
};
struct ForStmt : Stmt {
  std::vector<std::string> targets;  // `for a in` or `for k, v in`
  ExprPtr iter;
  ExprPtr filter;  // `for x in xs if cond` (may be null)
  Body body;
  Body else_body;
  bool recursive = false;  // `for ... recursive`: the body may call loop(children)
  Status Exec(Interp& in) const override;
  // Runs the loop over `seq` at nesting `depth` (1 for the statement itself; a recursive
  // loop(children) call runs it again one deeper).
  Status Run(Interp& in, const Value& seq, int64_t depth) const;
};
struct SetStmt : Stmt {
  std::vector<std::string> targets;  // `set a = ...`, `set a, b = ...`
  std::string ns_attr;               // `set ns.attr = ...` (targets = {ns})
  ExprPtr value;                     // null for a block set
  Body block;                        // {% set x %}...{% endset %}
  ExprPtr block_filter;              // {% set x | f %}: filters on a BlockValueExpr (or null)
  Status Exec(Interp& in) const override;
};
struct MacroStmt : Stmt {
  std::string name;
  std::vector<std::pair<std::string, ExprPtr>> params;  // default may be null
  Body body;
  // Whether the body mentions `varargs` / `kwargs` / `caller` (Jinja then accepts extra
  // positional / keyword arguments, or a call block).
  bool uses_varargs = false;
  bool uses_kwargs = false;
  bool uses_caller = false;
  Status Exec(Interp& in) const override;
};
struct LoopControlStmt : Stmt {  // {% break %} / {% continue %}
  bool is_break = true;
  Status Exec(Interp& in) const override;
};
struct BlockStmt : Stmt {  // {% generation %} / {% block %}: renders its body
  Body body;
  Status Exec(Interp& in) const override;
};
// {% call(params) macro(args) %}body{% endcall %}: calls the macro with `caller` bound to
// the body (a macro with `params`, closing over the variables visible at the call).
struct CallBlockStmt : Stmt {
  MacroStmt caller;
  std::unique_ptr<CallExpr> call;
  Status Exec(Interp& in) const override;
};
// {% filter f(args) | g %}body{% endfilter %}: the rendered body through the filters.
struct FilterBlockStmt : Stmt {
  ExprPtr chain;  // filters applied to a BlockValueExpr
  Body body;
  Status Exec(Interp& in) const override;
};
// {% with a = x, b = y %}body{% endwith %}: a scope with those variables.
struct WithStmt : Stmt {
  std::vector<std::pair<std::string, ExprPtr>> vars;
  Body body;
  Status Exec(Interp& in) const override;
};
// {% include %}, {% import %}, {% from %}, {% extends %}: parsed, but Hugging Face renders from
// a string with no template loader, so executing one is an error (as in Jinja).
struct LoaderStmt : Stmt {
  std::string tag;
  Status Exec(Interp& in) const override;
};

struct Program {
  std::string source;
  Body body;
};

// Parses a template (see jinja_lexer.h for the whitespace rules).
Result<std::shared_ptr<const Program>> ParseProgram(std::string_view source);

}  // namespace chorus::tokenizer::jinja

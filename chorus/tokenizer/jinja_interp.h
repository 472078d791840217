// Internal to chat templates (chat_template.h): the tree-walking interpreter state of one
// render — scopes, output buffer and the budgets that bound a render.
//
// Thread-safety: one Interp per render, used by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/tokenizer/jinja_ast.h"
#include "chorus/tokenizer/jinja_value.h"

namespace chorus::tokenizer::jinja {

struct Limits {
  size_t max_output_bytes = size_t{4} << 20;
  int64_t max_steps = 5'000'000;
  int64_t max_alloc_bytes = int64_t{64} << 20;
  int max_call_depth = 64;
};

// A scope's variables; scopes hold a handful of names, so a flat list beats hashing.
using VarList = std::vector<std::pair<std::string, Value>>;

class Interp {
 public:
  // `globals` become the root scope (the render variables).
  Interp(const Limits& limits, std::unordered_map<std::string, Value> globals);

  // Renders `body` into *out.
  Status Run(const Body& body, std::string* out);

  // ---- scopes (Jinja: for loops and macros open a scope; if/set do not)
  Value Lookup(const std::string& name) const;
  void Set(const std::string& name, Value v);
  void PushScope();
  void PopScope();

  // ---- output
  Status Write(std::string_view s);
  // Renders `body` into a fresh string (macro calls, block set).
  Result<std::string> Capture(const Body& body);
  // What `f` writes, as a fresh string (a recursive loop's loop(children)).
  Result<std::string> CaptureWith(const std::function<Status()>& f);
  Status ExecBody(const Body& body);

  // ---- budgets
  Status Step(int64_t n = 1) {
    steps_ += n;
    if (steps_ > limits_.max_steps) [[unlikely]]
      return StepsExceeded();
    return OkStatus();
  }
  // Charges `bytes` of allocation; also fails when one string would exceed the output cap.
  Status Alloc(int64_t bytes);
  Status CheckStringSize(size_t bytes) const;
  size_t max_output_bytes() const { return limits_.max_output_bytes; }

  // ---- value helpers (budgeted)
  Result<Value> MakeList(std::vector<Value> items, bool tuple = false,
                         SeqKind seq = SeqKind::kList);
  Result<Value> MakeString(std::string s);
  Result<bool> Equal(const Value& a, const Value& b);
  Result<std::string> ToStr(const Value& v);
  // Items a `for` loop visits (lists; dict keys; string characters; undefined → none).
  Result<std::vector<Value>> Iterate(const Value& v, const Node& at);

  // Every variable visible here (innermost wins), for a closure (a call block's caller).
  VarList VisibleLocals() const;

  // ---- calls
  // Calls macro `m`. `caller`: the body of a {% call %} block; `closure`: variables the
  // macro body sees besides its parameters (a caller sees those of its call site).
  Result<Value> CallMacro(const MacroStmt& m, CallArgs& args, const Node& at,
                          const Value* caller = nullptr, const VarList* closure = nullptr);
  // Calls any callable value (builtin, macro, caller).
  Result<Value> CallValue(const Value& f, CallArgs& args, const Node& at);
  int& call_depth() { return call_depth_; }
  const Limits& limits() const { return limits_; }

  // Loop control signalled by {% break %} / {% continue %}.
  enum class Flow : uint8_t { kNormal, kBreak, kContinue };
  Flow flow = Flow::kNormal;

  // The value of the enclosing {% filter %} block (BlockValueExpr).
  Value block_value;
  // Per running for-loop (innermost last): the last value given to loop.changed().
  std::vector<Value> loop_changed;
  // Seconds since the epoch for strftime_now (negative: the current time).
  int64_t now_unix = -1;

 private:
  Status StepsExceeded() const;
  Limits limits_;
  std::string* out_ = nullptr;
  int64_t steps_ = 0;
  int64_t alloc_ = 0;
  int call_depth_ = 0;
  // scopes_[0] is the root; lookups scan scopes_[floor_..] then scopes_[0] (a macro body
  // sees its own scopes and the template's top level, not its caller's locals).
  // scopes_[0, n_scopes_) are live; popped ones keep their capacity for the next push (a loop
  // opens a scope per iteration).
  std::vector<VarList> scopes_;
  size_t n_scopes_ = 0;
  size_t floor_ = 0;
};

// "chat template error at line L, column C: what" (kInvalidArgument).
Status RuntimeError(const Node& at, std::string_view what);

}  // namespace chorus::tokenizer::jinja

#include "chorus/tokenizer/jinja_interp.h"

#include <cmath>
#include <limits>
#include <utility>

#include "chorus/tokenizer/jinja_builtins.h"
#include "chorus/tokenizer/jinja_strings.h"

namespace chorus::tokenizer::jinja {

namespace {

// Bytes charged per list slot or dict entry (the allocation budget counts these).
constexpr int64_t kSlotBytes = 16;

struct ScopeGuard {
  explicit ScopeGuard(Interp& in) : in_(in) { in_.PushScope(); }
  ~ScopeGuard() { in_.PopScope(); }
  Interp& in_;
};

bool IsNumeric(const Value& v) { return v.is_int() || v.is_float() || v.is_bool(); }

std::string BinOpName(BinaryExpr::Op op) {
  switch (op) {
    case BinaryExpr::Op::kAdd:
      return "+";
    case BinaryExpr::Op::kSub:
      return "-";
    case BinaryExpr::Op::kMul:
      return "*";
    case BinaryExpr::Op::kDiv:
      return "/";
    case BinaryExpr::Op::kFloorDiv:
      return "//";
    case BinaryExpr::Op::kMod:
      return "%";
    case BinaryExpr::Op::kPow:
      return "**";
    case BinaryExpr::Op::kLt:
      return "<";
    case BinaryExpr::Op::kGt:
      return ">";
    case BinaryExpr::Op::kLe:
      return "<=";
    case BinaryExpr::Op::kGe:
      return ">=";
    default:
      return "?";
  }
}

Status TypeError(const Node& at, BinaryExpr::Op op, const Value& a, const Value& b) {
  if (a.is_undefined()) return RuntimeError(at, a.str());
  if (b.is_undefined()) return RuntimeError(at, b.str());
  return RuntimeError(at, "unsupported operand type(s) for " + BinOpName(op) + ": '" +
                              std::string(a.TypeName()) + "' and '" + std::string(b.TypeName()) +
                              "'");
}

Result<Value> EvalArgs(Interp& in, const ArgList& list, CallArgs* out) {
  for (const auto& e : list.pos) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    out->pos.push_back(std::move(v));
  }
  for (const auto& [k, e] : list.kw) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    out->kw.emplace_back(k, std::move(v));
  }
  return Value();
}

// Errors from builtins carry no position; add it (resource errors pass unchanged so the
// caller can tell them apart).
Status WithPosition(const Status& s, const Node& at, std::string_view what) {
  if (s.ok() || s.code() != StatusCode::kInvalidArgument) return s;
  return RuntimeError(at, std::string(what) + ": " + s.message());
}

Result<Value> Arith(Interp& in, const Node& at, BinaryExpr::Op op, const Value& a, const Value& b) {
  using Op = BinaryExpr::Op;
  // String and list operators.
  if (op == Op::kAdd && a.is_string() && b.is_string()) {
    CHORUS_RETURN_IF_ERROR(in.CheckStringSize(a.str().size() + b.str().size()));
    return in.MakeString(a.str() + b.str());
  }
  if (op == Op::kMod && a.is_string()) {
    CHORUS_ASSIGN_OR_RETURN(std::string r, PyPercent(a.str(), b, in.max_output_bytes()));
    return in.MakeString(std::move(r));
  }
  if (op == Op::kAdd && a.is_plain_list() && b.is_plain_list()) {
    const bool tuple = a.is_tuple() && b.is_tuple();
    std::vector<Value> items;
    CHORUS_RETURN_IF_ERROR(
        in.Alloc(static_cast<int64_t>(a.list().size() + b.list().size()) * kSlotBytes));
    items.reserve(a.list().size() + b.list().size());
    items.insert(items.end(), a.list().begin(), a.list().end());
    items.insert(items.end(), b.list().begin(), b.list().end());
    return in.MakeList(std::move(items), tuple);
  }
  if (op == Op::kMul && ((a.is_string() || a.is_plain_list()) && (b.is_int() || b.is_bool()))) {
    return Arith(in, at, op, b, a);
  }
  if (op == Op::kMul && (a.is_int() || a.is_bool()) && (b.is_string() || b.is_plain_list())) {
    const int64_t n = std::max<int64_t>(0, a.int_value());
    if (b.is_string()) {
      const size_t unit = b.str().size();
      if (unit != 0 && static_cast<uint64_t>(n) > in.max_output_bytes() / unit) {
        return in.CheckStringSize(in.max_output_bytes() + 1);
      }
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(unit * static_cast<size_t>(n)));
      CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(unit) * n));
      std::string s;
      s.reserve(unit * static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) s += b.str();
      return Value::Str(std::move(s));
    }
    const size_t unit = b.list().size();
    if (unit != 0 &&
        n > std::numeric_limits<int64_t>::max() / kSlotBytes / static_cast<int64_t>(unit)) {
      return in.Alloc(std::numeric_limits<int64_t>::max());
    }
    CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(unit) * n * kSlotBytes));
    std::vector<Value> items;
    items.reserve(unit * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) items.insert(items.end(), b.list().begin(), b.list().end());
    return in.MakeList(std::move(items), b.is_tuple());
  }
  if (!IsNumeric(a) || !IsNumeric(b)) return TypeError(at, op, a, b);

  const bool both_int = !a.is_float() && !b.is_float();
  if (both_int) {
    const int64_t x = a.int_value(), y = b.int_value();
    int64_t r = 0;
    switch (op) {
      case Op::kAdd:
        if (__builtin_add_overflow(x, y, &r)) return RuntimeError(at, "integer overflow");
        return Value::Int(r);
      case Op::kSub:
        if (__builtin_sub_overflow(x, y, &r)) return RuntimeError(at, "integer overflow");
        return Value::Int(r);
      case Op::kMul:
        if (__builtin_mul_overflow(x, y, &r)) return RuntimeError(at, "integer overflow");
        return Value::Int(r);
      case Op::kDiv:
        if (y == 0) return RuntimeError(at, "division by zero");
        return Value::Float(static_cast<double>(x) / static_cast<double>(y));
      case Op::kFloorDiv:
      case Op::kMod: {
        if (y == 0) return RuntimeError(at, "integer division or modulo by zero");
        if (x == std::numeric_limits<int64_t>::min() && y == -1) {
          return RuntimeError(at, "integer overflow");
        }
        // Python semantics: the remainder takes the sign of the divisor.
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        return Value::Int(op == Op::kFloorDiv ? q : m);
      }
      case Op::kPow: {
        if (y < 0) return Value::Float(std::pow(static_cast<double>(x), static_cast<double>(y)));
        int64_t result = 1, base = x, e = y;
        while (e > 0) {
          if (e & 1) {
            if (__builtin_mul_overflow(result, base, &result)) {
              return RuntimeError(at, "integer overflow");
            }
          }
          e >>= 1;
          if (e > 0 && __builtin_mul_overflow(base, base, &base)) {
            return RuntimeError(at, "integer overflow");
          }
        }
        return Value::Int(result);
      }
      default:
        break;
    }
    return TypeError(at, op, a, b);
  }
  const double x = a.AsDouble(), y = b.AsDouble();
  switch (op) {
    case Op::kAdd:
      return Value::Float(x + y);
    case Op::kSub:
      return Value::Float(x - y);
    case Op::kMul:
      return Value::Float(x * y);
    case Op::kDiv:
      if (y == 0) return RuntimeError(at, "float division by zero");
      return Value::Float(x / y);
    case Op::kFloorDiv:
      if (y == 0) return RuntimeError(at, "float floor division by zero");
      return Value::Float(std::floor(x / y));
    case Op::kMod: {
      if (y == 0) return RuntimeError(at, "float modulo by zero");
      double m = std::fmod(x, y);
      if (m != 0 && ((m < 0) != (y < 0))) m += y;
      return Value::Float(m);
    }
    case Op::kPow:
      return Value::Float(std::pow(x, y));
    default:
      break;
  }
  return TypeError(at, op, a, b);
}

Result<Value> Compare(Interp& in, const Node& at, BinaryExpr::Op op, const Value& a,
                      const Value& b) {
  using Op = BinaryExpr::Op;
  int c = 0;
  if (IsNumeric(a) && IsNumeric(b)) {
    if (!a.is_float() && !b.is_float()) {
      c = a.int_value() < b.int_value() ? -1 : (a.int_value() > b.int_value() ? 1 : 0);
    } else {
      const double x = a.AsDouble(), y = b.AsDouble();
      if (std::isnan(x) || std::isnan(y)) return Value::Bool(false);
      c = x < y ? -1 : (x > y ? 1 : 0);
    }
  } else if (a.is_string() && b.is_string()) {
    // Byte order of UTF-8 equals code point order (Python's str comparison).
    c = a.str().compare(b.str());
    c = c < 0 ? -1 : (c > 0 ? 1 : 0);
  } else if (a.is_plain_list() && b.is_plain_list() && a.is_tuple() == b.is_tuple()) {
    // Lexicographic: the first unequal pair decides, else the shorter sequence is smaller.
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(x[i], y[i]));
      if (!eq) return Compare(in, at, op, x[i], y[i]);
    }
    c = x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  } else {
    return TypeError(at, op, a, b);
  }
  switch (op) {
    case Op::kLt:
      return Value::Bool(c < 0);
    case Op::kGt:
      return Value::Bool(c > 0);
    case Op::kLe:
      return Value::Bool(c <= 0);
    case Op::kGe:
      return Value::Bool(c >= 0);
    default:
      break;
  }
  return TypeError(at, op, a, b);
}

Result<bool> Contains(Interp& in, const Node& at, const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        return RuntimeError(at, "'in <string>' requires string as left operand, not " +
                                    std::string(item.TypeName()));
      }
      CHORUS_RETURN_IF_ERROR(in.Step(static_cast<int64_t>(container.str().size() / 64)));
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& e : container.list()) {
        CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(e, item));
        if (eq) return true;
      }
      return false;
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return item.is_string() && container.dict().Find(item.str()) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    default:
      return RuntimeError(
          at, "argument of type '" + std::string(container.TypeName()) + "' is not iterable");
  }
}

Status BindTargets(Interp& in, const Node& at, const std::vector<std::string>& targets,
                   const Value& item) {
  if (targets.size() == 1) {
    in.Set(targets[0], item);
    return OkStatus();
  }
  if (!item.is_list() || item.list().size() != targets.size()) {
    return RuntimeError(at, "cannot unpack " + std::string(item.TypeName()) + " into " +
                                std::to_string(targets.size()) + " names");
  }
  for (size_t i = 0; i < targets.size(); ++i) in.Set(targets[i], item.list()[i]);
  return OkStatus();
}

// Python slice index normalisation (PySlice_AdjustIndices).
int64_t AdjustIndex(int64_t i, int64_t n, int64_t step) {
  if (i < 0) {
    i += n;
    if (i < 0) i = step < 0 ? -1 : 0;
  } else if (i >= n) {
    i = step < 0 ? n - 1 : n;
  }
  return i;
}

Result<Value> EvalBinaryOp(Interp& in, const Node& at, BinaryExpr::Op op, const Value& x,
                           const Value& y);

}  // namespace

Status RuntimeError(const Node& at, std::string_view what) {
  return InvalidArgumentError("chat template error at line " + std::to_string(at.line) +
                              ", column " + std::to_string(at.col) + ": " + std::string(what));
}

// ---------------------------------------------------------------- Interp

Interp::Interp(const Limits& limits, std::unordered_map<std::string, Value> globals)
    : limits_(limits) {
  scopes_.emplace_back();
  for (auto& [k, v] : globals) scopes_[0].emplace_back(k, std::move(v));
  n_scopes_ = 1;
}

Status Interp::Run(const Body& body, std::string* out) {
  out_ = out;
  return ExecBody(body);
}

namespace {
const Value* FindVar(const VarList& vars, const std::string& name) {
  for (const auto& [k, v] : vars) {
    if (k == name) return &v;
  }
  return nullptr;
}
}  // namespace

Value Interp::Lookup(const std::string& name) const {
  for (size_t i = n_scopes_; i-- > floor_;) {
    if (const Value* v = FindVar(scopes_[i], name)) return *v;
  }
  if (floor_ > 0) {
    if (const Value* v = FindVar(scopes_[0], name)) return *v;
  }
  if (const Value* g = FindGlobal(name)) return *g;
  return Value::Undefined("'" + name + "' is undefined");
}

void Interp::Set(const std::string& name, Value v) {
  VarList& vars = scopes_[n_scopes_ - 1];
  for (auto& [k, old] : vars) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars.emplace_back(name, std::move(v));
}
void Interp::PushScope() {
  if (n_scopes_ == scopes_.size()) scopes_.emplace_back();
  ++n_scopes_;
}
void Interp::PopScope() { scopes_[--n_scopes_].clear(); }

Status Interp::Write(std::string_view s) {
  if (out_->size() + s.size() > limits_.max_output_bytes) {
    return ResourceExhaustedError("chat template output exceeds " +
                                  std::to_string(limits_.max_output_bytes) + " bytes");
  }
  CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(s.size())));
  out_->append(s);
  return OkStatus();
}

Result<std::string> Interp::Capture(const Body& body) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  Status s = ExecBody(body);
  out_ = saved;
  if (!s.ok()) return s;
  return buf;
}

Result<std::string> Interp::CaptureWith(const std::function<Status()>& f) {
  std::string buf;
  std::string* saved = out_;
  out_ = &buf;
  Status s = f();
  out_ = saved;
  if (!s.ok()) return s;
  return buf;
}

Status Interp::ExecBody(const Body& body) {
  for (const auto& stmt : body) {
    CHORUS_RETURN_IF_ERROR(Step());
    CHORUS_RETURN_IF_ERROR(stmt->Exec(*this));
    if (flow != Flow::kNormal) return OkStatus();
  }
  return OkStatus();
}

Status Interp::StepsExceeded() const {
  return ResourceExhaustedError("chat template exceeded " + std::to_string(limits_.max_steps) +
                                " evaluation steps (runaway loop?)");
}

Status Interp::Alloc(int64_t bytes) {
  if (bytes > limits_.max_alloc_bytes - alloc_) {
    alloc_ = limits_.max_alloc_bytes;
    return ResourceExhaustedError("chat template allocated more than " +
                                  std::to_string(limits_.max_alloc_bytes) + " bytes");
  }
  alloc_ += bytes;
  return OkStatus();
}

Status Interp::CheckStringSize(size_t bytes) const {
  if (bytes > limits_.max_output_bytes) {
    return ResourceExhaustedError("chat template built a string longer than " +
                                  std::to_string(limits_.max_output_bytes) + " bytes");
  }
  return OkStatus();
}

Result<Value> Interp::MakeList(std::vector<Value> items, bool tuple, SeqKind seq) {
  CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(items.size()) * kSlotBytes));
  Value v = tuple                   ? Value::Tuple(std::move(items))
            : seq != SeqKind::kList ? Value::Seq(std::move(items), seq)
                                    : Value::List(std::move(items));
  if (v.depth() > kMaxValueDepth) {
    return InvalidArgumentError("chat template built lists nested deeper than " +
                                std::to_string(kMaxValueDepth) + " levels");
  }
  return v;
}

Result<Value> Interp::MakeString(std::string s) {
  CHORUS_RETURN_IF_ERROR(CheckStringSize(s.size()));
  CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(s.size())));
  return Value::Str(std::move(s));
}

Result<bool> Interp::Equal(const Value& a, const Value& b) {
  CHORUS_RETURN_IF_ERROR(Step());
  if (IsNumeric(a) && IsNumeric(b)) {
    if (!a.is_float() && !b.is_float()) return a.int_value() == b.int_value();
    return a.AsDouble() == b.AsDouble();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      CHORUS_RETURN_IF_ERROR(Step(static_cast<int64_t>(a.str().size() / 256)));
      return a.str() == b.str();
    case Value::Kind::kList: {
      const auto& x = a.list();
      const auto& y = b.list();
      if (a.seq_kind() != b.seq_kind()) return false;
      if (a.seq_kind() == SeqKind::kGenerator) return &x == &y;
      if (x.size() != y.size() || a.is_tuple() != b.is_tuple()) return false;
      if (&x == &y) return true;
      for (size_t i = 0; i < x.size(); ++i) {
        CHORUS_ASSIGN_OR_RETURN(bool eq, Equal(x[i], y[i]));
        if (!eq) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.dict();
      const auto& y = b.dict();
      if (x.items.size() != y.items.size()) return false;
      if (&x == &y) return true;
      for (const auto& [k, v] : x.items) {
        const Value* other = y.Find(k);
        if (other == nullptr) return false;
        CHORUS_ASSIGN_OR_RETURN(bool eq, Equal(v, *other));
        if (!eq) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.dict() == &b.dict();
    case Value::Kind::kCallable:
      return &a.callable() == &b.callable();
    default:
      return false;
  }
}

Result<std::string> Interp::ToStr(const Value& v) {
  if (v.is_string()) return v.str();
  std::string s;
  CHORUS_RETURN_IF_ERROR(AppendStr(v, &s, limits_.max_output_bytes));
  CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(s.size())));
  return s;
}

Result<std::vector<Value>> Interp::Iterate(const Value& v, const Node& at) {
  std::vector<Value> items;
  switch (v.kind()) {
    case Value::Kind::kList:
      CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(v.list().size()) * kSlotBytes));
      return v.list();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(v.dict().items.size()) * kSlotBytes));
      for (const auto& kv : v.dict().items) items.push_back(Value::Str(kv.first));
      return items;
    case Value::Kind::kString: {
      const auto offs = Utf8Offsets(v.str());
      CHORUS_RETURN_IF_ERROR(Alloc(static_cast<int64_t>(offs.size()) * kSlotBytes));
      for (size_t i = 0; i + 1 < offs.size(); ++i) {
        items.push_back(Value::Str(v.str().substr(offs[i], offs[i + 1] - offs[i])));
      }
      return items;
    }
    case Value::Kind::kUndefined:
      return items;
    default:
      return RuntimeError(at, "'" + std::string(v.TypeName()) + "' object is not iterable");
  }
}

VarList Interp::VisibleLocals() const {
  VarList out;
  for (size_t i = n_scopes_; i-- > floor_;) {
    if (i == 0) break;
    for (const auto& [k, v] : scopes_[i]) {
      if (FindVar(out, k) == nullptr) out.emplace_back(k, v);  // the innermost wins
    }
  }
  return out;
}

Result<Value> Interp::CallMacro(const MacroStmt& m, CallArgs& args, const Node& at,
                                const Value* caller, const VarList* closure) {
  if (call_depth_ >= limits_.max_call_depth) {
    return ResourceExhaustedError("chat template macro calls nest deeper than " +
                                  std::to_string(limits_.max_call_depth));
  }
  if (args.pos.size() > m.params.size() && !m.uses_varargs) {
    return RuntimeError(at, "macro '" + m.name + "' takes not more than " +
                                std::to_string(m.params.size()) + " argument(s)");
  }
  std::vector<std::pair<std::string, Value>> extra_kw;
  for (const auto& [k, v] : args.kw) {
    bool known = false;
    for (size_t i = 0; i < m.params.size(); ++i) {
      if (m.params[i].first == k) {
        known = true;
        if (i < args.pos.size()) {
          return RuntimeError(
              at, "macro '" + m.name + "' got multiple values for argument '" + k + "'");
        }
      }
    }
    if (known) continue;
    if (k == "caller" && m.uses_caller) continue;
    if (!m.uses_kwargs) {
      return RuntimeError(at, "macro '" + m.name + "' takes no keyword argument '" + k + "'");
    }
    extra_kw.emplace_back(k, v);
  }
  if (caller != nullptr && !m.uses_caller) {
    return RuntimeError(at, "macro '" + m.name + "' takes no keyword argument 'caller'");
  }
  ++call_depth_;
  const size_t saved_floor = floor_;
  PushScope();
  floor_ = n_scopes_ - 1;
  auto restore = [&]() {
    while (n_scopes_ > floor_) PopScope();
    floor_ = saved_floor;
    --call_depth_;
    flow = Flow::kNormal;
  };
  if (closure != nullptr) {
    for (const auto& [k, v] : *closure) Set(k, v);
  }
  for (size_t i = 0; i < m.params.size(); ++i) {
    const auto& [pname, pdefault] = m.params[i];
    Value v;
    if (i < args.pos.size()) {
      v = args.pos[i];
    } else if (const Value* kv = args.Kw(pname)) {
      v = *kv;
    } else if (pdefault) {
      auto r = pdefault->Eval(*this);
      if (!r.ok()) {
        restore();
        return r.status();
      }
      v = std::move(r).value();
    } else {
      v = Value::Undefined("parameter '" + pname + "' was not provided");
    }
    Set(pname, std::move(v));
  }
  if (m.uses_varargs) {
    std::vector<Value> rest;
    for (size_t i = m.params.size(); i < args.pos.size(); ++i) rest.push_back(args.pos[i]);
    Set("varargs", Value::Tuple(std::move(rest)));
  }
  if (m.uses_kwargs) {
    auto d = std::make_shared<DictData>();
    for (auto& [k, v] : extra_kw) d->Set(k, v);
    Set("kwargs", Value::Dict(std::move(d)));
  }
  if (m.uses_caller) {
    const Value* kw_caller = args.Kw("caller");
    Set("caller", caller != nullptr      ? *caller
                  : kw_caller != nullptr ? *kw_caller
                                         : Value::Undefined("'caller' is undefined"));
  }
  auto text = Capture(m.body);
  restore();
  if (!text.ok()) return text.status();
  return MakeString(std::move(text).value());
}

// The loop object of a recursive loop carries its loop(...) callable under this key.
constexpr std::string_view kLoopRecurseKey = "\x01loop";

Result<Value> Interp::CallValue(const Value& f, CallArgs& args, const Node& at) {
  if (f.is_undefined()) return RuntimeError(at, f.str());
  if (f.is_dict()) {
    if (const Value* r = f.dict().Find(kLoopRecurseKey); r != nullptr && r->is_callable()) {
      return CallValue(*r, args, at);
    }
  }
  if (!f.is_callable()) {
    return RuntimeError(at, "'" + std::string(f.TypeName()) + "' object is not callable");
  }
  const Callable& c = f.callable();
  if (c.macro != nullptr) return CallMacro(*c.macro, args, at, nullptr, c.closure.get());
  if (c.bound != nullptr) {
    auto r = c.bound(*this, c, args);
    if (!r.ok()) return WithPosition(r.status(), at, c.name);
    return r;
  }
  if (c.builtin == nullptr) return RuntimeError(at, "'" + c.name + "' object is not callable");
  auto r = c.builtin(*this, args);
  if (!r.ok() && c.name != "raise_exception") return WithPosition(r.status(), at, c.name);
  return r;
}

// ---------------------------------------------------------------- expressions

Result<Value> LiteralExpr::Eval(Interp& in) const { return value; }

Result<Value> NameExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  return in.Lookup(name);
}

Result<Value> ListExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  std::vector<Value> vals;
  vals.reserve(items.size());
  for (const auto& e : items) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    vals.push_back(std::move(v));
  }
  auto r = in.MakeList(std::move(vals), is_tuple);
  if (!r.ok()) return WithPosition(r.status(), *this, "list");
  return r;
}

Result<Value> DictExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  auto d = std::make_shared<DictData>();
  for (const auto& [ke, ve] : items) {
    CHORUS_ASSIGN_OR_RETURN(Value k, ke->Eval(in));
    CHORUS_ASSIGN_OR_RETURN(Value v, ve->Eval(in));
    if (!k.is_string()) return RuntimeError(*this, "only string keys are supported in dicts");
    CHORUS_RETURN_IF_ERROR(in.Alloc(kSlotBytes + static_cast<int64_t>(k.str().size())));
    d->Set(k.str(), std::move(v));
  }
  if (d->depth > kMaxValueDepth) return RuntimeError(*this, "dicts nested too deeply");
  return Value::Dict(std::move(d));
}

Result<Value> AttrExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  return GetAttr(o, name, *this);
}

Result<Value> IndexExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  CHORUS_ASSIGN_OR_RETURN(Value i, index->Eval(in));
  if (o.is_undefined()) return RuntimeError(*this, o.str());
  if (i.is_string() && (o.is_mapping())) return GetAttr(o, i.str(), *this);
  if (i.is_int() || i.is_bool()) {
    int64_t k = i.int_value();
    if (o.is_plain_list()) {
      const auto n = static_cast<int64_t>(o.list().size());
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::Undefined("list index out of range");
      return o.list()[static_cast<size_t>(k)];
    }
    if (o.is_string()) {
      const auto offs = Utf8Offsets(o.str());
      const auto n = static_cast<int64_t>(offs.size()) - 1;
      if (k < 0) k += n;
      if (k < 0 || k >= n) return Value::Undefined("string index out of range");
      const auto b = offs[static_cast<size_t>(k)], e = offs[static_cast<size_t>(k) + 1];
      return Value::Str(o.str().substr(b, e - b));
    }
  }
  return Value::Undefined("'" + std::string(o.TypeName()) + " object' has no item " +
                          (i.is_string() ? "'" + i.str() + "'" : std::string("of that type")));
}

Result<Value> SliceExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  if (o.is_undefined()) return RuntimeError(*this, o.str());
  auto get = [&](const ExprPtr& e, int64_t* out, bool* given) -> Status {
    *given = false;
    if (!e) return OkStatus();
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    if (v.is_none()) return OkStatus();
    if (!v.is_int() && !v.is_bool()) {
      return RuntimeError(*this, "slice indices must be integers or None");
    }
    *out = v.int_value();
    *given = true;
    return OkStatus();
  };
  int64_t start = 0, stop = 0, step = 1;
  bool has_start, has_stop, has_step;
  CHORUS_RETURN_IF_ERROR(get(this->start, &start, &has_start));
  CHORUS_RETURN_IF_ERROR(get(this->stop, &stop, &has_stop));
  CHORUS_RETURN_IF_ERROR(get(this->step, &step, &has_step));
  if (!has_step) step = 1;
  if (step == 0) return RuntimeError(*this, "slice step cannot be zero");
  if (step == std::numeric_limits<int64_t>::min()) step += 1;

  std::vector<size_t> offs;
  int64_t n;
  if (!o.is_plain_list() && o.is_list()) {
    return Value::Undefined("'" + std::string(o.TypeName()) + "' object is not subscriptable");
  }
  if (o.is_list()) {
    n = static_cast<int64_t>(o.list().size());
  } else if (o.is_string()) {
    offs = Utf8Offsets(o.str());
    n = static_cast<int64_t>(offs.size()) - 1;
  } else {
    // Jinja slices with Python's own operator: a TypeError for anything else.
    return RuntimeError(*this, "'" + std::string(o.TypeName()) + "' object is not subscriptable");
  }
  start = has_start ? AdjustIndex(start, n, step) : (step < 0 ? n - 1 : 0);
  stop = has_stop ? AdjustIndex(stop, n, step) : (step < 0 ? -1 : n);
  std::vector<int64_t> picks;
  if (step > 0) {
    for (int64_t i = start; i < stop; i += step) picks.push_back(i);
  } else {
    for (int64_t i = start; i > stop; i += step) picks.push_back(i);
  }
  CHORUS_RETURN_IF_ERROR(in.Step(static_cast<int64_t>(picks.size() / 16)));
  if (o.is_list()) {
    std::vector<Value> items;
    items.reserve(picks.size());
    for (int64_t i : picks) items.push_back(o.list()[static_cast<size_t>(i)]);
    return in.MakeList(std::move(items), o.is_tuple());
  }
  std::string s;
  for (int64_t i : picks) {
    const auto k = static_cast<size_t>(i);
    s.append(o.str(), offs[k], offs[k + 1] - offs[k]);
  }
  return in.MakeString(std::move(s));
}

Result<Value> CallExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value f, callee->Eval(in));
  if (f.is_undefined()) return RuntimeError(*this, f.str());
  CallArgs args;
  CHORUS_RETURN_IF_ERROR(EvalArgs(in, this->args, &args).status());
  return in.CallValue(f, args, *this);
}

Result<Value> MethodCallExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  if (o.is_undefined()) return RuntimeError(*this, o.str());
  CallArgs args;
  CHORUS_RETURN_IF_ERROR(EvalArgs(in, this->args, &args).status());
  auto r = CallMethod(in, o, name, args);
  if (!r.ok()) return WithPosition(r.status(), *this, name + "()");
  return r;
}

Result<Value> BlockValueExpr::Eval(Interp& in) const { return in.block_value; }

Result<Value> FilterExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  if (fn == nullptr) return RuntimeError(*this, "No filter named '" + name + "' found.");
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  CallArgs args;
  CHORUS_RETURN_IF_ERROR(EvalArgs(in, this->args, &args).status());
  auto r = fn(in, o, args);
  if (!r.ok()) return WithPosition(r.status(), *this, "filter '" + name + "'");
  return r;
}

Result<Value> TestExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  if (fn == nullptr) return RuntimeError(*this, "No test named '" + name + "' found.");
  CHORUS_ASSIGN_OR_RETURN(Value o, obj->Eval(in));
  CallArgs args;
  CHORUS_RETURN_IF_ERROR(EvalArgs(in, this->args, &args).status());
  auto r = fn(in, o, args);
  if (!r.ok()) return WithPosition(r.status(), *this, "test '" + name + "'");
  return Value::Bool(r.value() != negated);
}

Result<Value> UnaryExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value v, x->Eval(in));
  if (op == Op::kNot) return Value::Bool(!v.Truthy());
  if (v.is_float()) return Value::Float(op == Op::kNeg ? -v.float_value() : v.float_value());
  if (v.is_int() || v.is_bool()) {
    if (op == Op::kPos) return Value::Int(v.int_value());
    if (v.int_value() == std::numeric_limits<int64_t>::min()) {
      return RuntimeError(*this, "integer overflow");
    }
    return Value::Int(-v.int_value());
  }
  if (v.is_undefined()) return RuntimeError(*this, v.str());
  return RuntimeError(*this, std::string("bad operand type for unary ") +
                                 (op == Op::kNeg ? "-" : "+") + ": '" + std::string(v.TypeName()) +
                                 "'");
}

Result<Value> BinaryExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value x, a->Eval(in));
  if (op == Op::kOr) {
    if (x.Truthy()) return x;
    return b->Eval(in);
  }
  if (op == Op::kAnd) {
    if (!x.Truthy()) return x;
    return b->Eval(in);
  }
  CHORUS_ASSIGN_OR_RETURN(Value y, b->Eval(in));
  return EvalBinaryOp(in, *this, op, x, y);
}

Result<Value> CompareChainExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value x, first->Eval(in));
  for (const auto& [op, e] : rest) {
    CHORUS_ASSIGN_OR_RETURN(Value y, e->Eval(in));
    CHORUS_ASSIGN_OR_RETURN(Value r, EvalBinaryOp(in, *this, op, x, y));
    if (!r.Truthy()) return Value::Bool(false);
    x = std::move(y);
  }
  return Value::Bool(true);
}

namespace {
// Operators other than and/or (which short-circuit) on evaluated operands.
Result<Value> EvalBinaryOp(Interp& in, const Node& at, BinaryExpr::Op op, const Value& x,
                           const Value& y) {
  using Op = BinaryExpr::Op;
  switch (op) {
    case Op::kEq:
    case Op::kNe: {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(x, y));
      return Value::Bool(eq == (op == Op::kEq));
    }
    case Op::kLt:
    case Op::kGt:
    case Op::kLe:
    case Op::kGe:
      return Compare(in, at, op, x, y);
    case Op::kIn:
    case Op::kNotIn: {
      CHORUS_ASSIGN_OR_RETURN(bool c, Contains(in, at, y, x));
      return Value::Bool(c == (op == Op::kIn));
    }
    case Op::kConcat: {
      CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(x));
      CHORUS_ASSIGN_OR_RETURN(std::string t, in.ToStr(y));
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(s.size() + t.size()));
      s += t;
      return in.MakeString(std::move(s));
    }
    default:
      return Arith(in, at, op, x, y);
  }
}
}  // namespace

Result<Value> CondExpr::Eval(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value c, cond->Eval(in));
  if (c.Truthy()) return then->Eval(in);
  if (otherwise) return otherwise->Eval(in);
  return Value::Undefined("conditional expression without else evaluated to undefined");
}

// ---------------------------------------------------------------- statements

Status TextStmt::Exec(Interp& in) const { return in.Write(text); }

Status OutputStmt::Exec(Interp& in) const {
  CHORUS_ASSIGN_OR_RETURN(Value v, expr->Eval(in));
  if (v.is_string()) return in.Write(v.str());
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.Write(s);
}

Status IfStmt::Exec(Interp& in) const {
  for (const auto& [cond, body] : branches) {
    CHORUS_ASSIGN_OR_RETURN(Value c, cond->Eval(in));
    if (c.Truthy()) return in.ExecBody(body);
  }
  return in.ExecBody(else_body);
}

namespace {
// loop(children) in a recursive loop: the loop again over `children`, one level deeper; its
// output is the call's value.
Result<Value> LoopRecurse(Interp& in, const Callable& self, CallArgs& args) {
  if (args.pos.size() != 1 || !args.kw.empty()) {
    return InvalidArgumentError("loop() takes exactly one argument (the items to recurse into)");
  }
  if (in.call_depth() >= in.limits().max_call_depth) {
    return ResourceExhaustedError("chat template recursive loop nests deeper than " +
                                  std::to_string(in.limits().max_call_depth));
  }
  ++in.call_depth();
  const int64_t depth = self.state->counter;
  auto text = in.CaptureWith([&] { return self.state->loop->Run(in, args.pos[0], depth + 1); });
  --in.call_depth();
  if (!text.ok()) return text.status();
  return in.MakeString(std::move(text).value());
}
}  // namespace

Status ForStmt::Exec(Interp& in) const {
  CHORUS_ASSIGN_OR_RETURN(Value seq, iter->Eval(in));
  return Run(in, seq, 1);
}

Status ForStmt::Run(Interp& in, const Value& seq, int64_t depth) const {
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(seq, *this));
  if (filter) {
    std::vector<Value> kept;
    for (auto& item : items) {
      CHORUS_RETURN_IF_ERROR(in.Step());
      ScopeGuard scope(in);
      CHORUS_RETURN_IF_ERROR(BindTargets(in, *this, targets, item));
      CHORUS_ASSIGN_OR_RETURN(Value keep, filter->Eval(in));
      if (keep.Truthy()) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) return in.ExecBody(else_body);
  const auto n = static_cast<int64_t>(items.size());
  in.loop_changed.emplace_back();
  struct Pop {
    Interp& in;
    ~Pop() { in.loop_changed.pop_back(); }
  } pop{in};
  for (int64_t i = 0; i < n; ++i) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    ScopeGuard scope(in);
    const auto k = static_cast<size_t>(i);
    CHORUS_RETURN_IF_ERROR(BindTargets(in, *this, targets, items[k]));
    auto loop = std::make_shared<DictData>();
    loop->items.reserve(11);
    loop->AppendNew("index", Value::Int(i + 1));
    loop->AppendNew("index0", Value::Int(i));
    loop->AppendNew("revindex", Value::Int(n - i));
    loop->AppendNew("revindex0", Value::Int(n - i - 1));
    loop->AppendNew("first", Value::Bool(i == 0));
    loop->AppendNew("last", Value::Bool(i == n - 1));
    loop->AppendNew("length", Value::Int(n));
    loop->AppendNew("depth", Value::Int(depth));
    loop->AppendNew("depth0", Value::Int(depth - 1));
    if (i > 0) loop->AppendNew("previtem", items[k - 1]);
    if (i + 1 < n) loop->AppendNew("nextitem", items[k + 1]);
    if (recursive) {
      auto c = std::make_shared<Callable>();
      c->name = "loop";
      c->bound = LoopRecurse;
      c->state = std::make_shared<CallState>();
      c->state->counter = depth;
      c->state->loop = this;
      loop->AppendNew(std::string(kLoopRecurseKey), Value::Function(std::move(c)));
    }
    in.Set("loop", Value::Dict(std::move(loop)));
    CHORUS_RETURN_IF_ERROR(in.ExecBody(body));
    if (in.flow == Interp::Flow::kBreak) {
      in.flow = Interp::Flow::kNormal;
      break;
    }
    in.flow = Interp::Flow::kNormal;
  }
  return OkStatus();
}

Status SetStmt::Exec(Interp& in) const {
  Value v;
  if (value) {
    CHORUS_ASSIGN_OR_RETURN(v, value->Eval(in));
  } else {
    CHORUS_ASSIGN_OR_RETURN(std::string s, in.Capture(block));
    CHORUS_ASSIGN_OR_RETURN(v, in.MakeString(std::move(s)));
    if (block_filter) {
      Value saved = std::move(in.block_value);
      in.block_value = std::move(v);
      auto r = block_filter->Eval(in);
      in.block_value = std::move(saved);
      if (!r.ok()) return r.status();
      v = std::move(r).value();
    }
  }
  if (!ns_attr.empty()) {
    Value target = in.Lookup(targets[0]);
    if (!target.is_namespace()) {
      return RuntimeError(*this, "cannot assign attribute '" + ns_attr + "' on '" + targets[0] +
                                     "': not a namespace()");
    }
    if (v.HoldsNamespace()) {
      return RuntimeError(*this, "storing a namespace inside a namespace is not supported");
    }
    target.mutable_namespace().Set(ns_attr, std::move(v));
    return OkStatus();
  }
  return BindTargets(in, *this, targets, v);
}

Status MacroStmt::Exec(Interp& in) const {
  auto c = std::make_shared<Callable>();
  c->name = name;
  c->macro = this;
  in.Set(name, Value::Function(std::move(c)));
  return OkStatus();
}

Status LoopControlStmt::Exec(Interp& in) const {
  in.flow = is_break ? Interp::Flow::kBreak : Interp::Flow::kContinue;
  return OkStatus();
}

Status BlockStmt::Exec(Interp& in) const { return in.ExecBody(body); }

Status CallBlockStmt::Exec(Interp& in) const {
  CHORUS_RETURN_IF_ERROR(in.Step());
  CHORUS_ASSIGN_OR_RETURN(Value f, call->callee->Eval(in));
  if (f.is_undefined()) return RuntimeError(*call, f.str());
  CallArgs args;
  for (const auto& e : call->args.pos) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    args.pos.push_back(std::move(v));
  }
  for (const auto& [k, e] : call->args.kw) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    args.kw.emplace_back(k, std::move(v));
  }
  auto c = std::make_shared<Callable>();
  c->name = "caller";
  c->macro = &caller;
  c->closure = std::make_shared<const VarList>(in.VisibleLocals());
  const Value caller_value = Value::Function(std::move(c));
  Value result;
  if (f.is_callable() && f.callable().macro != nullptr) {
    CHORUS_ASSIGN_OR_RETURN(result, in.CallMacro(*f.callable().macro, args, *call, &caller_value,
                                                 f.callable().closure.get()));
  } else {
    args.kw.emplace_back("caller", caller_value);
    CHORUS_ASSIGN_OR_RETURN(result, in.CallValue(f, args, *call));
  }
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(result));
  return in.Write(s);
}

Status FilterBlockStmt::Exec(Interp& in) const {
  CHORUS_ASSIGN_OR_RETURN(std::string text, in.Capture(body));
  CHORUS_ASSIGN_OR_RETURN(Value v, in.MakeString(std::move(text)));
  Value saved = std::move(in.block_value);
  in.block_value = std::move(v);
  auto r = chain->Eval(in);
  in.block_value = std::move(saved);
  if (!r.ok()) return r.status();
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(*r));
  return in.Write(s);
}

Status WithStmt::Exec(Interp& in) const {
  std::vector<Value> values;
  for (const auto& [name, e] : vars) {
    CHORUS_ASSIGN_OR_RETURN(Value v, e->Eval(in));
    values.push_back(std::move(v));
  }
  ScopeGuard scope(in);
  for (size_t i = 0; i < vars.size(); ++i) in.Set(vars[i].first, std::move(values[i]));
  return in.ExecBody(body);
}

Status LoaderStmt::Exec(Interp& in) const {
  return RuntimeError(*this, "{% " + tag + " %}: no loader for this environment specified");
}

}  // namespace chorus::tokenizer::jinja

// Internal to chat templates (chat_template.h): the value model of the Jinja interpreter.
//
// Values follow Python/Jinja semantics: undefined, None, bool, int (int64), float, str,
// list (tuples are lists), dict (insertion-ordered, string keys), namespace (the only
// mutable object, shared by reference) and callables (builtins, macros).
// Lists and dicts are immutable once built (Hugging Face renders in an
// ImmutableSandboxedEnvironment) and shared by pointer, so copying a Value is cheap.
//
// Thread-safety: values are confined to one render; Program-owned literal values are never
// mutated and may be shared across renders.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "chorus/base/status.h"

namespace chorus::tokenizer::jinja {

class Value;
struct ListData;
struct DictData;
struct Callable;
struct ForStmt;
class Interp;
struct MacroStmt;

// Maximum nesting of lists/dicts a render may build (deeper → error). Bounds the recursion
// of printing, comparing and destroying values.
inline constexpr int kMaxValueDepth = 64;

// What Python object a list value stands for. Jinja's select/map/... filters return
// generators and dict.items()/keys()/values() return views; they behave differently from a
// list (a generator has no len() and is always true; neither can be indexed) and print
// differently, so the difference is kept.
enum class SeqKind : uint8_t { kList, kGenerator, kDictItems, kDictKeys, kDictValues };

class Value {
 public:
  enum class Kind : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kCallable,
  };

  Value() = default;  // undefined
  // An undefined value; `hint` names what was looked up (for error messages).
  static Value Undefined(std::string hint);
  static Value None();
  static Value Bool(bool b);
  static Value Int(int64_t i);
  static Value Float(double f);
  static Value Str(std::string s);
  // Depth is computed from the items; callers creating values at render time check it
  // against kMaxValueDepth (Interp::MakeList).
  static Value List(std::vector<Value> items);
  // A tuple: a list that prints as "(a, b)" (Python repr) and is not equal to a list.
  static Value Tuple(std::vector<Value> items);
  // A generator or dict view over `items` (see SeqKind).
  static Value Seq(std::vector<Value> items, SeqKind kind);
  // A named tuple (`names` label the items; attribute access reads them).
  static Value NamedTuple(std::vector<Value> items, std::vector<std::string> names);
  static Value Dict(std::shared_ptr<DictData> d);  // Requires: d != nullptr.
  static Value Namespace(std::shared_ptr<DictData> d);
  static Value Function(std::shared_ptr<const Callable> c);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }  // lists and tuples
  bool is_tuple() const;
  // SeqKind of a list value (kList for plain lists and tuples).
  SeqKind seq_kind() const;
  // A plain list or tuple (indexable, has len(), prints as itself).
  bool is_plain_list() const { return is_list() && seq_kind() == SeqKind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_mapping() const { return kind_ == Kind::kDict || kind_ == Kind::kNamespace; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool bool_value() const { return b_; }
  int64_t int_value() const { return i_; }  // Requires: is_int() or is_bool().
  double float_value() const { return f_; }
  // Numeric value of an int, float or bool.
  double AsDouble() const;
  // Requires: is_string(). For undefined: the hint.
  const std::string& str() const;
  // Requires: is_list().
  const std::vector<Value>& list() const;
  // Field names of a named tuple (empty otherwise). Requires: is_list().
  const std::vector<std::string>& field_names() const;
  // Requires: is_mapping().
  const DictData& dict() const;
  DictData& mutable_namespace() const;  // Requires: is_namespace().
  const Callable& callable() const;     // Requires: is_callable().

  // Nesting depth: 0 for scalars, 1 + deepest item for lists and dicts.
  int depth() const;
  // Whether this is or (transitively) holds a namespace; O(1), kept up to date on
  // construction because values may share sub-lists exponentially.
  bool HoldsNamespace() const;

  // Python truthiness.
  bool Truthy() const;
  // Python type name for error messages ("str", "int", "list", "dict", "NoneType", ...).
  std::string_view TypeName() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  // One pointer for every boxed kind (a Value is copied constantly; one refcount, not four):
  // kString and kUndefined (the hint): std::string; kList: ListData; kDict/kNamespace:
  // DictData (a namespace's is mutated through mutable_namespace); kCallable: Callable.
  std::shared_ptr<const void> p_;
  const std::string* s() const { return static_cast<const std::string*>(p_.get()); }
  const ListData* l() const { return static_cast<const ListData*>(p_.get()); }
  DictData* d() const { return const_cast<DictData*>(static_cast<const DictData*>(p_.get())); }
  const Callable* c() const { return static_cast<const Callable*>(p_.get()); }
};

struct ListData {
  std::vector<Value> items;
  int depth = 1;
  bool holds_namespace = false;
  bool is_tuple = false;
  SeqKind seq = SeqKind::kList;
  // Field names of a named tuple (groupby's (grouper, list)); empty for other lists.
  std::vector<std::string> field_names;
};

// Heterogeneous string hashing (lookups by string_view without building a std::string).
struct StrHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// Insertion-ordered string-keyed mapping. Small dicts (messages, tool calls, the loop object:
// nearly all of them) are searched linearly; a hash index is built once a dict grows past
// kIndexThreshold entries.
struct DictData {
  static constexpr size_t kIndexThreshold = 16;
  std::vector<std::pair<std::string, Value>> items;
  std::unordered_map<std::string, size_t, StrHash, std::equal_to<>> index;  // empty when small
  int depth = 1;
  bool holds_namespace = false;

  const Value* Find(std::string_view key) const;
  // Inserts or replaces (keeps the first insertion position) and updates depth.
  void Set(std::string key, Value v);
  // Appends a key known not to be present (a JSON object's keys, the loop object's fields).
  void AppendNew(std::string key, Value v);
};

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  const Value* Kw(std::string_view name) const;
};

using BuiltinFn = Result<Value> (*)(Interp& in, CallArgs& args);

// Mutable state of a stateful global's object (joiner, cycler): how often it was called and
// what it cycles through. Confined to one render like every value.
struct CallState {
  int64_t counter = 0;
  std::vector<Value> items;
  const ForStmt* loop = nullptr;  // a recursive loop's loop(...) (counter = its depth)
};

struct Callable {
  std::string name;
  BuiltinFn builtin = nullptr;  // a global function (range, namespace, ...)
  // joiner() / cycler() objects: called (or their methods called) with their own state.
  Result<Value> (*bound)(Interp& in, const Callable& self, CallArgs& args) = nullptr;
  std::shared_ptr<CallState> state;
  const MacroStmt* macro = nullptr;  // or a macro (owned by the Program)
  // For a call block's `caller`: the variables of the call site it closes over.
  std::shared_ptr<const std::vector<std::pair<std::string, Value>>> closure;
};

// Converts JSON (request messages, extra context) to a Value, keeping object key order.
// Nesting deeper than kMaxValueDepth is an error.
Result<Value> FromJson(const nlohmann::json& j);
Result<Value> FromJson(const nlohmann::ordered_json& j);

// Appends str(v) as Python/Jinja prints it: strings as is, None → "None", True → "True",
// floats in repr form, lists/dicts in repr form ("['a', 1]"), undefined → "".
// Fails with kResourceExhausted when `out` would grow beyond `limit` bytes.
Status AppendStr(const Value& v, std::string* out, size_t limit);
// Appends repr(v) (strings quoted).
Status AppendRepr(const Value& v, std::string* out, size_t limit);
// json.dumps options as Hugging Face's `tojson` filter passes them.
struct JsonOptions {
  int indent = -1;  // < 0: one line
  // Separators (null: Python's defaults, ", " / ": ", or "," / ": " with an indent).
  const std::string* item_sep = nullptr;
  const std::string* key_sep = nullptr;
  bool sort_keys = false;
  bool ensure_ascii = false;  // non-ASCII as \uXXXX (surrogate pairs above U+FFFF)
};
// Appends json.dumps(v, ...) as Hugging Face's `tojson` filter does. Undefined, namespaces
// and callables are errors.
Status AppendJson(const Value& v, const JsonOptions& opts, std::string* out, size_t limit);
// Length in bytes of the valid UTF-8 sequence starting at s[i], or 1 when invalid.
size_t Utf8SeqLen(std::string_view s, size_t i);
// Python repr of a float ("1.0", "0.1", "1e+16", "inf", "nan").
std::string FloatRepr(double f);

// Number of Unicode code points in UTF-8 `s` (invalid bytes count as one each).
size_t Utf8Length(std::string_view s);
// Byte offsets of each code point start in `s`, plus s.size() at the end.
std::vector<size_t> Utf8Offsets(std::string_view s);

}  // namespace chorus::tokenizer::jinja

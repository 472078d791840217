#include "chorus/tokenizer/jinja_builtins.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <unordered_map>
#include <utility>

namespace chorus::tokenizer::jinja {

namespace {

constexpr int64_t kSlotBytes = 16;

// ---------------------------------------------------------------- argument helpers

const Value* Arg(const CallArgs& a, size_t i, std::string_view name) {
  if (i < a.pos.size()) return &a.pos[i];
  return a.Kw(name);
}

Status MaxArgs(const CallArgs& a, size_t max_pos, std::string_view fn) {
  if (a.pos.size() > max_pos) {
    return InvalidArgumentError(std::string(fn) + " takes at most " + std::to_string(max_pos) +
                                " positional arguments");
  }
  return OkStatus();
}

Result<std::string> StrArg(const Value* v, std::string_view what) {
  if (v == nullptr || !v->is_string()) {
    return InvalidArgumentError(std::string(what) + " must be a string");
  }
  return v->str();
}

Result<int64_t> IntArg(const Value* v, std::string_view what) {
  if (v == nullptr || !(v->is_int() || v->is_bool())) {
    return InvalidArgumentError(std::string(what) + " must be an integer");
  }
  return v->int_value();
}

// ---------------------------------------------------------------- string helpers

bool IsPyWhitespace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v' ||
         (c >= '\x1c' && c <= '\x1f');
}
bool IsAsciiLower(char c) { return c >= 'a' && c <= 'z'; }
bool IsAsciiUpper(char c) { return c >= 'A' && c <= 'Z'; }
char ToUpper(char c) { return IsAsciiLower(c) ? static_cast<char>(c - 'a' + 'A') : c; }
char ToLower(char c) { return IsAsciiUpper(c) ? static_cast<char>(c - 'A' + 'a') : c; }

std::string Upper(std::string s) {
  for (char& c : s) c = ToUpper(c);
  return s;
}
std::string Lower(std::string s) {
  for (char& c : s) c = ToLower(c);
  return s;
}
// Python str.title(): a cased character after an uncased one is upper-cased, others lowered.
// Non-ASCII bytes count as cased letters (kept as they are) so words stay words.
std::string Title(std::string s) {
  bool prev_cased = false;
  for (char& c : s) {
    const bool non_ascii = static_cast<unsigned char>(c) >= 0x80;
    const bool letter = IsAsciiLower(c) || IsAsciiUpper(c);
    if (letter) c = prev_cased ? ToLower(c) : ToUpper(c);
    prev_cased = letter || non_ascii;
  }
  return s;
}
// Jinja's `title` filter (not str.title): words are split at whitespace, '-', '(', '{',
// '[' and '<'; each word's first character is upper-cased and the rest lower-cased.
std::string TitleFilter(std::string s) {
  bool word_start = true;
  for (char& c : s) {
    if (IsPyWhitespace(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<') {
      word_start = true;
      continue;
    }
    c = word_start ? ToUpper(c) : ToLower(c);
    word_start = false;
  }
  return s;
}
std::string Capitalize(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) s[i] = i == 0 ? ToUpper(s[i]) : ToLower(s[i]);
  return s;
}

// Strips whitespace (chars == nullptr) or any code point of *chars.
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const auto offs = Utf8Offsets(s);
  const size_t n = offs.size() - 1;
  auto strip_cp = [&](size_t k) {
    const std::string_view cp(s.data() + offs[k], offs[k + 1] - offs[k]);
    if (chars == nullptr) return cp.size() == 1 && IsPyWhitespace(cp[0]);
    const auto coffs = Utf8Offsets(*chars);
    for (size_t j = 0; j + 1 < coffs.size(); ++j) {
      if (std::string_view(chars->data() + coffs[j], coffs[j + 1] - coffs[j]) == cp) return true;
    }
    return false;
  };
  size_t b = 0, e = n;
  if (left) {
    while (b < e && strip_cp(b)) ++b;
  }
  if (right) {
    while (e > b && strip_cp(e - 1)) --e;
  }
  return s.substr(offs[b], offs[e] - offs[b]);
}

std::vector<std::string> Split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (sep == nullptr) {
    size_t i = 0;
    while (true) {
      while (i < s.size() && IsPyWhitespace(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        size_t e = s.size();
        while (e > i && IsPyWhitespace(s[e - 1])) --e;
        parts.push_back(s.substr(i, e - i));
        break;
      }
      size_t j = i;
      while (j < s.size() && !IsPyWhitespace(s[j])) ++j;
      parts.push_back(s.substr(i, j - i));
      i = j;
    }
    return parts;
  }
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) break;
    const size_t pos = s.find(*sep, start);
    if (pos == std::string::npos) break;
    parts.push_back(s.substr(start, pos - start));
    start = pos + sep->size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

Result<std::string> Replace(Interp& in, const std::string& s, const std::string& from,
                            const std::string& to, int64_t count) {
  std::string out;
  int64_t done = 0;
  auto can = [&]() { return count < 0 || done < count; };
  if (from.empty()) {
    // Python inserts `to` before every code point and at the end.
    const auto offs = Utf8Offsets(s);
    for (size_t k = 0; k + 1 < offs.size(); ++k) {
      if (can()) {
        out += to;
        ++done;
      }
      out.append(s, offs[k], offs[k + 1] - offs[k]);
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    }
    if (can()) out += to;
    CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    return out;
  }
  size_t start = 0;
  while (can()) {
    const size_t pos = s.find(from, start);
    if (pos == std::string::npos) break;
    out.append(s, start, pos - start);
    out += to;
    CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    start = pos + from.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
  return out;
}

Result<Value> StrList(Interp& in, std::vector<std::string> parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (auto& p : parts) {
    CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(p.size())));
    items.push_back(Value::Str(std::move(p)));
  }
  return in.MakeList(std::move(items));
}

// Looks up a dotted attribute path ("function.name", "0") for map/selectattr/join.
Result<Value> AttrPath(const Value& v, const std::string& path) {
  Value cur = v;
  size_t start = 0;
  Node at;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (cur.is_list() && !part.empty() &&
        std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      const size_t k = static_cast<size_t>(std::strtoull(part.c_str(), nullptr, 10));
      cur = k < cur.list().size() ? cur.list()[k] : Value::Undefined("index out of range");
    } else if (cur.is_undefined()) {
      return InvalidArgumentError(cur.str());
    } else {
      CHORUS_ASSIGN_OR_RETURN(cur, GetAttr(cur, part, at));
    }
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// ---------------------------------------------------------------- filters

Result<Value> FTrim(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, "trim"));
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  const Value* chars = Arg(a, 0, "chars");
  if (chars != nullptr && !chars->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(std::string c, StrArg(chars, "trim chars"));
    return in.MakeString(Strip(s, &c, true, true));
  }
  return in.MakeString(Strip(s, nullptr, true, true));
}

Result<Value> FLength(Interp& in, const Value& v, CallArgs& a) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return Value::Int(static_cast<int64_t>(Utf8Length(v.str())));
    case Value::Kind::kList:
      return Value::Int(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return Value::Int(static_cast<int64_t>(v.dict().items.size()));
    case Value::Kind::kUndefined:
      return Value::Int(0);
    default:
      return InvalidArgumentError("object of type '" + std::string(v.TypeName()) +
                                  "' has no len()");
  }
}

Result<Value> FUpper(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(Upper(std::move(s)));
}
Result<Value> FLower(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(Lower(std::move(s)));
}
Result<Value> FTitle(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(TitleFilter(std::move(s)));
}
Result<Value> FCapitalize(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(Capitalize(std::move(s)));
}

Result<Value> FToJson(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, "tojson"));
  int indent = -1;
  if (const Value* i = Arg(a, 0, "indent"); i != nullptr && !i->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(i, "tojson indent"));
    indent = static_cast<int>(std::clamp<int64_t>(n, 0, 64));
  }
  std::string s;
  CHORUS_RETURN_IF_ERROR(AppendJson(v, indent, &s, in.max_output_bytes()));
  return in.MakeString(std::move(s));
}

Result<Value> FDefault(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "default"));
  const Value* def = Arg(a, 0, "default_value");
  const Value* boolean = Arg(a, 1, "boolean");
  const bool use_default =
      v.is_undefined() || (boolean != nullptr && boolean->Truthy() && !v.Truthy());
  if (!use_default) return v;
  return def != nullptr ? *def : Value::Str("");
}

Result<Value> FJoin(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "join"));
  std::string sep;
  if (const Value* d = Arg(a, 0, "d")) {
    CHORUS_ASSIGN_OR_RETURN(sep, in.ToStr(*d));
  }
  const Value* attribute = Arg(a, 1, "attribute");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    Value item = items[i];
    if (attribute != nullptr) {
      CHORUS_ASSIGN_OR_RETURN(std::string path, in.ToStr(*attribute));
      CHORUS_ASSIGN_OR_RETURN(item, AttrPath(item, path));
    }
    if (i > 0) out += sep;
    CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(item));
    out += s;
    CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
  }
  return in.MakeString(std::move(out));
}

Result<Value> FFirst(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_list())
    return v.list().empty() ? Value::Undefined("first of an empty list") : v.list()[0];
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  return items.empty() ? Value::Undefined("first of an empty sequence") : items.front();
}

Result<Value> FLast(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_list())
    return v.list().empty() ? Value::Undefined("last of an empty list") : v.list().back();
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  return items.empty() ? Value::Undefined("last of an empty sequence") : items.back();
}

Result<Value> FString(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_string()) return v;
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(std::move(s));
}

Result<Value> FReplace(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, "replace"));
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  CHORUS_ASSIGN_OR_RETURN(std::string from, StrArg(Arg(a, 0, "old"), "replace old"));
  CHORUS_ASSIGN_OR_RETURN(std::string to, StrArg(Arg(a, 1, "new"), "replace new"));
  int64_t count = -1;
  if (const Value* c = Arg(a, 2, "count"); c != nullptr && !c->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(count, IntArg(c, "replace count"));
  }
  CHORUS_ASSIGN_OR_RETURN(std::string r, Replace(in, s, from, to, count));
  return in.MakeString(std::move(r));
}

Result<Value> FSafe(Interp& in, const Value& v, CallArgs& a) { return v; }

Result<Value> FEscape(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  std::string out;
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return in.MakeString(std::move(out));
}

Result<Value> FItems(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_undefined()) return in.MakeList({});
  if (!v.is_mapping()) {
    return InvalidArgumentError("can only get item pairs from a mapping, not " +
                                std::string(v.TypeName()));
  }
  std::vector<Value> pairs;
  for (const auto& [k, val] : v.dict().items) {
    CHORUS_ASSIGN_OR_RETURN(Value p, in.MakeList({Value::Str(k), val}, /*tuple=*/true));
    pairs.push_back(std::move(p));
  }
  return in.MakeList(std::move(pairs));
}

Result<Value> FList(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_list()) return v;
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  return in.MakeList(std::move(items));
}

Result<Value> FInt(Interp& in, const Value& v, CallArgs& a) {
  const Value* def = Arg(a, 0, "default");
  const Value fallback = def != nullptr ? *def : Value::Int(0);
  if (v.is_undefined()) return InvalidArgumentError(v.str());
  if (v.is_int() || v.is_bool()) return Value::Int(v.int_value());
  if (v.is_float()) {
    const double f = v.float_value();
    if (!std::isfinite(f) || std::fabs(f) >= 9.2e18) return fallback;
    return Value::Int(static_cast<int64_t>(f));
  }
  if (v.is_string()) {
    const std::string s = Strip(v.str(), nullptr, true, true);
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::Int(n);
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(f) && std::fabs(f) < 9.2e18) {
      return Value::Int(static_cast<int64_t>(f));
    }
  }
  return fallback;
}

Result<Value> FFloat(Interp& in, const Value& v, CallArgs& a) {
  const Value* def = Arg(a, 0, "default");
  const Value fallback = def != nullptr ? *def : Value::Float(0.0);
  if (v.is_undefined()) return InvalidArgumentError(v.str());
  if (v.is_number() || v.is_bool()) return Value::Float(v.AsDouble());
  if (v.is_string()) {
    const std::string s = Strip(v.str(), nullptr, true, true);
    char* end = nullptr;
    const double f = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::Float(f);
  }
  return fallback;
}

Result<Value> FAbs(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_float()) return Value::Float(std::fabs(v.float_value()));
  if (v.is_int() || v.is_bool()) {
    if (v.int_value() == std::numeric_limits<int64_t>::min()) {
      return InvalidArgumentError("integer overflow");
    }
    return Value::Int(v.int_value() < 0 ? -v.int_value() : v.int_value());
  }
  return InvalidArgumentError("bad operand type for abs(): '" + std::string(v.TypeName()) + "'");
}

Result<Value> FReverse(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_string()) {
    const auto offs = Utf8Offsets(v.str());
    std::string out;
    out.reserve(v.str().size());
    for (size_t k = offs.size() - 1; k-- > 0;) out.append(v.str(), offs[k], offs[k + 1] - offs[k]);
    return in.MakeString(std::move(out));
  }
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::reverse(items.begin(), items.end());
  return in.MakeList(std::move(items));
}

Result<Value> FMap(Interp& in, const Value& v, CallArgs& a) {
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::vector<Value> out;
  out.reserve(items.size());
  if (const Value* attr = a.Kw("attribute")) {
    CHORUS_ASSIGN_OR_RETURN(std::string path, in.ToStr(*attr));
    const Value* def = a.Kw("default");
    for (const auto& item : items) {
      CHORUS_RETURN_IF_ERROR(in.Step());
      CHORUS_ASSIGN_OR_RETURN(Value r, AttrPath(item, path));
      if (r.is_undefined() && def != nullptr) r = *def;
      out.push_back(std::move(r));
    }
    return in.MakeList(std::move(out));
  }
  CHORUS_ASSIGN_OR_RETURN(std::string name, StrArg(Arg(a, 0, "name"), "map filter name"));
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) return InvalidArgumentError("unknown filter '" + name + "'");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& item : items) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    CallArgs copy = rest;
    CHORUS_ASSIGN_OR_RETURN(Value r, fn(in, item, copy));
    out.push_back(std::move(r));
  }
  return in.MakeList(std::move(out));
}

// select / reject / selectattr / rejectattr.
Result<Value> SelectImpl(Interp& in, const Value& v, CallArgs& a, bool by_attr, bool keep) {
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  size_t next = 0;
  std::string path;
  if (by_attr) {
    CHORUS_ASSIGN_OR_RETURN(path, StrArg(Arg(a, 0, "attribute"), "attribute name"));
    next = 1;
  }
  TestFn test = nullptr;
  CallArgs test_args;
  if (next < a.pos.size()) {
    CHORUS_ASSIGN_OR_RETURN(std::string name, StrArg(&a.pos[next], "test name"));
    test = FindTest(name);
    if (test == nullptr) return InvalidArgumentError("unknown test '" + name + "'");
    test_args.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(next) + 1, a.pos.end());
  }
  std::vector<Value> out;
  for (const auto& item : items) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    Value subject = item;
    if (by_attr) {
      CHORUS_ASSIGN_OR_RETURN(subject, AttrPath(item, path));
    }
    bool ok;
    if (test != nullptr) {
      CallArgs copy = test_args;
      CHORUS_ASSIGN_OR_RETURN(ok, test(in, subject, copy));
    } else {
      ok = subject.Truthy();
    }
    if (ok == keep) out.push_back(item);
  }
  return in.MakeList(std::move(out));
}
Result<Value> FSelect(Interp& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, true);
}
Result<Value> FReject(Interp& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, false, false);
}
Result<Value> FSelectAttr(Interp& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, true);
}
Result<Value> FRejectAttr(Interp& in, const Value& v, CallArgs& a) {
  return SelectImpl(in, v, a, true, false);
}

// ---------------------------------------------------------------- tests

Result<bool> TDefined(Interp&, const Value& v, CallArgs&) { return !v.is_undefined(); }
Result<bool> TUndefined(Interp&, const Value& v, CallArgs&) { return v.is_undefined(); }
Result<bool> TNone(Interp&, const Value& v, CallArgs&) { return v.is_none(); }
Result<bool> TString(Interp&, const Value& v, CallArgs&) { return v.is_string(); }
Result<bool> TMapping(Interp&, const Value& v, CallArgs&) { return v.is_dict(); }
Result<bool> TIterable(Interp&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || v.is_mapping() || v.is_undefined();
}
Result<bool> TSequence(Interp&, const Value& v, CallArgs&) {
  return v.is_list() || v.is_string() || v.is_dict() || v.is_undefined();
}
// Python: bool is a Number (Jinja's `number` test says True for booleans).
Result<bool> TNumber(Interp&, const Value& v, CallArgs&) { return v.is_number() || v.is_bool(); }
Result<bool> TInteger(Interp&, const Value& v, CallArgs&) { return v.is_int(); }
Result<bool> TFloat(Interp&, const Value& v, CallArgs&) { return v.is_float(); }
Result<bool> TBoolean(Interp&, const Value& v, CallArgs&) { return v.is_bool(); }
Result<bool> TTrue(Interp&, const Value& v, CallArgs&) { return v.is_bool() && v.bool_value(); }
Result<bool> TFalse(Interp&, const Value& v, CallArgs&) { return v.is_bool() && !v.bool_value(); }
Result<bool> TCallable(Interp&, const Value& v, CallArgs&) { return v.is_callable(); }
// value % 2 == 1 / == 0 in Python (bool is an int, floats work too).
Result<double> PyMod2(const Value& v, std::string_view test) {
  if (v.is_int() || v.is_bool()) return static_cast<double>(((v.int_value() % 2) + 2) % 2);
  if (v.is_float() && std::isfinite(v.float_value())) {
    double m = std::fmod(v.float_value(), 2.0);
    if (m < 0) m += 2.0;
    return m;
  }
  return InvalidArgumentError("'" + std::string(test) + "' needs a number");
}
Result<bool> TOdd(Interp&, const Value& v, CallArgs&) {
  CHORUS_ASSIGN_OR_RETURN(double m, PyMod2(v, "odd"));
  return m == 1.0;
}
Result<bool> TEven(Interp&, const Value& v, CallArgs&) {
  CHORUS_ASSIGN_OR_RETURN(double m, PyMod2(v, "even"));
  return m == 0.0;
}
Result<bool> TDivisibleBy(Interp&, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(Arg(a, 0, "num"), "divisibleby argument"));
  if (!v.is_int() && !v.is_bool()) return InvalidArgumentError("'divisibleby' needs an integer");
  if (n == 0) return InvalidArgumentError("divisibleby 0");
  if (n == -1) return true;
  return (v.int_value() % n) == 0;
}
Result<bool> TEq(Interp& in, const Value& v, CallArgs& a) {
  const Value* o = Arg(a, 0, "other");
  if (o == nullptr) return InvalidArgumentError("test needs an argument");
  return in.Equal(v, *o);
}
Result<bool> TNe(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(bool eq, TEq(in, v, a));
  return !eq;
}
Result<bool> TOrder(Interp& in, const Value& v, CallArgs& a, int want_lt, bool or_equal) {
  const Value* o = Arg(a, 0, "other");
  if (o == nullptr) return InvalidArgumentError("test needs an argument");
  int c;
  if ((v.is_number() || v.is_bool()) && (o->is_number() || o->is_bool())) {
    const double x = v.AsDouble(), y = o->AsDouble();
    c = x < y ? -1 : (x > y ? 1 : 0);
  } else if (v.is_string() && o->is_string()) {
    c = v.str().compare(o->str());
  } else {
    return InvalidArgumentError("cannot compare '" + std::string(v.TypeName()) + "' and '" +
                                std::string(o->TypeName()) + "'");
  }
  if (c == 0) return or_equal;
  return want_lt ? c < 0 : c > 0;
}
Result<bool> TLt(Interp& in, const Value& v, CallArgs& a) { return TOrder(in, v, a, 1, false); }
Result<bool> TLe(Interp& in, const Value& v, CallArgs& a) { return TOrder(in, v, a, 1, true); }
Result<bool> TGt(Interp& in, const Value& v, CallArgs& a) { return TOrder(in, v, a, 0, false); }
Result<bool> TGe(Interp& in, const Value& v, CallArgs& a) { return TOrder(in, v, a, 0, true); }
Result<bool> TIn(Interp& in, const Value& v, CallArgs& a) {
  const Value* seq = Arg(a, 0, "seq");
  if (seq == nullptr) return InvalidArgumentError("'in' test needs a sequence");
  if (seq->is_string()) return v.is_string() && seq->str().find(v.str()) != std::string::npos;
  if (seq->is_mapping()) return v.is_string() && seq->dict().Find(v.str()) != nullptr;
  if (seq->is_list()) {
    for (const auto& e : seq->list()) {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(e, v));
      if (eq) return true;
    }
    return false;
  }
  return InvalidArgumentError("'in' test needs a sequence");
}
Result<bool> TLower(Interp&, const Value& v, CallArgs&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char c : v.str()) {
    if (IsAsciiUpper(c)) return false;
    cased = cased || IsAsciiLower(c);
  }
  return cased;
}
Result<bool> TUpper(Interp&, const Value& v, CallArgs&) {
  if (!v.is_string()) return false;
  bool cased = false;
  for (char c : v.str()) {
    if (IsAsciiLower(c)) return false;
    cased = cased || IsAsciiUpper(c);
  }
  return cased;
}
Result<bool> TSameAs(Interp& in, const Value& v, CallArgs& a) {
  const Value* o = Arg(a, 0, "other");
  if (o == nullptr) return InvalidArgumentError("'sameas' needs an argument");
  if (v.kind() != o->kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kNone:
    case Value::Kind::kUndefined:
      return true;
    case Value::Kind::kBool:
      return v.bool_value() == o->bool_value();
    case Value::Kind::kList:
      return &v.list() == &o->list();
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      return &v.dict() == &o->dict();
    default:
      return in.Equal(v, *o);
  }
}

// ---------------------------------------------------------------- globals

Result<Value> GRange(Interp& in, CallArgs& a) {
  if (a.pos.empty() || a.pos.size() > 3 || !a.kw.empty()) {
    return InvalidArgumentError("range expects 1 to 3 integer arguments");
  }
  int64_t start = 0, stop, step = 1;
  if (a.pos.size() == 1) {
    CHORUS_ASSIGN_OR_RETURN(stop, IntArg(&a.pos[0], "range stop"));
  } else {
    CHORUS_ASSIGN_OR_RETURN(start, IntArg(&a.pos[0], "range start"));
    CHORUS_ASSIGN_OR_RETURN(stop, IntArg(&a.pos[1], "range stop"));
    if (a.pos.size() == 3) {
      CHORUS_ASSIGN_OR_RETURN(step, IntArg(&a.pos[2], "range step"));
    }
  }
  if (step == 0) return InvalidArgumentError("range() arg 3 must not be zero");
  // Count in floating point first so that absurd ranges fail before any arithmetic overflows.
  const double count_f = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                   static_cast<double>(step));
  const int64_t count =
      count_f <= 0 ? 0 : (count_f > 1e15 ? int64_t{1} << 50 : static_cast<int64_t>(count_f));
  if (count > std::numeric_limits<int64_t>::max() / kSlotBytes) {
    return in.Alloc(std::numeric_limits<int64_t>::max());
  }
  CHORUS_RETURN_IF_ERROR(in.Alloc(count * kSlotBytes));
  std::vector<Value> items;
  items.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) items.push_back(Value::Int(start + i * step));
  return Value::List(std::move(items));
}

Result<Value> GNamespace(Interp& in, CallArgs& a) {
  auto d = std::make_shared<DictData>();
  for (const auto& p : a.pos) {
    if (!p.is_dict()) return InvalidArgumentError("namespace() positional argument must be a dict");
    for (const auto& [k, v] : p.dict().items) d->Set(k, v);
  }
  for (const auto& [k, v] : a.kw) d->Set(k, v);
  for (const auto& [k, v] : d->items) {
    if (v.HoldsNamespace()) {
      return InvalidArgumentError("storing a namespace inside a namespace is not supported");
    }
  }
  CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(d->items.size()) * kSlotBytes));
  return Value::Namespace(std::move(d));
}

Result<Value> GDict(Interp& in, CallArgs& a) {
  auto d = std::make_shared<DictData>();
  for (const auto& p : a.pos) {
    if (!p.is_mapping()) return InvalidArgumentError("dict() positional argument must be a dict");
    for (const auto& [k, v] : p.dict().items) d->Set(k, v);
  }
  for (const auto& [k, v] : a.kw) d->Set(k, v);
  if (d->depth > kMaxValueDepth + 2) return InvalidArgumentError("dict nested too deeply");
  CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(d->items.size()) * kSlotBytes));
  return Value::Dict(std::move(d));
}

// The template's own error: its message becomes the Status message verbatim.
Result<Value> GRaiseException(Interp& in, CallArgs& a) {
  std::string msg = "raise_exception called";
  if (!a.pos.empty()) {
    CHORUS_ASSIGN_OR_RETURN(msg, in.ToStr(a.pos[0]));
  }
  return InvalidArgumentError(std::move(msg));
}

// ---------------------------------------------------------------- methods

Result<Value> StringMethod(Interp& in, const std::string& s, const std::string& name, CallArgs& a) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, name));
    const Value* chars = Arg(a, 0, "chars");
    std::string c;
    const std::string* cp = nullptr;
    if (chars != nullptr && !chars->is_none()) {
      CHORUS_ASSIGN_OR_RETURN(c, StrArg(chars, "strip chars"));
      cp = &c;
    }
    return in.MakeString(Strip(s, cp, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* p = Arg(a, 0, "prefix");
    if (p == nullptr) return InvalidArgumentError(name + " needs an argument");
    std::vector<Value> options = p->is_list() ? p->list() : std::vector<Value>{*p};
    for (const auto& o : options) {
      CHORUS_ASSIGN_OR_RETURN(std::string x, StrArg(&o, name + " argument"));
      const bool hit = name == "startswith" ? s.compare(0, x.size(), x) == 0
                                            : (s.size() >= x.size() &&
                                               s.compare(s.size() - x.size(), x.size(), x) == 0);
      if (hit) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split") {
    CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, name));
    const Value* sep = Arg(a, 0, "sep");
    int64_t maxsplit = -1;
    if (const Value* m = Arg(a, 1, "maxsplit")) {
      CHORUS_ASSIGN_OR_RETURN(maxsplit, IntArg(m, "maxsplit"));
    }
    if (sep != nullptr && !sep->is_none()) {
      CHORUS_ASSIGN_OR_RETURN(std::string sp, StrArg(sep, "split separator"));
      if (sp.empty()) return InvalidArgumentError("empty separator");
      return StrList(in, Split(s, &sp, maxsplit));
    }
    return StrList(in, Split(s, nullptr, maxsplit));
  }
  if (name == "upper") return in.MakeString(Upper(s));
  if (name == "lower") return in.MakeString(Lower(s));
  if (name == "title") return in.MakeString(Title(s));
  if (name == "capitalize") return in.MakeString(Capitalize(s));
  if (name == "replace") {
    CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, name));
    CHORUS_ASSIGN_OR_RETURN(std::string from, StrArg(Arg(a, 0, "old"), "replace old"));
    CHORUS_ASSIGN_OR_RETURN(std::string to, StrArg(Arg(a, 1, "new"), "replace new"));
    int64_t count = -1;
    if (const Value* c = Arg(a, 2, "count")) {
      CHORUS_ASSIGN_OR_RETURN(count, IntArg(c, "replace count"));
    }
    CHORUS_ASSIGN_OR_RETURN(std::string r, Replace(in, s, from, to, count));
    return in.MakeString(std::move(r));
  }
  if (name == "find" || name == "count") {
    CHORUS_ASSIGN_OR_RETURN(std::string sub, StrArg(Arg(a, 0, "sub"), name + " argument"));
    if (name == "find") {
      const size_t pos = s.find(sub);
      if (pos == std::string::npos) return Value::Int(-1);
      return Value::Int(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, pos))));
    }
    if (sub.empty()) return Value::Int(static_cast<int64_t>(Utf8Length(s)) + 1);
    int64_t n = 0;
    for (size_t pos = s.find(sub); pos != std::string::npos; pos = s.find(sub, pos + sub.size())) {
      ++n;
    }
    return Value::Int(n);
  }
  if (name == "join") {
    const Value* it = Arg(a, 0, "iterable");
    if (it == nullptr) return InvalidArgumentError("join needs an iterable");
    Node at;
    CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(*it, at));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      CHORUS_RETURN_IF_ERROR(in.Step());
      if (!items[i].is_string()) {
        return InvalidArgumentError("sequence item " + std::to_string(i) + ": expected str, " +
                                    std::string(items[i].TypeName()) + " found");
      }
      if (i > 0) out += s;
      out += items[i].str();
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    }
    return in.MakeString(std::move(out));
  }
  if (name == "isdigit" || name == "isspace") {
    if (s.empty()) return Value::Bool(false);
    for (char c : s) {
      const bool ok = name == "isdigit" ? (c >= '0' && c <= '9') : IsPyWhitespace(c);
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  return InvalidArgumentError("'str' object has no attribute '" + name + "'");
}

}  // namespace

// ---------------------------------------------------------------- registries

FilterFn FindFilter(std::string_view name) {
  static const auto* const kFilters = new std::unordered_map<std::string_view, FilterFn>{
      {"trim", FTrim},
      {"length", FLength},
      {"count", FLength},
      {"upper", FUpper},
      {"lower", FLower},
      {"title", FTitle},
      {"capitalize", FCapitalize},
      {"tojson", FToJson},
      {"default", FDefault},
      {"d", FDefault},
      {"join", FJoin},
      {"first", FFirst},
      {"last", FLast},
      {"string", FString},
      {"replace", FReplace},
      {"safe", FSafe},
      {"e", FEscape},
      {"escape", FEscape},
      {"items", FItems},
      {"list", FList},
      {"int", FInt},
      {"float", FFloat},
      {"abs", FAbs},
      {"reverse", FReverse},
      {"map", FMap},
      {"select", FSelect},
      {"reject", FReject},
      {"selectattr", FSelectAttr},
      {"rejectattr", FRejectAttr},
  };
  auto it = kFilters->find(name);
  return it == kFilters->end() ? nullptr : it->second;
}

TestFn FindTest(std::string_view name) {
  static const auto* const kTests = new std::unordered_map<std::string_view, TestFn>{
      {"defined", TDefined},
      {"undefined", TUndefined},
      {"none", TNone},
      {"string", TString},
      {"mapping", TMapping},
      {"iterable", TIterable},
      {"sequence", TSequence},
      {"number", TNumber},
      {"integer", TInteger},
      {"float", TFloat},
      {"boolean", TBoolean},
      {"true", TTrue},
      {"false", TFalse},
      {"callable", TCallable},
      {"odd", TOdd},
      {"even", TEven},
      {"divisibleby", TDivisibleBy},
      {"eq", TEq},
      {"equalto", TEq},
      {"==", TEq},
      {"ne", TNe},
      {"!=", TNe},
      {"lt", TLt},
      {"lessthan", TLt},
      {"le", TLe},
      {"gt", TGt},
      {"greaterthan", TGt},
      {"ge", TGe},
      {"in", TIn},
      {"lower", TLower},
      {"upper", TUpper},
      {"sameas", TSameAs},
  };
  auto it = kTests->find(name);
  return it == kTests->end() ? nullptr : it->second;
}

const Value* FindGlobal(const std::string& name) {
  static const auto* const kGlobals = [] {
    auto* m = new std::unordered_map<std::string, Value>();
    auto add = [&](const char* n, BuiltinFn fn) {
      auto c = std::make_shared<Callable>();
      c->name = n;
      c->builtin = fn;
      (*m)[n] = Value::Function(std::move(c));
    };
    add("range", GRange);
    add("namespace", GNamespace);
    add("dict", GDict);
    add("raise_exception", GRaiseException);
    return m;
  }();
  auto it = kGlobals->find(name);
  return it == kGlobals->end() ? nullptr : &it->second;
}

Result<Value> GetAttr(const Value& obj, const std::string& name, const Node& at) {
  if (obj.is_undefined()) return RuntimeError(at, obj.str());
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value::Undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no attribute '" + name +
                          "'");
}

Result<Value> CallMethod(Interp& in, const Value& obj, const std::string& name, CallArgs& args) {
  if (obj.is_string()) return StringMethod(in, obj.str(), name, args);
  if (obj.is_dict()) {
    const DictData& d = obj.dict();
    if (name == "items") {
      CallArgs none;
      return FItems(in, obj, none);
    }
    if (name == "keys" || name == "values") {
      std::vector<Value> out;
      out.reserve(d.items.size());
      for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value::Str(k) : v);
      return in.MakeList(std::move(out));
    }
    if (name == "get") {
      CHORUS_ASSIGN_OR_RETURN(std::string key, StrArg(Arg(args, 0, "key"), "get key"));
      if (const Value* v = d.Find(key)) return *v;
      const Value* def = Arg(args, 1, "default");
      return def != nullptr ? *def : Value::None();
    }
    // loop.cycle('odd', 'even')
    if (name == "cycle" && d.Find("index0") != nullptr && d.Find("revindex0") != nullptr) {
      if (args.pos.empty()) return InvalidArgumentError("cycle needs at least one argument");
      const int64_t i = d.Find("index0")->int_value();
      return args.pos[static_cast<size_t>(i) % args.pos.size()];
    }
    // A callable stored in a dict (rare): call it.
    if (const Value* v = d.Find(name); v != nullptr && v->is_callable()) {
      const Callable& c = v->callable();
      Node at;
      if (c.macro != nullptr) return in.CallMacro(*c.macro, args, at);
      return c.builtin(in, args);
    }
  }
  if (obj.is_list() && (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
                        name == "remove" || name == "clear")) {
    return InvalidArgumentError("lists are immutable in chat templates ('" + name + "')");
  }
  return InvalidArgumentError("'" + std::string(obj.TypeName()) + "' object has no attribute '" +
                              name + "'");
}

}  // namespace chorus::tokenizer::jinja

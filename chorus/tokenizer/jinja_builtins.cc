#include "chorus/tokenizer/jinja_builtins.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string_view>
#include <unordered_map>
#include <utility>

#include "chorus/tokenizer/jinja_strings.h"

namespace chorus::tokenizer::jinja {

namespace {

constexpr int64_t kSlotBytes = 16;

// ---------------------------------------------------------------- argument helpers

const Value* Arg(const CallArgs& a, size_t i, std::string_view name) {
  if (i < a.pos.size()) return &a.pos[i];
  return a.Kw(name);
}

bool BoolArg(const CallArgs& a, size_t i, std::string_view name, bool def) {
  const Value* v = Arg(a, i, name);
  return v == nullptr ? def : v->Truthy();
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

// Strips whitespace (chars == nullptr) or any code point of *chars.
// The code point starting at byte i (an invalid byte is itself) and its length.
char32_t CodePointAt(const std::string& s, size_t i, size_t* len) {
  *len = Utf8SeqLen(s, i);
  const auto b = static_cast<unsigned char>(s[i]);
  if (*len == 1) return b;
  char32_t cp = b & (0xFF >> (*len + 1));
  for (size_t k = 1; k < *len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Start of the code point that ends at byte e (exclusive), e > 0.
size_t CodePointStartBefore(const std::string& s, size_t e) {
  size_t b = e - 1;
  // Back over up to three continuation bytes, then check that they form one valid sequence.
  size_t k = b;
  while (k > 0 && e - k < 4 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
  if (Utf8SeqLen(s, k) == e - k) return k;
  return b;
}

// Strips whitespace (chars == nullptr) or any code point of *chars, from the ends inwards
// (only the code points removed are decoded).
std::string Strip(const std::string& s, const std::string* chars, bool left, bool right) {
  const std::u32string set = chars != nullptr ? DecodeUtf8(*chars) : std::u32string();
  auto strip_cp = [&](char32_t c) {
    return chars == nullptr ? IsPySpace(c) : set.find(c) != std::u32string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t len;
      if (!strip_cp(CodePointAt(s, b, &len))) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      const size_t start = std::max(b, CodePointStartBefore(s, e));
      size_t len;
      if (!strip_cp(CodePointAt(s, start, &len))) break;
      e = start;
    }
  }
  return s.substr(b, e - b);
}

// str.split / str.rsplit. sep == nullptr splits at runs of Unicode whitespace.
std::vector<std::string> Split(const std::string& s, const std::string* sep, int64_t maxsplit,
                               bool from_right = false) {
  std::vector<std::string> parts;
  if (sep == nullptr) {
    std::u32string u = DecodeUtf8(s);
    if (from_right) std::reverse(u.begin(), u.end());
    size_t i = 0;
    while (true) {
      while (i < u.size() && IsPySpace(u[i])) ++i;
      if (i >= u.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit) {
        // The unsplit remainder keeps its trailing whitespace (Python).
        std::u32string piece = u.substr(i);
        if (from_right) std::reverse(piece.begin(), piece.end());
        parts.push_back(EncodeUtf8(piece));
        break;
      }
      size_t j = i;
      while (j < u.size() && !IsPySpace(u[j])) ++j;
      std::u32string piece = u.substr(i, j - i);
      if (from_right) std::reverse(piece.begin(), piece.end());
      parts.push_back(EncodeUtf8(piece));
      i = j;
    }
    if (from_right) std::reverse(parts.begin(), parts.end());
    return parts;
  }
  if (from_right) {
    size_t end = s.size();
    while (!(maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit)) {
      if (end < sep->size()) break;
      const size_t pos = s.rfind(*sep, end - sep->size());
      if (pos == std::string::npos) break;
      parts.push_back(s.substr(pos + sep->size(), end - pos - sep->size()));
      end = pos;
    }
    parts.push_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
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

// str.center / ljust / rjust (Python's padding split for center).
Result<std::string> Justify(Interp& in, const std::string& s, int64_t width,
                            const std::string& fill, std::string_view how) {
  const int64_t len = static_cast<int64_t>(Utf8Length(s));
  if (width <= len) return s;
  const int64_t marg = width - len;
  // Checked before multiplying: a width near 2^63 must not wrap around.
  if (static_cast<uint64_t>(marg) > in.max_output_bytes()) {
    return in.CheckStringSize(in.max_output_bytes() + 1);
  }
  CHORUS_RETURN_IF_ERROR(
      in.CheckStringSize(s.size() + static_cast<size_t>(marg) * std::max<size_t>(1, fill.size())));
  int64_t left = 0;
  if (how == "center") {
    left = marg / 2 + (marg & width & 1);
  } else if (how == "rjust") {
    left = marg;
  }
  std::string out;
  for (int64_t k = 0; k < left; ++k) out += fill;
  out += s;
  for (int64_t k = left; k < marg; ++k) out += fill;
  return out;
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
      if (v.seq_kind() == SeqKind::kGenerator) {
        return InvalidArgumentError("object of type 'generator' has no len()");
      }
      return Value::Int(static_cast<int64_t>(v.list().size()));
    case Value::Kind::kDict:
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
  return in.MakeString(PyUpper(s));
}
Result<Value> FLower(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(PyLower(s));
}
Result<Value> FTitle(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(JinjaTitle(s));
}
Result<Value> FCapitalize(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(PyCapitalize(s));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Result<Value> FToJson(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 4, "tojson"));
  JsonOptions o;
  o.ensure_ascii = BoolArg(a, 0, "ensure_ascii", false);
  if (const Value* i = Arg(a, 1, "indent"); i != nullptr && !i->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(i, "tojson indent"));
    o.indent = static_cast<int>(std::clamp<int64_t>(n, 0, 64));
  }
  std::string item_sep, key_sep;
  if (const Value* sep = Arg(a, 2, "separators"); sep != nullptr && !sep->is_none()) {
    if (!sep->is_plain_list() || sep->list().size() != 2 || !sep->list()[0].is_string() ||
        !sep->list()[1].is_string()) {
      return InvalidArgumentError("tojson separators must be a pair of strings");
    }
    item_sep = sep->list()[0].str();
    key_sep = sep->list()[1].str();
    o.item_sep = &item_sep;
    o.key_sep = &key_sep;
  }
  o.sort_keys = BoolArg(a, 3, "sort_keys", false);
  std::string s;
  CHORUS_RETURN_IF_ERROR(AppendJson(v, o, &s, in.max_output_bytes()));
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
  if (v.seq_kind() == SeqKind::kGenerator) {
    return InvalidArgumentError("'generator' object is not reversible");
  }
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

// The escaping of `escape` / `e` and `urlize`: & < > " ' as HTML entities (Markup's choice).
std::string HtmlEscape(const std::string& s) {
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
  return out;
}

Result<Value> FEscape(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return in.MakeString(HtmlEscape(s));
}

// `items` filter: a generator of (key, value) tuples; dict.items(): a dict_items view.
Result<Value> ItemPairs(Interp& in, const Value& v, SeqKind seq_kind) {
  if (v.is_undefined()) return in.MakeList({}, false, seq_kind);
  if (!v.is_mapping()) {
    return InvalidArgumentError("can only get item pairs from a mapping, not " +
                                std::string(v.TypeName()));
  }
  std::vector<Value> pairs;
  for (const auto& [k, val] : v.dict().items) {
    CHORUS_ASSIGN_OR_RETURN(Value p, in.MakeList({Value::Str(k), val}, /*tuple=*/true));
    pairs.push_back(std::move(p));
  }
  return in.MakeList(std::move(pairs), false, seq_kind);
}

Result<Value> FItems(Interp& in, const Value& v, CallArgs& a) {
  return ItemPairs(in, v, SeqKind::kGenerator);
}

Result<Value> FList(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_plain_list() && !v.is_tuple()) return v;
  if (v.is_list()) return in.MakeList(v.list());
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
  int base = 10;
  if (const Value* b = Arg(a, 1, "base"); b != nullptr && !b->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(b, "int base"));
    if (n != 0 && (n < 2 || n > 36))
      return InvalidArgumentError("int() base must be >= 2 and <= 36, or 0");
    base = static_cast<int>(n);
  }
  if (v.is_string()) {
    const std::string s = Strip(v.str(), nullptr, true, true);
    errno = 0;
    char* end = nullptr;
    const long long n = std::strtoll(s.c_str(), &end, base);
    if (base != 10) {
      if (!s.empty() && end == s.c_str() + s.size() && errno == 0) return Value::Int(n);
      return fallback;
    }
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
  // reversed(list) is an iterator; a generator is first turned into a list.
  return in.MakeList(std::move(items), false,
                     v.seq_kind() == SeqKind::kGenerator ? SeqKind::kList : SeqKind::kGenerator);
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
    return in.MakeList(std::move(out), false, SeqKind::kGenerator);
  }
  CHORUS_ASSIGN_OR_RETURN(std::string name, StrArg(Arg(a, 0, "name"), "map filter name"));
  FilterFn fn = FindFilter(name);
  if (fn == nullptr) return InvalidArgumentError("No filter named '" + name + "'.");
  CallArgs rest;
  rest.pos.assign(a.pos.begin() + 1, a.pos.end());
  rest.kw = a.kw;
  for (const auto& item : items) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    CallArgs copy = rest;
    CHORUS_ASSIGN_OR_RETURN(Value r, fn(in, item, copy));
    out.push_back(std::move(r));
  }
  return in.MakeList(std::move(out), false, SeqKind::kGenerator);
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
    if (test == nullptr) return InvalidArgumentError("No test named '" + name + "'.");
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
  return in.MakeList(std::move(out), false, SeqKind::kGenerator);
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

// ---------------------------------------------------------------- sorting and grouping

// Python's `<` ordering as sorted()/min()/max() use it: numbers, strings, and lists/tuples
// lexicographically; other mixes are a TypeError.
Result<int> PyCompare(Interp& in, const Value& a, const Value& b) {
  CHORUS_RETURN_IF_ERROR(in.Step());
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (!a.is_float() && !b.is_float()) {
      return a.int_value() < b.int_value() ? -1 : (a.int_value() > b.int_value() ? 1 : 0);
    }
    const double x = a.AsDouble(), y = b.AsDouble();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.str().compare(b.str());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  if (a.is_plain_list() && b.is_plain_list() && a.is_tuple() == b.is_tuple()) {
    const auto& x = a.list();
    const auto& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(x[i], y[i]));
      if (!eq) return PyCompare(in, x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : (x.size() > y.size() ? 1 : 0);
  }
  return InvalidArgumentError("'<' not supported between instances of '" +
                              std::string(a.TypeName()) + "' and '" + std::string(b.TypeName()) +
                              "'");
}

// Jinja's ignore_case: strings compare lower-cased.
Value IgnoreCase(const Value& v) { return v.is_string() ? Value::Str(PyLower(v.str())) : v; }

// environment.getitem along a dotted attribute path (make_attrgetter): "a.0.b"; an int
// attribute indexes.
Result<Value> GetItemPath(const Value& item, const Value& attribute) {
  if (attribute.is_int()) {
    if (item.is_plain_list()) {
      int64_t k = attribute.int_value();
      const auto n = static_cast<int64_t>(item.list().size());
      if (k < 0) k += n;
      if (k >= 0 && k < n) return item.list()[static_cast<size_t>(k)];
    }
    return Value::Undefined("index out of range");
  }
  if (!attribute.is_string()) return InvalidArgumentError("attribute must be a string");
  return AttrPath(item, attribute.str());
}

// The key of `item` for sort/unique/min/max/groupby: optional attribute, optional case folding.
Result<Value> SortKey(const Value& item, const Value* attribute, bool case_sensitive,
                      const Value* default_value = nullptr) {
  Value k = item;
  if (attribute != nullptr && !attribute->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(k, GetItemPath(item, *attribute));
    if (k.is_undefined() && default_value != nullptr) k = *default_value;
  }
  return case_sensitive ? k : IgnoreCase(k);
}

// Stable sort of `items` by `keys` (Python's sorted with key=..., reverse=...).
Status SortByKeys(Interp& in, std::vector<Value>* items, const std::vector<Value>& keys,
                  bool reverse) {
  std::vector<size_t> order(items->size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  Status err = OkStatus();
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (!err.ok()) return false;
    // reverse=True keeps equal items in their original order, as Python does.
    auto r = reverse ? PyCompare(in, keys[b], keys[a]) : PyCompare(in, keys[a], keys[b]);
    if (!r.ok()) {
      err = r.status();
      return false;
    }
    return *r < 0;
  });
  CHORUS_RETURN_IF_ERROR(err);
  std::vector<Value> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back((*items)[i]);
  *items = std::move(sorted);
  return OkStatus();
}

Result<Value> FSort(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, "sort"));
  const bool reverse = BoolArg(a, 0, "reverse", false);
  const bool case_sensitive = BoolArg(a, 1, "case_sensitive", false);
  const Value* attribute = Arg(a, 2, "attribute");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::vector<Value> keys;
  for (const auto& item : items) {
    CHORUS_ASSIGN_OR_RETURN(Value k, SortKey(item, attribute, case_sensitive));
    keys.push_back(std::move(k));
  }
  CHORUS_RETURN_IF_ERROR(SortByKeys(in, &items, keys, reverse));
  return in.MakeList(std::move(items));
}

Result<Value> FDictSort(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, "dictsort"));
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false);
  std::string by = "key";
  if (const Value* b = Arg(a, 1, "by")) {
    CHORUS_ASSIGN_OR_RETURN(by, StrArg(b, "dictsort by"));
  }
  const bool reverse = BoolArg(a, 2, "reverse", false);
  if (by != "key" && by != "value") {
    return InvalidArgumentError("You can only sort by either 'key' or 'value'");
  }
  if (!v.is_mapping()) {
    return InvalidArgumentError("'" + std::string(v.TypeName()) +
                                "' object has no attribute 'items'");
  }
  std::vector<Value> items, keys;
  for (const auto& [k, val] : v.dict().items) {
    CHORUS_ASSIGN_OR_RETURN(Value pair, in.MakeList({Value::Str(k), val}, /*tuple=*/true));
    items.push_back(std::move(pair));
    const Value& key = by == "key" ? items.back().list()[0] : val;
    keys.push_back(case_sensitive ? key : IgnoreCase(key));
  }
  CHORUS_RETURN_IF_ERROR(SortByKeys(in, &items, keys, reverse));
  return in.MakeList(std::move(items));
}

// Python hashability, for unique().
Status CheckHashable(const Value& v) {
  if (v.is_plain_list() && v.is_tuple()) {
    for (const auto& e : v.list()) CHORUS_RETURN_IF_ERROR(CheckHashable(e));
    return OkStatus();
  }
  if (v.is_list() || v.is_dict()) {
    return InvalidArgumentError("unhashable type: '" + std::string(v.TypeName()) + "'");
  }
  return OkStatus();
}

Result<Value> FUnique(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "unique"));
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false);
  const Value* attribute = Arg(a, 1, "attribute");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::vector<Value> seen, out;
  for (const auto& item : items) {
    CHORUS_ASSIGN_OR_RETURN(Value k, SortKey(item, attribute, case_sensitive));
    CHORUS_RETURN_IF_ERROR(CheckHashable(k));
    bool dup = false;
    for (const auto& s : seen) {
      CHORUS_ASSIGN_OR_RETURN(dup, in.Equal(s, k));
      if (dup) break;
    }
    if (dup) continue;
    seen.push_back(std::move(k));
    out.push_back(item);
  }
  return in.MakeList(std::move(out), false, SeqKind::kGenerator);
}

Result<Value> MinOrMax(Interp& in, const Value& v, CallArgs& a, bool want_max) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, want_max ? "max" : "min"));
  const bool case_sensitive = BoolArg(a, 0, "case_sensitive", false);
  const Value* attribute = Arg(a, 1, "attribute");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  if (items.empty()) return Value::Undefined("No aggregated item, sequence was empty.");
  size_t best = 0;
  CHORUS_ASSIGN_OR_RETURN(Value best_key, SortKey(items[0], attribute, case_sensitive));
  for (size_t i = 1; i < items.size(); ++i) {
    CHORUS_ASSIGN_OR_RETURN(Value k, SortKey(items[i], attribute, case_sensitive));
    // Python's min/max keep the first of equal items.
    CHORUS_ASSIGN_OR_RETURN(int c,
                            want_max ? PyCompare(in, best_key, k) : PyCompare(in, k, best_key));
    if (c < 0) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}
Result<Value> FMin(Interp& in, const Value& v, CallArgs& a) { return MinOrMax(in, v, a, false); }
Result<Value> FMax(Interp& in, const Value& v, CallArgs& a) { return MinOrMax(in, v, a, true); }

Result<Value> FSum(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "sum"));
  const Value* attribute = Arg(a, 0, "attribute");
  const Value* start = Arg(a, 1, "start");
  Value acc = start != nullptr ? *start : Value::Int(0);
  if (acc.is_string())
    return InvalidArgumentError("sum() can't sum strings [use ''.join(seq) instead]");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  for (const auto& item : items) {
    CHORUS_RETURN_IF_ERROR(in.Step());
    Value x = item;
    if (attribute != nullptr && !attribute->is_none()) {
      CHORUS_ASSIGN_OR_RETURN(x, GetItemPath(item, *attribute));
    }
    if ((acc.is_number() || acc.is_bool()) && (x.is_number() || x.is_bool())) {
      if (!acc.is_float() && !x.is_float()) {
        int64_t r;
        if (__builtin_add_overflow(acc.int_value(), x.int_value(), &r)) {
          return InvalidArgumentError("integer overflow");
        }
        acc = Value::Int(r);
      } else {
        acc = Value::Float(acc.AsDouble() + x.AsDouble());
      }
    } else if (acc.is_plain_list() && x.is_plain_list() && acc.is_tuple() == x.is_tuple()) {
      std::vector<Value> joined = acc.list();
      joined.insert(joined.end(), x.list().begin(), x.list().end());
      CHORUS_ASSIGN_OR_RETURN(acc, in.MakeList(std::move(joined), acc.is_tuple()));
    } else {
      if (x.is_undefined()) return InvalidArgumentError(x.str());
      return InvalidArgumentError("unsupported operand type(s) for +: '" +
                                  std::string(acc.TypeName()) + "' and '" +
                                  std::string(x.TypeName()) + "'");
    }
  }
  return acc;
}

Result<Value> FBatch(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "batch"));
  CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(Arg(a, 0, "linecount"), "batch linecount"));
  const Value* fill = Arg(a, 1, "fill_with");
  if (n <= 0) return InvalidArgumentError("batch linecount must be positive");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::vector<Value> out, cur;
  for (const auto& item : items) {
    if (static_cast<int64_t>(cur.size()) == n) {
      CHORUS_ASSIGN_OR_RETURN(Value l, in.MakeList(std::move(cur)));
      out.push_back(std::move(l));
      cur.clear();
    }
    cur.push_back(item);
  }
  if (!cur.empty()) {
    if (fill != nullptr && !fill->is_none()) {
      while (static_cast<int64_t>(cur.size()) < n) cur.push_back(*fill);
    }
    CHORUS_ASSIGN_OR_RETURN(Value l, in.MakeList(std::move(cur)));
    out.push_back(std::move(l));
  }
  return in.MakeList(std::move(out), false, SeqKind::kGenerator);
}

Result<Value> FSlice(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "slice"));
  CHORUS_ASSIGN_OR_RETURN(int64_t slices, IntArg(Arg(a, 0, "slices"), "slice count"));
  const Value* fill = Arg(a, 1, "fill_with");
  if (slices <= 0) return InvalidArgumentError("integer division or modulo by zero");
  if (slices > 100000) return InvalidArgumentError("slice count too large");
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> seq, in.Iterate(v, at));
  const auto length = static_cast<int64_t>(seq.size());
  const int64_t per = length / slices, extra = length % slices;
  int64_t offset = 0;
  std::vector<Value> out;
  for (int64_t k = 0; k < slices; ++k) {
    const int64_t start = offset + k * per;
    if (k < extra) ++offset;
    const int64_t end = offset + (k + 1) * per;
    std::vector<Value> tmp(seq.begin() + start, seq.begin() + end);
    if (fill != nullptr && !fill->is_none() && k >= extra) tmp.push_back(*fill);
    CHORUS_ASSIGN_OR_RETURN(Value l, in.MakeList(std::move(tmp)));
    out.push_back(std::move(l));
  }
  return in.MakeList(std::move(out), false, SeqKind::kGenerator);
}

Result<Value> FGroupBy(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, "groupby"));
  const Value* attribute = Arg(a, 0, "attribute");
  if (attribute == nullptr) return InvalidArgumentError("groupby needs an attribute");
  const Value* def = Arg(a, 1, "default");
  const bool case_sensitive = BoolArg(a, 2, "case_sensitive", false);
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  std::vector<Value> keys;
  for (const auto& item : items) {
    CHORUS_ASSIGN_OR_RETURN(Value k, SortKey(item, attribute, case_sensitive, def));
    keys.push_back(std::move(k));
  }
  std::vector<size_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  {
    std::vector<Value> idx;
    for (size_t i = 0; i < order.size(); ++i) idx.push_back(Value::Int(static_cast<int64_t>(i)));
    CHORUS_RETURN_IF_ERROR(SortByKeys(in, &idx, keys, false));
    for (size_t i = 0; i < idx.size(); ++i) order[i] = static_cast<size_t>(idx[i].int_value());
  }
  std::vector<Value> groups;
  size_t i = 0;
  while (i < order.size()) {
    size_t j = i + 1;
    while (j < order.size()) {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(keys[order[i]], keys[order[j]]));
      if (!eq) break;
      ++j;
    }
    std::vector<Value> members;
    for (size_t k = i; k < j; ++k) members.push_back(items[order[k]]);
    // The grouper is the first member's real (not case-folded) key.
    CHORUS_ASSIGN_OR_RETURN(Value grouper, SortKey(members[0], attribute, true, def));
    CHORUS_ASSIGN_OR_RETURN(Value list, in.MakeList(std::move(members)));
    CHORUS_RETURN_IF_ERROR(in.Alloc(2 * 16));
    groups.push_back(Value::NamedTuple({std::move(grouper), std::move(list)}, {"grouper", "list"}));
    i = j;
  }
  return in.MakeList(std::move(groups));
}

// ---------------------------------------------------------------- text filters

Result<Value> FIndent(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 3, "indent"));
  // Jinja appends "\n" to the value itself: anything but a string is a TypeError there.
  if (!v.is_string()) {
    return InvalidArgumentError("unsupported operand type(s) for +=: '" +
                                std::string(v.TypeName()) + "' and 'str'");
  }
  std::string s = v.str();
  std::string indention = "    ";
  if (const Value* w = Arg(a, 0, "width")) {
    if (w->is_string()) {
      indention = w->str();
    } else {
      CHORUS_ASSIGN_OR_RETURN(int64_t n, IntArg(w, "indent width"));
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(static_cast<size_t>(std::max<int64_t>(0, n))));
      indention.assign(static_cast<size_t>(std::max<int64_t>(0, n)), ' ');
    }
  }
  const bool first = BoolArg(a, 1, "first", false);
  const bool blank = BoolArg(a, 2, "blank", false);
  s += "\n";  // Jinja's own quirk, so that splitlines keeps a trailing empty line
  std::vector<std::string> lines = PySplitLines(s, false);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) rv += "\n" + indention;
      rv += lines[i];
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(rv.size()));
    }
  } else {
    rv = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i) {
      rv += "\n";
      if (!lines[i].empty()) rv += indention;
      rv += lines[i];
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(rv.size()));
    }
  }
  if (first) rv = indention + rv;
  return in.MakeString(std::move(rv));
}

Result<Value> FCenter(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, "center"));
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  int64_t width = 80;
  if (const Value* w = Arg(a, 0, "width")) {
    CHORUS_ASSIGN_OR_RETURN(width, IntArg(w, "center width"));
  }
  CHORUS_ASSIGN_OR_RETURN(std::string r, Justify(in, s, width, " ", "center"));
  return in.MakeString(std::move(r));
}

Result<Value> FTruncate(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 4, "truncate"));
  // Jinja measures the value itself: a short list or dict comes back unchanged, a value
  // without len() is a TypeError.
  if (!v.is_string() && !(v.is_plain_list() || v.is_dict())) {
    return InvalidArgumentError("object of type '" + std::string(v.TypeName()) + "' has no len()");
  }
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  int64_t length = 255, leeway = 5;
  if (const Value* l = Arg(a, 0, "length")) {
    CHORUS_ASSIGN_OR_RETURN(length, IntArg(l, "truncate length"));
  }
  const bool killwords = BoolArg(a, 1, "killwords", false);
  std::string end = "...";
  if (const Value* e = Arg(a, 2, "end")) {
    CHORUS_ASSIGN_OR_RETURN(end, StrArg(e, "truncate end"));
  }
  if (const Value* l = Arg(a, 3, "leeway"); l != nullptr && !l->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(leeway, IntArg(l, "truncate leeway"));
  }
  const std::u32string u = DecodeUtf8(s);
  const auto end_len = static_cast<int64_t>(Utf8Length(end));
  if (length < end_len)
    return InvalidArgumentError("expected length >= " + std::to_string(end_len));
  if (leeway < 0) return InvalidArgumentError("expected leeway >= 0");
  const int64_t len = v.is_string() ? static_cast<int64_t>(u.size())
                      : v.is_dict() ? static_cast<int64_t>(v.dict().items.size())
                                    : static_cast<int64_t>(v.list().size());
  if (len <= length + leeway) return v.is_string() ? in.MakeString(std::move(s)) : v;
  std::u32string head = u.substr(0, static_cast<size_t>(length - end_len));
  if (!killwords) {
    const size_t sp = head.rfind(U' ');
    if (sp != std::u32string::npos) head = head.substr(0, sp);
  }
  return in.MakeString(EncodeUtf8(head) + end);
}

Result<Value> FWordCount(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : DecodeUtf8(s)) {
    const bool w = IsWordCp(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value::Int(n);
}

// textwrap.wrap of one line as Jinja's wordwrap calls it (expand_tabs=False,
// replace_whitespace=False, drop_whitespace=True); words are split at whitespace only.
std::vector<std::u32string> WrapLine(const std::u32string& line, size_t width, bool break_long) {
  std::vector<std::u32string> chunks;
  for (size_t i = 0; i < line.size();) {
    const bool ws = IsPySpace(line[i]);
    size_t j = i;
    while (j < line.size() && IsPySpace(line[j]) == ws) ++j;
    chunks.push_back(line.substr(i, j - i));
    i = j;
  }
  std::reverse(chunks.begin(), chunks.end());
  std::vector<std::u32string> lines;
  auto is_blank = [](const std::u32string& c) {
    return std::all_of(c.begin(), c.end(), [](char32_t x) { return IsPySpace(x); });
  };
  while (!chunks.empty()) {
    std::vector<std::u32string> cur;
    size_t cur_len = 0;
    if (!lines.empty() && is_blank(chunks.back())) chunks.pop_back();
    while (!chunks.empty()) {
      const size_t l = chunks.back().size();
      if (cur_len + l <= width) {
        cur.push_back(chunks.back());
        chunks.pop_back();
        cur_len += l;
      } else {
        break;
      }
    }
    if (!chunks.empty() && chunks.back().size() > width) {
      const size_t space_left = width > cur_len ? width - cur_len : 1;
      if (break_long) {
        cur.push_back(chunks.back().substr(0, space_left));
        chunks.back() = chunks.back().substr(space_left);
      } else if (cur.empty()) {
        cur.push_back(chunks.back());
        chunks.pop_back();
      }
    }
    if (!cur.empty() && is_blank(cur.back())) cur.pop_back();
    if (!cur.empty()) {
      std::u32string joined;
      for (const auto& c : cur) joined += c;
      lines.push_back(std::move(joined));
    }
  }
  return lines;
}

Result<Value> FWordWrap(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 5, "wordwrap"));
  if (!v.is_string()) {  // Jinja calls s.splitlines()
    return InvalidArgumentError("'" + std::string(v.TypeName()) +
                                "' object has no attribute 'splitlines'");
  }
  const std::string& s = v.str();
  int64_t width = 79;
  if (const Value* w = Arg(a, 0, "width")) {
    CHORUS_ASSIGN_OR_RETURN(width, IntArg(w, "wordwrap width"));
  }
  if (width <= 0)
    return InvalidArgumentError("invalid width " + std::to_string(width) + " (must be > 0)");
  const bool break_long = BoolArg(a, 1, "break_long_words", true);
  std::string wrapstring = "\n";
  if (const Value* w = Arg(a, 2, "wrapstring"); w != nullptr && !w->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(wrapstring, StrArg(w, "wrapstring"));
  }
  std::string out;
  const auto lines = PySplitLines(s, false);
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) out += wrapstring;
    const auto wrapped = WrapLine(DecodeUtf8(lines[i]), static_cast<size_t>(width), break_long);
    for (size_t k = 0; k < wrapped.size(); ++k) {
      CHORUS_RETURN_IF_ERROR(in.Step());
      if (k > 0) out += wrapstring;
      out += EncodeUtf8(wrapped[k]);
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    }
  }
  return in.MakeString(std::move(out));
}

Result<Value> FFileSizeFormat(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, "filesizeformat"));
  const bool binary = BoolArg(a, 0, "binary", false);
  double bytes;
  if (v.is_number() || v.is_bool()) {
    bytes = v.AsDouble();
  } else if (v.is_string()) {
    char* end = nullptr;
    const std::string t = Strip(v.str(), nullptr, true, true);
    bytes = std::strtod(t.c_str(), &end);
    if (t.empty() || end != t.c_str() + t.size()) {
      return InvalidArgumentError("could not convert string to float: '" + v.str() + "'");
    }
  } else {
    return InvalidArgumentError("float() argument must be a string or a real number");
  }
  const double base = binary ? 1024 : 1000;
  static constexpr const char* kDec[] = {"kB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"};
  static constexpr const char* kBin[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  if (bytes == 1) return Value::Str("1 Byte");
  if (bytes < base) {
    return Value::Str(std::to_string(static_cast<int64_t>(bytes)) + " Bytes");
  }
  char buf[64];
  double unit = base;
  for (int i = 0; i < 8; ++i) {
    unit = std::pow(base, i + 2);
    if (bytes < unit || i == 7) {
      std::snprintf(buf, sizeof(buf), "%.1f %s", base * bytes / unit, binary ? kBin[i] : kDec[i]);
      return Value::Str(buf);
    }
  }
  return Value::Str("");
}

Result<Value> FFormat(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  if (!a.pos.empty() && !a.kw.empty()) {
    return InvalidArgumentError("can't handle positional and keyword arguments at the same time");
  }
  Value arg;
  if (!a.kw.empty()) {
    auto d = std::make_shared<DictData>();
    for (const auto& [k, x] : a.kw) d->Set(k, x);
    arg = Value::Dict(std::move(d));
  } else {
    CHORUS_ASSIGN_OR_RETURN(arg, in.MakeList(a.pos, /*tuple=*/true));
  }
  CHORUS_ASSIGN_OR_RETURN(std::string r, PyPercent(s, arg, in.max_output_bytes()));
  return in.MakeString(std::move(r));
}

// The sandbox's getattr(obj, name) without the item fallback: a namespace's attributes and a
// named tuple's fields; anything else is undefined.
Result<Value> FAttr(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string name, StrArg(Arg(a, 0, "name"), "attr name"));
  if (v.is_namespace()) {
    if (const Value* f = v.dict().Find(name)) return *f;
  }
  if (v.is_list()) {
    Node at;
    return GetAttr(v, name, at);
  }
  return Value::Undefined("'" + std::string(v.TypeName()) + " object' has no attribute '" + name +
                          "'");
}

std::string HtmlUnescape(const std::string& s) {
  static constexpr std::pair<std::string_view, std::string_view> kNamed[] = {
      {"&amp;", "&"},   {"&lt;", "<"},   {"&gt;", ">"},
      {"&quot;", "\""}, {"&apos;", "'"}, {"&nbsp;", "\xC2\xA0"}};
  std::string out;
  for (size_t i = 0; i < s.size();) {
    if (s[i] != '&') {
      out.push_back(s[i++]);
      continue;
    }
    bool done = false;
    for (const auto& [name, text] : kNamed) {
      if (s.compare(i, name.size(), name) == 0) {
        out += text;
        i += name.size();
        done = true;
        break;
      }
    }
    if (!done && i + 2 < s.size() && s[i + 1] == '#') {
      const bool hex = s[i + 2] == 'x' || s[i + 2] == 'X';
      size_t j = i + (hex ? 3 : 2);
      uint32_t cp = 0;
      const size_t digits_start = j;
      while (j < s.size() && j - digits_start < 8 &&
             (hex ? std::isxdigit(static_cast<unsigned char>(s[j])) != 0
                  : std::isdigit(static_cast<unsigned char>(s[j])) != 0)) {
        cp = cp * (hex ? 16 : 10) +
             static_cast<uint32_t>(
                 std::isdigit(static_cast<unsigned char>(s[j]))
                     ? s[j] - '0'
                     : (std::tolower(static_cast<unsigned char>(s[j])) - 'a' + 10));
        ++j;
      }
      if (j > digits_start && cp > 0 && cp < 0x110000 && !(cp >= 0xD800 && cp < 0xE000)) {
        AppendUtf8(cp, &out);
        i = (j < s.size() && s[j] == ';') ? j + 1 : j;
        done = true;
      }
    }
    if (!done) out.push_back(s[i++]);
  }
  return out;
}

Result<Value> FStripTags(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  std::string no_comments;
  for (size_t i = 0; i < s.size();) {
    if (s.compare(i, 4, "<!--") == 0) {
      const size_t e = s.find("-->", i + 4);
      if (e != std::string::npos) {
        i = e + 3;
        continue;
      }
    }
    no_comments.push_back(s[i++]);
  }
  std::string no_tags;
  for (size_t i = 0; i < no_comments.size();) {
    if (no_comments[i] == '<') {
      const size_t e = no_comments.find('>', i + 1);
      if (e != std::string::npos) {
        i = e + 1;
        continue;
      }
    }
    no_tags.push_back(no_comments[i++]);
  }
  std::string joined;
  for (const auto& w : Split(no_tags, nullptr, -1)) {
    if (!joined.empty()) joined += " ";
    joined += w;
  }
  return in.MakeString(HtmlUnescape(joined));
}

std::string UrlQuote(const std::string& s, bool for_qs) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) || c == '_' || c == '.' || c == '-' || c == '~' || (!for_qs && c == '/')) {
      out.push_back(c);
    } else if (for_qs && c == ' ') {
      out.push_back('+');
    } else {
      char buf[4];
      std::snprintf(buf, sizeof(buf), "%%%02X", u);
      out += buf;
    }
  }
  return out;
}

Result<Value> FUrlEncode(Interp& in, const Value& v, CallArgs& a) {
  if (v.is_string()) return in.MakeString(UrlQuote(v.str(), false));
  if (!v.is_list() && !v.is_mapping() && !v.is_undefined()) {  // not iterable: quote str(v)
    CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
    return in.MakeString(UrlQuote(s, false));
  }
  std::vector<std::pair<Value, Value>> pairs;
  if (v.is_mapping()) {
    for (const auto& [k, x] : v.dict().items) pairs.emplace_back(Value::Str(k), x);
  } else {
    Node at;
    CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
    for (const auto& item : items) {
      if (!item.is_plain_list() || item.list().size() != 2) {
        return InvalidArgumentError("urlencode needs a mapping or (key, value) pairs");
      }
      pairs.emplace_back(item.list()[0], item.list()[1]);
    }
  }
  std::string out;
  for (const auto& [k, x] : pairs) {
    CHORUS_ASSIGN_OR_RETURN(std::string ks, in.ToStr(k));
    CHORUS_ASSIGN_OR_RETURN(std::string xs, in.ToStr(x));
    if (!out.empty()) out += "&";
    out += UrlQuote(ks, true) + "=" + UrlQuote(xs, true);
  }
  return in.MakeString(std::move(out));
}

Result<Value> FXmlAttr(Interp& in, const Value& v, CallArgs& a) {
  if (!v.is_mapping()) return InvalidArgumentError("xmlattr needs a mapping");
  const bool autospace = BoolArg(a, 0, "autospace", true);
  std::string out;
  for (const auto& [k, x] : v.dict().items) {
    if (x.is_none() || x.is_undefined()) continue;
    CHORUS_ASSIGN_OR_RETURN(std::string xs, in.ToStr(x));
    if (!out.empty()) out += " ";
    out += HtmlEscape(k) + "=\"" + HtmlEscape(xs) + "\"";
  }
  if (autospace && !out.empty()) out = " " + out;
  return in.MakeString(std::move(out));
}

// Jinja's urlize for the link forms chat text contains: http(s):// URLs, www. hosts and
// e-mail addresses, with surrounding punctuation left outside the link.
Result<Value> FUrlize(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  int64_t trim = -1;
  if (const Value* t = Arg(a, 0, "trim_url_limit"); t != nullptr && !t->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(trim, IntArg(t, "trim_url_limit"));
  }
  const bool nofollow = BoolArg(a, 1, "nofollow", false);
  std::string target;
  if (const Value* t = Arg(a, 2, "target"); t != nullptr && !t->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(target, in.ToStr(*t));
  }
  std::string rel = nofollow ? "nofollow noopener" : "noopener";
  if (const Value* r = Arg(a, 3, "rel"); r != nullptr && !r->is_none()) {
    CHORUS_ASSIGN_OR_RETURN(std::string extra, in.ToStr(*r));
    rel = extra + " " + rel;
  }
  auto trim_text = [&](const std::string& x) {
    if (trim < 0 || static_cast<int64_t>(Utf8Length(x)) <= trim) return x;
    const std::u32string u = DecodeUtf8(x);
    return EncodeUtf8(u.substr(0, static_cast<size_t>(trim))) + "...";
  };
  std::string attrs = " rel=\"" + HtmlEscape(rel) + "\"";
  if (!target.empty()) attrs += " target=\"" + HtmlEscape(target) + "\"";
  std::string out;
  const std::u32string u = DecodeUtf8(s);
  size_t i = 0;
  while (i < u.size()) {
    const bool ws = IsPySpace(u[i]);
    size_t j = i;
    while (j < u.size() && IsPySpace(u[j]) == ws) ++j;
    std::string word = EncodeUtf8(u.substr(i, j - i));
    i = j;
    if (ws) {
      out += HtmlEscape(word);
      continue;
    }
    size_t h = 0;
    while (h < word.size() && (word[h] == '(' || word[h] == '<')) ++h;
    size_t t = word.size();
    while (t > h && std::string_view(".,)>\n").find(word[t - 1]) != std::string_view::npos) --t;
    const std::string head = word.substr(0, h), mid = word.substr(h, t - h), tail = word.substr(t);
    std::string link;
    if (mid.rfind("http://", 0) == 0 || mid.rfind("https://", 0) == 0) {
      link =
          "<a href=\"" + HtmlEscape(mid) + "\"" + attrs + ">" + HtmlEscape(trim_text(mid)) + "</a>";
    } else if (mid.rfind("www.", 0) == 0 && mid.size() > 4) {
      link = "<a href=\"https://" + HtmlEscape(mid) + "\"" + attrs + ">" +
             HtmlEscape(trim_text(mid)) + "</a>";
    } else if (const size_t at = mid.find('@');
               at != std::string::npos && at > 0 && mid.find('@', at + 1) == std::string::npos &&
               mid.find('.', at) != std::string::npos && mid.find(':') == std::string::npos) {
      link = "<a href=\"mailto:" + HtmlEscape(mid) + "\">" + HtmlEscape(mid) + "</a>";
    }
    out += link.empty() ? HtmlEscape(word) : HtmlEscape(head) + link + HtmlEscape(tail);
  }
  return in.MakeString(std::move(out));
}

Result<Value> FPprint(Interp& in, const Value& v, CallArgs& a) {
  // pprint.pformat: repr with dict keys sorted (values that fit one 80-column line).
  std::function<Result<Value>(const Value&)> sorted = [&](const Value& x) -> Result<Value> {
    if (x.is_dict()) {
      std::vector<std::pair<std::string, Value>> items(x.dict().items.begin(),
                                                       x.dict().items.end());
      std::stable_sort(items.begin(), items.end(),
                       [](const auto& p, const auto& q) { return p.first < q.first; });
      auto d = std::make_shared<DictData>();
      for (auto& [k, e] : items) {
        CHORUS_ASSIGN_OR_RETURN(Value s, sorted(e));
        d->Set(k, std::move(s));
      }
      return Value::Dict(std::move(d));
    }
    if (x.is_plain_list()) {
      std::vector<Value> items;
      for (const auto& e : x.list()) {
        CHORUS_ASSIGN_OR_RETURN(Value s, sorted(e));
        items.push_back(std::move(s));
      }
      return x.is_tuple() ? Value::Tuple(std::move(items)) : Value::List(std::move(items));
    }
    return x;
  };
  CHORUS_ASSIGN_OR_RETURN(Value s, sorted(v));
  std::string out;
  CHORUS_RETURN_IF_ERROR(AppendRepr(s, &out, in.max_output_bytes()));
  return in.MakeString(std::move(out));
}

Result<Value> FRandom(Interp& in, const Value& v, CallArgs& a) {
  Node at;
  CHORUS_ASSIGN_OR_RETURN(std::vector<Value> items, in.Iterate(v, at));
  if (items.empty()) return Value::Undefined("No random item, sequence was empty.");
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return items[static_cast<size_t>(rng() % items.size())];
}

Result<Value> FRound(Interp& in, const Value& v, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, "round"));
  int64_t precision = 0;
  if (const Value* p = Arg(a, 0, "precision")) {
    CHORUS_ASSIGN_OR_RETURN(precision, IntArg(p, "round precision"));
  }
  std::string method = "common";
  if (const Value* m = Arg(a, 1, "method")) {
    CHORUS_ASSIGN_OR_RETURN(method, StrArg(m, "round method"));
  }
  if (method != "common" && method != "ceil" && method != "floor") {
    return InvalidArgumentError("method must be common, ceil or floor");
  }
  if (!v.is_number() && !v.is_bool()) {
    return InvalidArgumentError("type " + std::string(v.TypeName()) +
                                " doesn't define __round__ method");
  }
  precision = std::clamp<int64_t>(precision, -308, 308);
  if (method == "common") {
    // Python's round(): an int stays an int; floats round half to even on the exact binary
    // value, which printf's correctly rounded conversion does too.
    if (!v.is_float()) {
      if (precision >= 0) return Value::Int(v.int_value());
      const double r =
          std::nearbyint(static_cast<double>(v.int_value()) / std::pow(10.0, -precision)) *
          std::pow(10.0, -precision);
      return Value::Int(static_cast<int64_t>(r));
    }
    const double f = v.float_value();
    if (!std::isfinite(f)) return Value::Float(f);
    if (precision >= 0) {
      char buf[400];
      std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::min<int64_t>(precision, 300)),
                    f);
      return Value::Float(std::strtod(buf, nullptr));
    }
    const double scale = std::pow(10.0, -precision);
    return Value::Float(std::nearbyint(f / scale) * scale);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  const double x = v.AsDouble() * scale;
  return Value::Float((method == "ceil" ? std::ceil(x) : std::floor(x)) / scale);
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
  return v.is_plain_list() || v.is_string() || v.is_dict() || v.is_undefined();
}
Result<bool> TEscaped(Interp&, const Value&, CallArgs&) { return false; }
Result<bool> TFilter(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && FindFilter(v.str()) != nullptr;
}
Result<bool> TTest(Interp&, const Value& v, CallArgs&) {
  return v.is_string() && FindTest(v.str()) != nullptr;
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
// Jinja: str(value).islower() / isupper().
Result<bool> TLower(Interp& in, const Value& v, CallArgs&) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return PyIsLower(s);
}
Result<bool> TUpper(Interp& in, const Value& v, CallArgs&) {
  CHORUS_ASSIGN_OR_RETURN(std::string s, in.ToStr(v));
  return PyIsUpper(s);
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

// transformers' strftime_now(format): datetime.now().strftime(format), local time.
Result<Value> GStrftimeNow(Interp& in, CallArgs& a) {
  if (a.pos.size() != 1 || !a.pos[0].is_string() || !a.kw.empty()) {
    return InvalidArgumentError("strftime_now expects one format string");
  }
  const time_t now = in.now_unix >= 0 ? static_cast<time_t>(in.now_unix) : time(nullptr);
  struct tm tm_buf;
  if (localtime_r(&now, &tm_buf) == nullptr) return InternalError("localtime failed");
  const std::string& fmt = a.pos[0].str();
  if (fmt.size() > 1024) return InvalidArgumentError("strftime_now format is too long");
  std::string out(fmt.size() * 16 + 64, '\0');
  const size_t n = fmt.empty() ? 0 : strftime(out.data(), out.size(), fmt.c_str(), &tm_buf);
  out.resize(n);
  return in.MakeString(std::move(out));
}

// joiner(sep=", "): a callable that returns "" the first time and `sep` afterwards.
Result<Value> JoinerCall(Interp& in, const Callable& self, CallArgs& a) {
  if (self.state->counter++ == 0) return Value::Str("");
  return self.state->items[0];
}
Result<Value> GJoiner(Interp& in, CallArgs& a) {
  CHORUS_RETURN_IF_ERROR(MaxArgs(a, 1, "joiner"));
  auto c = std::make_shared<Callable>();
  c->name = "joiner";
  c->bound = JoinerCall;
  c->state = std::make_shared<CallState>();
  const Value* sep = Arg(a, 0, "sep");
  c->state->items.push_back(sep != nullptr ? *sep : Value::Str(", "));
  return Value::Function(std::move(c));
}

// cycler(*items): an object with next(), reset() and `current` (CallMethod / GetAttr).
Result<Value> GCycler(Interp& in, CallArgs& a) {
  if (a.pos.empty()) return InvalidArgumentError("at least one item has to be provided");
  auto c = std::make_shared<Callable>();
  c->name = "cycler";
  c->state = std::make_shared<CallState>();
  c->state->items = a.pos;
  return Value::Function(std::move(c));
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
    if (p->is_list() && !p->is_tuple()) {
      return InvalidArgumentError(name + " first arg must be str or a tuple of str, not " +
                                  std::string(p->TypeName()));
    }
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
  if (name == "upper") return in.MakeString(PyUpper(s));
  if (name == "lower") return in.MakeString(PyLower(s));
  if (name == "title") return in.MakeString(PyTitle(s));
  if (name == "capitalize") return in.MakeString(PyCapitalize(s));
  if (name == "swapcase") return in.MakeString(PySwapcase(s));
  if (name == "casefold") return in.MakeString(PyCasefold(s));
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
  if (name.size() > 2 && name.compare(0, 2, "is") == 0) {
    const std::u32string u = DecodeUtf8(s);
    if (name == "isupper") return Value::Bool(PyIsUpper(s));
    if (name == "islower") return Value::Bool(PyIsLower(s));
    if (name == "istitle") return Value::Bool(PyIsTitle(s));
    bool (*pred)(char32_t) = nullptr;
    if (name == "isspace") pred = [](char32_t c) { return IsPySpace(c); };
    if (name == "isdigit" || name == "isdecimal" || name == "isnumeric") {
      pred = [](char32_t c) { return IsDigitCp(c); };
    }
    if (name == "isalpha") pred = [](char32_t c) { return IsAlphaCp(c); };
    if (name == "isalnum") pred = [](char32_t c) { return IsAlphaCp(c) || IsDigitCp(c); };
    if (name == "isascii") {
      for (char32_t c : u) {
        if (c >= 0x80) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
    if (name == "isidentifier") {
      if (u.empty() || IsDigitCp(u[0])) return Value::Bool(false);
      for (char32_t c : u) {
        if (!(IsAlphaCp(c) || IsDigitCp(c) || c == U'_')) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
    if (pred != nullptr) {
      if (u.empty()) return Value::Bool(false);
      for (char32_t c : u) {
        if (!pred(c)) return Value::Bool(false);
      }
      return Value::Bool(true);
    }
  }
  if (name == "format") {
    CHORUS_ASSIGN_OR_RETURN(std::string r, PyFormat(s, a, in.max_output_bytes()));
    return in.MakeString(std::move(r));
  }
  if (name == "format_map") {
    const Value* m = Arg(a, 0, "mapping");
    if (m == nullptr || !m->is_mapping()) return InvalidArgumentError("format_map needs a mapping");
    CallArgs kw;
    for (const auto& [k, v] : m->dict().items) kw.kw.emplace_back(k, v);
    CHORUS_ASSIGN_OR_RETURN(std::string r, PyFormat(s, kw, in.max_output_bytes()));
    return in.MakeString(std::move(r));
  }
  if (name == "rsplit") {
    CHORUS_RETURN_IF_ERROR(MaxArgs(a, 2, name));
    const Value* sep = Arg(a, 0, "sep");
    int64_t maxsplit = -1;
    if (const Value* m = Arg(a, 1, "maxsplit")) {
      CHORUS_ASSIGN_OR_RETURN(maxsplit, IntArg(m, "maxsplit"));
    }
    if (sep != nullptr && !sep->is_none()) {
      CHORUS_ASSIGN_OR_RETURN(std::string sp, StrArg(sep, "split separator"));
      if (sp.empty()) return InvalidArgumentError("empty separator");
      return StrList(in, Split(s, &sp, maxsplit, true));
    }
    return StrList(in, Split(s, nullptr, maxsplit, true));
  }
  if (name == "splitlines") {
    const Value* keep = Arg(a, 0, "keepends");
    return StrList(in, PySplitLines(s, keep != nullptr && keep->Truthy()));
  }
  if (name == "rfind" || name == "index" || name == "rindex") {
    CHORUS_ASSIGN_OR_RETURN(std::string sub, StrArg(Arg(a, 0, "sub"), name + " argument"));
    const size_t pos = name == "index" ? s.find(sub) : s.rfind(sub);
    if (pos == std::string::npos) {
      if (name == "rfind") return Value::Int(-1);
      return InvalidArgumentError("substring not found");
    }
    return Value::Int(static_cast<int64_t>(Utf8Length(std::string_view(s).substr(0, pos))));
  }
  if (name == "center" || name == "ljust" || name == "rjust") {
    CHORUS_ASSIGN_OR_RETURN(int64_t width, IntArg(Arg(a, 0, "width"), name + " width"));
    std::string fill = " ";
    if (const Value* f = Arg(a, 1, "fillchar")) {
      CHORUS_ASSIGN_OR_RETURN(fill, StrArg(f, name + " fillchar"));
      if (Utf8Length(fill) != 1) {
        return InvalidArgumentError("The fill character must be exactly one character long");
      }
    }
    CHORUS_ASSIGN_OR_RETURN(std::string r, Justify(in, s, width, fill, name));
    return in.MakeString(std::move(r));
  }
  if (name == "zfill") {
    CHORUS_ASSIGN_OR_RETURN(int64_t width, IntArg(Arg(a, 0, "width"), "zfill width"));
    const int64_t len = static_cast<int64_t>(Utf8Length(s));
    if (width <= len) return in.MakeString(s);
    CHORUS_RETURN_IF_ERROR(in.CheckStringSize(static_cast<size_t>(width)));
    const size_t sign = (!s.empty() && (s[0] == '+' || s[0] == '-')) ? 1 : 0;
    return in.MakeString(s.substr(0, sign) + std::string(static_cast<size_t>(width - len), '0') +
                         s.substr(sign));
  }
  if (name == "partition" || name == "rpartition") {
    CHORUS_ASSIGN_OR_RETURN(std::string sep, StrArg(Arg(a, 0, "sep"), name + " separator"));
    if (sep.empty()) return InvalidArgumentError("empty separator");
    const size_t pos = name == "partition" ? s.find(sep) : s.rfind(sep);
    std::vector<Value> parts;
    if (pos == std::string::npos) {
      parts = name == "partition"
                  ? std::vector<Value>{Value::Str(s), Value::Str(""), Value::Str("")}
                  : std::vector<Value>{Value::Str(""), Value::Str(""), Value::Str(s)};
    } else {
      parts = {Value::Str(s.substr(0, pos)), Value::Str(sep),
               Value::Str(s.substr(pos + sep.size()))};
    }
    CHORUS_RETURN_IF_ERROR(in.Alloc(static_cast<int64_t>(s.size())));
    return in.MakeList(std::move(parts), /*tuple=*/true);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    CHORUS_ASSIGN_OR_RETURN(std::string x, StrArg(Arg(a, 0, "prefix"), name + " argument"));
    if (name == "removeprefix" && s.compare(0, x.size(), x) == 0) {
      return in.MakeString(s.substr(x.size()));
    }
    if (name == "removesuffix" && !x.empty() && s.size() >= x.size() &&
        s.compare(s.size() - x.size(), x.size(), x) == 0) {
      return in.MakeString(s.substr(0, s.size() - x.size()));
    }
    return in.MakeString(s);
  }
  if (name == "expandtabs") {
    int64_t tab = 8;
    if (const Value* t = Arg(a, 0, "tabsize")) {
      CHORUS_ASSIGN_OR_RETURN(tab, IntArg(t, "tabsize"));
    }
    std::string out;
    size_t col = 0;
    for (char32_t c : DecodeUtf8(s)) {
      if (c == U'\t') {
        if (tab > 0) {
          const size_t n = static_cast<size_t>(tab) - col % static_cast<size_t>(tab);
          CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size() + n));
          out.append(n, ' ');
          col += n;
        }
      } else {
        AppendUtf8(c, &out);
        col = (c == U'\n' || c == U'\r') ? 0 : col + 1;
      }
      CHORUS_RETURN_IF_ERROR(in.CheckStringSize(out.size()));
    }
    return in.MakeString(std::move(out));
  }
  return InvalidArgumentError("'str' object has no attribute '" + name + "'");
}

}  // namespace

// ---------------------------------------------------------------- registries

namespace {
const std::unordered_map<std::string_view, FilterFn>& Filters() {
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
      {"attr", FAttr},
      {"batch", FBatch},
      {"center", FCenter},
      {"dictsort", FDictSort},
      {"filesizeformat", FFileSizeFormat},
      {"forceescape", FEscape},
      {"format", FFormat},
      {"groupby", FGroupBy},
      {"indent", FIndent},
      {"max", FMax},
      {"min", FMin},
      {"pprint", FPprint},
      {"random", FRandom},
      {"round", FRound},
      {"slice", FSlice},
      {"sort", FSort},
      {"striptags", FStripTags},
      {"sum", FSum},
      {"truncate", FTruncate},
      {"unique", FUnique},
      {"urlencode", FUrlEncode},
      {"urlize", FUrlize},
      {"wordcount", FWordCount},
      {"wordwrap", FWordWrap},
      {"xmlattr", FXmlAttr},
  };
  return *kFilters;
}

const std::unordered_map<std::string_view, TestFn>& Tests() {
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
      {"<", TLt},
      {"<=", TLe},
      {">", TGt},
      {">=", TGe},
      {"escaped", TEscaped},
      {"filter", TFilter},
      {"test", TTest},
  };
  return *kTests;
}

template <typename Map>
std::vector<std::string> SortedNames(const Map& m) {
  std::vector<std::string> names;
  for (const auto& kv : m) names.emplace_back(kv.first);
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

FilterFn FindFilter(std::string_view name) {
  auto it = Filters().find(name);
  return it == Filters().end() ? nullptr : it->second;
}

TestFn FindTest(std::string_view name) {
  auto it = Tests().find(name);
  return it == Tests().end() ? nullptr : it->second;
}

std::vector<std::string> FilterNames() { return SortedNames(Filters()); }
std::vector<std::string> TestNames() { return SortedNames(Tests()); }

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
    add("strftime_now", GStrftimeNow);
    add("joiner", GJoiner);
    add("cycler", GCycler);
    return m;
  }();
  auto it = kGlobals->find(name);
  return it == kGlobals->end() ? nullptr : &it->second;
}

Result<Value> GetAttr(const Value& obj, const std::string& name, const Node& at) {
  if (obj.is_undefined()) return RuntimeError(at, obj.str());
  if (obj.is_callable() && obj.callable().name == "cycler" && obj.callable().state &&
      name == "current") {
    const CallState& st = *obj.callable().state;
    return st.items[static_cast<size_t>(st.counter) % st.items.size()];
  }
  if (obj.is_list()) {
    const auto& names = obj.field_names();
    for (size_t i = 0; i < names.size(); ++i) {
      if (names[i] == name) return obj.list()[i];
    }
  }
  if (obj.is_mapping()) {
    if (const Value* v = obj.dict().Find(name)) return *v;
    return Value::Undefined("'dict object' has no attribute '" + name + "'");
  }
  return Value::Undefined("'" + std::string(obj.TypeName()) + " object' has no attribute '" + name +
                          "'");
}

Result<Value> CallMethod(Interp& in, const Value& obj, const std::string& name, CallArgs& args) {
  if (obj.is_string()) return StringMethod(in, obj.str(), name, args);
  if (obj.is_callable() && obj.callable().name == "cycler" && obj.callable().state) {
    CallState& st = *obj.callable().state;
    const auto n = static_cast<int64_t>(st.items.size());
    if (name == "next") {
      const Value v = st.items[static_cast<size_t>(st.counter % n)];
      st.counter = (st.counter + 1) % n;
      return v;
    }
    if (name == "reset") {
      st.counter = 0;
      return Value::None();
    }
  }
  if (obj.is_dict()) {
    const DictData& d = obj.dict();
    if (name == "items") return ItemPairs(in, obj, SeqKind::kDictItems);
    if (name == "keys" || name == "values") {
      std::vector<Value> out;
      out.reserve(d.items.size());
      for (const auto& [k, v] : d.items) out.push_back(name == "keys" ? Value::Str(k) : v);
      return in.MakeList(std::move(out), false,
                         name == "keys" ? SeqKind::kDictKeys : SeqKind::kDictValues);
    }
    if (name == "copy") return obj;  // dicts never change, so a copy is the same value
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
    // loop.changed(*values): true when the values differ from the previous call's.
    if (name == "changed" && d.Find("index0") != nullptr && d.Find("revindex0") != nullptr &&
        !in.loop_changed.empty()) {
      CHORUS_ASSIGN_OR_RETURN(Value now, in.MakeList(args.pos, /*tuple=*/true));
      Value& last = in.loop_changed.back();
      if (!last.is_undefined()) {
        CHORUS_ASSIGN_OR_RETURN(bool same, in.Equal(last, now));
        if (same) return Value::Bool(false);
      }
      last = std::move(now);
      return Value::Bool(true);
    }
    // A callable stored in a dict (rare): call it.
    if (const Value* v = d.Find(name); v != nullptr && v->is_callable()) {
      const Callable& c = v->callable();
      Node at;
      if (c.macro != nullptr) return in.CallMacro(*c.macro, args, at);
      return c.builtin(in, args);
    }
  }
  if (obj.is_plain_list() && (name == "index" || name == "count")) {
    const Value* x = Arg(args, 0, "value");
    if (x == nullptr) return InvalidArgumentError(name + "() takes exactly one argument");
    int64_t n = 0;
    for (size_t i = 0; i < obj.list().size(); ++i) {
      CHORUS_ASSIGN_OR_RETURN(bool eq, in.Equal(obj.list()[i], *x));
      if (eq && name == "index") return Value::Int(static_cast<int64_t>(i));
      if (eq) ++n;
    }
    if (name == "index") return InvalidArgumentError("value is not in list");
    return Value::Int(n);
  }
  if (obj.is_list() && (name == "append" || name == "extend" || name == "pop" || name == "insert" ||
                        name == "remove" || name == "clear")) {
    return InvalidArgumentError("lists are immutable in chat templates ('" + name + "')");
  }
  return InvalidArgumentError("'" + std::string(obj.TypeName()) + "' object has no attribute '" +
                              name + "'");
}

}  // namespace chorus::tokenizer::jinja

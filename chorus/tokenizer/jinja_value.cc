#include "chorus/tokenizer/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>

namespace chorus::tokenizer::jinja {

namespace {

const std::string& EmptyString() {
  static const std::string* const kEmpty = new std::string();
  return *kEmpty;
}

Status TooLarge(size_t limit) {
  return ResourceExhaustedError("chat template output exceeds " + std::to_string(limit) + " bytes");
}

Status Append(std::string* out, std::string_view s, size_t limit) {
  if (out->size() + s.size() > limit) return TooLarge(limit);
  out->append(s);
  return OkStatus();
}

size_t Utf8SeqLenImpl(std::string_view s, size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  size_t n;
  if (b < 0x80) return 1;
  if ((b & 0xE0) == 0xC0 && b >= 0xC2) {
    n = 2;
  } else if ((b & 0xF0) == 0xE0) {
    n = 3;
  } else if ((b & 0xF8) == 0xF0 && b <= 0xF4) {
    n = 4;
  } else {
    return 1;
  }
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

}  // namespace

size_t Utf8SeqLen(std::string_view s, size_t i) { return Utf8SeqLenImpl(s, i); }

namespace {

Status AppendPyStrRepr(std::string_view s, std::string* out, size_t limit) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = (has_single && !has_double) ? '"' : '\'';
  std::string r;
  r.reserve(s.size() + 2);
  r.push_back(quote);
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote) {
      r.push_back('\\');
      r.push_back(c);
    } else if (c == '\\') {
      r += "\\\\";
    } else if (c == '\n') {
      r += "\\n";
    } else if (c == '\r') {
      r += "\\r";
    } else if (c == '\t') {
      r += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", u);
      r += buf;
    } else {
      r.push_back(c);
    }
  }
  r.push_back(quote);
  return Append(out, r, limit);
}

Status AppendJsonString(std::string_view s, bool ensure_ascii, std::string* out, size_t limit) {
  std::string r;
  r.reserve(s.size() + 2);
  r.push_back('"');
  auto u_escape = [&](uint32_t cp) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
    r += buf;
  };
  for (size_t i = 0; i < s.size();) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x80 && ensure_ascii) {
      // Python's json.dumps(ensure_ascii=True): \uXXXX, astral code points as surrogate pairs.
      const size_t n = Utf8SeqLen(s, i);
      uint32_t cp = u;
      if (n > 1) {
        cp = u & (0xFF >> (n + 1));
        for (size_t k = 1; k < n; ++k)
          cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
      }
      if (cp >= 0x10000) {
        cp -= 0x10000;
        u_escape(0xD800 + (cp >> 10));
        u_escape(0xDC00 + (cp & 0x3FF));
      } else {
        u_escape(cp);
      }
      i += n;
      continue;
    }
    ++i;
    // Runs of characters that need no escaping are copied at once.
    if (u >= 0x20 && c != '"' && c != '\\' && !(u == 0x7f && ensure_ascii) && u < 0x80) {
      size_t j = i;
      while (j < s.size()) {
        const auto w = static_cast<unsigned char>(s[j]);
        if (w < 0x20 || w == '"' || w == '\\' || w >= 0x7f) break;
        ++j;
      }
      r.push_back(c);
      r.append(s.data() + i, j - i);
      i = j;
      continue;
    }
    switch (c) {
      case '"':
        r += "\\\"";
        break;
      case '\\':
        r += "\\\\";
        break;
      case '\n':
        r += "\\n";
        break;
      case '\r':
        r += "\\r";
        break;
      case '\t':
        r += "\\t";
        break;
      case '\b':
        r += "\\b";
        break;
      case '\f':
        r += "\\f";
        break;
      default:
        if (u < 0x20 || (u == 0x7f && ensure_ascii)) {
          u_escape(u);
        } else {
          r.push_back(c);
        }
    }
  }
  r.push_back('"');
  return Append(out, r, limit);
}

Status AppendJsonImpl(const Value& v, const JsonOptions& o, int level, std::string* out,
                      size_t limit) {
  auto newline = [&](int lvl) -> Status {
    if (o.indent < 0) return OkStatus();
    std::string nl = "\n";
    nl.append(static_cast<size_t>(o.indent) * static_cast<size_t>(lvl), ' ');
    return Append(out, nl, limit);
  };
  const std::string_view item_sep = o.item_sep != nullptr ? std::string_view(*o.item_sep)
                                    : o.indent < 0        ? std::string_view(", ")
                                                          : std::string_view(",");
  const std::string_view key_sep =
      o.key_sep != nullptr ? std::string_view(*o.key_sep) : std::string_view(": ");
  switch (v.kind()) {
    case Value::Kind::kNone:
      return Append(out, "null", limit);
    case Value::Kind::kBool:
      return Append(out, v.bool_value() ? "true" : "false", limit);
    case Value::Kind::kInt:
      return Append(out, std::to_string(v.int_value()), limit);
    case Value::Kind::kFloat: {
      const double f = v.float_value();
      if (std::isnan(f)) return Append(out, "NaN", limit);
      if (std::isinf(f)) return Append(out, f > 0 ? "Infinity" : "-Infinity", limit);
      return Append(out, FloatRepr(f), limit);
    }
    case Value::Kind::kString:
      return AppendJsonString(v.str(), o.ensure_ascii, out, limit);
    case Value::Kind::kList: {
      if (!v.is_plain_list()) {
        return InvalidArgumentError("Object of type " + std::string(v.TypeName()) +
                                    " is not JSON serializable");
      }
      const auto& items = v.list();
      if (items.empty()) return Append(out, "[]", limit);
      CHORUS_RETURN_IF_ERROR(Append(out, "[", limit));
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) CHORUS_RETURN_IF_ERROR(Append(out, item_sep, limit));
        CHORUS_RETURN_IF_ERROR(newline(level + 1));
        CHORUS_RETURN_IF_ERROR(AppendJsonImpl(items[i], o, level + 1, out, limit));
      }
      CHORUS_RETURN_IF_ERROR(newline(level));
      return Append(out, "]", limit);
    }
    case Value::Kind::kDict: {
      const auto& items = v.dict().items;
      if (items.empty()) return Append(out, "{}", limit);
      std::vector<size_t> order(items.size());
      for (size_t i = 0; i < order.size(); ++i) order[i] = i;
      if (o.sort_keys) {
        std::stable_sort(order.begin(), order.end(),
                         [&](size_t a, size_t b) { return items[a].first < items[b].first; });
      }
      CHORUS_RETURN_IF_ERROR(Append(out, "{", limit));
      for (size_t k = 0; k < order.size(); ++k) {
        const auto& [key, val] = items[order[k]];
        if (k > 0) CHORUS_RETURN_IF_ERROR(Append(out, item_sep, limit));
        CHORUS_RETURN_IF_ERROR(newline(level + 1));
        CHORUS_RETURN_IF_ERROR(AppendJsonString(key, o.ensure_ascii, out, limit));
        CHORUS_RETURN_IF_ERROR(Append(out, key_sep, limit));
        CHORUS_RETURN_IF_ERROR(AppendJsonImpl(val, o, level + 1, out, limit));
      }
      CHORUS_RETURN_IF_ERROR(newline(level));
      return Append(out, "}", limit);
    }
    case Value::Kind::kNamespace:
      return InvalidArgumentError("Object of type Namespace is not JSON serializable");
    case Value::Kind::kUndefined:
      return InvalidArgumentError("Object of type Undefined is not JSON serializable");
    case Value::Kind::kCallable:
      return InvalidArgumentError("Object of type function is not JSON serializable");
  }
  return InternalError("unreachable");
}

Status AppendReprImpl(const Value& v, bool top_level_str, std::string* out, size_t limit) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return top_level_str ? OkStatus() : Append(out, "Undefined", limit);
    case Value::Kind::kNone:
      return Append(out, "None", limit);
    case Value::Kind::kBool:
      return Append(out, v.bool_value() ? "True" : "False", limit);
    case Value::Kind::kInt:
      return Append(out, std::to_string(v.int_value()), limit);
    case Value::Kind::kFloat:
      return Append(out, FloatRepr(v.float_value()), limit);
    case Value::Kind::kString:
      if (top_level_str) return Append(out, v.str(), limit);
      return AppendPyStrRepr(v.str(), out, limit);
    case Value::Kind::kList: {
      const bool tuple = v.is_tuple();
      switch (v.seq_kind()) {
        case SeqKind::kGenerator:
          // CPython prints the object's address here, which no other engine can reproduce.
          return Append(out, "<generator object>", limit);
        case SeqKind::kDictItems:
        case SeqKind::kDictKeys:
        case SeqKind::kDictValues: {
          CHORUS_RETURN_IF_ERROR(Append(out, v.TypeName(), limit));
          CHORUS_RETURN_IF_ERROR(Append(out, "(", limit));
          CHORUS_RETURN_IF_ERROR(AppendReprImpl(Value::List(v.list()), false, out, limit));
          return Append(out, ")", limit);
        }
        case SeqKind::kList:
          break;
      }
      CHORUS_RETURN_IF_ERROR(Append(out, tuple ? "(" : "[", limit));
      const auto& items = v.list();
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) CHORUS_RETURN_IF_ERROR(Append(out, ", ", limit));
        CHORUS_RETURN_IF_ERROR(AppendReprImpl(items[i], false, out, limit));
      }
      if (tuple && items.size() == 1) CHORUS_RETURN_IF_ERROR(Append(out, ",", limit));
      return Append(out, tuple ? ")" : "]", limit);
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.is_namespace()) CHORUS_RETURN_IF_ERROR(Append(out, "<Namespace ", limit));
      CHORUS_RETURN_IF_ERROR(Append(out, "{", limit));
      const auto& items = v.dict().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) CHORUS_RETURN_IF_ERROR(Append(out, ", ", limit));
        CHORUS_RETURN_IF_ERROR(AppendPyStrRepr(items[i].first, out, limit));
        CHORUS_RETURN_IF_ERROR(Append(out, ": ", limit));
        CHORUS_RETURN_IF_ERROR(AppendReprImpl(items[i].second, false, out, limit));
      }
      CHORUS_RETURN_IF_ERROR(Append(out, "}", limit));
      if (v.is_namespace()) CHORUS_RETURN_IF_ERROR(Append(out, ">", limit));
      return OkStatus();
    }
    case Value::Kind::kCallable:
      return Append(out, "<function " + v.callable().name + ">", limit);
  }
  return InternalError("unreachable");
}

}  // namespace

Value Value::Undefined(std::string hint) {
  Value v;
  v.p_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}
Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}
Value Value::Bool(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  v.i_ = b ? 1 : 0;
  return v;
}
Value Value::Int(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}
Value Value::Float(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}
Value Value::Str(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.p_ = std::make_shared<const std::string>(std::move(s));
  return v;
}
Value Value::List(std::vector<Value> items) {
  auto l = std::make_shared<ListData>();
  int depth = 0;
  for (const auto& it : items) {
    depth = std::max(depth, it.depth());
    l->holds_namespace = l->holds_namespace || it.HoldsNamespace();
  }
  l->depth = depth + 1;
  l->items = std::move(items);
  Value v;
  v.kind_ = Kind::kList;
  v.p_ = std::move(l);
  return v;
}
Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  const_cast<ListData*>(v.l())->is_tuple = true;
  return v;
}
bool Value::is_tuple() const { return kind_ == Kind::kList && l()->is_tuple; }
const std::vector<std::string>& Value::field_names() const { return l()->field_names; }
SeqKind Value::seq_kind() const { return kind_ == Kind::kList ? l()->seq : SeqKind::kList; }
Value Value::Seq(std::vector<Value> items, SeqKind kind) {
  Value v = List(std::move(items));
  const_cast<ListData*>(v.l())->seq = kind;
  return v;
}
Value Value::NamedTuple(std::vector<Value> items, std::vector<std::string> names) {
  Value v = Tuple(std::move(items));
  const_cast<ListData*>(v.l())->field_names = std::move(names);
  return v;
}
Value Value::Dict(std::shared_ptr<DictData> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.p_ = std::move(d);
  return v;
}
Value Value::Namespace(std::shared_ptr<DictData> d) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.p_ = std::move(d);
  return v;
}
Value Value::Function(std::shared_ptr<const Callable> c) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.p_ = std::move(c);
  return v;
}

double Value::AsDouble() const {
  if (kind_ == Kind::kFloat) return f_;
  return static_cast<double>(i_);
}

const std::string& Value::str() const { return p_ ? *s() : EmptyString(); }

const std::vector<Value>& Value::list() const {
  CHORUS_CHECK(kind_ == Kind::kList && p_ != nullptr);
  return l()->items;
}
const DictData& Value::dict() const {
  CHORUS_CHECK(is_mapping() && p_ != nullptr);
  return *d();
}
DictData& Value::mutable_namespace() const {
  CHORUS_CHECK(kind_ == Kind::kNamespace && p_ != nullptr);
  return *d();
}
const Callable& Value::callable() const {
  CHORUS_CHECK(kind_ == Kind::kCallable && p_ != nullptr);
  return *c();
}

int Value::depth() const {
  switch (kind_) {
    case Kind::kList:
      return l()->depth;
    case Kind::kDict:
      return d()->depth;
    case Kind::kNamespace:
      // A namespace never holds another namespace (Interp enforces it) and its values are
      // at most kMaxValueDepth deep, whatever it is later mutated to.
      return kMaxValueDepth + 1;
    default:
      return 0;
  }
}

bool Value::HoldsNamespace() const {
  switch (kind_) {
    case Kind::kNamespace:
      return true;
    case Kind::kList:
      return l()->holds_namespace;
    case Kind::kDict:
      return d()->holds_namespace;
    default:
      return false;
  }
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return b_;
    case Kind::kInt:
      return i_ != 0;
    case Kind::kFloat:
      return f_ != 0.0;
    case Kind::kString:
      return !str().empty();
    case Kind::kList:
      return l()->seq == SeqKind::kGenerator || !l()->items.empty();
    case Kind::kDict:
      return !d()->items.empty();
    case Kind::kNamespace:
    case Kind::kCallable:
      return true;
  }
  return false;
}

std::string_view Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      switch (l()->seq) {
        case SeqKind::kGenerator:
          return "generator";
        case SeqKind::kDictItems:
          return "dict_items";
        case SeqKind::kDictKeys:
          return "dict_keys";
        case SeqKind::kDictValues:
          return "dict_values";
        case SeqKind::kList:
          break;
      }
      return l()->is_tuple ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kCallable:
      return "function";
  }
  return "?";
}

const Value* DictData::Find(std::string_view key) const {
  if (index.empty()) {
    for (const auto& [k, v] : items) {
      if (k == key) return &v;
    }
    return nullptr;
  }
  auto it = index.find(key);
  if (it == index.end()) return nullptr;
  return &items[it->second].second;
}
void DictData::AppendNew(std::string key, Value v) {
  depth = std::max(depth, v.depth() + 1);
  holds_namespace = holds_namespace || v.HoldsNamespace();
  if (!index.empty()) index.emplace(key, items.size());
  items.emplace_back(std::move(key), std::move(v));
  if (index.empty() && items.size() > kIndexThreshold) {
    for (size_t i = 0; i < items.size(); ++i) index.emplace(items[i].first, i);
  }
}

void DictData::Set(std::string key, Value v) {
  depth = std::max(depth, v.depth() + 1);
  // Only ever set, never cleared on replacement: a conservative answer is fine.
  holds_namespace = holds_namespace || v.HoldsNamespace();
  if (index.empty()) {
    for (auto& [k, old] : items) {
      if (k == key) {
        old = std::move(v);
        return;
      }
    }
    items.emplace_back(std::move(key), std::move(v));
    if (items.size() > kIndexThreshold) {
      for (size_t i = 0; i < items.size(); ++i) index.emplace(items[i].first, i);
    }
    return;
  }
  auto it = index.find(key);
  if (it != index.end()) {
    items[it->second].second = std::move(v);
    return;
  }
  index.emplace(key, items.size());
  items.emplace_back(std::move(key), std::move(v));
}

const Value* CallArgs::Kw(std::string_view name) const {
  for (const auto& [k, v] : kw) {
    if (k == name) return &v;
  }
  return nullptr;
}

namespace {
template <typename Json>
Result<Value> FromJsonImpl(const Json& j, int depth) {
  if (depth > kMaxValueDepth) {
    return InvalidArgumentError("chat template input nests deeper than " +
                                std::to_string(kMaxValueDepth) + " levels");
  }
  switch (j.type()) {
    case Json::value_t::null:
    case Json::value_t::discarded:
      return Value::None();
    case Json::value_t::boolean:
      return Value::Bool(j.template get<bool>());
    case Json::value_t::number_integer:
      return Value::Int(j.template get<int64_t>());
    case Json::value_t::number_unsigned: {
      const auto u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value::Float(static_cast<double>(u));
      return Value::Int(static_cast<int64_t>(u));
    }
    case Json::value_t::number_float:
      return Value::Float(j.template get<double>());
    case Json::value_t::string:
      return Value::Str(j.template get_ref<const std::string&>());
    case Json::value_t::binary:
      return InvalidArgumentError("chat template input: binary JSON values are not supported");
    case Json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) {
        CHORUS_ASSIGN_OR_RETURN(Value v, FromJsonImpl(e, depth + 1));
        items.push_back(std::move(v));
      }
      return Value::List(std::move(items));
    }
    case Json::value_t::object: {
      auto d = std::make_shared<DictData>();
      d->items.reserve(j.size());
      for (auto it = j.begin(); it != j.end(); ++it) {
        CHORUS_ASSIGN_OR_RETURN(Value v, FromJsonImpl(it.value(), depth + 1));
        d->AppendNew(it.key(), std::move(v));  // JSON object keys are unique
      }
      return Value::Dict(std::move(d));
    }
  }
  return InternalError("unreachable");
}
}  // namespace

Result<Value> FromJson(const nlohmann::json& j) { return FromJsonImpl(j, 0); }
Result<Value> FromJson(const nlohmann::ordered_json& j) { return FromJsonImpl(j, 0); }

Status AppendStr(const Value& v, std::string* out, size_t limit) {
  return AppendReprImpl(v, /*top_level_str=*/true, out, limit);
}

Status AppendRepr(const Value& v, std::string* out, size_t limit) {
  return AppendReprImpl(v, /*top_level_str=*/false, out, limit);
}

Status AppendJson(const Value& v, const JsonOptions& opts, std::string* out, size_t limit) {
  return AppendJsonImpl(v, opts, 0, out, limit);
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f > 0 ? "inf" : "-inf";
  if (f == 0.0) return std::signbit(f) ? "-0.0" : "0.0";
  // Shortest round-trip digits in scientific form, e.g. "1.2345e+02".
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  std::string out;
  size_t pos = 0;
  if (sci[0] == '-') {
    out.push_back('-');
    pos = 1;
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (size_t i = pos; i < e_pos; ++i) {
    if (sci[i] != '.') digits.push_back(sci[i]);
  }
  const int exp10 = std::atoi(sci.c_str() + e_pos + 1);
  // Python's repr: positional notation when -4 <= exponent < 16, else scientific.
  if (exp10 >= -4 && exp10 < 16) {
    if (exp10 >= 0) {
      const size_t int_digits = static_cast<size_t>(exp10) + 1;
      if (digits.size() <= int_digits) {
        out += digits;
        out.append(int_digits - digits.size(), '0');
        out += ".0";
      } else {
        out += digits.substr(0, int_digits);
        out.push_back('.');
        out += digits.substr(int_digits);
      }
    } else {
      out += "0.";
      out.append(static_cast<size_t>(-exp10 - 1), '0');
      out += digits;
    }
  } else {
    out.push_back(digits[0]);
    if (digits.size() > 1) {
      out.push_back('.');
      out += digits.substr(1);
    }
    char ebuf[16];
    std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp10 < 0 ? '-' : '+', std::abs(exp10));
    out += ebuf;
  }
  return out;
}

size_t Utf8Length(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); i += Utf8SeqLen(s, i)) ++n;
  return n;
}

std::vector<size_t> Utf8Offsets(std::string_view s) {
  std::vector<size_t> offs;
  offs.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); i += Utf8SeqLen(s, i)) offs.push_back(i);
  offs.push_back(s.size());
  return offs;
}

}  // namespace chorus::tokenizer::jinja

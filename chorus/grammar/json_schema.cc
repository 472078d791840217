#include "chorus/grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>

#include "chorus/tokenizer/utf8.h"

namespace chorus::grammar {
namespace {

using json = nlohmann::json;
using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr int kMaxDepth = 64;  // nested schemas (not $ref recursion, which is a rule reference)

const std::set<std::string>& Annotations() {
  static const std::set<std::string> k = {"title",    "description", "$schema",  "$id",
                                          "$comment", "default",     "examples", "deprecated",
                                          "readOnly", "writeOnly"};
  return k;
}
const std::set<std::string>& Supported() {
  static const std::set<std::string> k = {
      "type",       "properties", "required",  "additionalProperties",
      "enum",       "const",      "items",     "prefixItems",
      "minItems",   "maxItems",   "minLength", "maxLength",
      "pattern",    "format",     "minimum",   "maximum",
      "anyOf",      "oneOf",      "$ref",      "$defs",
      "definitions"};
  return k;
}

Status Unsupported(const std::string& what, const std::string& ptr) {
  return InvalidArgumentError(what + " at " + ptr);
}

std::string Esc(const std::string& s) {  // a JSON pointer token
  std::string o;
  for (char c : s) {
    if (c == '~') {
      o += "~0";
    } else if (c == '/') {
      o += "~1";
    } else {
      o += c;
    }
  }
  return o;
}

// Code points of a UTF-8 string (invalid bytes as U+FFFD).
std::vector<uint32_t> Codepoints(std::string_view s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    const size_t len = tokenizer::internal::ValidUtf8CharLen(s.substr(i));
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (len <= 1) {
      out.push_back(len == 1 ? c : 0xFFFD);
      ++i;
      continue;
    }
    static constexpr uint8_t kMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
    uint32_t cp = c & kMask[len];
    for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    out.push_back(cp);
    i += len;
  }
  return out;
}

// The JSON-string form of one code point (escaped when JSON requires it).
std::string JsonChar(uint32_t cp) {
  std::string s;
  switch (cp) {
    case '"':
      return "\\\"";
    case '\\':
      return "\\\\";
    case '\n':
      return "\\n";
    case '\r':
      return "\\r";
    case '\t':
      return "\\t";
    case '\b':
      return "\\b";
    case '\f':
      return "\\f";
    default:
      break;
  }
  if (cp < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", cp);
    return buf;
  }
  tokenizer::internal::AppendCodepoint(cp, &s);
  return s;
}

// Code points a class may produce unescaped inside a JSON string: not '"', '\' or controls.
Ranges RemoveForbidden(const Ranges& r) {
  Ranges out;
  for (auto [lo, hi] : r) {
    lo = std::max<uint32_t>(lo, 0x20);
    for (uint32_t bad : {uint32_t{'"'}, uint32_t{'\\'}}) {
      if (lo <= bad && bad <= hi) {
        if (lo < bad) out.emplace_back(lo, bad - 1);
        lo = bad + 1;
      }
    }
    if (lo <= hi) out.emplace_back(lo, hi);
  }
  return out;
}

Ranges Complement(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : r) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = std::max(next, hi + 1);
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

class RegexParser;

// The key order of every "properties" object, by the JSON pointer ("#/...") of the schema that
// holds it — what an ordered_json parse of the request kept and nlohmann::json sorts away.
using PropertyOrder = std::map<std::string, std::vector<std::string>>;

void CollectOrder(const nlohmann::ordered_json& node, const std::string& ptr, PropertyOrder* out) {
  if (node.is_object()) {
    if (auto p = node.find("properties"); p != node.end() && p->is_object()) {
      auto& keys = (*out)[ptr];
      for (auto it = p->begin(); it != p->end(); ++it) keys.push_back(it.key());
    }
    for (auto it = node.begin(); it != node.end(); ++it)
      CollectOrder(it.value(), ptr + "/" + Esc(it.key()), out);
  } else if (node.is_array()) {
    for (size_t i = 0; i < node.size(); ++i)
      CollectOrder(node[i], ptr + "/" + std::to_string(i), out);
  }
}

class Compiler {
 public:
  Compiler(const json& root, const JsonSchemaOptions& opts, const PropertyOrder* order = nullptr)
      : root_(root), opts_(opts), order_(order) {}

  Result<GrammarAst> Run() {
    CHORUS_ASSIGN_OR_RETURN(Expr e, Compile(root_, "#", 0));
    ast_.root = ast_.Define("root", std::move(e));
    return std::move(ast_);
  }

  Result<Expr> Compile(const json& s, const std::string& ptr, int depth);

  // Shared rules, defined on first use.
  Expr Ws() {
    return Shared("ws", [&] {
      return Expr::Optional(Expr::Alt(
          {Expr::Literal(" "),
           Expr::Seq({Expr::Literal("\n"), Expr::Repeat(Expr::Chars({{' ', ' '}, {'\t', '\t'}}), 0,
                                                        opts_.max_indent)})}));
    });
  }
  Expr Hex() { return Expr::Chars({{'0', '9'}, {'a', 'f'}, {'A', 'F'}}); }
  // One character of a JSON string: unescaped, or an escape (\uXXXX never a surrogate, so one
  // escape is one code point for every JSON parser and minLength/maxLength count right).
  Expr Char() {
    return Shared("char", [&] {
      Expr u = Expr::Seq(
          {Expr::Literal("u"),
           Expr::Alt({Expr::Seq({Expr::Chars(
                                     {{'0', '9'}, {'a', 'c'}, {'A', 'C'}, {'e', 'f'}, {'E', 'F'}}),
                                 Expr::Repeat(Hex(), 3, 3)}),
                      Expr::Seq({Expr::Chars({{'d', 'd'}, {'D', 'D'}}), Expr::Chars({{'0', '7'}}),
                                 Expr::Repeat(Hex(), 2, 2)})})});
      return Expr::Alt({Expr::Chars({{'"', '"'}, {'\\', '\\'}, {0, 0x1F}}, true),
                        Expr::Seq({Expr::Literal("\\"), Expr::Alt({Expr::Chars({{'"', '"'},
                                                                                {'\\', '\\'},
                                                                                {'/', '/'},
                                                                                {'b', 'b'},
                                                                                {'f', 'f'},
                                                                                {'n', 'n'},
                                                                                {'r', 'r'},
                                                                                {'t', 't'}}),
                                                                   std::move(u)})})});
    });
  }
  Expr String(int min, int max) {
    if (min == 0 && max == kUnbounded) {
      return Shared("string", [&] {
        return Expr::Seq({Expr::Literal("\""), Expr::Star(Char()), Expr::Literal("\"")});
      });
    }
    return Expr::Seq({Expr::Literal("\""), Expr::Repeat(Char(), min, max), Expr::Literal("\"")});
  }
  Expr Digits(int min, int max) { return Expr::Repeat(Expr::Chars({{'0', '9'}}), min, max); }
  Expr UnsignedInt() {
    return Expr::Alt({Expr::Literal("0"),
                      Expr::Seq({Expr::Chars({{'1', '9'}}), Digits(0, opts_.max_int_digits - 1)})});
  }
  Expr Integer() {
    return Shared("integer", [&] {
      return Expr::Seq({Expr::Optional(Expr::Literal("-")), UnsignedInt()});
    });
  }
  Expr Number() {
    return Shared("number", [&] {
      return Expr::Seq(
          {Expr::Optional(Expr::Literal("-")), UnsignedInt(),
           Expr::Optional(Expr::Seq({Expr::Literal("."), Digits(1, opts_.max_frac_digits)})),
           Expr::Optional(Expr::Seq({Expr::Chars({{'e', 'e'}, {'E', 'E'}}),
                                     Expr::Optional(Expr::Chars({{'-', '-'}, {'+', '+'}})),
                                     Digits(1, opts_.max_exp_digits)}))});
    });
  }
  Expr AnyValue() {
    const int id = ast_.RuleId("value");
    if (!ast_.defined[static_cast<size_t>(id)]) {
      ast_.Define("value", Expr::Seq({}));  // placeholder: recursion through object/array
      Expr v = Expr::Alt({AnyObject(), AnyArray(), String(0, kUnbounded), Number(),
                          Expr::Literal("true"), Expr::Literal("false"), Expr::Literal("null")});
      ast_.bodies[static_cast<size_t>(id)] = std::move(v);
    }
    return Expr::Ref(id);
  }
  Expr AnyObject() {
    return Shared("object", [&] {
      Expr kv =
          Expr::Seq({String(0, kUnbounded), Ws(), Expr::Literal(":"), Ws(), AnyValue(), Ws()});
      return Expr::Seq(
          {Expr::Literal("{"), Ws(),
           Expr::Optional(Expr::Seq({kv, Expr::Star(Expr::Seq({Expr::Literal(","), Ws(), kv}))})),
           Expr::Literal("}")});
    });
  }
  Expr AnyArray() {
    return Shared("array", [&] {
      Expr item = Expr::Seq({AnyValue(), Ws()});
      return Expr::Seq({Expr::Literal("["), Ws(),
                        Expr::Optional(Expr::Seq(
                            {item, Expr::Star(Expr::Seq({Expr::Literal(","), Ws(), item}))})),
                        Expr::Literal("]")});
    });
  }

 private:
  template <typename F>
  Expr Shared(const std::string& name, F&& make) {
    const int id = ast_.RuleId(name);
    if (!ast_.defined[static_cast<size_t>(id)]) {
      ast_.defined[static_cast<size_t>(id)] = true;  // reserve before building (recursion)
      ast_.bodies[static_cast<size_t>(id)] = make();
    }
    return Expr::Ref(id);
  }
  std::string NewName(const char* stem) { return std::string(stem) + std::to_string(counter_++); }

  Result<Expr> Ref(const std::string& ref, const std::string& ptr);
  Result<Expr> Typed(const std::string& type, const json& s, const std::string& ptr, int depth);
  Result<Expr> Object(const json& s, const std::string& ptr, int depth);
  Result<Expr> Array(const json& s, const std::string& ptr, int depth);
  Result<Expr> StringSchema(const json& s, const std::string& ptr);
  Result<Expr> IntegerSchema(const json& s, const std::string& ptr);
  Result<Expr> Format(const std::string& f, const std::string& ptr);
  Result<Expr> KeyNotIn(const std::vector<std::string>& names);
  Expr PosRange(uint64_t a, uint64_t b);
  Expr SameLen(const std::string& lo, const std::string& hi);

  const json& root_;
  const JsonSchemaOptions opts_;
  const PropertyOrder* order_;  // null: the json object's (sorted) key order
  GrammarAst ast_;
  std::map<std::string, int> refs_;
  int counter_ = 0;
};

// ---- regex subset ------------------------------------------------------------------------------

class RegexParser {
 public:
  // `raw`: the regex describes raw text that must match whole (vLLM's guided_regex; `c` may be
  // null), not a JSON string's content under JSON Schema's search semantics.
  RegexParser(Compiler* c, std::vector<uint32_t> p, std::string ptr, bool raw = false)
      : c_(c), p_(std::move(p)), ptr_(std::move(ptr)), raw_(raw) {}

  Result<Expr> Parse() {
    bool anchored_start = false, anchored_end = false;
    size_t end = p_.size();
    if (!p_.empty() && p_[0] == '^') {
      anchored_start = true;
      i_ = 1;
    }
    if (end > i_ && p_[end - 1] == '$' && (end < 2 || p_[end - 2] != '\\')) {
      anchored_end = true;
      --end;
    }
    end_ = end;
    CHORUS_ASSIGN_OR_RETURN(Expr body, Alternation(0));
    if (i_ != end_) return Err("unexpected ')'");
    if (raw_) return body;  // the whole output matches it, anchored or not
    std::vector<Expr> seq;
    seq.push_back(Expr::Literal("\""));
    if (!anchored_start) seq.push_back(Expr::Star(c_->Char()));
    seq.push_back(std::move(body));
    if (!anchored_end) seq.push_back(Expr::Star(c_->Char()));
    seq.push_back(Expr::Literal("\""));
    return Expr::Seq(std::move(seq));
  }

 private:
  Status Err(const std::string& m) const {
    return InvalidArgumentError((raw_ ? "regex: " : "pattern: ") + m + " (position " +
                                std::to_string(i_) + ")" + (ptr_.empty() ? "" : " at " + ptr_));
  }
  // A literal character: raw UTF-8, or its JSON-string form.
  std::string Lit(uint32_t cp) const {
    if (!raw_) return JsonChar(cp);
    std::string s;
    tokenizer::internal::AppendCodepoint(cp, &s);
    return s;
  }
  bool More() const { return i_ < end_; }
  uint32_t Peek() const { return p_[i_]; }

  Result<Expr> Alternation(int depth) {
    if (depth > 50) return Err("groups nested too deeply");
    std::vector<Expr> alts;
    for (;;) {
      std::vector<Expr> seq;
      while (More() && Peek() != '|' && Peek() != ')') {
        CHORUS_ASSIGN_OR_RETURN(Expr atom, Atom(depth));
        CHORUS_RETURN_IF_ERROR(Quantifier(&atom));
        seq.push_back(std::move(atom));
      }
      alts.push_back(Expr::Seq(std::move(seq)));
      if (More() && Peek() == '|') {
        ++i_;
        continue;
      }
      break;
    }
    return Expr::Alt(std::move(alts));
  }

  Status Quantifier(Expr* atom) {
    if (!More()) return OkStatus();
    const uint32_t c = Peek();
    int min = -2, max = 0;
    if (c == '*') {
      min = 0, max = kUnbounded, ++i_;
    } else if (c == '+') {
      min = 1, max = kUnbounded, ++i_;
    } else if (c == '?') {
      min = 0, max = 1, ++i_;
    } else if (c == '{') {
      ++i_;
      int64_t m = 0, n = 0;
      if (!Int(&m)) return Err("expected a number after '{'");
      n = m;
      if (More() && Peek() == ',') {
        ++i_;
        n = kUnbounded;
        if (More() && Peek() != '}' && !Int(&n)) return Err("expected a number or '}'");
      }
      if (!More() || Peek() != '}') return Err("expected '}'");
      ++i_;
      if (m > 10000 || n > 10000) return Err("repetition count above 10000");
      if (n != kUnbounded && n < m) return Err("repetition {m,n} with n < m");
      min = static_cast<int>(m), max = static_cast<int>(n);
    }
    if (min == -2) return OkStatus();
    if (More() && (Peek() == '?' || Peek() == '+'))
      return Err("lazy and possessive quantifiers are not supported");
    if (More() && (Peek() == '*' || Peek() == '{')) return Err("nested quantifier");
    *atom = Expr::Repeat(std::move(*atom), min, max);
    return OkStatus();
  }

  bool Int(int64_t* v) {
    const size_t b = i_;
    *v = 0;
    while (More() && Peek() >= '0' && Peek() <= '9') {
      if (*v < 1000000) *v = *v * 10 + (Peek() - '0');
      ++i_;
    }
    return i_ > b;
  }

  // A class as JSON-string content: the class's characters that need no escape. Raw: any but
  // NUL.
  Result<Expr> Class(Ranges r) {
    if (raw_) {
      r = Complement(Complement(r));  // sorted, merged
      if (!r.empty() && r.front().first == 0) {
        if (r.front().second == 0) {
          r.erase(r.begin());
        } else {
          r.front().first = 1;
        }
      }
      if (r.empty()) return Err("character class matches nothing");
      return Expr::Chars(std::move(r));
    }
    r = RemoveForbidden(r);
    if (r.empty()) return Err("character class matches only characters JSON must escape");
    return Expr::Chars(std::move(r));
  }

  Ranges Shorthand(uint32_t c, bool* ok) const {
    if (raw_ && c == 's') {  // in raw text, tabs and newlines are whitespace as in other engines
      *ok = true;
      return {{' ', ' '}, {'\t', '\r'}};
    }
    *ok = true;
    switch (c) {
      case 'd':
        return {{'0', '9'}};
      case 'D':
        return Complement({{'0', '9'}});
      case 'w':
        return {{'0', '9'}, {'a', 'z'}, {'A', 'Z'}, {'_', '_'}};
      case 'W':
        return Complement({{'0', '9'}, {'a', 'z'}, {'A', 'Z'}, {'_', '_'}});
      case 's':
        return {{' ', ' '}};  // tabs and newlines are controls: JSON escapes them
      case 'S':
        return Complement({{' ', ' '}, {'\t', '\r'}});
      default:
        *ok = false;
        return {};
    }
  }

  // An escaped literal character after '\' (not a shorthand class).
  Result<uint32_t> EscapedChar() {
    if (!More()) return Err("escape at end of pattern");
    const uint32_t c = Peek();
    ++i_;
    switch (c) {
      case 'n':
        return uint32_t{'\n'};
      case 't':
        return uint32_t{'\t'};
      case 'r':
        return uint32_t{'\r'};
      case 'f':
        return uint32_t{'\f'};
      case 'v':
        return uint32_t{'\v'};
      case 'u': {
        uint32_t v = 0;
        for (int k = 0; k < 4; ++k) {
          if (!More()) return Err("expected 4 hex digits after \\u");
          const uint32_t h = Peek();
          int d = h >= '0' && h <= '9'   ? int(h - '0')
                  : h >= 'a' && h <= 'f' ? int(h - 'a' + 10)
                  : h >= 'A' && h <= 'F' ? int(h - 'A' + 10)
                                         : -1;
          if (d < 0) return Err("expected 4 hex digits after \\u");
          v = v * 16 + static_cast<uint32_t>(d);
          ++i_;
        }
        return v;
      }
      default:
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
          --i_;
          return Err(std::string("unsupported escape \\") + static_cast<char>(c));
        }
        return c;  // \. \\ \/ \( ...
    }
  }

  Result<Expr> Atom(int depth) {
    const uint32_t c = Peek();
    if (c == '(') {
      ++i_;
      if (More() && Peek() == '?') {
        if (i_ + 1 < end_ && p_[i_ + 1] == ':') {
          i_ += 2;
        } else {
          return Err("lookaround and named groups are not supported");
        }
      }
      CHORUS_ASSIGN_OR_RETURN(Expr e, Alternation(depth + 1));
      if (!More() || Peek() != ')') return Err("missing ')'");
      ++i_;
      return e;
    }
    if (c == '[') {
      ++i_;
      bool negated = false;
      if (More() && Peek() == '^') {
        negated = true;
        ++i_;
      }
      Ranges r;
      bool first = true;
      while (More() && (Peek() != ']' || first)) {
        first = false;
        uint32_t lo;
        if (Peek() == '\\') {
          ++i_;
          bool sh = false;
          if (More()) {
            Ranges s = Shorthand(Peek(), &sh);
            if (sh) {
              ++i_;
              r.insert(r.end(), s.begin(), s.end());
              continue;
            }
          }
          CHORUS_ASSIGN_OR_RETURN(lo, EscapedChar());
        } else {
          lo = Peek();
          ++i_;
        }
        uint32_t hi = lo;
        if (More() && Peek() == '-' && i_ + 1 < end_ && p_[i_ + 1] != ']') {
          ++i_;
          if (Peek() == '\\') {
            ++i_;
            CHORUS_ASSIGN_OR_RETURN(hi, EscapedChar());
          } else {
            hi = Peek();
            ++i_;
          }
          if (hi < lo) return Err("reversed range in class");
        }
        r.emplace_back(lo, hi);
      }
      if (!More()) return Err("missing ']'");
      ++i_;
      return Class(negated ? Complement(r) : r);
    }
    if (c == '.') {
      ++i_;
      // Raw: anything but a newline (Python's and Outlines' '.'); in JSON also no \r.
      return Class(raw_ ? Complement({{'\n', '\n'}}) : Complement({{'\n', '\n'}, {'\r', '\r'}}));
    }
    if (c == '\\') {
      ++i_;
      bool sh = false;
      if (More()) {
        Ranges s = Shorthand(Peek(), &sh);
        if (sh) {
          ++i_;
          return Class(s);
        }
      }
      if (More() && Peek() >= '1' && Peek() <= '9') return Err("backreferences are not supported");
      if (More() && (Peek() == 'b' || Peek() == 'B'))
        return Err("word boundaries are not supported");
      CHORUS_ASSIGN_OR_RETURN(uint32_t lit, EscapedChar());
      return Expr::Literal(Lit(lit));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') return Err("quantifier without an operand");
    if (c == '^' || c == '$') return Err("anchors are only supported at the pattern's ends");
    ++i_;
    return Expr::Literal(Lit(c));
  }

  Compiler* c_;
  std::vector<uint32_t> p_;
  std::string ptr_;
  bool raw_ = false;
  size_t i_ = 0, end_ = 0;
};

// ---- schema keywords ---------------------------------------------------------------------------

Result<Expr> Compiler::Compile(const json& s, const std::string& ptr, int depth) {
  if (depth > kMaxDepth) return InvalidArgumentError("schema nested too deeply at " + ptr);
  if (s.is_boolean()) {
    if (s.get<bool>()) return AnyValue();
    return InvalidArgumentError("schema 'false' can match nothing at " + ptr);
  }
  if (!s.is_object())
    return InvalidArgumentError("a schema must be an object or a boolean at " + ptr);
  std::vector<std::string> constraining;
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (Annotations().count(it.key())) continue;
    if (!Supported().count(it.key()))
      return Unsupported("unsupported JSON schema keyword '" + it.key() + "'", ptr);
    if (it.key() != "$defs" && it.key() != "definitions") constraining.push_back(it.key());
  }
  for (const char* defs : {"$defs", "definitions"}) {
    if (s.contains(defs) && !s[defs].is_object())
      return InvalidArgumentError(std::string(defs) + " must be an object at " + ptr);
  }
  auto only = [&](const std::string& kw, std::initializer_list<const char*> allowed) -> Status {
    for (const std::string& k : constraining) {
      if (k == kw) continue;
      bool ok = false;
      for (const char* a : allowed) ok |= k == a;
      if (!ok)
        return Unsupported("keyword '" + k + "' combined with '" + kw + "' is not supported", ptr);
    }
    return OkStatus();
  };
  if (s.contains("$ref")) {
    CHORUS_RETURN_IF_ERROR(only("$ref", {}));
    if (!s["$ref"].is_string()) return InvalidArgumentError("$ref must be a string at " + ptr);
    return Ref(s["$ref"].get<std::string>(), ptr);
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!s.contains(kw)) continue;
    CHORUS_RETURN_IF_ERROR(only(kw, {}));
    const json& list = s[kw];
    if (!list.is_array() || list.empty())
      return InvalidArgumentError(std::string(kw) + " must be a non-empty list at " + ptr);
    std::vector<Expr> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      CHORUS_ASSIGN_OR_RETURN(
          Expr e, Compile(list[i], ptr + "/" + kw + "/" + std::to_string(i), depth + 1));
      alts.push_back(std::move(e));
    }
    return Expr::Alt(std::move(alts));
  }
  std::set<std::string> types;
  if (s.contains("type")) {
    const json& t = s["type"];
    auto add = [&](const json& v) -> Status {
      static const std::set<std::string> kTypes = {"object",  "array",   "string", "number",
                                                   "integer", "boolean", "null"};
      if (!v.is_string() || !kTypes.count(v.get<std::string>()))
        return InvalidArgumentError("unknown type " + v.dump() + " at " + ptr + "/type");
      types.insert(v.get<std::string>());
      return OkStatus();
    };
    if (t.is_array()) {
      if (t.empty()) return InvalidArgumentError("type list is empty at " + ptr + "/type");
      for (const json& v : t) CHORUS_RETURN_IF_ERROR(add(v));
    } else {
      CHORUS_RETURN_IF_ERROR(add(t));
    }
  }
  auto type_of = [](const json& v) -> std::string {
    if (v.is_object()) return "object";
    if (v.is_array()) return "array";
    if (v.is_string()) return "string";
    if (v.is_boolean()) return "boolean";
    if (v.is_null()) return "null";
    if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
    if (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>()) return "integer";
    return "number";
  };
  auto type_ok = [&](const json& v) {
    if (types.empty()) return true;
    const std::string t = type_of(v);
    return types.count(t) > 0 || (t == "integer" && types.count("number") > 0);
  };
  for (const char* kw : {"enum", "const"}) {
    if (!s.contains(kw)) continue;
    CHORUS_RETURN_IF_ERROR(only(kw, {"type"}));
    std::vector<json> values;
    if (std::string(kw) == "enum") {
      if (!s[kw].is_array() || s[kw].empty())
        return InvalidArgumentError("enum must be a non-empty list at " + ptr);
      for (const json& v : s[kw]) values.push_back(v);
    } else {
      values.push_back(s[kw]);
    }
    std::vector<Expr> alts;
    for (const json& v : values) {
      if (type_ok(v)) alts.push_back(Expr::Literal(v.dump()));
    }
    if (alts.empty())
      return InvalidArgumentError(std::string(kw) + " has no value of the schema's type at " + ptr);
    return Expr::Alt(std::move(alts));
  }
  if (types.empty()) {
    // Infer the type from the keywords present; none: any value.
    auto has = [&](std::initializer_list<const char*> ks) {
      for (const char* k : ks) {
        if (s.contains(k)) return true;
      }
      return false;
    };
    if (has({"properties", "required", "additionalProperties"})) types.insert("object");
    if (has({"items", "prefixItems", "minItems", "maxItems"})) types.insert("array");
    if (has({"minLength", "maxLength", "pattern", "format"})) types.insert("string");
    if (has({"minimum", "maximum"})) types.insert("integer");
    if (types.empty()) return AnyValue();
  }
  if (types.count("number") && (s.contains("minimum") || s.contains("maximum")))
    return Unsupported("'minimum'/'maximum' are only supported on integers", ptr);
  if (types.count("number")) types.erase("integer");  // number already admits integers
  std::vector<Expr> alts;
  for (const std::string& t : types) {
    CHORUS_ASSIGN_OR_RETURN(Expr e, Typed(t, s, ptr, depth));
    alts.push_back(std::move(e));
  }
  return Expr::Alt(std::move(alts));
}

Result<Expr> Compiler::Ref(const std::string& ref, const std::string& ptr) {
  if (ref.empty() || ref[0] != '#')
    return Unsupported("only local $ref (\"#...\") is supported, got '" + ref + "'", ptr);
  if (auto it = refs_.find(ref); it != refs_.end()) return Expr::Ref(it->second);
  const json* target = &root_;
  if (ref.size() > 1) {
    try {
      const json::json_pointer jp(ref.substr(1));
      if (!root_.contains(jp))
        return InvalidArgumentError("$ref '" + ref + "' points nowhere at " + ptr);
      target = &root_.at(jp);
    } catch (const json::exception&) {
      return InvalidArgumentError("$ref '" + ref + "' is not a valid JSON pointer at " + ptr);
    }
  }
  const int id = ast_.RuleId(NewName("ref"));
  refs_[ref] = id;
  ast_.defined[static_cast<size_t>(id)] = true;  // reserved: recursion refers to it
  CHORUS_ASSIGN_OR_RETURN(Expr body, Compile(*target, ref, 0));
  ast_.bodies[static_cast<size_t>(id)] = std::move(body);
  return Expr::Ref(id);
}

Result<Expr> Compiler::Typed(const std::string& t, const json& s, const std::string& ptr,
                             int depth) {
  if (t == "object") return Object(s, ptr, depth);
  if (t == "array") return Array(s, ptr, depth);
  if (t == "string") return StringSchema(s, ptr);
  if (t == "integer") return IntegerSchema(s, ptr);
  if (t == "number") return Number();
  if (t == "boolean") return Expr::Alt({Expr::Literal("true"), Expr::Literal("false")});
  return Expr::Literal("null");
}

Result<Expr> Compiler::Object(const json& s, const std::string& ptr, int depth) {
  const json empty = json::object();
  const json& props = s.contains("properties") ? s["properties"] : empty;
  if (!props.is_object()) return InvalidArgumentError("properties must be an object at " + ptr);
  std::set<std::string> required;
  if (s.contains("required")) {
    if (!s["required"].is_array()) return InvalidArgumentError("required must be a list at " + ptr);
    for (const json& r : s["required"]) {
      if (!r.is_string())
        return InvalidArgumentError("required must list strings at " + ptr + "/required");
      if (!props.contains(r.get<std::string>()))
        return Unsupported(
            "required property '" + r.get<std::string>() + "' is not in 'properties'",
            ptr + "/required");
      required.insert(r.get<std::string>());
    }
  }
  // Extra properties: absent additionalProperties means none when properties are declared
  // (the output still validates: it only omits what was allowed), any when none are.
  std::optional<Expr> extra_value;
  if (s.contains("additionalProperties")) {
    const json& ap = s["additionalProperties"];
    if (!(ap.is_boolean() && !ap.get<bool>())) {
      CHORUS_ASSIGN_OR_RETURN(Expr v, Compile(ap, ptr + "/additionalProperties", depth + 1));
      extra_value = std::move(v);
    }
  } else if (props.empty()) {
    extra_value = AnyValue();
  }
  if (props.empty() && extra_value && !s.contains("additionalProperties")) return AnyObject();

  // Properties in the schema's own order when the caller kept it (CompileOrderedJsonSchema).
  std::vector<std::string> order;
  if (order_ != nullptr) {
    if (auto o = order_->find(ptr); o != order_->end()) {
      for (const std::string& key : o->second) {
        if (props.contains(key) && std::find(order.begin(), order.end(), key) == order.end())
          order.push_back(key);
      }
    }
  }
  if (order.size() != props.size()) {
    order.clear();
    for (auto it = props.begin(); it != props.end(); ++it) order.push_back(it.key());
  }
  std::vector<std::string> names;
  std::vector<Expr> kvs;
  for (const std::string& key : order) {
    CHORUS_ASSIGN_OR_RETURN(Expr v,
                            Compile(props.at(key), ptr + "/properties/" + Esc(key), depth + 1));
    names.push_back(key);
    // Each pair is used twice below (first / after a comma): a rule, so nested schemas are not
    // copied (copies would grow exponentially with the nesting depth).
    const int kv =
        ast_.Define(NewName("kv"), Expr::Seq({Expr::Literal(json(key).dump()), Ws(),
                                              Expr::Literal(":"), Ws(), std::move(v), Ws()}));
    kvs.push_back(Expr::Ref(kv));
  }
  const std::string stem = NewName("obj");
  // A_i: properties i.. with nothing written yet; B_i: with something written (commas first).
  // Built from the end: A_k / B_k are the extra properties (or nothing).
  const size_t k = kvs.size();
  std::vector<int> a_id(k + 1), b_id(k + 1);
  for (size_t i = 0; i <= k; ++i) {
    a_id[i] = ast_.RuleId(stem + "_a" + std::to_string(i));
    b_id[i] = ast_.RuleId(stem + "_b" + std::to_string(i));
  }
  if (extra_value) {
    CHORUS_ASSIGN_OR_RETURN(Expr key, KeyNotIn(names));
    const int extra = ast_.Define(
        stem + "_extra",
        Expr::Seq({std::move(key), Ws(), Expr::Literal(":"), Ws(), std::move(*extra_value), Ws()}));
    Expr more = Expr::Star(Expr::Seq({Expr::Literal(","), Ws(), Expr::Ref(extra)}));
    ast_.Define(stem + "_b" + std::to_string(k), more);
    ast_.Define(stem + "_a" + std::to_string(k),
                Expr::Optional(Expr::Seq({Expr::Ref(extra), std::move(more)})));
  } else {
    ast_.Define(stem + "_a" + std::to_string(k), Expr::Seq({}));
    ast_.Define(stem + "_b" + std::to_string(k), Expr::Seq({}));
  }
  for (size_t i = k; i-- > 0;) {
    const bool req = required.count(names[i]) > 0;
    Expr with_comma = Expr::Seq({Expr::Literal(","), Ws(), kvs[i], Expr::Ref(b_id[i + 1])});
    Expr first = Expr::Seq({kvs[i], Expr::Ref(b_id[i + 1])});
    if (req) {
      ast_.Define(stem + "_b" + std::to_string(i), std::move(with_comma));
      ast_.Define(stem + "_a" + std::to_string(i), std::move(first));
    } else {
      ast_.Define(stem + "_b" + std::to_string(i),
                  Expr::Alt({std::move(with_comma), Expr::Ref(b_id[i + 1])}));
      ast_.Define(stem + "_a" + std::to_string(i),
                  Expr::Alt({std::move(first), Expr::Ref(a_id[i + 1])}));
    }
  }
  return Expr::Seq({Expr::Literal("{"), Ws(), Expr::Ref(a_id[0]), Expr::Literal("}")});
}

// A JSON string key that is none of `names` (compared character by character; an escaped
// spelling of a declared name, e.g. "\u0061", is not recognised as that name).
Result<Expr> Compiler::KeyNotIn(const std::vector<std::string>& names) {
  if (names.empty()) return String(0, kUnbounded);
  struct TrieNode {
    std::map<uint32_t, int> kids;
    bool terminal = false;
  };
  std::vector<TrieNode> t(1);
  for (const std::string& n : names) {
    int cur = 0;
    for (uint32_t cp : Codepoints(n)) {
      auto it = t[static_cast<size_t>(cur)].kids.find(cp);
      if (it == t[static_cast<size_t>(cur)].kids.end()) {
        t.push_back({});
        const int nid = static_cast<int>(t.size() - 1);
        t[static_cast<size_t>(cur)].kids[cp] = nid;
        cur = nid;
      } else {
        cur = it->second;
      }
    }
    t[static_cast<size_t>(cur)].terminal = true;
  }
  const std::string stem = NewName("key");
  Expr rest = Expr::Seq({Expr::Star(Char()), Expr::Literal("\"")});
  for (size_t i = 0; i < t.size(); ++i) ast_.RuleId(stem + "_" + std::to_string(i));
  for (size_t i = 0; i < t.size(); ++i) {
    std::vector<Expr> alts;
    if (!t[i].terminal) alts.push_back(Expr::Literal("\""));
    Ranges taken = {{'"', '"'}, {'\\', '\\'}, {0, 0x1F}};
    for (auto [cp, kid] : t[i].kids) {
      taken.emplace_back(cp, cp);
      alts.push_back(Expr::Seq(
          {Expr::Literal(JsonChar(cp)), Expr::Ref(ast_.RuleId(stem + "_" + std::to_string(kid)))}));
    }
    // Any other character (or an escape) leaves the names behind: the rest is free.
    alts.push_back(
        Expr::Seq({Expr::Alt({Expr::Chars(taken, true),
                              Expr::Seq({Expr::Literal("\\"), Expr::Chars({{'"', '"'},
                                                                           {'\\', '\\'},
                                                                           {'/', '/'},
                                                                           {'b', 'b'},
                                                                           {'f', 'f'},
                                                                           {'n', 'n'},
                                                                           {'r', 'r'},
                                                                           {'t', 't'}})})}),
                   rest}));
    ast_.Define(stem + "_" + std::to_string(i), Expr::Alt(std::move(alts)));
  }
  return Expr::Seq({Expr::Literal("\""), Expr::Ref(ast_.RuleId(stem + "_0"))});
}

Result<Expr> Compiler::Array(const json& s, const std::string& ptr, int depth) {
  auto get_count = [&](const char* kw, int64_t* v) -> Status {
    if (!s.contains(kw)) return OkStatus();
    if (!s[kw].is_number_integer() && !s[kw].is_number_unsigned())
      return InvalidArgumentError(std::string(kw) + " must be an integer at " + ptr);
    *v = s[kw].get<int64_t>();
    if (*v < 0 || *v > 10000)
      return Unsupported(std::string(kw) + " must be in [0, 10000]", ptr + "/" + kw);
    return OkStatus();
  };
  int64_t min = 0, max = kUnbounded;
  CHORUS_RETURN_IF_ERROR(get_count("minItems", &min));
  CHORUS_RETURN_IF_ERROR(get_count("maxItems", &max));
  std::vector<Expr> prefix;
  if (s.contains("prefixItems")) {
    if (!s["prefixItems"].is_array())
      return InvalidArgumentError("prefixItems must be a list at " + ptr);
    for (size_t i = 0; i < s["prefixItems"].size(); ++i) {
      CHORUS_ASSIGN_OR_RETURN(
          Expr e,
          Compile(s["prefixItems"][i], ptr + "/prefixItems/" + std::to_string(i), depth + 1));
      prefix.push_back(std::move(e));
    }
  }
  std::optional<Expr> item;
  if (s.contains("items")) {
    const json& it = s["items"];
    if (!(it.is_boolean() && !it.get<bool>())) {
      CHORUS_ASSIGN_OR_RETURN(Expr e, Compile(it, ptr + "/items", depth + 1));
      // Used more than once below: a rule (no copies of the nested schema, see Object).
      item = Expr::Ref(ast_.Define(NewName("item"), std::move(e)));
    }
  } else {
    item = AnyValue();
  }
  const int64_t p = static_cast<int64_t>(prefix.size());
  if (!item) max = max == kUnbounded ? p : std::min(max, p);
  if (max != kUnbounded && min > max)
    return InvalidArgumentError("minItems above the number of items allowed at " + ptr);
  if (max == 0) return Expr::Seq({Expr::Literal("["), Ws(), Expr::Literal("]")});
  auto elem = [&](int64_t i) {
    return Expr::Seq({i < p ? prefix[static_cast<size_t>(i)] : *item, Ws()});
  };
  // tail(i): the elements after the i-th (each with its leading comma).
  std::optional<Expr> tail;  // built from the end
  {
    // Beyond the prefix: repetitions of `item`.
    const int64_t from = std::max<int64_t>(p, 1);
    if (item && (max == kUnbounded || max > from)) {
      const int64_t lo = std::max<int64_t>(min - from, 0);
      const int64_t hi = max == kUnbounded ? kUnbounded : max - from;
      tail = Expr::Repeat(Expr::Seq({Expr::Literal(","), Ws(), elem(from)}), static_cast<int>(lo),
                          static_cast<int>(hi));
    } else {
      tail = Expr::Seq({});
    }
    for (int64_t i = std::min<int64_t>(p, max == kUnbounded ? p : max) - 1; i >= 1; --i) {
      Expr one = Expr::Seq({Expr::Literal(","), Ws(), elem(i), std::move(*tail)});
      tail = i < min ? std::move(one) : Expr::Optional(std::move(one));
    }
  }
  Expr body = Expr::Seq({elem(0), std::move(*tail)});
  if (min == 0) body = Expr::Optional(std::move(body));
  return Expr::Seq({Expr::Literal("["), Ws(), std::move(body), Expr::Literal("]")});
}

Result<Expr> Compiler::StringSchema(const json& s, const std::string& ptr) {
  auto get_len = [&](const char* kw, int64_t* v) -> Status {
    if (!s.contains(kw)) return OkStatus();
    if (!s[kw].is_number_integer() && !s[kw].is_number_unsigned())
      return InvalidArgumentError(std::string(kw) + " must be an integer at " + ptr);
    *v = s[kw].get<int64_t>();
    if (*v < 0 || *v > 10000)
      return Unsupported(std::string(kw) + " must be in [0, 10000]", ptr + "/" + kw);
    return OkStatus();
  };
  int64_t min = 0, max = kUnbounded;
  CHORUS_RETURN_IF_ERROR(get_len("minLength", &min));
  CHORUS_RETURN_IF_ERROR(get_len("maxLength", &max));
  if (max != kUnbounded && min > max)
    return InvalidArgumentError("minLength above maxLength at " + ptr);
  const bool has_len = s.contains("minLength") || s.contains("maxLength");
  if (s.contains("pattern")) {
    if (has_len || s.contains("format"))
      return Unsupported("'pattern' combined with minLength/maxLength/format is not supported",
                         ptr);
    if (!s["pattern"].is_string())
      return InvalidArgumentError("pattern must be a string at " + ptr);
    RegexParser rp(this, Codepoints(s["pattern"].get<std::string>()), ptr + "/pattern");
    return rp.Parse();
  }
  if (s.contains("format")) {
    if (has_len)
      return Unsupported("'format' combined with minLength/maxLength is not supported", ptr);
    if (!s["format"].is_string()) return InvalidArgumentError("format must be a string at " + ptr);
    return Format(s["format"].get<std::string>(), ptr + "/format");
  }
  return String(static_cast<int>(min), static_cast<int>(max));
}

Result<Expr> Compiler::Format(const std::string& f, const std::string& ptr) {
  auto d = [](char lo, char hi) { return Expr::Chars({{uint32_t(lo), uint32_t(hi)}}); };
  auto L = [](const char* s) { return Expr::Literal(s); };
  auto two = [&](Expr a, Expr b) { return Expr::Seq({std::move(a), std::move(b)}); };
  // Days valid in every year (February stops at 28: the 29th is valid only in leap years).
  auto date = [&] {
    Expr d31 = Expr::Alt(
        {two(L("0"), d('1', '9')), two(d('1', '2'), d('0', '9')), two(L("3"), d('0', '1'))});
    Expr d30 = Expr::Alt({two(L("0"), d('1', '9')), two(d('1', '2'), d('0', '9')), L("30")});
    Expr d28 =
        Expr::Alt({two(L("0"), d('1', '9')), two(L("1"), d('0', '9')), two(L("2"), d('0', '8'))});
    Expr md = Expr::Alt(
        {Expr::Seq({Expr::Alt({L("01"), L("03"), L("05"), L("07"), L("08"), L("10"), L("12")}),
                    L("-"), d31}),
         Expr::Seq({Expr::Alt({L("04"), L("06"), L("09"), L("11")}), L("-"), d30}),
         Expr::Seq({L("02-"), d28})});
    return Expr::Seq({d('1', '9'), Expr::Repeat(d('0', '9'), 3, 3), L("-"), std::move(md)});
  };
  auto time = [&] {
    Expr hh = Expr::Alt({two(d('0', '1'), d('0', '9')), two(L("2"), d('0', '3'))});
    Expr mm = two(d('0', '5'), d('0', '9'));
    return Expr::Seq(
        {hh, L(":"), mm, L(":"), mm,
         Expr::Optional(Expr::Seq({L("."), Expr::Repeat(d('0', '9'), 1, 6)})),
         Expr::Alt({L("Z"), Expr::Seq({Expr::Chars({{'+', '+'}, {'-', '-'}}), hh, L(":"), mm})})});
  };
  Expr body;
  if (f == "date") {
    body = date();
  } else if (f == "time") {
    body = time();
  } else if (f == "date-time") {
    body = Expr::Seq({date(), L("T"), time()});
  } else if (f == "uuid") {
    Expr h = Expr::Chars({{'0', '9'}, {'a', 'f'}});
    body = Expr::Seq({Expr::Repeat(h, 8, 8), L("-"), Expr::Repeat(h, 4, 4), L("-"),
                      Expr::Repeat(h, 4, 4), L("-"), Expr::Repeat(h, 4, 4), L("-"),
                      Expr::Repeat(h, 12, 12)});
  } else if (f == "email") {
    Expr local = Expr::Chars(
        {{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'.', '.'}, {'_', '_'}, {'+', '+'}, {'-', '-'}});
    Expr label = Expr::Chars({{'a', 'z'}, {'A', 'Z'}, {'0', '9'}, {'-', '-'}});
    body = Expr::Seq({Expr::Repeat(local, 1, 32), L("@"), Expr::Repeat(label, 1, 32),
                      Expr::Repeat(Expr::Seq({L("."), Expr::Repeat(label, 1, 16)}), 1, 3)});
  } else {
    return Unsupported(
        "unsupported format '" + f + "' (supported: date, time, date-time, uuid, email)", ptr);
  }
  return Expr::Seq({L("\""), std::move(body), L("\"")});
}

// Digit strings of equal length between lo and hi (inclusive).
Expr Compiler::SameLen(const std::string& lo, const std::string& hi) {
  if (lo.empty()) return Expr::Seq({});
  auto digit = [](char a, char b) { return Expr::Chars({{uint32_t(a), uint32_t(b)}}); };
  if (lo.size() == 1) return digit(lo[0], hi[0]);
  const std::string lr = lo.substr(1), hr = hi.substr(1);
  if (lo[0] == hi[0]) return Expr::Seq({Expr::Literal(std::string(1, lo[0])), SameLen(lr, hr)});
  const bool lo_zeros = lr.find_first_not_of('0') == std::string::npos;
  const bool hi_nines = hr.find_first_not_of('9') == std::string::npos;
  const int n = static_cast<int>(lr.size());
  std::vector<Expr> alts;
  char mid_lo = static_cast<char>(lo[0] + 1), mid_hi = static_cast<char>(hi[0] - 1);
  if (lo_zeros) {
    mid_lo = lo[0];
  } else {
    alts.push_back(Expr::Seq(
        {Expr::Literal(std::string(1, lo[0])), SameLen(lr, std::string(lr.size(), '9'))}));
  }
  if (hi_nines) mid_hi = hi[0];
  if (mid_lo <= mid_hi) alts.push_back(Expr::Seq({digit(mid_lo, mid_hi), Digits(n, n)}));
  if (!hi_nines)
    alts.push_back(Expr::Seq(
        {Expr::Literal(std::string(1, hi[0])), SameLen(std::string(hr.size(), '0'), hr)}));
  return Expr::Alt(std::move(alts));
}

// Decimal forms (no leading zeros) of the integers in [a, b].
Expr Compiler::PosRange(uint64_t a, uint64_t b) {
  std::vector<Expr> alts;
  uint64_t pow = 1;  // 10^(d-1)
  for (int d = 1; d <= 20 && pow <= b; ++d, pow *= 10) {
    const uint64_t first = d == 1 ? 0 : pow;
    const uint64_t last = pow > UINT64_MAX / 10 ? UINT64_MAX : pow * 10 - 1;
    const uint64_t lo = std::max(a, first), hi = std::min(b, last);
    if (lo > hi) continue;
    alts.push_back(SameLen(std::to_string(lo), std::to_string(hi)));
    if (pow > UINT64_MAX / 10) break;
  }
  return Expr::Alt(std::move(alts));
}

Result<Expr> Compiler::IntegerSchema(const json& s, const std::string& ptr) {
  if (!s.contains("minimum") && !s.contains("maximum")) return Integer();
  int64_t limit = 1;
  for (int i = 0; i < opts_.max_int_digits && i < 18; ++i) limit *= 10;
  limit -= 1;  // the largest magnitude an unbounded side reaches (documented)
  int64_t lo = -limit, hi = limit;
  for (const char* kw : {"minimum", "maximum"}) {
    if (!s.contains(kw)) continue;
    if (!s[kw].is_number())
      return InvalidArgumentError(std::string(kw) + " must be a number at " + ptr);
    const double v = s[kw].get<double>();
    if (std::abs(v) > 9e15) return Unsupported(std::string(kw) + " beyond ±9e15", ptr + "/" + kw);
    if (std::string(kw) == "minimum") {
      lo = static_cast<int64_t>(std::ceil(v));
    } else {
      hi = static_cast<int64_t>(std::floor(v));
    }
  }
  if (lo > hi) return InvalidArgumentError("minimum above maximum at " + ptr);
  std::vector<Expr> alts;
  if (lo < 0) {
    const int64_t nhi = std::min<int64_t>(hi, -1);  // negatives: "-" + magnitude in [-nhi, -lo]
    alts.push_back(Expr::Seq(
        {Expr::Literal("-"), PosRange(static_cast<uint64_t>(-nhi), static_cast<uint64_t>(-lo))}));
  }
  if (hi >= 0)
    alts.push_back(
        PosRange(static_cast<uint64_t>(std::max<int64_t>(lo, 0)), static_cast<uint64_t>(hi)));
  return Expr::Alt(std::move(alts));
}

}  // namespace

Result<GrammarAst> JsonSchemaToAst(const nlohmann::json& schema, const JsonSchemaOptions& opts) {
  Compiler c(schema, opts);
  return c.Run();
}

Result<Grammar> CompileJsonSchema(const nlohmann::json& schema, const JsonSchemaOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(GrammarAst ast, JsonSchemaToAst(schema, opts));
  return Grammar::FromAst(ast);
}

Result<GrammarAst> OrderedJsonSchemaToAst(const nlohmann::ordered_json& schema,
                                          const JsonSchemaOptions& opts) {
  PropertyOrder order;
  CollectOrder(schema, "#", &order);
  const json plain = json::parse(schema.dump());
  Compiler c(plain, opts, &order);
  return c.Run();
}

Result<Grammar> CompileOrderedJsonSchema(const nlohmann::ordered_json& schema,
                                         const JsonSchemaOptions& opts) {
  CHORUS_ASSIGN_OR_RETURN(GrammarAst ast, OrderedJsonSchemaToAst(schema, opts));
  return Grammar::FromAst(ast);
}

Result<Grammar> CachedOrderedJsonSchema(const nlohmann::ordered_json& schema) {
  return SharedGrammarCache().GetOrCompile("json_schema_ordered:" + schema.dump(),
                                           [&] { return CompileOrderedJsonSchema(schema); });
}

Grammar AnyJsonObjectGrammar() {
  static const Grammar g = *CompileJsonSchema(json{{"type", "object"}});
  return g;
}

Grammar AnyJsonValueGrammar() {
  static const Grammar g = *CompileJsonSchema(json(true));
  return g;
}

Result<Grammar> CachedJsonSchema(const nlohmann::json& schema) {
  return SharedGrammarCache().GetOrCompile("json_schema:" + schema.dump(),
                                           [&] { return CompileJsonSchema(schema); });
}

Result<Grammar> CompileRegex(std::string_view pattern, const std::string& where) {
  if (pattern.empty())
    return InvalidArgumentError("regex: empty" + (where.empty() ? "" : " at " + where));
  RegexParser rp(nullptr, Codepoints(std::string(pattern)), where, /*raw=*/true);
  CHORUS_ASSIGN_OR_RETURN(Expr e, rp.Parse());
  GrammarAst ast;
  ast.root = ast.Define("root", std::move(e));
  return Grammar::FromAst(ast);
}

Result<Grammar> CachedRegex(std::string_view pattern, const std::string& where) {
  return SharedGrammarCache().GetOrCompile("regex:" + std::string(pattern),
                                           [&] { return CompileRegex(pattern, where); });
}

Result<Grammar> CachedGbnf(std::string_view text) {
  return SharedGrammarCache().GetOrCompile("gbnf:" + std::string(text),
                                           [&] { return CompileGbnf(text); });
}

}  // namespace chorus::grammar

// GBNF (llama.cpp's grammar format) → GrammarAst. Grammar summary in grammar.h.
#include <algorithm>
#include <map>

#include "chorus/grammar/grammar.h"
#include "chorus/tokenizer/utf8.h"

namespace chorus::grammar {
namespace {

constexpr int kMaxNesting = 200;  // parentheses; deeper input is rejected, not a stack overflow

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view s) : s_(s) {}

  Result<GrammarAst> Parse() {
    SkipSpace(true);
    while (p_ < s_.size()) {
      CHORUS_RETURN_IF_ERROR(ParseRule());
      SkipSpace(true);
    }
    if (!error_.ok()) return error_;
    auto root = std::find(ast_.names.begin(), ast_.names.end(), "root");
    if (root == ast_.names.end() || !ast_.defined[static_cast<size_t>(root - ast_.names.begin())])
      return InvalidArgumentError("GBNF: the grammar has no 'root' rule");
    ast_.root = static_cast<int>(root - ast_.names.begin());
    for (size_t i = 0; i < ast_.names.size(); ++i) {
      if (!ast_.defined[i])
        return ErrorAt(first_use_[ast_.names[i]], "rule '" + ast_.names[i] + "' is not defined");
    }
    return std::move(ast_);
  }

 private:
  Status ErrorAt(size_t pos, const std::string& msg) const {
    int line = 1, col = 1;
    for (size_t i = 0; i < pos && i < s_.size(); ++i) {
      if (s_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return InvalidArgumentError("GBNF line " + std::to_string(line) + ", column " +
                                std::to_string(col) + ": " + msg);
  }
  Status Error(const std::string& msg) const { return ErrorAt(p_, msg); }

  bool AtEnd() const { return p_ >= s_.size(); }
  char Peek(size_t k = 0) const { return p_ + k < s_.size() ? s_[p_ + k] : '\0'; }

  // Skips blanks and comments; newlines too when `newlines`.
  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++p_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n') ++p_;
      } else {
        break;
      }
    }
  }

  static bool IsNameChar(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '_';
  }

  std::string ParseName() {
    const size_t b = p_;
    while (!AtEnd() && IsNameChar(Peek())) ++p_;
    return std::string(s_.substr(b, p_ - b));
  }

  Status ParseRule() {
    const size_t at = p_;
    const std::string name = ParseName();
    if (name.empty()) return Error("expected a rule name");
    SkipSpace(false);
    if (s_.substr(p_, 3) != "::=") return Error("expected '::=' after rule name '" + name + "'");
    p_ += 3;
    SkipSpace(true);
    Expr body;
    CHORUS_RETURN_IF_ERROR(ParseAlternates(0, &body));
    const int id = ast_.RuleId(name);
    if (ast_.defined[static_cast<size_t>(id)])
      return ErrorAt(at, "rule '" + name + "' is defined twice");
    ast_.Define(name, std::move(body));
    if (!AtEnd() && Peek() != '\n') return Error(std::string("unexpected '") + Peek() + "'");
    return OkStatus();
  }

  Status ParseAlternates(int depth, Expr* out) {
    std::vector<Expr> alts;
    for (;;) {
      Expr seq;
      CHORUS_RETURN_IF_ERROR(ParseSequence(depth, &seq));
      alts.push_back(std::move(seq));
      // A top-level rule may continue on the next line when that line starts with '|'.
      const size_t save = p_;
      SkipSpace(true);
      if (Peek() != '|') {
        p_ = save;
        break;
      }
      ++p_;
      SkipSpace(true);
    }
    *out = Expr::Alt(std::move(alts));
    return OkStatus();
  }

  Status ParseSequence(int depth, Expr* out) {
    std::vector<Expr> items;
    const bool nested = depth > 0;
    for (;;) {
      SkipSpace(nested);
      if (AtEnd()) break;
      const char c = Peek();
      Expr item;
      if (c == '"') {
        ++p_;
        std::string text;
        while (!AtEnd() && Peek() != '"') {
          uint32_t cp;
          CHORUS_RETURN_IF_ERROR(ParseChar(&cp));
          tokenizer::internal::AppendCodepoint(cp, &text);
        }
        if (AtEnd()) return Error("unterminated string literal");
        ++p_;
        item = Expr::Literal(std::move(text));
      } else if (c == '[') {
        ++p_;
        bool negated = false;
        if (Peek() == '^') {
          negated = true;
          ++p_;
        }
        std::vector<std::pair<uint32_t, uint32_t>> ranges;
        while (!AtEnd() && Peek() != ']') {
          uint32_t lo, hi;
          CHORUS_RETURN_IF_ERROR(ParseChar(&lo));
          hi = lo;
          if (Peek() == '-' && Peek(1) != ']' && p_ + 1 < s_.size()) {
            ++p_;
            CHORUS_RETURN_IF_ERROR(ParseChar(&hi));
            if (hi < lo) return Error("character range is reversed");
          }
          ranges.emplace_back(lo, hi);
        }
        if (AtEnd()) return Error("unterminated character class");
        ++p_;
        if (ranges.empty() && !negated) return Error("empty character class");
        item = Expr::Chars(std::move(ranges), negated);
      } else if (c == '.') {
        ++p_;
        item = Expr::Chars({}, true);
      } else if (c == '(') {
        if (depth >= kMaxNesting) return Error("parentheses nested too deeply");
        ++p_;
        SkipSpace(true);
        CHORUS_RETURN_IF_ERROR(ParseAlternates(depth + 1, &item));
        SkipSpace(true);
        if (Peek() != ')') return Error("expected ')'");
        ++p_;
      } else if (IsNameChar(c)) {
        const size_t at = p_;
        const std::string name = ParseName();
        // `name ::=` starts the next rule (a rule may end at a newline inside no group).
        size_t q = p_;
        while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t')) ++q;
        if (s_.substr(q, 3) == "::=") {
          p_ = at;
          if (nested) return Error("rule definition inside parentheses");
          break;
        }
        first_use_.try_emplace(name, at);
        item = Expr::Ref(ast_.RuleId(name));
      } else {
        break;  // '|', ')', newline, end: the caller decides
      }
      CHORUS_RETURN_IF_ERROR(ParsePostfix(&item));
      items.push_back(std::move(item));
    }
    *out = Expr::Seq(std::move(items));
    return OkStatus();
  }

  Status ParsePostfix(Expr* item) {
    for (;;) {
      const char c = Peek();
      if (c == '*') {
        ++p_;
        *item = Expr::Star(std::move(*item));
      } else if (c == '+') {
        ++p_;
        *item = Expr::Plus(std::move(*item));
      } else if (c == '?') {
        ++p_;
        *item = Expr::Optional(std::move(*item));
      } else if (c == '{') {
        ++p_;
        SkipSpace(false);
        int64_t m = 0;
        if (!ParseInt(&m)) return Error("expected a number after '{'");
        int64_t n = m;
        SkipSpace(false);
        if (Peek() == ',') {
          ++p_;
          SkipSpace(false);
          n = kUnbounded;
          if (Peek() != '}' && !ParseInt(&n)) return Error("expected a number or '}'");
          SkipSpace(false);
        }
        if (Peek() != '}') return Error("expected '}'");
        ++p_;
        if (n != kUnbounded && n < m) return Error("repetition {m,n} with n < m");
        if (m > 100000 || n > 100000) return Error("repetition count above 100000");
        *item = Expr::Repeat(std::move(*item), static_cast<int>(m), static_cast<int>(n));
      } else {
        return OkStatus();
      }
    }
  }

  bool ParseInt(int64_t* v) {
    const size_t b = p_;
    *v = 0;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      if (*v < 10000000) *v = *v * 10 + (Peek() - '0');
      ++p_;
    }
    return p_ > b;
  }

  Status ParseHex(int digits, uint32_t* cp) {
    *cp = 0;
    for (int i = 0; i < digits; ++i) {
      const char c = Peek();
      int d;
      if (c >= '0' && c <= '9') {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        return Error("expected " + std::to_string(digits) + " hex digits");
      }
      *cp = *cp * 16 + static_cast<uint32_t>(d);
      ++p_;
    }
    if (*cp > kMaxCodepoint) return Error("code point above U+10FFFF");
    return OkStatus();
  }

  // One (possibly escaped, possibly multi-byte) character of a literal or class.
  Status ParseChar(uint32_t* cp) {
    const unsigned char c = static_cast<unsigned char>(Peek());
    if (c == '\\') {
      ++p_;
      if (AtEnd()) return Error("escape at end of input");
      const char e = Peek();
      ++p_;
      switch (e) {
        case 'n':
          *cp = '\n';
          return OkStatus();
        case 'r':
          *cp = '\r';
          return OkStatus();
        case 't':
          *cp = '\t';
          return OkStatus();
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
        case '\'':
          *cp = static_cast<uint32_t>(e);
          return OkStatus();
        case 'x':
          return ParseHex(2, cp);
        case 'u':
          return ParseHex(4, cp);
        case 'U':
          return ParseHex(8, cp);
        default:
          --p_;
          return Error(std::string("unknown escape '\\") + e + "'");
      }
    }
    if (c == '\n' || c == '\r') return Error("newline inside a literal or class");
    const size_t len = tokenizer::internal::ValidUtf8CharLen(s_.substr(p_));
    if (len == 0) return Error("invalid UTF-8");
    if (len == 1) {
      *cp = c;
    } else {
      static constexpr uint8_t kMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
      *cp = c & kMask[len];
      for (size_t i = 1; i < len; ++i) *cp = (*cp << 6) | (static_cast<uint8_t>(s_[p_ + i]) & 0x3F);
    }
    p_ += len;
    return OkStatus();
  }

  std::string_view s_;
  size_t p_ = 0;
  GrammarAst ast_;
  std::map<std::string, size_t> first_use_;
  Status error_;
};

}  // namespace

Result<GrammarAst> ParseGbnf(std::string_view text) {
  if (text.size() > (8u << 20)) return InvalidArgumentError("GBNF: grammar larger than 8 MiB");
  GbnfParser p(text);
  return p.Parse();
}

Result<Grammar> CompileGbnf(std::string_view text) {
  CHORUS_ASSIGN_OR_RETURN(GrammarAst ast, ParseGbnf(text));
  Result<Grammar> g = Grammar::FromAst(ast);
  if (!g.ok()) return InvalidArgumentError("GBNF: " + g.status().message());
  return g;
}

}  // namespace chorus::grammar

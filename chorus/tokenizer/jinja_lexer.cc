#include "chorus/tokenizer/jinja_lexer.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <tuple>

#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer::jinja {

namespace {

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// How the text next to a tag is trimmed.
enum class LeftMode : uint8_t { kNone, kStripAll, kTrimNewline };  // start of a text
enum class RightMode : uint8_t { kNone, kStripAll, kLstrip };      // end of a text

struct TextPiece {
  size_t token_index;  // index of the kText token in the output
  std::string raw;
  bool starts_line = false;
  LeftMode left = LeftMode::kNone;
  RightMode right = RightMode::kNone;
};

std::string FinalizeText(const TextPiece& p) {
  const std::string& s = p.raw;
  size_t end = s.size();
  if (p.right == RightMode::kStripAll) {
    while (end > 0 && IsSpace(s[end - 1])) --end;
  } else if (p.right == RightMode::kLstrip) {
    const size_t nl = s.rfind('\n');
    const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos > 0 || p.starts_line) {
      bool all_ws = true;
      for (size_t i = l_pos; i < s.size(); ++i) {
        if (s[i] != ' ' && s[i] != '\t') {
          all_ws = false;
          break;
        }
      }
      if (all_ws) end = l_pos;
    }
  }
  size_t begin = 0;
  if (p.left == LeftMode::kStripAll) {
    while (begin < end && IsSpace(s[begin])) ++begin;
  } else if (p.left == LeftMode::kTrimNewline && !s.empty() && s[0] == '\n') {
    begin = 1;
  }
  if (begin >= end) return std::string();
  return s.substr(begin, end - begin);
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  Result<std::vector<Token>> Run() {
    size_t pos = 0;
    LeftMode pending_left = LeftMode::kNone;
    while (pos < src_.size()) {
      // Find the next tag opener.
      size_t open = pos;
      char kind = 0;
      while (true) {
        open = src_.find('{', open);
        if (open == std::string::npos || open + 1 >= src_.size()) {
          open = std::string::npos;
          break;
        }
        const char c = src_[open + 1];
        if (c == '{' || c == '%' || c == '#') {
          kind = c;
          break;
        }
        ++open;
      }
      const size_t text_end = open == std::string::npos ? src_.size() : open;
      AddText(pos, text_end, pending_left);
      pending_left = LeftMode::kNone;
      if (open == std::string::npos) break;

      size_t p = open + 2;
      char left_mod = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) {
        left_mod = src_[p];
        ++p;
      }
      const bool is_block_like = kind != '{';
      // Whitespace control on the text before the tag.
      if (left_mod == '-') {
        SetRightOfLastText(RightMode::kStripAll);
      } else if (left_mod != '+' && is_block_like) {
        SetRightOfLastText(RightMode::kLstrip);
      }

      if (kind == '#') {
        size_t close = src_.find("#}", p);
        if (close == std::string::npos) {
          auto [l, c] = LineCol(open);
          return SyntaxError(l, c, "unclosed comment '{#'");
        }
        const char right_mod = close > p ? src_[close - 1] : 0;
        pending_left = right_mod == '-'   ? LeftMode::kStripAll
                       : right_mod == '+' ? LeftMode::kNone
                                          : LeftMode::kTrimNewline;
        pos = close + 2;
        continue;
      }

      if (kind == '%') {
        // {% raw %} ... {% endraw %}
        size_t after_raw;
        char raw_right_mod;
        if (MatchKeywordTag(p, "raw", &after_raw, &raw_right_mod)) {
          size_t search = after_raw;
          size_t end_open = std::string::npos, end_after = 0;
          char end_left_mod = 0, end_right_mod = 0;
          while (true) {
            size_t cand = src_.find("{%", search);
            if (cand == std::string::npos) break;
            size_t q = cand + 2;
            char lm = 0;
            if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) lm = src_[q++];
            size_t after;
            char rm;
            if (MatchKeywordTag(q, "endraw", &after, &rm)) {
              end_open = cand;
              end_after = after;
              end_left_mod = lm;
              end_right_mod = rm;
              break;
            }
            search = cand + 2;
          }
          if (end_open == std::string::npos) {
            auto [l, c] = LineCol(open);
            return SyntaxError(l, c, "missing {% endraw %} for {% raw %}");
          }
          AddText(after_raw, end_open,
                  raw_right_mod == '-'   ? LeftMode::kStripAll
                  : raw_right_mod == '+' ? LeftMode::kNone
                                         : LeftMode::kTrimNewline);
          if (end_left_mod == '-') {
            SetRightOfLastText(RightMode::kStripAll);
          } else if (end_left_mod != '+') {
            SetRightOfLastText(RightMode::kLstrip);
          }
          pending_left = end_right_mod == '-'   ? LeftMode::kStripAll
                         : end_right_mod == '+' ? LeftMode::kNone
                                                : LeftMode::kTrimNewline;
          pos = end_after;
          continue;
        }
      }

      // Code: tokens until the closing delimiter at bracket depth 0.
      Token begin_tok;
      begin_tok.kind = kind == '{' ? TokKind::kVarBegin : TokKind::kBlockBegin;
      std::tie(begin_tok.line, begin_tok.col) = LineCol(open);
      tokens_.push_back(begin_tok);
      int depth = 0;
      bool closed = false;
      while (p < src_.size()) {
        if (IsSpace(src_[p])) {
          ++p;
          continue;
        }
        if (depth == 0) {
          // Closing delimiters, with an optional '-' / '+' modifier.
          size_t q = p;
          char right_mod = 0;
          if ((src_[q] == '-' || src_[q] == '+') && q + 1 < src_.size()) {
            right_mod = src_[q];
            ++q;
          }
          const bool var_close = kind == '{' && src_.compare(q, 2, "}}") == 0 && right_mod != '+';
          const bool block_close = kind == '%' && src_.compare(q, 2, "%}") == 0;
          if (var_close || block_close) {
            Token end_tok;
            end_tok.kind = var_close ? TokKind::kVarEnd : TokKind::kBlockEnd;
            std::tie(end_tok.line, end_tok.col) = LineCol(p);
            tokens_.push_back(end_tok);
            if (right_mod == '-') {
              pending_left = LeftMode::kStripAll;
            } else if (right_mod != '+' && block_close) {
              pending_left = LeftMode::kTrimNewline;
            }
            p = q + 2;
            closed = true;
            break;
          }
        }
        CHORUS_RETURN_IF_ERROR(LexCodeToken(&p, &depth));
      }
      if (!closed) {
        auto [l, c] = LineCol(open);
        return SyntaxError(
            l, c, kind == '{' ? "unclosed '{{' (missing '}}')" : "unclosed '{%' (missing '%}')");
      }
      pos = p;
    }
    for (const auto& piece : texts_) tokens_[piece.token_index].text = FinalizeText(piece);
    std::vector<Token> out;
    out.reserve(tokens_.size() + 1);
    for (auto& t : tokens_) {
      if (t.kind == TokKind::kText && t.text.empty()) continue;
      out.push_back(std::move(t));
    }
    Token eof;
    eof.kind = TokKind::kEof;
    std::tie(eof.line, eof.col) = LineCol(src_.size());
    out.push_back(eof);
    return out;
  }

 private:
  std::pair<int, int> LineCol(size_t off) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), off);
    const size_t line_idx = static_cast<size_t>(it - line_starts_.begin()) - 1;
    return {static_cast<int>(line_idx + 1), static_cast<int>(off - line_starts_[line_idx] + 1)};
  }

  // Adds the text src_[begin, end) (possibly empty: it still receives the lstrip/trim flags
  // so that an empty piece never lets a rule leak onto other text).
  void AddText(size_t begin, size_t end, LeftMode left) {
    Token t;
    t.kind = TokKind::kText;
    std::tie(t.line, t.col) = LineCol(begin);
    TextPiece piece;
    piece.token_index = tokens_.size();
    piece.raw = src_.substr(begin, end - begin);
    piece.starts_line = begin == 0 || src_[begin - 1] == '\n';
    piece.left = left;
    texts_.push_back(std::move(piece));
    tokens_.push_back(std::move(t));
  }

  void SetRightOfLastText(RightMode mode) {
    if (!tokens_.empty() && tokens_.back().kind == TokKind::kText && !texts_.empty() &&
        texts_.back().token_index == tokens_.size() - 1) {
      texts_.back().right = mode;
    }
  }

  // Matches `\s* keyword \s* [-+]? %}` at p; on success returns the offset after "%}".
  bool MatchKeywordTag(size_t p, std::string_view keyword, size_t* after, char* right_mod) {
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    if (src_.compare(p, keyword.size(), keyword) != 0) return false;
    p += keyword.size();
    if (p < src_.size() && IsNameChar(src_[p])) return false;
    while (p < src_.size() && IsSpace(src_[p])) ++p;
    char mod = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) mod = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    *after = p + 2;
    *right_mod = mod;
    return true;
  }

  Status LexCodeToken(size_t* pp, int* depth) {
    size_t p = *pp;
    Token t;
    std::tie(t.line, t.col) = LineCol(p);
    const char c = src_[p];
    if (IsNameStart(c)) {
      size_t q = p;
      while (q < src_.size() && IsNameChar(src_[q])) ++q;
      t.kind = TokKind::kName;
      t.text = src_.substr(p, q - p);
      tokens_.push_back(std::move(t));
      *pp = q;
      return OkStatus();
    }
    if (IsDigit(c)) return LexNumber(pp, std::move(t));
    if (c == '\'' || c == '"') return LexString(pp, std::move(t));
    static constexpr std::string_view kTwo[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (auto op : kTwo) {
      if (src_.compare(p, 2, op) == 0) {
        t.kind = TokKind::kOp;
        t.text = std::string(op);
        tokens_.push_back(std::move(t));
        *pp = p + 2;
        return OkStatus();
      }
    }
    static constexpr std::string_view kOne = "+-*/%~<>()[]{},.:|=";
    if (kOne.find(c) != std::string_view::npos) {
      if (c == '(' || c == '[' || c == '{') ++*depth;
      if ((c == ')' || c == ']' || c == '}') && *depth > 0) --*depth;
      t.kind = TokKind::kOp;
      t.text = std::string(1, c);
      tokens_.push_back(std::move(t));
      *pp = p + 1;
      return OkStatus();
    }
    std::string what = "unexpected character '";
    what.push_back(c);
    what += "'";
    return SyntaxError(t.line, t.col, what);
  }

  Status LexNumber(size_t* pp, Token t) {
    size_t p = *pp;
    std::string digits;
    bool is_float = false;
    auto take_digits = [&]() {
      while (p < src_.size() && (IsDigit(src_[p]) || src_[p] == '_')) {
        if (src_[p] != '_') digits.push_back(src_[p]);
        ++p;
      }
    };
    take_digits();
    if (p + 1 < src_.size() && src_[p] == '.' && IsDigit(src_[p + 1])) {
      is_float = true;
      digits.push_back('.');
      ++p;
      take_digits();
    }
    if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
      size_t q = p + 1;
      if (q < src_.size() && (src_[q] == '+' || src_[q] == '-')) ++q;
      if (q < src_.size() && IsDigit(src_[q])) {
        is_float = true;
        digits.push_back('e');
        digits.append(src_, p + 1, q - p - 1);
        p = q;
        take_digits();
      }
    }
    errno = 0;
    char* end = nullptr;
    if (is_float) {
      t.kind = TokKind::kFloat;
      t.float_value = std::strtod(digits.c_str(), &end);
    } else {
      t.kind = TokKind::kInt;
      t.int_value = std::strtoll(digits.c_str(), &end, 10);
      if (errno == ERANGE) return SyntaxError(t.line, t.col, "integer literal out of range");
    }
    t.text = digits;
    tokens_.push_back(std::move(t));
    *pp = p;
    return OkStatus();
  }

  static int HexVal(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  static void AppendUtf8(uint32_t cp, std::string* out) {
    if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
    internal::AppendCodepoint(cp, out);
  }

  // Python string-literal escapes (Jinja decodes literals with "unicode-escape"); an
  // unknown escape keeps its backslash.
  Status LexString(size_t* pp, Token t) {
    const char quote = src_[*pp];
    size_t p = *pp + 1;
    std::string out;
    while (true) {
      if (p >= src_.size()) return SyntaxError(t.line, t.col, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) return SyntaxError(t.line, t.col, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            const int h = p + k < src_.size() ? HexVal(src_[p + k]) : -1;
            if (h < 0) return SyntaxError(t.line, t.col, "truncated \\x/\\u escape in string");
            cp = cp * 16 + static_cast<uint32_t>(h);
          }
          p += n;
          AppendUtf8(cp, &out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int k = 0; k < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++k) {
              cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            }
            AppendUtf8(cp, &out);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
    t.kind = TokKind::kString;
    t.text = std::move(out);
    tokens_.push_back(std::move(t));
    *pp = p;
    return OkStatus();
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  std::vector<TextPiece> texts_;
};

}  // namespace

Status SyntaxError(int line, int col, std::string_view what) {
  return InvalidArgumentError("chat template syntax error at line " + std::to_string(line) +
                              ", column " + std::to_string(col) + ": " + std::string(what));
}

Result<std::vector<Token>> Lex(std::string_view source) {
  // Newlines → "\n" (Jinja's newline_sequence); drop one trailing newline.
  std::string src;
  src.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      src.push_back(source[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(std::move(src));
  return lexer.Run();
}

}  // namespace chorus::tokenizer::jinja

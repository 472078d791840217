#include "chorus/tokenizer/jinja_strings.h"

#include <locale.h>  // newlocale, towupper_l (POSIX)

#include <clocale>
#include <cmath>
#include <cstdio>
#include <cwctype>
#include <limits>
#include <optional>

#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer::jinja {

namespace {

// The C.UTF-8 locale's case tables (glibc has full Unicode simple mappings there). Created
// once; null when the C library lacks it (then only ASCII letters change case).
locale_t Utf8Locale() {
  static const locale_t loc = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return loc;
}

char32_t ToUpperCp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  locale_t l = Utf8Locale();
  return l ? static_cast<char32_t>(towupper_l(static_cast<wint_t>(c), l)) : c;
}
char32_t ToLowerCp(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  locale_t l = Utf8Locale();
  return l ? static_cast<char32_t>(towlower_l(static_cast<wint_t>(c), l)) : c;
}

// Upper-cases one code point into `out` with Python's one-to-many special cases.
void AppendUpper(char32_t c, std::u32string* out) {
  if (c == U'\u00DF') {  // ß
    *out += U"SS";
    return;
  }
  out->push_back(ToUpperCp(c));
}

void AppendLower(const std::u32string& s, size_t i, std::u32string* out) {
  const char32_t c = s[i];
  if (c == U'\u0130') {  // İ → i + combining dot above
    *out += U"i\u0307";
    return;
  }
  if (c == U'\u03A3') {
    // Final sigma: after a cased letter and not before one (Python's lower()).
    bool before = false, after = false;
    for (size_t k = i; k-- > 0;) {
      if (IsCased(s[k])) {
        before = true;
        break;
      }
      if (s[k] != U'\'' && s[k] != U'\u2019') break;
    }
    for (size_t k = i + 1; k < s.size(); ++k) {
      if (IsCased(s[k])) {
        after = true;
        break;
      }
      if (s[k] != U'\'' && s[k] != U'\u2019') break;
    }
    out->push_back(before && !after ? U'\u03C2' : U'\u03C3');
    return;
  }
  out->push_back(ToLowerCp(c));
}

// Title case of one code point (Unicode's titlecase equals uppercase for all but a few
// digraphs, which the C library maps to their titlecase forms through towupper anyway).
void AppendTitle(char32_t c, std::u32string* out) {
  if (c == U'\u00DF') {
    *out += U"Ss";
    return;
  }
  switch (c) {  // the Latin digraphs: upper/lower/title forms
    case U'\u01C4':
    case U'\u01C5':
    case U'\u01C6':
      out->push_back(U'\u01C5');
      return;
    case U'\u01C7':
    case U'\u01C8':
    case U'\u01C9':
      out->push_back(U'\u01C8');
      return;
    case U'\u01CA':
    case U'\u01CB':
    case U'\u01CC':
      out->push_back(U'\u01CB');
      return;
    case U'\u01F1':
    case U'\u01F2':
    case U'\u01F3':
      out->push_back(U'\u01F2');
      return;
    default:
      out->push_back(ToUpperCp(c));
  }
}

bool IsTitleCp(char32_t c) {
  return c == U'\u01C5' || c == U'\u01C8' || c == U'\u01CB' || c == U'\u01F2';
}

}  // namespace

// ---------------------------------------------------------------- UTF-8

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t n = Utf8SeqLen(s, i);
    const auto b = static_cast<unsigned char>(s[i]);
    char32_t cp = b;
    if (n > 1) {
      cp = b & (0xFF >> (n + 1));
      for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
    }
    out.push_back(cp);
    i += n;
  }
  return out;
}

void AppendUtf8(char32_t cp, std::string* out) {
  internal::AppendCodepoint(static_cast<uint32_t>(cp), out);
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

// ---------------------------------------------------------------- classes

bool IsPySpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsUpperCp(char32_t c) { return !IsTitleCp(c) && ToLowerCp(c) != c; }
bool IsLowerCp(char32_t c) {
  if (c == U'\u00DF') return true;
  return !IsTitleCp(c) && ToUpperCp(c) != c;
}
bool IsCased(char32_t c) { return IsUpperCp(c) || IsLowerCp(c) || IsTitleCp(c); }

bool IsDigitCp(char32_t c) {
  // ASCII and the decimal digit blocks scripts commonly use (Arabic-Indic, Devanagari,
  // fullwidth); the C library classifies other scripts' digits as letters.
  return (c >= U'0' && c <= U'9') || (c >= 0x660 && c <= 0x669) || (c >= 0x6F0 && c <= 0x6F9) ||
         (c >= 0x966 && c <= 0x96F) || (c >= 0xFF10 && c <= 0xFF19);
}

bool IsAlphaCp(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  locale_t l = Utf8Locale();
  return l != static_cast<locale_t>(0) && iswalpha_l(static_cast<wint_t>(c), l) != 0 &&
         !IsDigitCp(c);
}

bool IsWordCp(char32_t c) { return c == U'_' || IsAlphaCp(c) || IsDigitCp(c); }

// ---------------------------------------------------------------- case mapping

std::string PyUpper(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  out.reserve(u.size());
  for (char32_t c : u) AppendUpper(c, &out);
  return EncodeUtf8(out);
}

std::string PyLower(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  out.reserve(u.size());
  for (size_t i = 0; i < u.size(); ++i) AppendLower(u, i, &out);
  return EncodeUtf8(out);
}

std::string PyCasefold(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (u[i] == U'\u00DF') {
      out += U"ss";
    } else if (u[i] == U'\u03A3' || u[i] == U'\u03C2') {
      out.push_back(U'\u03C3');
    } else {
      AppendLower(u, i, &out);
    }
  }
  return EncodeUtf8(out);
}

std::string PySwapcase(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (IsUpperCp(u[i])) {
      AppendLower(u, i, &out);
    } else if (IsLowerCp(u[i])) {
      AppendUpper(u[i], &out);
    } else {
      out.push_back(u[i]);
    }
  }
  return EncodeUtf8(out);
}

std::string PyTitle(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  bool prev_cased = false;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    if (prev_cased) {
      AppendLower(u, i, &out);
    } else {
      AppendTitle(c, &out);
    }
    prev_cased = IsCased(c);
  }
  return EncodeUtf8(out);
}

std::string PyCapitalize(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  std::u32string out;
  for (size_t i = 0; i < u.size(); ++i) {
    if (i == 0) {
      AppendTitle(u[i], &out);
    } else {
      AppendLower(u, i, &out);
    }
  }
  return EncodeUtf8(out);
}

std::string JinjaTitle(std::string_view s) {
  const std::u32string u = DecodeUtf8(s);
  auto is_sep = [](char32_t c) {
    return IsPySpace(c) || c == U'-' || c == U'(' || c == U'{' || c == U'[' || c == U'<';
  };
  std::u32string out;
  size_t i = 0;
  while (i < u.size()) {
    // One item of re.split(r"([-\s({\[<]+)"): a run of separators or a word.
    const bool sep = is_sep(u[i]);
    size_t j = i;
    while (j < u.size() && is_sep(u[j]) == sep) ++j;
    const std::u32string item = u.substr(i, j - i);
    AppendUpper(item[0], &out);
    for (size_t k = 1; k < item.size(); ++k) AppendLower(item, k, &out);
    i = j;
  }
  return EncodeUtf8(out);
}

bool PyIsUpper(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (IsLowerCp(c) || IsTitleCp(c)) return false;
    cased = cased || IsUpperCp(c);
  }
  return cased;
}

bool PyIsLower(std::string_view s) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (IsUpperCp(c) || IsTitleCp(c)) return false;
    cased = cased || IsLowerCp(c);
  }
  return cased;
}

bool PyIsTitle(std::string_view s) {
  bool cased = false, prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    if (IsUpperCp(c) || IsTitleCp(c)) {
      if (prev_cased) return false;
      prev_cased = cased = true;
    } else if (IsLowerCp(c)) {
      if (!prev_cased) return false;
      prev_cased = cased = true;
    } else {
      prev_cased = false;
    }
  }
  return cased;
}

std::vector<std::string> PySplitLines(std::string_view s, bool keepends) {
  const std::u32string u = DecodeUtf8(s);
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < u.size(); ++i) {
    const char32_t c = u[i];
    const bool brk = c == U'\n' || c == U'\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D ||
                     c == 0x1E || c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) continue;
    size_t end = i + 1;
    if (c == U'\r' && i + 1 < u.size() && u[i + 1] == U'\n') end = i + 2;
    out.push_back(EncodeUtf8(u.substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < u.size()) out.push_back(EncodeUtf8(u.substr(start)));
  return out;
}

// ---------------------------------------------------------------- formatting

namespace {

struct Spec {
  char32_t fill = U' ';
  char align = 0;  // '<' '>' '^' '=' or 0 (type default)
  char sign = '-';
  bool alt = false;
  bool zero = false;
  int width = -1;
  char grouping = 0;  // ',' or '_'
  int precision = -1;
  char type = 0;
};

Result<Spec> ParseSpec(std::string_view spec) {
  Spec s;
  const std::u32string u = DecodeUtf8(spec);
  size_t i = 0;
  auto is_align = [](char32_t c) { return c == U'<' || c == U'>' || c == U'^' || c == U'='; };
  if (u.size() >= 2 && is_align(u[1])) {
    s.fill = u[0];
    s.align = static_cast<char>(u[1]);
    i = 2;
  } else if (!u.empty() && is_align(u[0])) {
    s.align = static_cast<char>(u[0]);
    i = 1;
  }
  if (i < u.size() && (u[i] == U'+' || u[i] == U'-' || u[i] == U' '))
    s.sign = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == U'#') {
    s.alt = true;
    ++i;
  }
  if (i < u.size() && u[i] == U'0') {
    s.zero = true;
    ++i;
  }
  auto read_int = [&](int* out) {
    int64_t v = 0;
    bool any = false;
    while (i < u.size() && u[i] >= U'0' && u[i] <= U'9') {
      v = v * 10 + (u[i] - U'0');
      if (v > (1 << 30)) v = 1 << 30;  // saturates; the output limit then refuses it
      ++i;
      any = true;
    }
    if (any) *out = static_cast<int>(v);
    return any;
  };
  read_int(&s.width);
  if (i < u.size() && (u[i] == U',' || u[i] == U'_')) s.grouping = static_cast<char>(u[i++]);
  if (i < u.size() && u[i] == U'.') {
    ++i;
    if (!read_int(&s.precision)) return InvalidArgumentError("Format specifier missing precision");
  }
  if (i < u.size()) s.type = static_cast<char>(u[i++]);
  if (i != u.size()) return InvalidArgumentError("Invalid format specifier");
  return s;
}

std::string Pad(const std::string& body, const Spec& s, char default_align, size_t sign_len) {
  const size_t len = Utf8Length(body);
  if (s.width < 0 || len >= static_cast<size_t>(s.width)) return body;
  const size_t pad = static_cast<size_t>(s.width) - len;
  std::string fill;
  AppendUtf8(s.fill, &fill);
  auto rep = [&](size_t n) {
    std::string r;
    for (size_t k = 0; k < n; ++k) r += fill;
    return r;
  };
  const char align = s.align ? s.align : default_align;
  switch (align) {
    case '<':
      return body + rep(pad);
    case '^':
      return rep(pad / 2) + body + rep(pad - pad / 2);
    case '=':
      return body.substr(0, sign_len) + rep(pad) + body.substr(sign_len);
    default:
      return rep(pad) + body;
  }
}

std::string Group(const std::string& digits, char sep, size_t every = 3) {
  if (sep == 0) return digits;
  std::string out;
  const size_t n = digits.size();
  for (size_t k = 0; k < n; ++k) {
    if (k > 0 && (n - k) % every == 0) out.push_back(sep);
    out.push_back(digits[k]);
  }
  return out;
}

Result<std::string> FormatInt(int64_t v, Spec s) {
  const bool neg = v < 0;
  const uint64_t mag = neg ? 0 - static_cast<uint64_t>(v) : static_cast<uint64_t>(v);
  std::string digits, prefix;
  char buf[80];
  switch (s.type) {
    case 0:
    case 'd':
    case 'n':
      std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(mag));
      digits = buf;
      break;
    case 'x':
    case 'X':
      std::snprintf(buf, sizeof(buf), s.type == 'x' ? "%llx" : "%llX",
                    static_cast<unsigned long long>(mag));
      digits = buf;
      if (s.alt) prefix = s.type == 'x' ? "0x" : "0X";
      break;
    case 'o':
      std::snprintf(buf, sizeof(buf), "%llo", static_cast<unsigned long long>(mag));
      digits = buf;
      if (s.alt) prefix = "0o";
      break;
    case 'b': {
      uint64_t m = mag;
      do {
        digits.insert(digits.begin(), static_cast<char>('0' + (m & 1)));
        m >>= 1;
      } while (m != 0);
      if (s.alt) prefix = "0b";
      break;
    }
    case 'c': {
      if (v < 0 || v > 0x10FFFF || (v >= 0xD800 && v < 0xE000)) {
        return InvalidArgumentError("%c arg not in range(0x110000)");
      }
      std::string out;
      AppendUtf8(static_cast<char32_t>(v), &out);
      return Pad(out, s, '<', 0);
    }
    default:
      return InvalidArgumentError(std::string("Unknown format code '") + s.type +
                                  "' for object of type 'int'");
  }
  digits = Group(digits, s.grouping,
                 (s.type == 'x' || s.type == 'X' || s.type == 'o' || s.type == 'b') ? 4 : 3);
  const std::string sign = neg ? "-" : (s.sign == '+' ? "+" : (s.sign == ' ' ? " " : ""));
  if (s.zero && s.align == 0) {
    s.fill = U'0';
    s.align = '=';
  }
  return Pad(sign + prefix + digits, s, '>', sign.size() + prefix.size());
}

Result<std::string> FormatFloat(double f, Spec s) {
  std::string body;
  const bool neg = std::signbit(f) && !std::isnan(f);
  const double mag = std::fabs(f);
  char type = s.type;
  int prec = s.precision;
  bool percent = false;
  if (type == '%') {
    percent = true;
    type = 'f';
  }
  if (type == 0 && prec < 0) {
    body = FloatRepr(mag);
  } else {
    if (type == 0 || type == 'n') type = 'g';
    if (prec < 0) prec = 6;
    const char fmt[] = {'%', '.', '*', type, 0};
    if (std::isinf(mag) || std::isnan(mag)) {
      body = std::isnan(mag) ? "nan" : "inf";
      if (std::isupper(static_cast<unsigned char>(type))) body = body == "nan" ? "NAN" : "INF";
    } else {
      std::vector<char> buf(static_cast<size_t>(prec) + 400);
      std::snprintf(buf.data(), buf.size(), fmt, prec, percent ? mag * 100 : mag);
      body = buf.data();
      // Python's default (no type) keeps a ".0" on whole numbers in fixed notation.
      if (s.type == 0 && body.find_first_of(".en") == std::string::npos) body += ".0";
    }
  }
  if (s.grouping) {
    const size_t dot = body.find_first_of(".eE");
    const std::string int_part = body.substr(0, dot);
    body = Group(int_part, s.grouping) + (dot == std::string::npos ? "" : body.substr(dot));
  }
  if (percent) body += "%";
  const std::string sign = neg ? "-" : (s.sign == '+' ? "+" : (s.sign == ' ' ? " " : ""));
  if (s.zero && s.align == 0) {
    s.fill = U'0';
    s.align = '=';
  }
  return Pad(sign + body, s, '>', sign.size());
}

// format(v, spec) for the value kinds templates meet.
Result<std::string> FormatValue(const Value& v, std::string_view spec_text, size_t limit) {
  if (spec_text.empty()) {
    std::string out;
    CHORUS_RETURN_IF_ERROR(AppendStr(v, &out, limit));
    return out;
  }
  CHORUS_ASSIGN_OR_RETURN(Spec s, ParseSpec(spec_text));
  if (s.width > 0 && static_cast<size_t>(s.width) > limit) {
    return ResourceExhaustedError("chat template format width exceeds the output limit");
  }
  // A number's precision is digits to print (a string's only truncates).
  if (!v.is_string() && s.precision > 0 && static_cast<size_t>(s.precision) > limit) {
    return ResourceExhaustedError("chat template format precision exceeds the output limit");
  }
  if (v.is_string()) {
    if (s.type != 0 && s.type != 's') {
      return InvalidArgumentError(std::string("Unknown format code '") + s.type +
                                  "' for object of type 'str'");
    }
    std::string body = v.str();
    if (s.precision >= 0) {
      const auto offs = Utf8Offsets(body);
      if (static_cast<size_t>(s.precision) + 1 < offs.size()) {
        body = body.substr(0, offs[static_cast<size_t>(s.precision)]);
      }
    }
    return Pad(body, s, '<', 0);
  }
  if (v.is_int() || v.is_bool()) {
    if (s.type == 'e' || s.type == 'E' || s.type == 'f' || s.type == 'F' || s.type == 'g' ||
        s.type == 'G' || s.type == '%') {
      return FormatFloat(static_cast<double>(v.int_value()), s);
    }
    if (s.precision >= 0) {
      return InvalidArgumentError("Precision not allowed in integer format specifier");
    }
    return FormatInt(v.int_value(), s);
  }
  if (v.is_float()) {
    if (s.type != 0 && std::string_view("eEfFgGn%").find(s.type) == std::string_view::npos) {
      return InvalidArgumentError(std::string("Unknown format code '") + s.type +
                                  "' for object of type 'float'");
    }
    return FormatFloat(v.float_value(), s);
  }
  return InvalidArgumentError("unsupported format string passed to " + std::string(v.TypeName()) +
                              ".__format__");
}

// Looks up `.attr` / `[key]` parts of a format field on `v` (the sandbox's getattr/getitem:
// a mapping's item, a sequence's index).
Result<Value> FieldPart(const Value& v, const std::string& key, bool is_index) {
  if (v.is_mapping()) {
    if (const Value* f = v.dict().Find(key)) return *f;
  } else if (v.is_list() && is_index && !key.empty() &&
             key.find_first_not_of("0123456789") == std::string::npos && key.size() < 10) {
    const size_t k = static_cast<size_t>(std::stoul(key));
    if (k < v.list().size()) return v.list()[k];
    return InvalidArgumentError("list index out of range");
  }
  if (is_index) return InvalidArgumentError("'" + key + "'");
  return InvalidArgumentError("'" + std::string(v.TypeName()) + "' object has no attribute '" +
                              key + "'");
}

}  // namespace

Result<std::string> PyFormat(std::string_view fmt, const CallArgs& args, size_t limit) {
  std::string out;
  size_t auto_index = 0;
  bool used_auto = false, used_manual = false;
  for (size_t i = 0; i < fmt.size();) {
    const char c = fmt[i];
    if (c == '}') {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') {
        out.push_back('}');
        i += 2;
        continue;
      }
      return InvalidArgumentError("Single '}' encountered in format string");
    }
    if (c != '{') {
      out.push_back(c);
      ++i;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out.push_back('{');
      i += 2;
      continue;
    }
    // A replacement field up to the matching '}' (nested fields in the spec are not allowed).
    const size_t close = fmt.find('}', i + 1);
    if (close == std::string_view::npos) {
      return InvalidArgumentError("expected '}' before end of string");
    }
    std::string_view field = fmt.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string_view::npos) {
      return InvalidArgumentError("nested replacement fields are not supported");
    }
    i = close + 1;
    std::string_view spec;
    char conversion = 0;
    if (size_t colon = field.find(':'); colon != std::string_view::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    if (size_t bang = field.find('!'); bang != std::string_view::npos) {
      if (bang + 2 != field.size()) {
        return InvalidArgumentError("expected ':' after conversion specifier");
      }
      conversion = field[bang + 1];
      if (conversion != 'r' && conversion != 's' && conversion != 'a') {
        return InvalidArgumentError(std::string("Unknown conversion specifier ") + conversion);
      }
      field = field.substr(0, bang);
    }
    size_t name_end = field.find_first_of(".[");
    const std::string first(field.substr(0, name_end));
    Value v;
    if (first.empty() || first.find_first_not_of("0123456789") == std::string::npos) {
      size_t idx;
      if (first.empty()) {
        if (used_manual) {
          return InvalidArgumentError(
              "cannot switch from manual field specification to automatic field numbering");
        }
        used_auto = true;
        idx = auto_index++;
      } else {
        if (used_auto) {
          return InvalidArgumentError(
              "cannot switch from automatic field numbering to manual field specification");
        }
        used_manual = true;
        idx = first.size() > 9 ? args.pos.size() : static_cast<size_t>(std::stoul(first));
      }
      if (idx >= args.pos.size()) {
        return InvalidArgumentError("Replacement index " + std::to_string(idx) +
                                    " out of range for positional args tuple");
      }
      v = args.pos[idx];
    } else {
      const Value* kv = args.Kw(first);
      if (kv == nullptr) return InvalidArgumentError("'" + first + "'");
      v = *kv;
    }
    // .attr and [key] parts.
    while (name_end != std::string_view::npos && name_end < field.size()) {
      if (field[name_end] == '.') {
        const size_t next = field.find_first_of(".[", name_end + 1);
        const std::string key(field.substr(name_end + 1, next == std::string_view::npos
                                                             ? std::string_view::npos
                                                             : next - name_end - 1));
        if (key.empty()) return InvalidArgumentError("Empty attribute in format string");
        CHORUS_ASSIGN_OR_RETURN(v, FieldPart(v, key, false));
        name_end = next;
      } else {
        const size_t rb = field.find(']', name_end);
        if (rb == std::string_view::npos)
          return InvalidArgumentError("Missing ']' in format string");
        const std::string key(field.substr(name_end + 1, rb - name_end - 1));
        CHORUS_ASSIGN_OR_RETURN(v, FieldPart(v, key, true));
        name_end = rb + 1;
        if (name_end < field.size() && field[name_end] != '.' && field[name_end] != '[') {
          return InvalidArgumentError("Only '.' or '[' may follow ']' in format field specifier");
        }
      }
    }
    if (conversion == 'r' || conversion == 'a') {
      std::string r;
      CHORUS_RETURN_IF_ERROR(AppendRepr(v, &r, limit));
      v = Value::Str(std::move(r));
    } else if (conversion == 's') {
      std::string r;
      CHORUS_RETURN_IF_ERROR(AppendStr(v, &r, limit));
      v = Value::Str(std::move(r));
    }
    CHORUS_ASSIGN_OR_RETURN(std::string piece, FormatValue(v, spec, limit));
    out += piece;
    if (out.size() > limit) {
      return ResourceExhaustedError("chat template built a string longer than " +
                                    std::to_string(limit) + " bytes");
    }
  }
  return out;
}

Result<std::string> PyPercent(std::string_view fmt, const Value& arg, size_t limit) {
  std::vector<Value> items;
  const bool is_tuple = arg.is_tuple();
  if (is_tuple) {
    items = arg.list();
  } else {
    items.push_back(arg);
  }
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  for (size_t i = 0; i < fmt.size();) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i++]);
      continue;
    }
    ++i;
    if (i >= fmt.size()) return InvalidArgumentError("incomplete format");
    Value v;
    bool have_value = false;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string_view::npos) return InvalidArgumentError("incomplete format key");
      const std::string key(fmt.substr(i + 1, close - i - 1));
      if (!arg.is_mapping()) return InvalidArgumentError("format requires a mapping");
      const Value* f = arg.dict().Find(key);
      if (f == nullptr) return InvalidArgumentError("'" + key + "'");
      v = *f;
      have_value = true;
      used_mapping = true;
      i = close + 1;
    }
    Spec s;
    s.align = '>';
    bool left = false;
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos) {
      if (fmt[i] == '-') left = true;
      if (fmt[i] == '+') s.sign = '+';
      if (fmt[i] == ' ' && s.sign != '+') s.sign = ' ';
      if (fmt[i] == '#') s.alt = true;
      if (fmt[i] == '0') s.zero = true;
      ++i;
    }
    auto take_value = [&]() -> Result<Value> {
      if (next >= items.size())
        return InvalidArgumentError("not enough arguments for format string");
      return items[next++];
    };
    auto read_num = [&](int* out_n) -> Status {
      if (i < fmt.size() && fmt[i] == '*') {
        ++i;
        CHORUS_ASSIGN_OR_RETURN(Value w, take_value());
        if (!w.is_int()) return InvalidArgumentError("* wants int");
        *out_n = static_cast<int>(std::clamp<int64_t>(w.int_value(), -(1 << 30), 1 << 30));
        return OkStatus();
      }
      int64_t n = -1;
      while (i < fmt.size() && fmt[i] >= '0' && fmt[i] <= '9') {
        n = (n < 0 ? 0 : n) * 10 + (fmt[i] - '0');
        if (n > (1 << 30)) n = 1 << 30;  // saturates; the output limit then refuses it
        ++i;
      }
      if (n >= 0) *out_n = static_cast<int>(n);
      return OkStatus();
    };
    CHORUS_RETURN_IF_ERROR(read_num(&s.width));
    if (s.width < -1) {
      left = true;
      s.width = -s.width;
    }
    if (i < fmt.size() && fmt[i] == '.') {
      ++i;
      s.precision = 0;
      CHORUS_RETURN_IF_ERROR(read_num(&s.precision));
    }
    while (i < fmt.size() && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) ++i;
    if (i >= fmt.size()) return InvalidArgumentError("incomplete format");
    const char type = fmt[i++];
    if (type == '%') {
      out.push_back('%');
      continue;
    }
    if ((s.width > 0 && static_cast<size_t>(s.width) > limit) ||
        (s.precision > 0 && static_cast<size_t>(s.precision) > limit && type != 's' &&
         type != 'r' && type != 'a')) {
      return ResourceExhaustedError("chat template format width exceeds the output limit");
    }
    if (!have_value) {
      if (arg.is_mapping() && !is_tuple) {
        v = arg;  // '%s' % {'a': 1} formats the dict itself
        next = items.size();
      } else {
        CHORUS_ASSIGN_OR_RETURN(v, take_value());
      }
    }
    if (left) s.align = '<';
    std::string piece;
    switch (type) {
      case 's':
      case 'r':
      case 'a': {
        std::string r;
        if (type == 's') {
          CHORUS_RETURN_IF_ERROR(AppendStr(v, &r, limit));
        } else {
          CHORUS_RETURN_IF_ERROR(AppendRepr(v, &r, limit));
        }
        if (s.precision >= 0) {
          const auto offs = Utf8Offsets(r);
          if (static_cast<size_t>(s.precision) + 1 < offs.size()) {
            r = r.substr(0, offs[static_cast<size_t>(s.precision)]);
          }
        }
        Spec ps = s;
        ps.zero = false;
        piece = Pad(r, ps, '>', 0);
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        int64_t n;
        if (v.is_int() || v.is_bool()) {
          n = v.int_value();
        } else if (v.is_float() && std::isfinite(v.float_value()) &&
                   std::fabs(v.float_value()) < 9.2e18 && type != 'x' && type != 'X' &&
                   type != 'o') {
          n = static_cast<int64_t>(v.float_value());
        } else {
          return InvalidArgumentError(std::string("%") + type +
                                      " format: a real number is required, not " +
                                      std::string(v.TypeName()));
        }
        Spec is = s;
        is.type = (type == 'i' || type == 'u') ? 'd' : type;
        is.precision = -1;
        if (s.zero && !left) {
          is.fill = U'0';
          is.align = '=';
        }
        CHORUS_ASSIGN_OR_RETURN(piece, FormatInt(n, is));
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G': {
        if (!v.is_number() && !v.is_bool()) {
          return InvalidArgumentError(std::string("must be real number, not ") +
                                      std::string(v.TypeName()));
        }
        Spec fs = s;
        fs.type = type;
        if (fs.precision < 0) fs.precision = 6;
        if (s.zero && !left) {
          fs.fill = U'0';
          fs.align = '=';
        }
        fs.zero = false;
        CHORUS_ASSIGN_OR_RETURN(piece, FormatFloat(v.AsDouble(), fs));
        break;
      }
      case 'c': {
        if (v.is_string() && Utf8Length(v.str()) == 1) {
          piece = v.str();
        } else if (v.is_int()) {
          const int64_t cp = v.int_value();
          if (cp < 0 || cp > 0x10FFFF || (cp >= 0xD800 && cp < 0xE000)) {
            return InvalidArgumentError("%c arg not in range(0x110000)");
          }
          AppendUtf8(static_cast<char32_t>(cp), &piece);
        } else {
          return InvalidArgumentError("%c requires int or char");
        }
        Spec ps = s;
        ps.zero = false;
        piece = Pad(piece, ps, '>', 0);
        break;
      }
      default:
        return InvalidArgumentError(std::string("unsupported format character '") + type + "'");
    }
    out += piece;
    if (out.size() > limit) {
      return ResourceExhaustedError("chat template built a string longer than " +
                                    std::to_string(limit) + " bytes");
    }
  }
  // Python treats any subscriptable non-tuple argument (a list or dict) as a mapping here,
  // so only a tuple or a scalar can have arguments left over.
  const bool mapping_like = !is_tuple && (arg.is_list() || arg.is_mapping());
  if (!used_mapping && next < items.size() && !mapping_like) {
    return InvalidArgumentError("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace chorus::tokenizer::jinja

// Internal to chat templates (chat_template.h): Python `str` semantics the Jinja interpreter
// needs — Unicode case mapping, whitespace and line splitting, `str.format` and printf-style
// `%` formatting.
//
// Case mapping uses the C library's Unicode tables (the C.UTF-8 locale's towupper/towlower),
// which are Unicode's simple mappings; Python's few one-to-many mappings that templates can
// meet (ß → SS, İ → i̇) and the final-sigma rule of lower() are applied on top.
//
// Thread-safety: all functions are pure.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/tokenizer/jinja_value.h"

namespace chorus::tokenizer::jinja {

// UTF-8 <-> code points (an invalid byte decodes to itself, as one code point).
std::u32string DecodeUtf8(std::string_view s);
std::string EncodeUtf8(std::u32string_view s);
void AppendUtf8(char32_t cp, std::string* out);

// Python's str.isspace() for one code point.
bool IsPySpace(char32_t c);
// Whether a code point has case (upper or lower case letter).
bool IsCased(char32_t c);
bool IsUpperCp(char32_t c);
bool IsLowerCp(char32_t c);
// str.isdigit() / isalpha() for one code point; IsWordCp: regex \w (letters, digits, '_').
bool IsDigitCp(char32_t c);
bool IsAlphaCp(char32_t c);
bool IsWordCp(char32_t c);

std::string PyUpper(std::string_view s);
std::string PyLower(std::string_view s);
std::string PyCasefold(std::string_view s);
std::string PySwapcase(std::string_view s);
std::string PyTitle(std::string_view s);       // str.title()
std::string PyCapitalize(std::string_view s);  // str.capitalize()
// Jinja's `title` filter: words start after whitespace and any of "-({[<".
std::string JinjaTitle(std::string_view s);
// str.isupper() / islower() / istitle() / isalpha() / isalnum() / isdigit()-like predicates.
bool PyIsUpper(std::string_view s);
bool PyIsLower(std::string_view s);
bool PyIsTitle(std::string_view s);

// str.splitlines(keepends).
std::vector<std::string> PySplitLines(std::string_view s, bool keepends);

// str.format(*pos, **kw) as Jinja's sandboxed formatter runs it (fields `{}`, `{0}`,
// `{name}`, `{0.attr}`, `{0[key]}`, conversions !s !r, and the format-spec mini-language for
// strings, integers and floats).
Result<std::string> PyFormat(std::string_view fmt, const CallArgs& args, size_t limit);

// fmt % arg (printf-style): `arg` is a tuple of values, a dict for %(name)s, or one value.
Result<std::string> PyPercent(std::string_view fmt, const Value& arg, size_t limit);

}  // namespace chorus::tokenizer::jinja

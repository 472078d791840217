#include "chorus/tokenizer/utf8.h"

#include <array>

namespace chorus::tokenizer::internal {
namespace {

// Valid range of the second byte after lead byte `b` (Unicode Table 3-7); the third and fourth
// bytes are always 80..BF.
inline bool SecondByteOk(uint8_t lead, uint8_t b) {
  switch (lead) {
    case 0xE0:
      return b >= 0xA0 && b <= 0xBF;
    case 0xED:
      return b >= 0x80 && b <= 0x9F;
    case 0xF0:
      return b >= 0x90 && b <= 0xBF;
    case 0xF4:
      return b >= 0x80 && b <= 0x8F;
    default:
      return b >= 0x80 && b <= 0xBF;
  }
}

inline bool IsCont(uint8_t b) { return b >= 0x80 && b <= 0xBF; }

// Length of the maximal prefix of a (possibly ill-formed) sequence at s that is consistent
// with a well-formed sequence: this is what one U+FFFD replaces.
size_t MaximalSubpart(std::string_view s) {
  const uint8_t lead = static_cast<uint8_t>(s[0]);
  const size_t need = Utf8SeqLen(lead);
  if (need == 1) return 1;
  size_t i = 1;
  if (i < s.size() && SecondByteOk(lead, static_cast<uint8_t>(s[i]))) {
    ++i;
    while (i < need && i < s.size() && IsCont(static_cast<uint8_t>(s[i]))) ++i;
  }
  return i;
}

struct ByteTables {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int, 324> cp_to_byte{};  // alphabet code points are all < 324
  ByteTables() {
    cp_to_byte.fill(-1);
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      byte_to_cp[b] = printable ? static_cast<uint32_t>(b) : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = b;
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables t;
  return t;
}

// Decodes the code point at s[*i] (well-formed or not: an ill-formed byte decodes as itself with
// cp = 0xFFFFFFFF) and advances *i.
uint32_t NextCodepoint(std::string_view s, size_t* i) {
  const size_t n = ValidUtf8CharLen(s.substr(*i));
  if (n == 0) {
    ++*i;
    return 0xFFFFFFFFu;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + *i);
  uint32_t cp;
  switch (n) {
    case 1:
      cp = p[0];
      break;
    case 2:
      cp = ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
      break;
    case 3:
      cp = ((p[0] & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
      break;
    default:
      cp = ((p[0] & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  }
  *i += n;
  return cp;
}

}  // namespace

size_t ValidUtf8CharLen(std::string_view s) {
  if (s.empty()) return 0;
  const uint8_t lead = static_cast<uint8_t>(s[0]);
  if (lead < 0x80) return 1;
  const size_t need = Utf8SeqLen(lead);
  if (need == 1 || s.size() < need) return 0;
  if (!SecondByteOk(lead, static_cast<uint8_t>(s[1]))) return 0;
  for (size_t i = 2; i < need; ++i) {
    if (!IsCont(static_cast<uint8_t>(s[i]))) return 0;
  }
  return need;
}

size_t IncompleteUtf8PrefixLen(std::string_view s) {
  if (s.empty()) return 0;
  const uint8_t lead = static_cast<uint8_t>(s[0]);
  const size_t need = Utf8SeqLen(lead);
  if (need == 1 || s.size() >= need) return 0;
  const size_t sub = MaximalSubpart(s);
  // Incomplete only if every byte present is consistent and the input simply ended.
  return sub == s.size() ? sub : 0;
}

void AppendSanitizedUtf8(std::string_view s, std::string* out) {
  size_t i = 0;
  while (i < s.size()) {
    const size_t n = ValidUtf8CharLen(s.substr(i));
    if (n > 0) {
      out->append(s.data() + i, n);
      i += n;
    } else {
      out->append("\xEF\xBF\xBD");
      i += MaximalSubpart(s.substr(i));
    }
  }
}

std::string SanitizeUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  AppendSanitizedUtf8(s, &out);
  return out;
}

void AppendCodepoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t CountUtf8Chars(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    const size_t len = ValidUtf8CharLen(s.substr(i));
    i += len == 0 ? 1 : len;
  }
  return n;
}

uint32_t ByteToUnicode(uint8_t b) { return Tables().byte_to_cp[b]; }

int UnicodeToByte(uint32_t cp) { return cp < 324 ? Tables().cp_to_byte[cp] : -1; }

std::string ByteLevelDecode(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  size_t i = 0;
  while (i < piece.size()) {
    const size_t start = i;
    const uint32_t cp = NextCodepoint(piece, &i);
    const int b = cp == 0xFFFFFFFFu ? -1 : UnicodeToByte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(piece.substr(start, i - start));
    }
  }
  return out;
}

std::string ByteLevelEncode(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) AppendCodepoint(ByteToUnicode(static_cast<uint8_t>(c)), &out);
  return out;
}

int ParseBytePiece(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

}  // namespace chorus::tokenizer::internal

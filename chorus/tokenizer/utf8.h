// UTF-8 helpers shared by the tokenizers and the streaming detokenizer, and the GPT-2
// byte-level alphabet (each byte 0..255 <-> one printable code point).
//
// Thread-safety: free functions over their arguments; the byte-level tables are immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace chorus::tokenizer::internal {

// Length of the UTF-8 sequence announced by lead byte `b` (1 for ASCII and for bytes that
// cannot start a sequence: those are treated as one-byte "characters" by the tokenizers).
inline size_t Utf8SeqLen(uint8_t b) {
  if (b < 0x80) return 1;
  if (b >= 0xC2 && b <= 0xDF) return 2;
  if (b >= 0xE0 && b <= 0xEF) return 3;
  if (b >= 0xF0 && b <= 0xF4) return 4;
  return 1;
}

// Number of bytes of the well-formed code point starting at s[0] (1..4), or 0 when the bytes at
// s are not a complete well-formed sequence (invalid, or truncated by the end of `s`).
size_t ValidUtf8CharLen(std::string_view s);

// Length of the longest prefix of `s` that is a valid-but-incomplete UTF-8 sequence start
// (0 when s[0] can never start a sequence or the bytes already form an invalid sequence). Only
// meaningful when ValidUtf8CharLen(s) == 0.
size_t IncompleteUtf8PrefixLen(std::string_view s);

// Appends `s` to `out` with every maximal ill-formed subsequence replaced by U+FFFD (the Unicode
// "maximal subpart" practice, as Python's errors="replace" and Rust's from_utf8_lossy).
void AppendSanitizedUtf8(std::string_view s, std::string* out);
std::string SanitizeUtf8(std::string_view s);

// Encodes code point `cp` (must be <= 0x10FFFF) as UTF-8.
void AppendCodepoint(uint32_t cp, std::string* out);

// Number of UTF-8 characters (a byte that starts no valid sequence counts as one).
size_t CountUtf8Chars(std::string_view s);

// GPT-2 bytes_to_unicode(): the code point that stands for byte `b` in byte-level vocabularies.
uint32_t ByteToUnicode(uint8_t b);
// Inverse: the byte a code point stands for, or -1 if it is not in the byte-level alphabet.
int UnicodeToByte(uint32_t cp);
// Decodes a byte-level piece ("Ġhello") to its bytes (" hello"). Code points outside the
// alphabet are copied as their own UTF-8 (as HF's ByteLevel decoder does).
std::string ByteLevelDecode(std::string_view piece);
// Encodes raw bytes into the byte-level alphabet.
std::string ByteLevelEncode(std::string_view bytes);

// Parses a byte-fallback piece "<0xAB>" (exactly 6 chars, upper- or lower-case hex) to its
// byte, or -1.
int ParseBytePiece(std::string_view piece);

}  // namespace chorus::tokenizer::internal

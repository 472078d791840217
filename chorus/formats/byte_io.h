// Little-endian byte cursor and checked integer arithmetic shared by the format readers and
// writers. Every read is bounds-checked against the buffer; nothing here allocates.
//
// Thread-safety: ByteReader is a cursor over borrowed bytes (one user at a time); the
// functions are pure.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <type_traits>

namespace chorus::formats::internal {

// a * b, or false on overflow.
inline bool CheckedMul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
inline bool CheckedAdd(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}

// Rounds `x` up to a multiple of `align` (a power of two); false on overflow.
inline bool AlignUp(uint64_t x, uint64_t align, uint64_t* out) {
  uint64_t t;
  if (!CheckedAdd(x, align - 1, &t)) return false;
  *out = t & ~(align - 1);
  return true;
}

// Reads little-endian values from [data, data + size). Each Read* returns false (and leaves the
// cursor unchanged) when fewer bytes remain than it needs.
class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }

  template <typename T>
  bool Read(T* out) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (remaining() < sizeof(T)) return false;
    std::memcpy(out, data_ + pos_, sizeof(T));  // host is little-endian (x86-64, aarch64)
    pos_ += sizeof(T);
    return true;
  }
  // A view of the next `n` bytes.
  bool ReadBytes(uint64_t n, std::string_view* out) {
    if (n > remaining()) return false;
    *out = std::string_view(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return true;
  }
  bool Skip(uint64_t n) {
    if (n > remaining()) return false;
    pos_ += static_cast<size_t>(n);
    return true;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

// Appends little-endian values to a string.
class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}
  template <typename T>
  void Write(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_->append(b, sizeof(T));
  }
  void WriteBytes(std::string_view s) { out_->append(s.data(), s.size()); }
  void PadTo(uint64_t align, char fill = '\0') {
    while (out_->size() % align != 0) out_->push_back(fill);
  }
  size_t size() const { return out_->size(); }

 private:
  std::string* out_;
};

// A printable, length-limited rendering of untrusted text for error messages.
inline std::string Printable(std::string_view s, size_t max_len = 64) {
  std::string r;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      r.push_back(static_cast<char>(c));
    } else {
      static const char kHex[] = "0123456789abcdef";
      r += "\\x";
      r.push_back(kHex[c >> 4]);
      r.push_back(kHex[c & 15]);
    }
  }
  if (s.size() > max_len) r += "...";
  return r;
}

}  // namespace chorus::formats::internal

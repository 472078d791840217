// Tokenizer base-class helpers, the streaming detokenizer and decode post-processing.
#include "chorus/tokenizer/tokenizer.h"

#include <algorithm>

#include "chorus/tokenizer/utf8.h"

namespace chorus::tokenizer {

bool Tokenizer::IsEos(int32_t id) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return std::binary_search(special_ids_.begin(), special_ids_.end(), id);
}

void Tokenizer::set_special_ids(std::vector<int32_t> ids) {
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  special_ids_ = std::move(ids);
}

std::string Tokenizer::Decode(std::span<const int32_t> ids, bool include_special) const {
  std::string raw;
  int32_t prev = -1;
  for (int32_t id : ids) {
    raw += TokenBytes(prev, id, include_special);
    prev = id;
  }
  return internal::SanitizeUtf8(raw);
}

std::string StreamingDetokenizer::Push(int32_t id) {
  pending_ += tok_->TokenBytes(prev_, id, include_special_);
  prev_ = id;
  // Hold back a trailing incomplete-but-still-valid sequence (at most 3 bytes, starting at a
  // lead byte). Everything before it is final: a lead byte always starts a new sequence, so
  // sanitizing the prefix on its own gives the same text as sanitizing the whole later.
  size_t hold = 0;
  for (size_t k = 1; k <= 3 && k <= pending_.size(); ++k) {
    const std::string_view tail = std::string_view(pending_).substr(pending_.size() - k);
    const auto lead = static_cast<uint8_t>(tail[0]);
    if (lead >= 0x80 && lead < 0xC0) continue;  // a continuation byte: look further back
    if (internal::IncompleteUtf8PrefixLen(tail) == k) hold = k;
    break;
  }
  std::string out;
  internal::AppendSanitizedUtf8(std::string_view(pending_).substr(0, pending_.size() - hold), &out);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out = internal::SanitizeUtf8(pending_);
  pending_.clear();
  return out;
}

std::string CleanUpTokenizationSpaces(std::string_view text) {
  static constexpr std::pair<std::string_view, std::string_view> kRules[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"},
  };
  std::string s(text);
  for (const auto& [from, to] : kRules) {
    std::string out;
    out.reserve(s.size());
    size_t i = 0;
    while (true) {
      const size_t j = s.find(from, i);
      if (j == std::string::npos) {
        out.append(s, i, std::string::npos);
        break;
      }
      out.append(s, i, j - i);
      out.append(to);
      i = j + from.size();
    }
    s = std::move(out);
  }
  return s;
}

}  // namespace chorus::tokenizer

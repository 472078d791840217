#include "chorus/tokenizer/added_tokens.h"

#include <algorithm>
#include <unordered_set>

namespace chorus::tokenizer::internal {
namespace {

bool IsSpaceByte(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

}  // namespace

void AddedTokenMatcher::Build(std::vector<AddedToken> tokens) {
  tokens_.clear();
  for (auto& b : by_first_byte_) b.clear();
  std::unordered_set<std::string> seen;
  for (auto& t : tokens) {
    if (t.content.empty() || t.id < 0 || !seen.insert(t.content).second) continue;
    tokens_.push_back(std::move(t));
  }
  for (uint32_t i = 0; i < tokens_.size(); ++i) {
    by_first_byte_[static_cast<uint8_t>(tokens_[i].content[0])].push_back(i);
  }
  for (auto& b : by_first_byte_) {
    std::stable_sort(b.begin(), b.end(), [&](uint32_t x, uint32_t y) {
      return tokens_[x].content.size() > tokens_[y].content.size();
    });
  }
}

std::vector<Segment> AddedTokenMatcher::Split(std::string_view text, bool parse_special) const {
  std::vector<Segment> out;
  size_t text_start = 0;  // start of the pending raw-text run
  size_t i = 0;
  auto flush_text = [&](size_t end) {
    if (end > text_start) {
      out.push_back(Segment{text.substr(text_start, end - text_start), -1, text_start});
    }
  };
  while (i < text.size()) {
    const auto& bucket = by_first_byte_[static_cast<uint8_t>(text[i])];
    const AddedToken* match = nullptr;
    for (uint32_t idx : bucket) {
      const AddedToken& t = tokens_[idx];
      if (t.special && !parse_special) continue;
      if (text.compare(i, t.content.size(), t.content) == 0) {
        match = &t;  // bucket is longest first
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    size_t left_end = i;
    if (match->lstrip) {
      while (left_end > text_start && IsSpaceByte(text[left_end - 1])) --left_end;
    }
    flush_text(left_end);
    out.push_back(Segment{text.substr(i, match->content.size()), match->id, i});
    i += match->content.size();
    if (match->rstrip) {
      while (i < text.size() && IsSpaceByte(text[i])) ++i;
    }
    text_start = i;
  }
  flush_text(text.size());
  return out;
}

}  // namespace chorus::tokenizer::internal

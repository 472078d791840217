#include "chorus/engine/stop_checker.h"

#include <algorithm>

namespace chorus::engine {

StopChecker::StopChecker(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const auto& s : stops_) max_stop_ = std::max(max_stop_, s.size());
}

StopChecker::Output StopChecker::Push(std::string_view text) {
  Output out;
  if (stopped_) return out;
  held_.append(text);
  if (stops_.empty()) {
    out.text.swap(held_);
    return out;
  }
  // Earliest match of any stop string.
  size_t best = std::string::npos;
  for (const auto& s : stops_) best = std::min(best, held_.find(s));
  if (best != std::string::npos) {
    out.text = held_.substr(0, best);
    out.stopped = stopped_ = true;
    held_.clear();
    return out;
  }
  // Keep the last max_stop_-1 bytes: they may be the start of a stop string.
  size_t keep = std::min(held_.size(), max_stop_ - 1);
  size_t cut = held_.size() - keep;
  // Never split a UTF-8 character: move the cut back over continuation bytes.
  while (cut > 0 && cut < held_.size() && (static_cast<unsigned char>(held_[cut]) & 0xC0) == 0x80)
    --cut;
  out.text = held_.substr(0, cut);
  held_.erase(0, cut);
  return out;
}

std::string StopChecker::Flush() {
  std::string s;
  if (!stopped_) s.swap(held_);
  return s;
}

}  // namespace chorus::engine

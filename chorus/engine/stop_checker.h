// StopChecker: applies OpenAI `stop` strings to streamed text. Text that could still turn
// into a stop string is held back, so a client never sees part of a stop sequence; the
// held-back cut is always at a UTF-8 character boundary.
//
// Thread-safety: one per sequence; not thread-safe.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace chorus::engine {

class StopChecker {
 public:
  explicit StopChecker(std::vector<std::string> stops);

  struct Output {
    std::string text;      // safe to emit now
    bool stopped = false;  // a stop string matched; `text` ends just before it
  };
  // Appends newly decoded text.
  Output Push(std::string_view text);
  // End of generation: everything still held back.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  size_t max_stop_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace chorus::engine

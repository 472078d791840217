// CHORUS_LOG(INFO) << "req=" << id << " ..."; — line-oriented logging to stderr.
// Never used inside kernels or a step's hot loop.
//
// Thread-safety: each line is written with one call, so lines from threads never interleave.
#pragma once

#include <sstream>

namespace chorus {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Lines below this level are dropped. Default kInfo. Set from apps/ only (flags/env).
void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();

namespace internal {
class LogLine {
 public:
  LogLine(LogLevel level, const char* file, int line);
  ~LogLine();
  template <typename T>
  LogLine& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};
}  // namespace internal
}  // namespace chorus

#define CHORUS_LOG_LEVEL_DEBUG ::chorus::LogLevel::kDebug
#define CHORUS_LOG_LEVEL_INFO ::chorus::LogLevel::kInfo
#define CHORUS_LOG_LEVEL_WARNING ::chorus::LogLevel::kWarning
#define CHORUS_LOG_LEVEL_ERROR ::chorus::LogLevel::kError
#define CHORUS_LOG(level)                                   \
  if (CHORUS_LOG_LEVEL_##level < ::chorus::MinLogLevel()) { \
  } else                                                    \
    ::chorus::internal::LogLine(CHORUS_LOG_LEVEL_##level, __FILE__, __LINE__)

#include "chorus/base/logging.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>

namespace chorus {
namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
const char* LevelLetter(LogLevel l) {
  switch (l) {
    case LogLevel::kDebug:
      return "D";
    case LogLevel::kInfo:
      return "I";
    case LogLevel::kWarning:
      return "W";
    case LogLevel::kError:
      return "E";
  }
  return "?";
}
}  // namespace

void SetMinLogLevel(LogLevel level) { g_min_level.store(static_cast<int>(level)); }
LogLevel MinLogLevel() { return static_cast<LogLevel>(g_min_level.load()); }

namespace internal {
LogLine::LogLine(LogLevel level, const char* file, int line) : level_(level) {
  auto now = std::chrono::system_clock::now();
  std::time_t t = std::chrono::system_clock::to_time_t(now);
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(now.time_since_epoch()) % 1000;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%H:%M:%S", &tm);
  const char* base = std::strrchr(file, '/');
  stream_ << LevelLetter(level_) << " " << buf << "." << ms.count() / 100 << (ms.count() / 10) % 10
          << ms.count() % 10 << " " << (base ? base + 1 : file) << ":" << line << "] ";
}
LogLine::~LogLine() {
  stream_ << '\n';
  std::string s = stream_.str();
  // One write() per line so concurrent lines do not interleave.
  ssize_t unused = ::write(STDERR_FILENO, s.data(), s.size());
  (void)unused;
}
}  // namespace internal
}  // namespace chorus

// CHORUS_CHECK: invariants that only a bug in Chorus can break. Never for user input —
// user input is validated into a Status.
#pragma once

#include <sstream>
#include <string>

namespace chorus::internal {

// Collects a streamed message and aborts in its destructor.
class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* condition);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `CHORUS_CHECK(c) << "msg";` compile to nothing when c holds.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace chorus::internal

#define CHORUS_CHECK(cond)                 \
  (cond) ? (void)0                         \
         : ::chorus::internal::Voidify() & \
               ::chorus::internal::CheckFailure(__FILE__, __LINE__, #cond)

#define CHORUS_CHECK_EQ(a, b) CHORUS_CHECK((a) == (b)) << " (" << (a) << " vs " << (b) << ") "
#define CHORUS_CHECK_LT(a, b) CHORUS_CHECK((a) < (b)) << " (" << (a) << " vs " << (b) << ") "
#define CHORUS_CHECK_LE(a, b) CHORUS_CHECK((a) <= (b)) << " (" << (a) << " vs " << (b) << ") "
#define CHORUS_CHECK_GE(a, b) CHORUS_CHECK((a) >= (b)) << " (" << (a) << " vs " << (b) << ") "

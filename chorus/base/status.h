// Status and Result<T>: errors as values (abseil-style). Library code never throws.
//
// Thread-safety: value types; safe to copy between threads.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "chorus/base/check.h"

namespace chorus {

enum class StatusCode : uint8_t {
  kOk = 0,
  kCancelled,
  kInvalidArgument,  // bad user input: malformed file, request or flag
  kNotFound,         // a file, model, adapter or tensor that does not exist
  kAlreadyExists,
  kPermissionDenied,
  kResourceExhausted,  // out of pool pages, queue full, size limit
  kFailedPrecondition,
  kOutOfRange,     // an offset or index outside its container
  kUnimplemented,  // a valid input Chorus does not support (yet)
  kInternal,       // a bug in Chorus
  kUnavailable,    // try again later (overload, draining)
  kDataLoss,       // truncated or corrupted file
  kDeadlineExceeded,
  kUnauthenticated,
};

std::string_view StatusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "INVALID_ARGUMENT: message" (or "OK").
  std::string ToString() const;

  // Returns a copy whose message is "context: message" — used to add context on the way up.
  Status WithContext(std::string_view context) const;

  void IgnoreError() const {}

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

inline Status OkStatus() { return Status(); }
Status InvalidArgumentError(std::string message);
Status NotFoundError(std::string message);
Status AlreadyExistsError(std::string message);
Status OutOfRangeError(std::string message);
Status DataLossError(std::string message);
Status UnimplementedError(std::string message);
Status InternalError(std::string message);
Status ResourceExhaustedError(std::string message);
Status FailedPreconditionError(std::string message);
Status UnavailableError(std::string message);
Status PermissionDeniedError(std::string message);
Status CancelledError(std::string message);
Status UnauthenticatedError(std::string message);
Status DeadlineExceededError(std::string message);
// Wraps errno of a failed system call: "<what>: <strerror>". ENOENT maps to kNotFound.
Status ErrnoError(int err, std::string_view what);

// Result<T> holds either a T or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    CHORUS_CHECK(!std::get<Status>(v_).ok()) << "Result constructed from an OK Status";
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOkStatus;
    return ok() ? kOkStatus : std::get<Status>(v_);
  }
  // Requires: ok().
  T& value() & {
    CHORUS_CHECK(ok()) << status().ToString();
    return std::get<T>(v_);
  }
  const T& value() const& {
    CHORUS_CHECK(ok()) << status().ToString();
    return std::get<T>(v_);
  }
  T&& value() && {
    CHORUS_CHECK(ok()) << status().ToString();
    return std::get<T>(std::move(v_));
  }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

 private:
  std::variant<T, Status> v_;
};

namespace internal {
inline Status AsStatus(const Status& s) { return s; }
template <typename T>
Status AsStatus(const Result<T>& r) {
  return r.status();
}
}  // namespace internal

}  // namespace chorus

#define CHORUS_STATUS_CONCAT_INNER(a, b) a##b
#define CHORUS_STATUS_CONCAT(a, b) CHORUS_STATUS_CONCAT_INNER(a, b)

// Returns the error from the enclosing function if `expr` (a Status or Result) is not OK.
#define CHORUS_RETURN_IF_ERROR(expr)                                        \
  do {                                                                      \
    ::chorus::Status chorus_status_ = ::chorus::internal::AsStatus((expr)); \
    if (!chorus_status_.ok()) return chorus_status_;                        \
  } while (0)

// CHORUS_ASSIGN_OR_RETURN(auto x, MakeX()); — declares/assigns from a Result or returns its error.
#define CHORUS_ASSIGN_OR_RETURN(lhs, rexpr) \
  CHORUS_ASSIGN_OR_RETURN_IMPL(CHORUS_STATUS_CONCAT(chorus_result_, __LINE__), lhs, rexpr)
#define CHORUS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, rexpr) \
  auto tmp = (rexpr);                                 \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()

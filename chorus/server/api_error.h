// OpenAI-shaped API errors and the one mapping from chorus::Status to an HTTP status.
//
// Every error the server sends has the body
//   {"error": {"message": "...", "type": "...", "param": <string|null>, "code": <string|null>}}
// Messages are short and never echo request text (a prompt can be megabytes).
//
// Thread-safety: value types and pure functions.
#pragma once

#include <string>

#include "chorus/base/status.h"

namespace chorus::server {

struct ApiError {
  int http_status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending request field; empty = null
  std::string code;   // machine-readable code; empty = null
  // Seconds for a Retry-After header (429 / 503); 0 = no header.
  int retry_after_s = 0;

  // The JSON body, one line.
  std::string ToJson() const;
};

// The Status → HTTP mapping, in one place:
//   kInvalidArgument, kFailedPrecondition, kDataLoss → 400 invalid_request_error
//   kOutOfRange        → 400 invalid_request_error, code "context_length_exceeded"
//   kUnimplemented     → 400 invalid_request_error, code "unsupported"
//   kNotFound          → 404 invalid_request_error, code "not_found"
//   kUnauthenticated   → 401 invalid_request_error, code "invalid_api_key"
//   kPermissionDenied  → 403 permission_error
//   kResourceExhausted → 429 rate_limit_error, code "rate_limit_exceeded", Retry-After: 1
//   kUnavailable, kCancelled → 503 service_unavailable, Retry-After: 5
//   kDeadlineExceeded  → 504 timeout
//   kInternal and anything else → 500 server_error
ApiError ErrorFromStatus(const Status& s, std::string param = {});

// Shorthands for the common rows.
ApiError BadRequest(std::string message, std::string param = {}, std::string code = {});
ApiError NotFound(std::string message, std::string code = "not_found");

}  // namespace chorus::server

#include "chorus/server/api_error.h"

#include <nlohmann/json.hpp>

namespace chorus::server {

std::string ApiError::ToJson() const {
  nlohmann::json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  nlohmann::json body = {{"error", std::move(e)}};
  // Invalid UTF-8 (e.g. from a file name in a message) is replaced, never thrown.
  return body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

ApiError ErrorFromStatus(const Status& s, std::string param) {
  ApiError e;
  e.message = s.message();
  e.param = std::move(param);
  switch (s.code()) {
    case StatusCode::kOk:
    case StatusCode::kInvalidArgument:
    case StatusCode::kFailedPrecondition:
    case StatusCode::kDataLoss:
    case StatusCode::kAlreadyExists:
      e.http_status = 400;
      break;
    case StatusCode::kOutOfRange:
      e.http_status = 400;
      e.code = "context_length_exceeded";
      break;
    case StatusCode::kUnimplemented:
      e.http_status = 400;
      e.code = "unsupported";
      break;
    case StatusCode::kNotFound:
      e.http_status = 404;
      e.code = "not_found";
      break;
    case StatusCode::kUnauthenticated:
      e.http_status = 401;
      e.code = "invalid_api_key";
      break;
    case StatusCode::kPermissionDenied:
      e.http_status = 403;
      e.type = "permission_error";
      break;
    case StatusCode::kResourceExhausted:
      e.http_status = 429;
      e.type = "rate_limit_error";
      e.code = "rate_limit_exceeded";
      e.retry_after_s = 1;
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kCancelled:
      e.http_status = 503;
      e.type = "service_unavailable";
      e.code = "service_unavailable";
      e.retry_after_s = 5;
      break;
    case StatusCode::kDeadlineExceeded:
      e.http_status = 504;
      e.type = "timeout";
      break;
    case StatusCode::kInternal:
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  return e;
}

ApiError BadRequest(std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = 400;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

ApiError NotFound(std::string message, std::string code) {
  ApiError e;
  e.http_status = 404;
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

}  // namespace chorus::server

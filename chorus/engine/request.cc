#include "chorus/engine/request.h"

namespace chorus::engine {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone:
      return "";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
  }
  return "";
}

std::optional<StreamEvent> RequestHandle::Next(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return !events_.empty(); })) return std::nullopt;
  StreamEvent ev = std::move(events_.front());
  events_.pop_front();
  if (ev.finish != FinishReason::kNone) ++finished_popped_;
  return ev;
}

bool RequestHandle::Done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return finished_popped_ >= n_choices_ && events_.empty();
}

void RequestHandle::Push(StreamEvent ev) {
  if (ev.token >= 0) completion_tokens_.fetch_add(1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    events_.push_back(std::move(ev));
  }
  cv_.notify_all();
}

}  // namespace chorus::engine

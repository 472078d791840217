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

const char* PoolingName(Pooling p) {
  switch (p) {
    case Pooling::kLast:
      return "last";
    case Pooling::kMean:
      return "mean";
    case Pooling::kFirst:
      return "cls";
  }
  return "";
}

std::optional<Pooling> ParsePooling(std::string_view name) {
  for (Pooling p : {Pooling::kLast, Pooling::kMean, Pooling::kFirst})
    if (name == PoolingName(p)) return p;
  return std::nullopt;
}

std::optional<StreamEvent> RequestHandle::Next(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  MutexLock lock(&mu_);
  while (events_.empty()) {
    if (!cv_.WaitUntil(&mu_, deadline) && events_.empty()) return std::nullopt;
  }
  StreamEvent ev = std::move(events_.front());
  events_.pop_front();
  if (ev.finish != FinishReason::kNone) ++finished_popped_;
  return ev;
}

bool RequestHandle::Done() const {
  MutexLock lock(&mu_);
  return finished_popped_ >= n_choices_ && events_.empty();
}

void RequestHandle::Push(StreamEvent ev) {
  if (ev.token >= 0 && !ev.prompt) completion_tokens_.fetch_add(1);
  {
    MutexLock lock(&mu_);
    events_.push_back(std::move(ev));
  }
  cv_.SignalAll();
}

}  // namespace chorus::engine

#include "chorus/dist/thread_communicator.h"

#include <barrier>
#include <cstring>

#include "chorus/base/check.h"

namespace chorus::dist {
namespace {

struct Group {
  explicit Group(int n) : sync(n), ptr(static_cast<size_t>(n), nullptr) {}
  std::barrier<> sync;
  std::vector<void*> ptr;  // each rank's buffer of the current collective
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<Group> g, int rank, int size)
      : g_(std::move(g)), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(float* data, int64_t n) override {
    Publish(data);
    tmp_.assign(static_cast<size_t>(n), 0.0f);
    for (int r = 0; r < size_; ++r) {
      const auto* p = static_cast<const float*>(g_->ptr[static_cast<size_t>(r)]);
      for (int64_t i = 0; i < n; ++i) tmp_[static_cast<size_t>(i)] += p[i];
    }
    g_->sync.arrive_and_wait();  // every rank has read every input
    std::memcpy(data, tmp_.data(), static_cast<size_t>(n) * sizeof(float));
    g_->sync.arrive_and_wait();
    stats_.all_reduces += 1;
    stats_.all_reduce_bytes += n * static_cast<int64_t>(sizeof(float));
  }
  void Broadcast(void* data, int64_t bytes, int root) override {
    Publish(data);
    if (rank_ != root)
      std::memcpy(data, g_->ptr[static_cast<size_t>(root)], static_cast<size_t>(bytes));
    g_->sync.arrive_and_wait();
    stats_.broadcasts += 1;
    stats_.broadcast_bytes += bytes;
  }
  void Gather(const float* in, int64_t n, float* out, int root) override {
    Publish(const_cast<float*>(in));
    if (rank_ == root) {
      for (int r = 0; r < size_; ++r) {
        std::memcpy(out + r * n, g_->ptr[static_cast<size_t>(r)],
                    static_cast<size_t>(n) * sizeof(float));
      }
    }
    g_->sync.arrive_and_wait();
    stats_.gathers += 1;
  }
  void AllGather(const float* in, int64_t n, float* out) override {
    Publish(const_cast<float*>(in));
    for (int r = 0; r < size_; ++r) {
      std::memcpy(out + r * n, g_->ptr[static_cast<size_t>(r)],
                  static_cast<size_t>(n) * sizeof(float));
    }
    g_->sync.arrive_and_wait();  // every rank has read every input
    stats_.all_gathers += 1;
    stats_.all_gather_bytes += n * static_cast<int64_t>(sizeof(float));
  }
  void Barrier() override { g_->sync.arrive_and_wait(); }
  const char* kind() const override { return "threads"; }

 private:
  void Publish(void* p) {
    g_->ptr[static_cast<size_t>(rank_)] = p;
    g_->sync.arrive_and_wait();
  }
  std::shared_ptr<Group> g_;
  int rank_, size_;
  std::vector<float> tmp_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> MakeThreadCommunicators(int n) {
  CHORUS_CHECK(n >= 1) << "MakeThreadCommunicators(" << n << ")";
  auto g = std::make_shared<Group>(n);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < n; ++r) out.push_back(std::make_unique<ThreadCommunicator>(g, r, n));
  return out;
}

}  // namespace chorus::dist

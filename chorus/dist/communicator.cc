#include "chorus/dist/communicator.h"

#include <cstring>
#include <string>

namespace chorus::dist {
namespace {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, int64_t) override {}
  void Broadcast(void*, int64_t, int) override {}
  void Gather(const float* in, int64_t n, float* out, int) override {
    if (out != in) std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  }
  void AllGather(const float* in, int64_t n, float* out) override {
    std::memcpy(out, in, static_cast<size_t>(n) * sizeof(float));
  }
  void Barrier() override {}
  const char* kind() const override { return "local"; }
};

}  // namespace

std::unique_ptr<Communicator> MakeLocalCommunicator() {
  return std::make_unique<LocalCommunicator>();
}

// Implemented in mpi/mpi_communicator.cc or mpi/mpi_unavailable.cc (CMake picks one).
Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(int expected_size);

Result<std::unique_ptr<Communicator>> MakeTensorParallelCommunicator(int n) {
  if (n < 1 || n > 1024)
    return InvalidArgumentError("--tp " + std::to_string(n) + " must be in [1, 1024]");
  if (n == 1) return MakeLocalCommunicator();
  return MakeMpiCommunicator(n);
}

}  // namespace chorus::dist

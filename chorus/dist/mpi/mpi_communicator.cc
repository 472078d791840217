// The MPI communicator (docs/scaleout.md): the only file of Chorus that includes mpi.h.
//
// MPI is initialized once per process, MPI_THREAD_SERIALIZED (collectives come from the engine
// thread, not always the main one, but never from two threads at once), and finalized at exit.
// Communication errors abort the job (MPI's default handler): a rank that lost its peers has no
// state worth keeping, and the others would block forever otherwise.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>

#include "chorus/base/check.h"
#include "chorus/dist/communicator.h"

namespace chorus::dist {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// MPI counts are int: large buffers go in pieces of at most this many elements.
constexpr int64_t kMaxCount = int64_t{1} << 30;

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void AllReduceSum(float* data, int64_t n) override {
    const double t0 = Now();
    for (int64_t off = 0; off < n; off += kMaxCount) {
      const int count = static_cast<int>(n - off < kMaxCount ? n - off : kMaxCount);
      MPI_Allreduce(MPI_IN_PLACE, data + off, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    stats_.all_reduces += 1;
    stats_.all_reduce_bytes += n * static_cast<int64_t>(sizeof(float));
    stats_.all_reduce_seconds += Now() - t0;
  }
  void Broadcast(void* data, int64_t bytes, int root) override {
    const double t0 = Now();
    auto* p = static_cast<char*>(data);
    for (int64_t off = 0; off < bytes; off += kMaxCount) {
      const int count = static_cast<int>(bytes - off < kMaxCount ? bytes - off : kMaxCount);
      MPI_Bcast(p + off, count, MPI_BYTE, root, MPI_COMM_WORLD);
    }
    stats_.broadcasts += 1;
    stats_.broadcast_bytes += bytes;
    stats_.broadcast_seconds += Now() - t0;
  }
  // Every rank, root included, must call this for the same message: MPI never matches a
  // non-blocking collective with a blocking one.
  void BroadcastMayIdle(void* data, int64_t bytes, int root) override {
    CHORUS_CHECK(bytes < kMaxCount) << "BroadcastMayIdle of " << bytes << " bytes";
    const double t0 = Now();
    MPI_Request req;
    MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, MPI_COMM_WORLD, &req);
    if (rank_ == root) {
      MPI_Wait(&req, MPI_STATUS_IGNORE);
      stats_.broadcasts += 1;
      stats_.broadcast_bytes += bytes;
      stats_.broadcast_seconds += Now() - t0;
      return;
    }
    // Spin for the first 20 ms (between decode steps rank 0 runs the output head and samples,
    // ~10 ms at batch 32 on the TinyLlama shape: a sleeping worker would make every step
    // late), then sleep 50 µs → 1 ms between polls: an idle server's workers cost no core, and
    // the first step after an idle period waits at most ~1 ms longer.
    int done = 0;
    for (auto sleep = std::chrono::microseconds(50);;) {
      MPI_Test(&req, &done, MPI_STATUS_IGNORE);
      if (done) break;
      if (Now() - t0 < 20e-3) continue;
      std::this_thread::sleep_for(sleep);
      sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
    stats_.broadcasts += 1;
    stats_.broadcast_bytes += bytes;
    stats_.broadcast_seconds += Now() - t0;
  }
  void Gather(const float* in, int64_t n, float* out, int root) override {
    const double t0 = Now();
    CHORUS_CHECK(n < kMaxCount) << "gather of " << n << " floats per rank";
    MPI_Gather(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT, root,
               MPI_COMM_WORLD);
    stats_.gathers += 1;
    stats_.gather_bytes += n * static_cast<int64_t>(sizeof(float));
    stats_.gather_seconds += Now() - t0;
  }
  void AllGather(const float* in, int64_t n, float* out) override {
    const double t0 = Now();
    CHORUS_CHECK(n < kMaxCount) << "all-gather of " << n << " floats per rank";
    MPI_Allgather(in, static_cast<int>(n), MPI_FLOAT, out, static_cast<int>(n), MPI_FLOAT,
                  MPI_COMM_WORLD);
    stats_.all_gathers += 1;
    stats_.all_gather_bytes += n * static_cast<int64_t>(sizeof(float));
    stats_.all_gather_seconds += Now() - t0;
  }
  void Barrier() override { MPI_Barrier(MPI_COMM_WORLD); }
  const char* kind() const override { return "mpi"; }

 private:
  int rank_, size_;
};

void FinalizeAtExit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

bool MpiBuilt() { return true; }

Result<std::unique_ptr<Communicator>> MakeMpiCommunicator(int expected_size) {
  static std::once_flag once;
  static int provided = 0;
  std::call_once(once, [] {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided);
      std::atexit(FinalizeAtExit);
    } else {
      MPI_Query_thread(&provided);
    }
  });
  if (provided < MPI_THREAD_SERIALIZED) {
    return FailedPreconditionError(
        "the MPI library offers no MPI_THREAD_SERIALIZED support (needed: collectives come from "
        "the engine thread)");
  }
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size != expected_size) {
    return InvalidArgumentError("--tp " + std::to_string(expected_size) + " but this job has " +
                                std::to_string(size) + " MPI process" + (size == 1 ? "" : "es") +
                                ": start it as `mpirun -np " + std::to_string(expected_size) +
                                " chorus ... --tp " + std::to_string(expected_size) +
                                "` (docs/scaleout.md)");
  }
  return std::unique_ptr<Communicator>(new MpiCommunicator(rank, size));
}

}  // namespace chorus::dist

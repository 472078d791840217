// Communicator: the collective operations tensor parallelism needs (docs/scaleout.md), behind an
// interface so that the model code never includes mpi.h. Two implementations: a single-process
// one (size 1: every collective is the identity, so TP=1 runs the very code TP=N runs), and one
// over MPI (chorus/dist/mpi/), compiled only when CMake found MPI.
//
// Collectives are called by every rank in the same order (the forward pass is the same program
// on every rank); a rank that diverges deadlocks, which is why rank 0 broadcasts each step's plan
// (model/tensor_parallel.h) instead of letting ranks decide anything alone.
//
// Thread-safety: calls must be serialized (one thread at a time: the engine thread, or the main
// thread before and after it); the MPI implementation initializes MPI_THREAD_SERIALIZED.
#pragma once

#include <cstdint>
#include <memory>

#include "chorus/base/status.h"

namespace chorus::dist {

// Time and volume spent in collectives, for the per-step communication figures of
// `chorus bench --tp` (wall time inside the calls, including waiting for the other ranks).
struct CommStats {
  int64_t all_reduces = 0;
  int64_t all_reduce_bytes = 0;
  double all_reduce_seconds = 0;
  int64_t broadcasts = 0;
  int64_t broadcast_bytes = 0;
  double broadcast_seconds = 0;
  int64_t gathers = 0;
  int64_t gather_bytes = 0;
  double gather_seconds = 0;
  int64_t all_gathers = 0;
  int64_t all_gather_bytes = 0;  // sent by this rank
  double all_gather_seconds = 0;
  double seconds() const {
    return all_reduce_seconds + broadcast_seconds + gather_seconds + all_gather_seconds;
  }
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Elementwise sum over ranks of data[0, n), result on every rank. Summation order is fixed by
  // the implementation (the same for every call of a given size), not by timing.
  virtual void AllReduceSum(float* data, int64_t n) = 0;
  // Root's `bytes` bytes at data are copied to every other rank's data.
  virtual void Broadcast(void* data, int64_t bytes, int root) = 0;
  // Broadcast for a receiver that may wait long (a worker rank between steps of an idle
  // server): the same result, but a waiting rank polls briefly and then sleeps between polls
  // instead of spinning on a core. Every rank (the root too) must use this call, not
  // Broadcast, for a given message. Default: Broadcast.
  virtual void BroadcastMayIdle(void* data, int64_t bytes, int root) {
    Broadcast(data, bytes, root);
  }
  // Every rank's `n` floats concatenated in rank order into `out` [size() · n] on `root` (out is
  // not touched on other ranks and may be null there).
  virtual void Gather(const float* in, int64_t n, float* out, int root) = 0;
  // Every rank's `n` floats concatenated in rank order into `out` [size() · n] on every rank (the
  // shrink of a LoRA adapter split along its rank: docs/scaleout.md). `in` and `out` must not
  // overlap.
  virtual void AllGather(const float* in, int64_t n, float* out) = 0;
  virtual void Barrier() = 0;
  // "local" or "mpi" (for logs and reports).
  virtual const char* kind() const = 0;

  const CommStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }

 protected:
  CommStats stats_;
};

// The single-process communicator: rank 0 of 1.
std::unique_ptr<Communicator> MakeLocalCommunicator();

// Whether this binary was built with MPI (CMake found it).
bool MpiBuilt();

// For `--tp n`: n == 1 gives the local communicator without touching MPI; n > 1 initializes MPI
// (once per process) and checks that the job has exactly n ranks. Errors name the fix: a build
// without MPI names the Debian packages; a wrong rank count names the mpirun command line.
Result<std::unique_ptr<Communicator>> MakeTensorParallelCommunicator(int n);

}  // namespace chorus::dist

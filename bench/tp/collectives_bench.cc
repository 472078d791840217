// The latency of one all-reduce between tensor-parallel ranks, at the sizes a decode step moves:
// the base's (rows × hidden, two per layer) and a LoRA shrink's (rows × rank, what S-LoRA §6's
// split would add, 2–5 per layer; docs/scaleout.md "LoRA under tensor parallelism"). Ranks wait
// at a barrier before each call, so the figure is the transfer and reduction, not the waiting for
// a slower rank that a real step's collectives also absorb (reported by `chorus bench --tp`).
//
// usage: mpirun -np 2 --bind-to none build/release/bench/collectives_bench [ROWS] [ITERATIONS]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "chorus/dist/communicator.h"

int main(int argc, char** argv) {
  const long rows = argc > 1 ? std::atol(argv[1]) : 32;
  const int iterations = argc > 2 ? std::atoi(argv[2]) : 2000;
  if (rows < 1 || iterations < 10) {
    std::fprintf(stderr, "usage: collectives_bench [ROWS ≥ 1] [ITERATIONS ≥ 10]\n");
    return 2;
  }
  const char* size_env = std::getenv("OMPI_COMM_WORLD_SIZE");
  const int ranks = size_env != nullptr ? std::atoi(size_env) : 1;
  auto comm = chorus::dist::MakeTensorParallelCommunicator(ranks);
  if (!comm.ok()) {
    std::fprintf(stderr, "collectives_bench: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  chorus::dist::Communicator& c = **comm;
  struct Size {
    const char* what;
    long width;
  };
  const Size sizes[] = {{"LoRA shrink, rank 16", 16},
                        {"LoRA shrink, rank 64", 64},
                        {"hidden 2048 (TinyLlama)", 2048},
                        {"hidden 4096 (7B)", 4096}};
  if (c.rank() == 0)
    std::printf("%d ranks (%s), %ld rows, %d all-reduces per size\n", c.size(), c.kind(), rows,
                iterations);
  for (const Size& s : sizes) {
    std::vector<float> data(static_cast<size_t>(rows * s.width), 1.0f);
    std::vector<double> us;
    for (int i = 0; i < iterations; ++i) {
      c.Barrier();
      const auto t0 = std::chrono::steady_clock::now();
      c.AllReduceSum(data.data(), static_cast<int64_t>(data.size()));
      us.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      std::fill(data.begin(), data.end(), 1.0f);  // keep the values finite
    }
    std::sort(us.begin(), us.end());
    if (c.rank() == 0)
      std::printf("%-26s %8ld floats  median %8.1f us  p90 %8.1f us\n", s.what, rows * s.width,
                  us[us.size() / 2], us[us.size() * 9 / 10]);
  }
  return 0;
}

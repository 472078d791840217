// Communicators for N ranks that are N threads of one process: the tests of tensor parallelism
// run the sharded forward pass against the whole model without MPI (docs/scaleout.md, "Tests").
// Every collective meets at a barrier; sums are taken in rank order, so every rank gets the same
// bits.
#pragma once

#include <memory>
#include <vector>

#include "chorus/dist/communicator.h"

namespace chorus::dist {

// Ranks 0 … n − 1 of one group; each must be used by one thread at a time, all of them
// concurrently (a collective blocks until every rank has called it). Requires n ≥ 1.
std::vector<std::unique_ptr<Communicator>> MakeThreadCommunicators(int n);

}  // namespace chorus::dist

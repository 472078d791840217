// `--tp N` of the subcommands that run a model (docs/scaleout.md): the communicator, this
// rank's shard, and rank 0's TpLeader. Every rank runs the same command line; the helpers keep
// the ranks in step on failure (a rank that fails alone would leave the others blocked in a
// collective).
#pragma once

#include <memory>

#include "chorus/base/status.h"
#include "chorus/dist/communicator.h"
#include "chorus/model/model.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::apps {

struct TensorParallel {
  std::unique_ptr<dist::Communicator> comm;  // local (size 1) without --tp
  std::unique_ptr<model::TpLeader> leader;   // rank 0 of size > 1 only
  int rank() const { return comm->rank(); }
  int size() const { return comm->size(); }
  bool worker() const { return comm->rank() > 0; }
};

// The communicator of `--tp n` (errors name the fix: missing MPI, wrong mpirun -np).
Result<TensorParallel> StartTensorParallel(int n);

// Every rank calls it with its own status after a step that may fail on some ranks only (model
// loading, sharding): OK on every rank only when it was OK on every rank. A rank whose own step
// succeeded learns that another failed (the failing rank reports its own error).
Status AgreeAcrossRanks(dist::Communicator* comm, const Status& mine);

// Replaces `*model` by this rank's shard (all ranks agree on success) and, on rank 0 of a size
// > 1 job, creates the leader. Size 1: leaves the model alone.
Status ShardForTensorParallel(TensorParallel* tp, std::shared_ptr<const model::Model>* model);

}  // namespace chorus::apps

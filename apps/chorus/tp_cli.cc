#include "apps/chorus/tp_cli.h"

#include <string>

namespace chorus::apps {

Result<TensorParallel> StartTensorParallel(int n) {
  TensorParallel tp;
  CHORUS_ASSIGN_OR_RETURN(tp.comm, dist::MakeTensorParallelCommunicator(n));
  return tp;
}

Status AgreeAcrossRanks(dist::Communicator* comm, const Status& mine) {
  if (comm->size() == 1) return mine;
  float failed = mine.ok() ? 0.0f : 1.0f;
  comm->AllReduceSum(&failed, 1);
  if (!mine.ok()) return mine;
  if (failed > 0) {
    return FailedPreconditionError(std::to_string(static_cast<int>(failed)) +
                                   " other tensor-parallel rank(s) failed (see their messages)");
  }
  return OkStatus();
}

Status ShardForTensorParallel(TensorParallel* tp, std::shared_ptr<const model::Model>* model) {
  if (tp->size() == 1) return OkStatus();
  auto shard = model::ShardModel(*model, tp->rank(), tp->size());
  CHORUS_RETURN_IF_ERROR(AgreeAcrossRanks(tp->comm.get(), shard.status()));
  *model = std::move(shard).value();  // the full model's copies go with the last reference
  if (!tp->worker()) tp->leader = std::make_unique<model::TpLeader>(tp->comm.get());
  return OkStatus();
}

}  // namespace chorus::apps

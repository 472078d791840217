// Tensor parallelism (docs/scaleout.md): Megatron-style sharding of a model over the ranks of a
// dist::Communicator, and the step protocol between rank 0 (which schedules) and the others.
//
// Each rank holds one shard: q, k, v, gate and up split by output rows (whole heads; KV heads
// split across ranks, so each rank's KV cache holds only its own KV heads) and o and down split
// by input columns. A rank's attention output times its o columns, and its MLP activations times
// its down columns, are partial sums of the full products: the forward pass all-reduces them
// (two all-reduces per layer, model/forward.h). Embeddings, norms and the output head are
// replicated; the head runs on rank 0 only (the only rank that samples), see docs/scaleout.md
// for why it is not split.
//
// The shard is itself a Model whose config has n_heads / N, n_kv_heads / N and n_ff / N, so the
// forward pass, the KV cache layout and the kernels run unchanged on it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "chorus/base/thread_pool.h"
#include "chorus/dist/communicator.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/model.h"

namespace chorus::model {

// The config of one of `size` shards of `c`. Refused with a message naming the reason: heads or
// KV heads not divisible by `size` (GQA with fewer KV heads than ranks is refused, not
// replicated), n_ff not divisible, or `size` < 1.
Result<ModelConfig> ShardConfig(const ModelConfig& c, int size);

// Shard `rank` of `size` of `full`: its own copy of the o and down columns, views of the q, k, v,
// gate and up rows (and q/k/v biases), the rest shared. Quantized matrices split along whole
// blocks: a column split (o, down) that does not fall on a block boundary is refused naming the
// tensor and the block size. size == 1 returns `full` itself.
Result<std::shared_ptr<const Model>> ShardModel(std::shared_ptr<const Model> full, int rank,
                                                int size);

// What every rank must agree on before the first step (rank 0 broadcasts it): the step bounds
// its Forward and the KV pool its block ids index.
struct TpSetup {
  int64_t max_rows = 0;
  int64_t max_seqs = 0;
  int64_t max_logit_rows = 0;
  int64_t n_pages = 0;
  int64_t block_size = 16;
  int32_t kv_dtype = 0;  // kernels::KvDtype
  int32_t threads = 1;   // compute threads of each worker rank
};

// The step plan on the wire: rank 0 sends StepInput's arrays (tokens, positions, sequences,
// logit rows, the block tables' entries the step reads) and optionally each row's variant slot,
// the others receive them. Hooks do not cross: a slot is an index into a table of variants every
// rank loaded for its shard (RunTpWorker's `hook_for`). Between steps rank 0 may define a slot:
// it sends the slot and an opaque description of the variant (the adapters module writes and
// reads it), every rank loads its shard of that variant, and all agree on the outcome. Rank 0
// may also announce a variant it will likely define soon (a prefetch: no slot, no reply), so the
// workers can start loading it off the step's critical path.
class StepChannel {
 public:
  enum class Message { kStop, kStep, kDefine, kPrefetch };
  StepChannel(dist::Communicator* comm, int64_t max_rows, int64_t max_seqs);
  // Rank 0: broadcasts `in` (its tables read through `kv`'s geometry), when not empty the rows'
  // variant slots [rows] (−1 = base), and the page copies (source, destination block ids, in
  // order: memory::KvCache::copies()) the ranks must make before the step.
  void Send(const StepInput& in, const memory::KvCache& kv, std::span<const int32_t> row_slots = {},
            std::span<const int32_t> page_copies = {});
  // Rank 0: broadcasts a slot's definition (the ranks then agree on it: TpLeader::Define).
  void SendDefine(int32_t slot, std::string_view description);
  // Rank 0: broadcasts a prefetch hint (TpLeader::Prefetch).
  void SendPrefetch(std::string_view description);
  // Rank 0: tells the workers to return.
  void SendStop();
  // Other ranks: the next message.
  Message Receive();
  // The received step, valid until the next Receive(); hook null.
  StepInput Input() const;
  // The received rows' variant slots; empty when rank 0 sent none.
  std::span<const int32_t> row_slots() const;
  // The received step's page copies, [source, destination, ...].
  std::span<const int32_t> page_copies() const;
  // The received definition (kDefine) or prefetch (kPrefetch: the slot is −1), valid until the
  // next Receive().
  int32_t define_slot() const { return header_[1]; }
  std::string_view define_description() const;

 private:
  void SendDescription(int32_t kind, int32_t slot, std::string_view description);

  dist::Communicator* comm_;
  int64_t max_rows_, max_seqs_;
  std::vector<int32_t> header_;   // kind, rows, seqs, logit rows, payload ints
  std::vector<int32_t> payload_;  // tokens, positions, seq, logit rows, table lengths, tables
  std::vector<const int32_t*> tables_;
  std::vector<int64_t> scratch_last_;  // Send: each sequence's last position in the step
  int64_t n_rows_ = 0, n_seqs_ = 0, n_logit_ = 0, n_copies_ = 0;
  const int32_t* copies_ = nullptr;
  bool has_slots_ = false;
};

// Rank 0's side: broadcasts the setup once, then each step's plan, then the stop (also on
// destruction, so the workers end whatever way rank 0 leaves).
class TpLeader {
 public:
  explicit TpLeader(dist::Communicator* comm) : comm_(comm) {}
  ~TpLeader() { Stop(); }
  TpLeader(const TpLeader&) = delete;
  TpLeader& operator=(const TpLeader&) = delete;

  dist::Communicator* comm() const { return comm_; }
  // Once, before the first step. Requires comm rank 0.
  void Start(const TpSetup& setup);
  void Step(const StepInput& in, const memory::KvCache& kv, std::span<const int32_t> row_slots = {},
            std::span<const int32_t> page_copies = {});
  // Between steps: every worker loads its shard of the variant `description` names into `slot`
  // (RunTpWorker's `define`). OK only when every worker succeeded; otherwise an error naming the
  // ranks that failed (each prints its own reason); rank 0 then uses the slot for nothing until
  // it defines it again (a worker that did load the variant keeps it until then).
  Status Define(int32_t slot, std::string_view description);
  // Between steps: the workers may start loading their shard of the variant `description`
  // names, which rank 0 is likely to Define soon (its own copy is being loaded for a queued
  // request). A hint: no reply, no agreement; a worker without `prefetch` ignores it.
  void Prefetch(std::string_view description);
  void Stop();

 private:
  dist::Communicator* comm_;
  std::unique_ptr<StepChannel> channel_;
  bool stopped_ = false;
};

// A worker rank (rank > 0): receives the setup, then runs every step rank 0 sends through its
// own Forward over `shard` and its own KV cache (its KV heads only) until the stop message.
// Returns when rank 0 stops; the logits are computed on rank 0 only. When rank 0 sends row
// slots, `hook_for` gives the step's hook for them (this rank's shards of the variants: e.g. a
// LoraHook over adapters::LoraAdapter::BuildShard's parts); a step with slots and no `hook_for` is
// an error. `define` loads this rank's shard of a variant into a slot when rank 0 defines one (no
// `define`: every definition fails on this rank); its error is printed, and rank 0 refuses
// the variant. `prefetch` receives rank 0's prefetch hints (it must not block long: the
// workers are between steps).
using TpHookForRows = std::function<Result<const LinearHook*>(std::span<const int32_t> slots)>;
using TpDefineSlot = std::function<Status(int32_t slot, std::string_view description)>;
using TpPrefetch = std::function<void(std::string_view description)>;
Status RunTpWorker(dist::Communicator* comm, std::shared_ptr<const Model> shard,
                   const TpHookForRows& hook_for = nullptr, const TpDefineSlot& define = nullptr,
                   const TpPrefetch& prefetch = nullptr);

}  // namespace chorus::model

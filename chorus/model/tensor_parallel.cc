#include "chorus/model/tensor_parallel.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>

#include "chorus/memory/page_pool.h"

namespace chorus::model {
namespace {

constexpr int32_t kStop = 0;
constexpr int32_t kStep = 1;
constexpr int32_t kDefine = 2;
constexpr int32_t kPrefetch = 3;
// kind, rows, seqs, logit rows, payload ints, has slots, page copies
constexpr int kHeaderInts = 7;

// Columns [c0, c1) of a 2-D tensor, copied (o and down: split along their input features). A
// quantized row is a run of blocks, so the split must fall on a block boundary.
Result<Tensor> Columns(const Tensor& t, int64_t c0, int64_t c1, const std::string& name) {
  const TensorView& v = t.view();
  const int64_t block = DTypeBlockElems(t.dtype());
  if (c0 % block != 0 || c1 % block != 0) {
    return InvalidArgumentError("tensor '" + name + "' (" + std::string(DTypeName(t.dtype())) +
                                ", blocks of " + std::to_string(block) +
                                ") cannot be split at column " +
                                std::to_string(c0 % block != 0 ? c0 : c1) +
                                ": a tensor-parallel split of o/down must fall on a block "
                                "boundary (use fewer ranks or another weight type)");
  }
  const int64_t rows = v.shape[0];
  Tensor out = Tensor::Zeros(t.dtype(), {rows, c1 - c0});
  const int64_t off = DTypeBytes(t.dtype(), c0), bytes = DTypeBytes(t.dtype(), c1 - c0);
  auto* dst = static_cast<uint8_t*>(out.mutable_data());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * bytes, v.Row(r) + off, static_cast<size_t>(bytes));
  return out;
}

// Elements [b, e) of a 1-D tensor (a bias), as a view.
Tensor Elements(const Tensor& t, int64_t b, int64_t e) {
  const int64_t n = t.view().NumElements();
  return t.Reshaped({n, 1}).Rows(b, e).Reshaped({e - b});
}

}  // namespace

Result<ModelConfig> ShardConfig(const ModelConfig& c, int size) {
  if (size < 1) return InvalidArgumentError("tensor-parallel size must be ≥ 1");
  auto refuse = [&](const std::string& what) {
    return InvalidArgumentError("cannot split this model over " + std::to_string(size) +
                                " tensor-parallel ranks: " + what + " (docs/scaleout.md)");
  };
  if (c.n_kv_heads % size != 0) {
    return refuse(std::to_string(c.n_kv_heads) + " KV heads " +
                  (c.n_kv_heads < size ? "are fewer than the ranks" : "do not divide evenly") +
                  "; each rank must hold whole KV heads (replicating KV heads is not supported)");
  }
  if (c.n_heads % size != 0)
    return refuse(std::to_string(c.n_heads) + " attention heads do not divide evenly");
  if (c.n_ff % size != 0)
    return refuse("the MLP width " + std::to_string(c.n_ff) + " does not divide evenly");
  ModelConfig s = c;
  s.n_heads = c.n_heads / size;
  s.n_kv_heads = c.n_kv_heads / size;
  s.n_ff = c.n_ff / size;
  return s;
}

Result<std::shared_ptr<const Model>> ShardModel(std::shared_ptr<const Model> full, int rank,
                                                int size) {
  if (size == 1) return full;
  if (rank < 0 || rank >= size)
    return InvalidArgumentError("rank " + std::to_string(rank) + " of " + std::to_string(size));
  const ModelConfig& c = full->config();
  CHORUS_ASSIGN_OR_RETURN(ModelConfig sc, ShardConfig(c, size));
  // The rows / columns [r · part, (r + 1) · part) of each split tensor, by HF name.
  struct Split {
    bool columns;
    int64_t part;
  };
  std::map<std::string, Split> splits;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    splits[HfLayerTensorName(l, Linear::kQ)] = {false, sc.q_dim()};
    splits[HfLayerTensorName(l, Linear::kK)] = {false, sc.kv_dim()};
    splits[HfLayerTensorName(l, Linear::kV)] = {false, sc.kv_dim()};
    splits[HfLayerTensorName(l, Linear::kGate)] = {false, sc.n_ff};
    splits[HfLayerTensorName(l, Linear::kUp)] = {false, sc.n_ff};
    splits[HfLayerTensorName(l, Linear::kO)] = {true, sc.q_dim()};
    splits[HfLayerTensorName(l, Linear::kDown)] = {true, sc.n_ff};
    if (c.qkv_bias) {
      splits[HfBiasName(l, Linear::kQ)] = {false, sc.q_dim()};
      splits[HfBiasName(l, Linear::kK)] = {false, sc.kv_dim()};
      splits[HfBiasName(l, Linear::kV)] = {false, sc.kv_dim()};
    }
  }
  Model::NamedTensors shard;
  shard.reserve(full->tensors().size());
  for (const auto& [name, t] : full->tensors()) {
    auto it = splits.find(name);
    if (it == splits.end()) {
      shard.emplace_back(name, t);  // replicated: embeddings, norms, the head
      continue;
    }
    const int64_t b = rank * it->second.part, e = b + it->second.part;
    if (t.view().n_dims() == 1) {
      shard.emplace_back(name, Elements(t, b, e));
    } else if (it->second.columns) {
      CHORUS_ASSIGN_OR_RETURN(Tensor cols, Columns(t, b, e, name));
      shard.emplace_back(name, std::move(cols));
    } else {
      shard.emplace_back(name, t.Rows(b, e));
    }
  }
  return Model::Build(std::move(sc), std::move(shard), full->format(),
                      full->source() + " (tensor-parallel shard " + std::to_string(rank) + "/" +
                          std::to_string(size) + ")");
}

StepChannel::StepChannel(dist::Communicator* comm, int64_t max_rows, int64_t max_seqs)
    : comm_(comm), max_rows_(max_rows), max_seqs_(max_seqs) {
  header_.assign(kHeaderInts, 0);
  payload_.reserve(static_cast<size_t>(4 * max_rows + max_seqs));
  tables_.reserve(static_cast<size_t>(max_seqs));
}

void StepChannel::Send(const StepInput& in, const memory::KvCache& kv,
                       std::span<const int32_t> row_slots, std::span<const int32_t> page_copies) {
  CHORUS_CHECK_EQ(comm_->rank(), 0);
  const auto n_rows = static_cast<int64_t>(in.tokens.size());
  const auto n_seqs = static_cast<int64_t>(in.block_tables.size());
  const auto n_logit = static_cast<int64_t>(in.logit_rows.size());
  CHORUS_CHECK(n_rows <= max_rows_ && n_seqs <= max_seqs_);
  // Each sequence's table entries up to its last row's block: what this step reads or writes.
  std::vector<int64_t>& last = scratch_last_;
  last.assign(static_cast<size_t>(n_seqs), 0);
  for (int64_t i = 0; i < n_rows; ++i) {
    auto& m = last[static_cast<size_t>(in.seq[static_cast<size_t>(i)])];
    m = std::max<int64_t>(m, in.positions[static_cast<size_t>(i)]);
  }
  payload_.clear();
  payload_.insert(payload_.end(), in.tokens.begin(), in.tokens.end());
  payload_.insert(payload_.end(), in.positions.begin(), in.positions.end());
  payload_.insert(payload_.end(), in.seq.begin(), in.seq.end());
  payload_.insert(payload_.end(), in.logit_rows.begin(), in.logit_rows.end());
  const bool slots = !row_slots.empty();
  if (slots) {
    CHORUS_CHECK_EQ(static_cast<int64_t>(row_slots.size()), n_rows);
    payload_.insert(payload_.end(), row_slots.begin(), row_slots.end());
  }
  const size_t lengths_at = payload_.size();
  payload_.resize(lengths_at + static_cast<size_t>(n_seqs));
  for (int64_t s = 0; s < n_seqs; ++s) {
    const int64_t entries = kv.BlocksFor(last[static_cast<size_t>(s)] + 1) * kv.n_groups();
    payload_[lengths_at + static_cast<size_t>(s)] = static_cast<int32_t>(entries);
    const int32_t* t = in.block_tables[static_cast<size_t>(s)];
    payload_.insert(payload_.end(), t, t + entries);
  }
  CHORUS_CHECK(page_copies.size() % 2 == 0);
  payload_.insert(payload_.end(), page_copies.begin(), page_copies.end());
  header_ = {kStep,
             static_cast<int32_t>(n_rows),
             static_cast<int32_t>(n_seqs),
             static_cast<int32_t>(n_logit),
             static_cast<int32_t>(payload_.size()),
             slots ? 1 : 0,
             static_cast<int32_t>(page_copies.size() / 2)};
  comm_->BroadcastMayIdle(header_.data(), kHeaderInts * sizeof(int32_t), 0);
  comm_->Broadcast(payload_.data(), static_cast<int64_t>(payload_.size() * sizeof(int32_t)), 0);
}

void StepChannel::SendDefine(int32_t slot, std::string_view description) {
  CHORUS_CHECK(slot >= 0);
  SendDescription(kDefine, slot, description);
}

void StepChannel::SendPrefetch(std::string_view description) {
  SendDescription(kPrefetch, -1, description);
}

void StepChannel::SendDescription(int32_t kind, int32_t slot, std::string_view description) {
  CHORUS_CHECK_EQ(comm_->rank(), 0);
  // The description travels in the int32 payload: its length in bytes, then its bytes padded.
  payload_.assign(1 + (description.size() + 3) / 4, 0);
  payload_[0] = static_cast<int32_t>(description.size());
  std::memcpy(payload_.data() + 1, description.data(), description.size());
  header_ = {kind, slot, 0, 0, static_cast<int32_t>(payload_.size()), 0, 0};
  comm_->BroadcastMayIdle(header_.data(), kHeaderInts * sizeof(int32_t), 0);
  comm_->Broadcast(payload_.data(), static_cast<int64_t>(payload_.size() * sizeof(int32_t)), 0);
}

std::string_view StepChannel::define_description() const {
  return {reinterpret_cast<const char*>(payload_.data() + 1), static_cast<size_t>(payload_[0])};
}

void StepChannel::SendStop() {
  header_ = {kStop, 0, 0, 0, 0, 0, 0};
  comm_->BroadcastMayIdle(header_.data(), kHeaderInts * sizeof(int32_t), 0);
}

StepChannel::Message StepChannel::Receive() {
  // The header may be long in coming (an idle server): wait without holding a core.
  comm_->BroadcastMayIdle(header_.data(), kHeaderInts * sizeof(int32_t), 0);
  if (header_[0] == kStop) return Message::kStop;
  if (header_[0] == kDefine || header_[0] == kPrefetch) {
    CHORUS_CHECK((header_[0] == kPrefetch || header_[1] >= 0) && header_[4] >= 1)
        << "corrupt tensor-parallel definition";
    payload_.resize(static_cast<size_t>(header_[4]));
    comm_->Broadcast(payload_.data(), static_cast<int64_t>(payload_.size() * sizeof(int32_t)), 0);
    CHORUS_CHECK(payload_[0] >= 0 &&
                 (static_cast<size_t>(payload_[0]) + 3) / 4 + 1 == payload_.size())
        << "corrupt tensor-parallel definition";
    return header_[0] == kDefine ? Message::kDefine : Message::kPrefetch;
  }
  CHORUS_CHECK_EQ(header_[0], kStep) << "corrupt tensor-parallel step header";
  n_rows_ = header_[1];
  n_seqs_ = header_[2];
  n_logit_ = header_[3];
  has_slots_ = header_[5] != 0;
  CHORUS_CHECK(n_rows_ > 0 && n_rows_ <= max_rows_ && n_seqs_ <= max_seqs_)
      << "tensor-parallel step of " << n_rows_ << " rows / " << n_seqs_
      << " sequences exceeds the setup";
  payload_.resize(static_cast<size_t>(header_[4]));
  comm_->Broadcast(payload_.data(), static_cast<int64_t>(payload_.size() * sizeof(int32_t)), 0);
  tables_.clear();
  const int32_t* lengths = payload_.data() + (has_slots_ ? 4 : 3) * n_rows_ + n_logit_;
  const int32_t* t = lengths + n_seqs_;
  for (int64_t s = 0; s < n_seqs_; ++s) {
    tables_.push_back(t);
    t += lengths[s];
  }
  n_copies_ = header_[6];
  copies_ = t;
  CHORUS_CHECK(n_copies_ >= 0 && copies_ + 2 * n_copies_ == payload_.data() + payload_.size())
      << "corrupt tensor-parallel step payload";
  return Message::kStep;
}

std::span<const int32_t> StepChannel::row_slots() const {
  if (!has_slots_) return {};
  return {payload_.data() + 3 * n_rows_ + n_logit_, static_cast<size_t>(n_rows_)};
}

std::span<const int32_t> StepChannel::page_copies() const {
  return {copies_, static_cast<size_t>(2 * n_copies_)};
}

StepInput StepChannel::Input() const {
  const int32_t* p = payload_.data();
  const auto rows = static_cast<size_t>(n_rows_);
  StepInput in;
  in.tokens = {p, rows};
  in.positions = {p + rows, rows};
  in.seq = {p + 2 * rows, rows};
  in.logit_rows = {p + 3 * rows, static_cast<size_t>(n_logit_)};
  in.block_tables = {tables_.data(), tables_.size()};
  return in;
}

void TpLeader::Start(const TpSetup& setup) {
  CHORUS_CHECK_EQ(comm_->rank(), 0);
  TpSetup s = setup;
  comm_->BroadcastMayIdle(&s, sizeof(s), 0);
  channel_ = std::make_unique<StepChannel>(comm_, setup.max_rows, setup.max_seqs);
}

void TpLeader::Step(const StepInput& in, const memory::KvCache& kv,
                    std::span<const int32_t> row_slots, std::span<const int32_t> page_copies) {
  CHORUS_CHECK(channel_ != nullptr) << "TpLeader::Step before Start";
  channel_->Send(in, kv, row_slots, page_copies);
}

Status TpLeader::Define(int32_t slot, std::string_view description) {
  CHORUS_CHECK(channel_ != nullptr) << "TpLeader::Define before Start";
  channel_->SendDefine(slot, description);
  // Each worker adds its rank's bit (exact in a float for the ranks an MPI job on CPUs has).
  float failed = 0;
  comm_->AllReduceSum(&failed, 1);
  if (failed == 0) return OkStatus();
  std::string ranks;
  for (int r = 1; r < comm_->size() && r < 24; ++r) {
    if ((static_cast<int64_t>(failed) >> r) & 1)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  }
  return UnavailableError("tensor-parallel rank(s) " + (ranks.empty() ? std::string("?") : ranks) +
                          " could not load their shard (their log says why)");
}

void TpLeader::Prefetch(std::string_view description) {
  CHORUS_CHECK(channel_ != nullptr) << "TpLeader::Prefetch before Start";
  channel_->SendPrefetch(description);
}

void TpLeader::Stop() {
  if (stopped_ || comm_ == nullptr || comm_->size() == 1) return;
  stopped_ = true;
  if (channel_ == nullptr) {  // never started: the workers wait for the setup first
    TpSetup none;
    comm_->BroadcastMayIdle(&none, sizeof(none), 0);
    return;
  }
  channel_->SendStop();
}

Status RunTpWorker(dist::Communicator* comm, std::shared_ptr<const Model> shard,
                   const TpHookForRows& hook_for, const TpDefineSlot& define,
                   const TpPrefetch& prefetch) {
  CHORUS_CHECK(comm->rank() > 0) << "RunTpWorker on rank 0";
  TpSetup s;
  comm->BroadcastMayIdle(&s, sizeof(s), 0);
  if (s.max_rows == 0) return OkStatus();  // rank 0 stopped before starting
  const memory::KvLayout layout =
      KvLayoutFor(shard->config(), s.block_size, static_cast<kernels::KvDtype>(s.kv_dtype));
  memory::PagePool pages(s.n_pages, layout.PageBytes());
  // Block ids come from rank 0's allocator: every rank's pool has the same number of pages of
  // the same shape (its own KV heads), so an id means the same tokens everywhere.
  memory::KvCache kv(layout, &pages);
  Forward fwd(shard, s.max_rows, std::max<int64_t>(1, s.max_logit_rows), comm);
  ThreadPool pool(s.threads);
  StepChannel channel(comm, s.max_rows, s.max_seqs);
  for (;;) {
    const StepChannel::Message m = channel.Receive();
    if (m == StepChannel::Message::kStop) break;
    if (m == StepChannel::Message::kPrefetch) {
      if (prefetch) prefetch(channel.define_description());
      continue;
    }
    if (m == StepChannel::Message::kDefine) {
      Status s = define ? define(channel.define_slot(), channel.define_description())
                        : FailedPreconditionError("this rank serves no variants");
      if (!s.ok()) {
        std::fprintf(stderr, "tensor-parallel rank %d: variant slot %d: %s\n", comm->rank(),
                     channel.define_slot(), s.ToString().c_str());
      }
      float failed = s.ok() ? 0.0f : static_cast<float>(int64_t{1} << std::min(comm->rank(), 23));
      comm->AllReduceSum(&failed, 1);
      continue;
    }
    // Rank 0's copy-on-write copies since the last step, in order: the same pages here.
    const std::span<const int32_t> copies = channel.page_copies();
    for (size_t i = 0; i < copies.size(); i += 2) {
      CHORUS_CHECK(copies[i] >= 0 && copies[i] < s.n_pages && copies[i + 1] >= 0 &&
                   copies[i + 1] < s.n_pages)
          << "tensor-parallel page copy outside the pool";
      std::memcpy(pages.PageData(copies[i + 1]), pages.PageData(copies[i]),
                  static_cast<size_t>(pages.page_bytes()));
    }
    StepInput in = channel.Input();
    in.logit_rows = {};  // the head runs on rank 0
    if (!channel.row_slots().empty()) {
      // A failure here cannot be skipped (rank 0 is already in the step's collectives), so it
      // ends this rank, and mpirun the job, with the reason.
      CHORUS_CHECK(hook_for != nullptr) << "rank 0 sent variant slots; this rank has no variants";
      Result<const LinearHook*> hook = hook_for(channel.row_slots());
      CHORUS_CHECK(hook.ok()) << "tensor-parallel rank " << comm->rank() << ": "
                              << hook.status().ToString();
      in.hook = *hook;
    }
    fwd.Run(in, &kv, &pool, nullptr);
  }
  return OkStatus();
}

}  // namespace chorus::model

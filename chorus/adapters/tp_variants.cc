#include "chorus/adapters/tp_variants.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "chorus/adapters/delta/delta_tp.h"
#include "chorus/adapters/fingerprint.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::adapters {

using json = nlohmann::json;

namespace {
constexpr int kLoaderNice = 10;
}  // namespace

std::string DescribeTpVariant(const VariantRef& ref) {
  json files = json::array();
  for (const AdapterFile& f : ref.files)
    files.push_back({{"path", f.path}, {"size", f.size}, {"mtime_ns", f.mtime_ns}});
  return json{{"name", ref.name},          {"kind", ref.kind},
              {"path", ref.path},          {"content_hash", ref.id.content_hash},
              {"version", ref.id.version}, {"files", files}}
      .dump();
}

Result<VariantRef> ParseTpVariant(std::string_view description) {
  const json j = json::parse(description, nullptr, /*allow_exceptions=*/false);
  auto bad = [&](const char* what) {
    return InvalidArgumentError(std::string("tensor-parallel variant definition: ") + what);
  };
  if (!j.is_object()) return bad("not a JSON object");
  for (const char* k : {"name", "kind", "path"}) {
    if (!j.contains(k) || !j[k].is_string()) return bad("a string field is missing");
  }
  for (const char* k : {"content_hash", "version"}) {
    if (!j.contains(k) || !j[k].is_number_unsigned()) return bad("a number field is missing");
  }
  if (!j.contains("files") || !j["files"].is_array()) return bad("no file list");
  VariantRef ref;
  ref.name = j["name"].get<std::string>();
  ref.kind = j["kind"].get<std::string>();
  ref.path = j["path"].get<std::string>();
  ref.id.content_hash = j["content_hash"].get<uint64_t>();
  ref.id.version = j["version"].get<uint64_t>();
  for (const json& f : j["files"]) {
    if (!f.is_object() || !f.contains("path") || !f["path"].is_string() || !f.contains("size") ||
        !f["size"].is_number_integer() || !f.contains("mtime_ns") ||
        !f["mtime_ns"].is_number_integer()) {
      return bad("a malformed file entry");
    }
    ref.files.push_back(
        {f["path"].get<std::string>(), f["size"].get<int64_t>(), f["mtime_ns"].get<int64_t>()});
  }
  return ref;
}

Result<int32_t> TpVariantSlots::Bind(const std::shared_ptr<const void>& copy,
                                     const VariantRef& ref) {
  CHORUS_CHECK(copy != nullptr);
  auto it = by_copy_.find(copy.get());
  if (it != by_copy_.end()) {
    if (it->second.copy.lock() == copy) return it->second.slot;
    // A copy that is gone left its address to this one: its slot is free again.
    free_.push_back(it->second.slot);
    by_copy_.erase(it);
  }
  if (free_.empty()) {
    // Slots of copies that no one holds any more are reusable: no planned row can name them.
    for (auto b = by_copy_.begin(); b != by_copy_.end();) {
      if (b->second.copy.expired()) {
        free_.push_back(b->second.slot);
        b = by_copy_.erase(b);
      } else {
        ++b;
      }
    }
  }
  int32_t slot;
  if (!free_.empty()) {
    slot = free_.back();
    free_.pop_back();
  } else {
    slot = next_slot_++;
  }
  ++definitions_;
  std::string description = DescribeTpVariant(ref);
  hinted_.erase(description);
  if (Status s = define_(slot, description); !s.ok()) {
    free_.push_back(slot);
    return s.WithContext("adapter '" + ref.name + "'");
  }
  by_copy_[copy.get()] = {copy, slot, std::move(description)};
  return slot;
}

bool TpVariantSlots::ShouldPrefetch(const VariantRef& ref) {
  std::string description = DescribeTpVariant(ref);
  for (const auto& [addr, b] : by_copy_) {
    if (b.description == description && !b.copy.expired()) return false;
  }
  if (hinted_.count(description) > 0) return false;
  if (hinted_.size() >= kMaxHinted) hinted_.clear();  // forgetting only costs a repeated hint
  hinted_.insert(std::move(description));
  return true;
}

int32_t TpVariantSlots::SlotOf(const void* copy) const {
  auto it = by_copy_.find(copy);
  CHORUS_CHECK(it != by_copy_.end()) << "a variant in a tensor-parallel step without a slot";
  return it->second.slot;
}

VariantSlotHook::VariantSlotHook(const model::ModelConfig& config, int64_t max_rows,
                                 dist::Communicator* comm)
    : lora_(config, max_rows, comm), delta_hook_(max_rows) {
  lora_slots_.reserve(static_cast<size_t>(max_rows));
  row_deltas_.reserve(static_cast<size_t>(max_rows));
}

void VariantSlotHook::Clear(int32_t slot) {
  CHORUS_CHECK(slot >= 0);
  lora_.Set(slot, nullptr);
  if (static_cast<size_t>(slot) < deltas_.size()) deltas_[static_cast<size_t>(slot)] = nullptr;
}

void VariantSlotHook::SetLora(int32_t slot, std::shared_ptr<const LoraAdapter> adapter) {
  Clear(slot);
  lora_.Set(slot, std::move(adapter));
}

void VariantSlotHook::SetDelta(int32_t slot, std::shared_ptr<const delta::DeltaWeights> delta) {
  Clear(slot);
  if (static_cast<size_t>(slot) >= deltas_.size()) deltas_.resize(static_cast<size_t>(slot) + 1);
  deltas_[static_cast<size_t>(slot)] = std::move(delta);
}

Result<const model::LinearHook*> VariantSlotHook::ForRows(std::span<const int32_t> slots) {
  lora_slots_.clear();
  row_deltas_.clear();
  bool any_lora = false, any_delta = false;
  for (int32_t s : slots) {
    const delta::DeltaWeights* d = s >= 0 && static_cast<size_t>(s) < deltas_.size()
                                       ? deltas_[static_cast<size_t>(s)].get()
                                       : nullptr;
    row_deltas_.push_back(d);
    lora_slots_.push_back(d != nullptr ? -1 : s);  // a LoRA slot, or an empty one: LoraSlotHook
    any_delta |= d != nullptr;                     // names it in its error
    any_lora |= d == nullptr && s >= 0;
  }
  hook_.Clear();
  if (any_lora) {
    CHORUS_ASSIGN_OR_RETURN(const model::LinearHook* h, lora_.ForRows(lora_slots_));
    hook_.Add(h);
  }
  if (any_delta) {
    CHORUS_RETURN_IF_ERROR(delta_hook_.SetRows(row_deltas_));
    hook_.Add(&delta_hook_);
  }
  return static_cast<const model::LinearHook*>(&hook_);
}

TpVariantWorker::TpVariantWorker(const model::ModelConfig& full, dist::Communicator* comm,
                                 int64_t max_rows, LoraLoadOptions opts,
                                 std::string base_weights_hash)
    : full_(full),
      rank_(comm->rank()),
      size_(comm->size()),
      opts_(std::move(opts)),
      base_weights_hash_(std::move(base_weights_hash)),
      slots_(model::ShardConfig(full, size_).value(), max_rows, comm) {}

TpVariantWorker::~TpVariantWorker() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (loader_.joinable()) loader_.join();  // a load in progress finishes first
}

Status TpVariantWorker::Define(int32_t slot, std::string_view description) {
  slots_.Clear(slot);  // whatever happens, the slot no longer holds what it held
  std::optional<Result<Loaded>> pre = TakePrefetched(std::string(description));
  if (pre) ++prefetch_hits_;
  Result<Loaded> v = pre ? std::move(*pre) : Load(description);
  if (!v.ok()) return v.status();
  if (v->delta) {
    slots_.SetDelta(slot, std::move(v->delta));
  } else {
    slots_.SetLora(slot, std::move(v->lora));
  }
  return OkStatus();
}

void TpVariantWorker::Prefetch(std::string_view description) {
  std::string d(description);
  {
    MutexLock lock(&mu_);
    if (loading_ == d) return;
    for (const std::string& q : queued_)
      if (q == d) return;
    for (const auto& [l, r] : loaded_)
      if (l == d) return;
    while (queued_.size() + loaded_.size() >= kMaxPrefetched) {
      if (!loaded_.empty()) {
        loaded_.pop_front();
      } else {
        queued_.pop_front();
      }
    }
    queued_.push_back(std::move(d));
  }
  if (!loader_.joinable()) loader_ = std::thread([this] { LoaderMain(); });
  cv_.SignalAll();
}

void TpVariantWorker::WaitForPrefetches() {
  MutexLock lock(&mu_);
  while (!queued_.empty() || !loading_.empty()) cv_.Wait(&mu_);
}

std::optional<Result<TpVariantWorker::Loaded>> TpVariantWorker::TakePrefetched(
    const std::string& description) {
  MutexLock lock(&mu_);
  for (auto q = queued_.begin(); q != queued_.end(); ++q) {
    if (*q == description) {  // not started: loading it here is no slower than waiting
      queued_.erase(q);
      return std::nullopt;
    }
  }
  while (loading_ == description) cv_.Wait(&mu_);
  for (auto l = loaded_.begin(); l != loaded_.end(); ++l) {
    if (l->first == description) {
      Result<Loaded> r = std::move(l->second);
      loaded_.erase(l);
      return r;
    }
  }
  return std::nullopt;
}

void TpVariantWorker::LoaderMain() {
  // Below the compute thread's priority: a prefetch must not slow the steps the ranks run
  // meanwhile (rank 0 would wait for this rank at every collective). Linux: `who` = 0 is the
  // calling thread. A refusal leaves it at the worker's priority.
  (void)::setpriority(PRIO_PROCESS, 0, kLoaderNice);
  for (;;) {
    std::string description;
    {
      MutexLock lock(&mu_);
      while (!stop_ && queued_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      loading_ = std::move(queued_.front());
      queued_.pop_front();
      description = loading_;
    }
    Result<Loaded> r = Load(description);  // the file read and conversion, off the lock
    {
      MutexLock lock(&mu_);
      loaded_.emplace_back(std::move(description), std::move(r));
      loading_.clear();
    }
    cv_.SignalAll();
  }
}

Result<TpVariantWorker::Loaded> TpVariantWorker::Load(std::string_view description) const {
  CHORUS_ASSIGN_OR_RETURN(VariantRef ref, ParseTpVariant(description));
  if (ref.kind != "lora" && ref.kind != "delta")
    return InvalidArgumentError("variant '" + ref.name + "' of unknown kind '" + ref.kind + "'");
  CHORUS_RETURN_IF_ERROR(
      VerifyRegisteredContent(ref.name, ref.path, ref.files, ref.id.content_hash));
  if (ref.kind == "delta") {
    CHORUS_ASSIGN_OR_RETURN(
        auto d, delta::LoadDeltaWeightsShard(ref.path, full_, base_weights_hash_, rank_, size_,
                                             ref.name, opts_.limits.arena, ref.id.ToString()));
    return Loaded{nullptr, std::move(d)};
  }
  LoraLoadOptions lo = opts_;
  lo.id = ref.id;
  CHORUS_ASSIGN_OR_RETURN(auto adapter,
                          LoadLoraAdapterShard(ref.path, full_, rank_, size_, lo, ref.name));
  return Loaded{std::move(adapter), nullptr};
}

}  // namespace chorus::adapters

#include "chorus/engine/full_models.h"

#include <cstdio>
#include <filesystem>

#include "chorus/adapters/registry.h"
#include "chorus/base/logging.h"
#include "chorus/model/loader.h"

namespace chorus::engine {

using Clock = std::chrono::steady_clock;

int64_t ProcessReadBytes() {
  std::FILE* fp = std::fopen("/proc/self/io", "r");
  if (fp == nullptr) return 0;
  char line[128];
  long long v = 0;
  while (std::fgets(line, sizeof(line), fp)) {
    if (std::sscanf(line, "read_bytes: %lld", &v) == 1) break;
  }
  std::fclose(fp);
  return static_cast<int64_t>(v);
}

Status CheckSameShape(const model::ModelConfig& base, const model::ModelConfig& m,
                      const std::string& what) {
  // Summary() names the architecture, every dimension, the vocabulary, the context, RoPE and
  // the attention variants: what the engine's KV layout, step arrays and tokenizer depend on.
  const std::string b = base.Summary(), s = m.Summary();
  if (b != s || base.norm_eps != m.norm_eps || base.layer_sliding != m.layer_sliding ||
      base.norm_plus_one != m.norm_plus_one || base.sandwich_norms != m.sandwich_norms ||
      base.embed_scale != m.embed_scale) {
    return InvalidArgumentError(what + " is not the base model's shape: it has " + s +
                                " (norm_eps " + std::to_string(m.norm_eps) + "), the base " + b +
                                " (norm_eps " + std::to_string(base.norm_eps) + ")");
  }
  return OkStatus();
}

FullModels::FullModels(Options opts, EngineMetrics* metrics, std::function<void()> wake)
    : opts_(opts), metrics_(metrics), wake_(std::move(wake)) {}

Result<std::unique_ptr<FullModels>> FullModels::Create(const std::vector<FullModelSpec>& specs,
                                                       const model::ModelConfig& base,
                                                       const std::string& base_name, Options opts,
                                                       EngineMetrics* metrics,
                                                       std::function<void()> wake) {
  if (opts.max_resident < 1 || opts.max_resident > 4096)
    return InvalidArgumentError("max-resident-models must be in [1, 4096]");
  if (specs.empty()) return InvalidArgumentError("--swap-full-models needs --full-model NAME=PATH");
  std::unique_ptr<FullModels> fm(new FullModels(opts, metrics, std::move(wake)));
  uint64_t version = 0;
  for (const FullModelSpec& s : specs) {
    const std::string what = "full model '" + s.name + "' (" + s.path + ")";
    if (!adapters::IsValidAdapterName(s.name))
      return InvalidArgumentError("full model name '" + s.name.substr(0, 64) +
                                  "' is not valid: 1..128 characters of [A-Za-z0-9._:/-]");
    if (s.name == base_name)
      return InvalidArgumentError(what + ": the name is the base model's served name");
    if (fm->entries_.count(s.name) != 0)
      return InvalidArgumentError(what + ": the name is given twice");
    std::error_code ec;
    if (!std::filesystem::exists(s.path, ec))
      return InvalidArgumentError(what + ": no such file or directory");
    // Validated as a swap-in will load it (read, converted, repacked), then dropped: the first
    // request for it must not be the one to find that it cannot be served. Its pages stay in
    // the page cache, as after every swap-in (SwapMain).
    auto m = model::LoadModel(s.path, model::SourcePages::kKeep);
    if (!m.ok()) return m.status().WithContext(what);
    CHORUS_RETURN_IF_ERROR(CheckSameShape(base, (*m)->config(), what));
    // The identity of the registration (adapters/variant.h): the file's size and modification
    // time stand in for a content hash (hashing gigabytes at start-up would double its cost);
    // the version numbers the command line's models.
    const auto size = std::filesystem::is_regular_file(s.path, ec)
                          ? static_cast<uint64_t>(std::filesystem::file_size(s.path, ec))
                          : 0;
    const auto mtime = static_cast<uint64_t>(
        std::filesystem::last_write_time(s.path, ec).time_since_epoch().count());
    adapters::VariantRef ref{
        .name = s.name,
        .id = {.content_hash = (size * 0x9E3779B97F4A7C15ull) ^ mtime, .version = ++version},
        .kind = "full",
        .path = std::filesystem::absolute(s.path, ec).string()};
    fm->refs_.push_back(ref);
    fm->entries_[s.name].ref = std::move(ref);
  }
  fm->thread_ = std::thread([raw = fm.get()] { raw->SwapMain(); });
  return fm;
}

FullModels::~FullModels() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

FullModels::Entry* FullModels::Find(const std::string& name) {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

void FullModels::SwapMain() {
  for (;;) {
    Entry* e;
    {
      MutexLock lock(&mu_);
      while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      e = jobs_.front();
      jobs_.pop_front();
    }
    // Only the immutable ref is read here; the entry's state belongs to the engine thread.
    const std::string path = e->ref.path;
    const auto t0 = Clock::now();
    const int64_t read0 = ProcessReadBytes();
    Done d{e, nullptr, nullptr, OkStatus()};
    // Keep the file in the page cache: a model swapped out is read again at its next swap-in,
    // as a model server reading its checkpoints through the page cache would.
    auto m = model::LoadModel(path, model::SourcePages::kKeep);
    if (m.ok()) {
      d.model = *m;
      d.forward = std::make_unique<model::Forward>(d.model, opts_.max_rows, opts_.max_logit_rows);
    } else {
      d.status = m.status().WithContext("full model '" + e->ref.name + "'");
    }
    const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    const int64_t read = ProcessReadBytes() - read0;
    std::error_code ec;
    const auto bytes = std::filesystem::is_regular_file(path, ec)
                           ? static_cast<int64_t>(std::filesystem::file_size(path, ec))
                           : 0;
    if (d.status.ok()) {
      metrics_->full_model_swaps.fetch_add(1);
      metrics_->full_model_swap_seconds.Observe(seconds);
      metrics_->full_model_swap_file_bytes.fetch_add(
          static_cast<uint64_t>(std::max<int64_t>(bytes, 0)));
      metrics_->full_model_swap_read_bytes.fetch_add(
          static_cast<uint64_t>(std::max<int64_t>(read, 0)));
      CHORUS_LOG(INFO) << "full model '" << e->ref.name << "' swapped in: " << seconds << " s, "
                       << bytes << " file bytes, " << read << " bytes read from storage";
    } else {
      metrics_->full_model_swap_errors.fetch_add(1);
      CHORUS_LOG(WARNING) << d.status.ToString();
    }
    {
      MutexLock lock(&mu_);
      done_.push_back(std::move(d));
    }
    if (wake_) wake_();
  }
}

void FullModels::Poll() {
  std::vector<Done> done;
  {
    MutexLock lock(&mu_);
    done.swap(done_);
  }
  for (Done& d : done) {
    Entry* e = d.entry;
    CHORUS_CHECK(e->state == State::kLoading);
    if (d.status.ok()) {
      e->state = State::kResident;
      e->model = std::move(d.model);
      e->forward = std::move(d.forward);
      e->last_use = ++tick_;
    } else {
      e->state = State::kFailed;
      e->error = std::move(d.status);
    }
  }
  metrics_->full_models_resident.store(resident());
}

int64_t FullModels::resident() const {
  int64_t n = 0;
  for (const auto& [name, e] : entries_) n += e.state == State::kResident;
  return n;
}

void FullModels::Evict(Entry* e) {
  CHORUS_CHECK(e->state == State::kResident && e->users == 0);
  e->forward.reset();
  e->model.reset();  // the weights go now: at most max_resident models are ever held
  e->state = State::kAbsent;
  metrics_->full_model_evictions.fetch_add(1);
  CHORUS_LOG(INFO) << "full model '" << e->ref.name << "' evicted";
}

bool FullModels::Want(Entry* e) {
  if (e->state == State::kResident) return true;
  if (e->state == State::kLoading) return false;
  // kAbsent, or kFailed (a file that failed may have been fixed: try again).
  int64_t held = 0;
  Entry* victim = nullptr;
  for (auto& [name, o] : entries_) {
    if (o.state != State::kResident && o.state != State::kLoading) continue;
    ++held;
    if (o.state == State::kResident && o.users == 0 &&
        (victim == nullptr || o.last_use < victim->last_use))
      victim = &o;
  }
  if (held >= opts_.max_resident) {
    if (victim == nullptr) return false;  // every slot is busy: the request waits
    Evict(victim);
  }
  e->state = State::kLoading;
  e->error = OkStatus();
  {
    MutexLock lock(&mu_);
    jobs_.push_back(e);
  }
  cv_.Signal();
  metrics_->full_models_resident.store(resident());
  return false;
}

void FullModels::Pin(Entry* e) {
  CHORUS_CHECK(e->state == State::kResident);
  ++e->users;
  e->last_use = ++tick_;
}

void FullModels::Unpin(Entry* e) {
  CHORUS_CHECK(e->users > 0);
  --e->users;
  e->last_use = ++tick_;
}

}  // namespace chorus::engine

#include "chorus/engine/adapter_residency.h"

#include <cstdio>

#include "chorus/base/logging.h"

namespace chorus::engine {

using adapters::LoraAdapter;
using delta::DeltaWeights;
using Clock = std::chrono::steady_clock;

AdapterResidency::AdapterResidency(memory::PagePool* pool, EngineMetrics* metrics,
                                   std::shared_ptr<adapters::AdapterCache> cache,
                                   std::function<void()> wake, Options opts)
    : pool_(pool),
      metrics_(metrics),
      cache_(std::move(cache)),
      wake_(std::move(wake)),
      opts_(opts) {
  const int n = std::max(1, opts_.loader_threads);
  for (int i = 0; i < n; ++i) loaders_.emplace_back([this] { LoaderMain(); });
}

AdapterResidency::~AdapterResidency() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  for (auto& t : loaders_) t.join();
  // Tickets still queued never ran: complete them so nobody waits forever.
  for (Job& j : jobs_) {
    if (j.ticket) {
      j.ticket->status = UnavailableError("server is shutting down");
      j.ticket->done.store(true, std::memory_order_release);
    }
  }
}

void AdapterResidency::LoaderMain() {
  for (;;) {
    Job job;
    {
      MutexLock lock(&mu_);
      while (!stop_ && jobs_.empty()) cv_.Wait(&mu_);
      if (stop_) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    if (job.paged != nullptr) {
      job.paged->CopyIn();
      MutexLock lock(&mu_);
      copied_.emplace_back(std::move(job.entry), Clock::now());
      continue;  // the engine applies it at its next step; nothing waits for it
    }
    const auto t0 = Clock::now();
    Status st;
    if (!cache_) {
      st = UnavailableError("no adapter cache");
    } else if (job.key.kind == "delta") {
      auto r = cache_->GetDelta(job.key);
      if (r.ok()) job.ticket->delta = *r;
      st = r.status();
    } else {
      auto r = cache_->Get(job.key);
      if (r.ok()) job.ticket->adapter = *r;
      st = r.status();
    }
    metrics_->adapter_disk_load_seconds.Observe(
        std::chrono::duration<double>(Clock::now() - t0).count());
    metrics_->adapter_disk_loads.fetch_add(1);
    if (!st.ok()) {
      metrics_->adapter_disk_load_errors.fetch_add(1);
      CHORUS_LOG(WARNING) << "adapter '" << job.key.name << "' failed to load: " << st.ToString();
      job.ticket->status = std::move(st);
    }
    job.ticket->done.store(true, std::memory_order_release);
    if (wake_) wake_();
  }
}

std::shared_ptr<AdapterTicket> AdapterResidency::Load(const adapters::VariantRef& key) {
  auto t = std::make_shared<AdapterTicket>();
  // A host-cache hit is handed over at once (no file is read); a miss queues a disk load.
  if (cache_ && !key.id.empty()) {
    if (key.kind == "delta") {
      if (auto hit = cache_->GetDeltaIfCached(key.id)) {
        t->delta = std::move(hit);
        t->done.store(true, std::memory_order_release);
        return t;
      }
    } else if (auto hit = cache_->GetIfCached(key.id)) {
      t->adapter = std::move(hit);
      t->done.store(true, std::memory_order_release);
      return t;
    }
  }
  {
    MutexLock lock(&mu_);
    if (stop_) {
      t->status = UnavailableError("server is shutting down");
      t->done.store(true);
      return t;
    }
    jobs_.push_back(Job{nullptr, "", key, t});
  }
  cv_.Signal();
  return t;
}

void AdapterResidency::Forget(const std::string& name) {
  MutexLock lock(&mu_);
  forget_.push_back(name);
}

std::string AdapterResidency::KeyOf(const LoraAdapter* a) {
  if (!a->id().empty()) return a->id().ToString();
  char buf[32];
  std::snprintf(buf, sizeof(buf), "@%p", static_cast<const void*>(a));
  return buf;
}

std::string AdapterResidency::KeyOf(const DeltaWeights* d) {
  if (!d->identity().empty()) return "delta:" + d->identity();
  char buf[40];
  std::snprintf(buf, sizeof(buf), "delta@%p", static_cast<const void*>(d));
  return buf;
}

void AdapterResidency::Poll() {
  std::vector<std::pair<std::string, Clock::time_point>> copied;
  std::vector<std::string> forget;
  {
    MutexLock lock(&mu_);
    copied.swap(copied_);
    forget.swap(forget_);
  }
  for (const auto& [key, done] : copied) {
    auto it = entries_.find(key);
    CHORUS_CHECK(it != entries_.end() && it->second.paged != nullptr &&
                 it->second.state == State::kLoading);
    Entry& e = it->second;
    e.state = State::kResident;
    metrics_->adapter_pool_loads.fetch_add(1);
    metrics_->adapter_pool_load_seconds.Observe(
        std::chrono::duration<double>(done - e.load_start).count());
    if (e.host_has_id) {
      // The rows have landed: the host tier may now evict its copy; a reload finds this one.
      e.paged->ReleaseHost();
      e.host.reset();
    }
    if (e.forgotten && e.pins == 0) Drop(key);
  }
  for (const std::string& name : forget) {
    std::vector<std::string> drop;
    for (auto& [key, e] : entries_) {
      if (e.name != name) continue;
      e.forgotten = true;
      if (e.pins == 0 && e.state != State::kLoading) drop.push_back(key);
    }
    for (const std::string& key : drop) Drop(key);
  }
  PublishGauges();
}

void AdapterResidency::FreePoolCopy(Entry* e) {
  if (!e->paged) return;
  CHORUS_CHECK(e->state != State::kLoading);
  pool_->Free(e->paged->pages());
  e->paged.reset();
  e->lora_view = nullptr;
  e->delta_view = nullptr;
  e->state = State::kHostOnly;
}

void AdapterResidency::Drop(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end()) return;
  if (it->second.paged) metrics_->adapter_pool_evictions.fetch_add(1);
  FreePoolCopy(&it->second);
  entries_.erase(it);
}

void AdapterResidency::MaybeErase(const std::string& key) {
  auto it = entries_.find(key);
  if (it == entries_.end() || it->second.pins > 0 || it->second.state == State::kLoading) return;
  if (it->second.forgotten || it->second.state == State::kHostOnly) Drop(key);
}

void AdapterResidency::PinKey(const std::string& key, const std::string& name,
                              std::shared_ptr<const void> host, bool has_id) {
  Entry& e = entries_[key];
  if (e.name.empty()) e.name = name;
  // A host-only entry serves rows from its host copy: keep the newest one (a reload's), so an
  // evicted-and-reloaded copy is what the host tier accounts for.
  if (e.state == State::kHostOnly) {
    e.host = std::move(host);
    e.host_has_id = has_id;
  }
  ++e.pins;
  e.last_use = ++tick_;
  if (e.state == State::kResident) {
    metrics_->adapter_pool_hits.fetch_add(1);
  } else {
    metrics_->adapter_pool_misses.fetch_add(1);
  }
}

void AdapterResidency::Pin(const std::shared_ptr<const LoraAdapter>& a) {
  PinKey(KeyOf(a.get()), a->name(), a, !a->id().empty());
}

void AdapterResidency::Pin(const std::shared_ptr<const DeltaWeights>& d) {
  PinKey(KeyOf(d.get()), d->name(), d, !d->identity().empty());
}

void AdapterResidency::UnpinKey(const std::string& key) {
  auto it = entries_.find(key);
  CHORUS_CHECK(it != entries_.end() && it->second.pins > 0)
      << "unpin of an adapter that is not pinned";
  --it->second.pins;
  it->second.last_use = ++tick_;
  MaybeErase(key);
}

void AdapterResidency::Unpin(const LoraAdapter* a) { UnpinKey(KeyOf(a)); }
void AdapterResidency::Unpin(const DeltaWeights* d) { UnpinKey(KeyOf(d)); }

const adapters::LoraView* AdapterResidency::View(const LoraAdapter* a) {
  auto it = entries_.find(KeyOf(a));
  if (it == entries_.end() || it->second.state != State::kResident) return a;
  it->second.last_use = ++tick_;
  return it->second.lora_view;
}

const delta::DeltaView* AdapterResidency::View(const DeltaWeights* d) {
  auto it = entries_.find(KeyOf(d));
  if (it == entries_.end() || it->second.state != State::kResident) return d;
  it->second.last_use = ++tick_;
  return it->second.delta_view;
}

bool AdapterResidency::WantsPoolCopy(const std::string& key) const {
  auto it = entries_.find(key);
  return it == entries_.end() || (it->second.state == State::kHostOnly && !it->second.forgotten);
}

bool AdapterResidency::StateIs(const std::string& key, State state) const {
  auto it = entries_.find(key);
  return it != entries_.end() && it->second.state == state;
}

bool AdapterResidency::Resident(const LoraAdapter* a) const {
  return StateIs(KeyOf(a), State::kResident);
}
bool AdapterResidency::Resident(const DeltaWeights* d) const {
  return StateIs(KeyOf(d), State::kResident);
}
bool AdapterResidency::Loading(const LoraAdapter* a) const {
  return StateIs(KeyOf(a), State::kLoading);
}
bool AdapterResidency::Loading(const DeltaWeights* d) const {
  return StateIs(KeyOf(d), State::kLoading);
}

void AdapterResidency::Prefetch(const std::shared_ptr<const LoraAdapter>& a, int64_t keep_free,
                                bool may_evict) {
  const std::string key = KeyOf(a.get());
  if (!opts_.pool_copies || !WantsPoolCopy(key)) return;
  auto need = adapters::PagedLora::PagesNeeded(*a, pool_->page_bytes());
  if (!need.ok()) return;  // a row larger than a page: served from the host copy
  StartPoolCopy(key, a->name(), a, !a->id().empty(), *need, keep_free, may_evict,
                [&](std::vector<int32_t> pages) -> Result<NewCopy> {
                  CHORUS_ASSIGN_OR_RETURN(auto paged,
                                          adapters::PagedLora::Create(a, pool_, std::move(pages)));
                  NewCopy made;
                  made.lora_view = paged.get();
                  made.copy = std::move(paged);
                  return made;
                });
}

void AdapterResidency::Prefetch(const std::shared_ptr<const DeltaWeights>& d, int64_t keep_free,
                                bool may_evict) {
  const std::string key = KeyOf(d.get());
  if (!opts_.pool_copies || !WantsPoolCopy(key)) return;
  auto need = delta::PagedDelta::PagesNeeded(*d, pool_->page_bytes());
  if (!need.ok()) return;  // a band larger than a page: served from the host copy
  StartPoolCopy(key, d->name(), d, !d->identity().empty(), *need, keep_free, may_evict,
                [&](std::vector<int32_t> pages) -> Result<NewCopy> {
                  CHORUS_ASSIGN_OR_RETURN(auto paged,
                                          delta::PagedDelta::Create(d, pool_, std::move(pages)));
                  NewCopy made;
                  made.delta_view = paged.get();
                  made.copy = std::move(paged);
                  return made;
                });
}

void AdapterResidency::StartPoolCopy(
    const std::string& key, const std::string& name, std::shared_ptr<const void> host, bool has_id,
    int64_t need, int64_t keep_free, bool may_evict,
    const std::function<Result<NewCopy>(std::vector<int32_t>)>& make) {
  if (!WantsPoolCopy(key)) return;
  if (may_evict) EvictFor(need + keep_free);
  if (pool_->n_free() < need + keep_free) return;
  auto pages = pool_->Allocate(need, memory::PageKind::kAdapter);
  if (!pages.ok()) return;
  auto made = make(*pages);
  if (!made.ok()) {
    pool_->Free(*pages);
    CHORUS_LOG(WARNING) << "pool copy of '" << name << "': " << made.status().ToString();
    return;
  }
  Entry& e = entries_[key];
  e.host = std::move(host);  // held until the copy lands (the copy holds it too)
  e.host_has_id = has_id;
  if (e.name.empty()) e.name = name;
  e.paged = std::move(made->copy);
  e.lora_view = made->lora_view;
  e.delta_view = made->delta_view;
  e.state = State::kLoading;
  e.load_start = Clock::now();
  if (e.last_use == 0) e.last_use = ++tick_;
  {
    MutexLock lock(&mu_);
    jobs_.push_front(
        Job{e.paged.get(), key, {}, nullptr});  // pool copies are short: ahead of disk loads
  }
  cv_.Signal();
}

bool AdapterResidency::EvictFor(int64_t n_free) {
  while (pool_->n_free() < n_free) {
    const std::string* victim = nullptr;
    uint64_t oldest = UINT64_MAX;
    for (const auto& [key, e] : entries_) {
      if (e.state == State::kResident && e.pins == 0 && e.last_use < oldest) {
        oldest = e.last_use;
        victim = &key;
      }
    }
    if (victim == nullptr) return false;
    const std::string key = *victim;
    Entry& e = entries_.at(key);
    CHORUS_LOG(DEBUG) << "evict adapter '" << e.name << "' from the pool";
    metrics_->adapter_pool_evictions.fetch_add(1);
    FreePoolCopy(&e);
    MaybeErase(key);
  }
  return true;
}

int64_t AdapterResidency::pages_used() const { return pool_->n_used(memory::PageKind::kAdapter); }

void AdapterResidency::PublishGauges() {
  int64_t resident = 0;
  for (const auto& [key, e] : entries_) resident += e.state == State::kResident ? 1 : 0;
  metrics_->adapters_resident.store(resident);
  metrics_->pool_pages_total.store(pool_->n_pages());
  metrics_->pool_pages_kv.store(pool_->n_used(memory::PageKind::kKv));
  metrics_->pool_pages_adapter.store(pool_->n_used(memory::PageKind::kAdapter));
}

}  // namespace chorus::engine

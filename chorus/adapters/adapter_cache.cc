#include "chorus/adapters/adapter_cache.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "chorus/adapters/delta/delta_tp.h"
#include "chorus/adapters/lora/lora_tp.h"
#include "chorus/memory/host_arena.h"

namespace chorus::adapters {

const std::vector<double>& AdapterCache::LoadSecondsBounds() {
  static const std::vector<double> kBounds = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25,  0.5,    1,     2.5,  5,     10};
  return kBounds;
}

namespace {

// Decoded copies are built into one arena as large as the cache (memory/host_arena.h), unless
// the caller brought its own.
LoraLimits WithArena(LoraLimits limits, int64_t max_bytes) {
  if (!limits.arena && max_bytes > 0) {
    limits.arena = std::make_shared<memory::HostArena>(static_cast<size_t>(max_bytes));
  }
  return limits;
}

}  // namespace

AdapterCache::AdapterCache(model::ModelConfig base, int64_t max_bytes, LoraLimits limits,
                           std::string base_weights_hash, TensorParallelShard shard)
    : base_(std::move(base)),
      shard_(shard),
      max_bytes_(max_bytes),
      limits_(WithArena(std::move(limits), max_bytes)),
      base_weights_hash_(std::move(base_weights_hash)) {}

void AdapterCache::CountLoadLocked(double secs) {
  ++stats_.loads;
  stats_.load_seconds_total += secs;
  stats_.last_load_seconds = secs;
  const auto& b = LoadSecondsBounds();
  // Prometheus buckets are "≤ le": the first bound not below secs.
  const size_t i = static_cast<size_t>(std::lower_bound(b.begin(), b.end(), secs) - b.begin());
  ++stats_.load_seconds_buckets[i];
}

Result<std::shared_ptr<const delta::DeltaWeights>> AdapterCache::GetDelta(const VariantRef& key) {
  CHORUS_CHECK(!key.id.empty()) << "AdapterCache::GetDelta of '" << key.name << "' without an id";
  {
    MutexLock lock(&mu_);
    for (;;) {
      auto it = deltas_.find(key.id);
      if (it == deltas_.end()) break;
      if (!it->second.loading) {
        ++stats_.hits;
        it->second.last_use = ++tick_;
        return it->second.weights;
      }
      // Another thread is loading this delta: wait for its copy instead of reading the file a
      // second time (a TinyLlama-shape delta is ~120 MB and ~0.5 s of a core; with two loader
      // threads, two requests for one cold delta loaded it twice).
      loaded_.Wait(&mu_);
    }
    ++stats_.misses;
    DeltaEntry& e = deltas_[key.id];
    e.loading = true;
    e.name = key.name;
  }
  const auto t0 = std::chrono::steady_clock::now();
  // As for LoRA adapters: never load changed files under the registered identity.
  auto loaded = [&]() -> Result<std::shared_ptr<const delta::DeltaWeights>> {
    CHORUS_RETURN_IF_ERROR(
        VerifyRegisteredContent(key.name, key.path, key.files, key.id.content_hash));
    CHORUS_ASSIGN_OR_RETURN(std::vector<AdapterFile> before, CurrentFingerprints(key.files));
    CHORUS_ASSIGN_OR_RETURN(auto w, delta::LoadDeltaWeightsShard(
                                        key.path, base_, base_weights_hash_, shard_.rank,
                                        shard_.size, key.name, limits_.arena, key.id.ToString()));
    if (!CheckFingerprints(before).ok()) {
      return UnavailableError("delta '" + key.name + "': " + key.path +
                              " changed while being loaded; try again");
    }
    return w;
  }();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MutexLock lock(&mu_);
  // Erase() leaves loading entries alone, so this load's entry is still there.
  auto it = deltas_.find(key.id);
  CHORUS_CHECK(it != deltas_.end() && it->second.loading);
  if (!loaded.ok()) {
    ++stats_.load_errors;
    deltas_.erase(it);  // not cached: a waiter tries the load itself and gets its own error
    loaded_.SignalAll();
    return loaded.status();
  }
  CountLoadLocked(secs);
  std::shared_ptr<const delta::DeltaWeights> out = *loaded;
  it->second.weights = out;
  it->second.bytes = delta::DeltaWeightsBytes(*out);
  it->second.loading = false;
  it->second.last_use = ++tick_;
  stats_.bytes += it->second.bytes;
  ++stats_.entries;
  EvictLocked();
  loaded_.SignalAll();
  return out;
}

std::shared_ptr<const delta::DeltaWeights> AdapterCache::GetDeltaIfCached(const VariantId& id) {
  MutexLock lock(&mu_);
  auto it = deltas_.find(id);
  if (it == deltas_.end() || it->second.loading) return nullptr;
  ++stats_.hits;
  it->second.last_use = ++tick_;
  return it->second.weights;
}

Result<std::shared_ptr<const LoraAdapter>> AdapterCache::Get(const VariantRef& key) {
  CHORUS_CHECK(!key.id.empty()) << "AdapterCache::Get of '" << key.name << "' without an id";
  const VariantId id = key.id;
  {
    MutexLock lock(&mu_);
    for (;;) {
      auto it = entries_.find(id);
      if (it == entries_.end()) break;
      if (!it->second.loading) {
        ++stats_.hits;
        lru_.splice(lru_.begin(), lru_, it->second.lru);
        return it->second.adapter;
      }
      loaded_.Wait(&mu_);  // another thread is loading this adapter
    }
    ++stats_.misses;
    Entry& e = entries_[id];
    e.loading = true;
    e.name = key.name;
    lru_.push_front(id);
    e.lru = lru_.begin();
  }

  const auto t0 = std::chrono::steady_clock::now();
  LoraLoadOptions lo;
  lo.limits = limits_;
  lo.id = key.id;
  // Never load changed files under the registered identity: check them before, and that they
  // did not change while being read.
  auto loaded = [&]() -> Result<std::shared_ptr<const LoraAdapter>> {
    CHORUS_RETURN_IF_ERROR(
        VerifyRegisteredContent(key.name, key.path, key.files, key.id.content_hash));
    CHORUS_ASSIGN_OR_RETURN(std::vector<AdapterFile> before, CurrentFingerprints(key.files));
    CHORUS_ASSIGN_OR_RETURN(auto adapter, LoadLoraAdapterShard(key.path, base_, shard_.rank,
                                                               shard_.size, lo, key.name));
    if (!CheckFingerprints(before).ok()) {
      return UnavailableError("adapter '" + key.name + "': " + key.path +
                              " changed while being loaded; try again");
    }
    return adapter;
  }();
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (!loaded.ok()) {
    ++stats_.load_errors;
    if (it != entries_.end()) {
      lru_.erase(it->second.lru);
      entries_.erase(it);
    }
    loaded_.SignalAll();
    return loaded.status();
  }
  CountLoadLocked(secs);
  std::shared_ptr<const LoraAdapter> adapter = *loaded;
  if (it != entries_.end()) {  // not erased meanwhile
    it->second.adapter = adapter;
    it->second.loading = false;
    stats_.bytes += adapter->memory_bytes();
    ++stats_.entries;
    EvictLocked();
  }
  loaded_.SignalAll();
  return adapter;
}

std::shared_ptr<const LoraAdapter> AdapterCache::GetIfCached(const VariantId& id) {
  MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.loading) return nullptr;
  ++stats_.hits;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return it->second.adapter;
}

void AdapterCache::EvictLocked() {
  // Least recently used first; entries in use (held outside the cache) or loading are skipped.
  auto it = lru_.end();
  while (stats_.bytes > max_bytes_ && it != lru_.begin()) {
    --it;
    auto e = entries_.find(*it);
    if (e == entries_.end() || e->second.loading || e->second.adapter.use_count() > 1) continue;
    stats_.bytes -= e->second.adapter->memory_bytes();
    --stats_.entries;
    ++stats_.evictions;
    entries_.erase(e);
    it = lru_.erase(it);
  }
  // Then deltas nobody holds, least recently used first.
  while (stats_.bytes > max_bytes_) {
    auto victim = deltas_.end();
    for (auto d = deltas_.begin(); d != deltas_.end(); ++d) {
      if (d->second.loading || d->second.weights.use_count() > 1) continue;
      if (victim == deltas_.end() || d->second.last_use < victim->second.last_use) victim = d;
    }
    if (victim == deltas_.end()) break;
    stats_.bytes -= victim->second.bytes;
    --stats_.entries;
    ++stats_.evictions;
    deltas_.erase(victim);
  }
}

void AdapterCache::Erase(const std::string& name) {
  MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (it->second.name == name && !it->second.loading) {
      stats_.bytes -= it->second.adapter->memory_bytes();
      --stats_.entries;
      lru_.erase(it->second.lru);
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = deltas_.begin(); it != deltas_.end();) {
    if (it->second.name == name && !it->second.loading) {
      stats_.bytes -= it->second.bytes;
      --stats_.entries;
      it = deltas_.erase(it);
    } else {
      ++it;
    }
  }
}

AdapterCache::Stats AdapterCache::stats() const {
  Stats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
  }
  if (const auto& arena = limits_.arena) {
    s.arena_bytes = static_cast<int64_t>(arena->bytes());
    s.arena_prefaulted_bytes = static_cast<int64_t>(arena->prefaulted_bytes());
    s.arena_used_bytes = static_cast<int64_t>(arena->bytes_in_use());
  }
  return s;
}

}  // namespace chorus::adapters

#include "chorus/memory/prefix_cache.h"

#include <algorithm>

namespace chorus::memory {
namespace {

// splitmix64's finalizer: a fast 64-bit mix (keys are verified, so collisions only cost a miss).
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

}  // namespace

uint64_t PrefixVariantKey(uint64_t content_hash, uint64_t version) {
  if (content_hash == 0 && version == 0) return 0;
  const uint64_t k = Mix(content_hash ^ Mix(version + 0x9e3779b97f4a7c15ull));
  return k == 0 ? 1 : k;
}

PrefixCache::PrefixCache(KvCache* kv) : kv_(kv), block_size_(kv->layout().block_size) {}

PrefixCache::~PrefixCache() {
  std::vector<int32_t> one(1);
  for (auto& [key, e] : entries_) {
    kv_->SetCacheMark(e.block, false);
    one.assign(1, e.block);
    kv_->Release(&one);
  }
}

uint64_t PrefixCache::KeyOf(uint64_t parent_key, uint64_t variant,
                            std::span<const int32_t> block) const {
  uint64_t h = Mix(parent_key ^ 0x5851f42d4c957f2dull) ^ Mix(variant + 1);
  for (int32_t t : block) h = Mix(h ^ static_cast<uint32_t>(t));
  return h;
}

PrefixCache::Entry* PrefixCache::Find(uint64_t parent_key, uint64_t parent_serial, uint64_t variant,
                                      std::span<const int32_t> block, uint64_t* key) {
  *key = KeyOf(parent_key, variant, block);
  auto it = entries_.find(*key);
  if (it == entries_.end()) return nullptr;
  Entry& e = it->second;
  if (e.parent_serial != parent_serial || e.variant != variant ||
      !std::equal(block.begin(), block.end(), e.tokens.begin(), e.tokens.end())) {
    return nullptr;  // a hash collision: not this block
  }
  return &e;
}

void PrefixCache::Touch(Entry* e, uint64_t key) {
  lru_.erase(e->lru);
  lru_.push_front(key);
  e->lru = lru_.begin();
}

int64_t PrefixCache::Match(uint64_t variant, std::span<const int32_t> tokens, int64_t max_tokens,
                           std::vector<int32_t>* table, PrefixChain* chain) {
  CHORUS_CHECK(table->empty());
  *chain = PrefixChain{};
  const int64_t n_blocks =
      std::min<int64_t>(static_cast<int64_t>(tokens.size()), max_tokens) / block_size_;
  std::vector<std::pair<Entry*, uint64_t>> hits;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint64_t key = 0;
    Entry* e =
        Find(chain->key, chain->serial, variant,
             tokens.subspan(static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_)),
             &key);
    if (e == nullptr) break;
    hits.emplace_back(e, key);
    table->push_back(e->block);
    chain->blocks = b + 1;
    chain->key = key;
    chain->serial = e->serial;
  }
  for (auto& [e, key] : hits) Touch(e, key);
  *table = kv_->Fork(*table);  // this sequence's own reference on each matched block
  return chain->blocks * block_size_;
}

void PrefixCache::Insert(uint64_t variant, std::span<const int32_t> tokens, int64_t n_computed,
                         const std::vector<int32_t>& table, PrefixChain* chain) {
  const int64_t full =
      std::min<int64_t>(n_computed / block_size_, static_cast<int64_t>(table.size()));
  for (int64_t b = chain->blocks; b < full; ++b) {
    const std::span<const int32_t> block =
        tokens.subspan(static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_));
    uint64_t key = 0;
    Entry* e = Find(chain->key, chain->serial, variant, block, &key);
    if (e == nullptr) {
      if (entries_.count(key) != 0) return;  // a colliding entry holds the key: stop the chain
      Entry* parent = nullptr;
      if (chain->serial != 0) {
        // The chain may run through an entry another sequence registered (a duplicate block);
        // if that entry was evicted since, the chain cannot grow from it.
        auto p = entries_.find(chain->key);
        if (p == entries_.end() || p->second.serial != chain->serial) return;
        parent = &p->second;
      }
      const int32_t blk = table[static_cast<size_t>(b)];
      if (blk == KvCache::kDroppedBlock) return;     // behind a sliding window: gone
      std::vector<int32_t> held = kv_->Fork({blk});  // the cache's own reference
      Entry& n = entries_[key];
      n.block = held[0];
      kv_->SetCacheMark(n.block, true);
      n.serial = next_serial_++;
      n.parent_serial = chain->serial;
      n.parent_key = chain->key;
      if (parent != nullptr) ++parent->children;
      n.variant = variant;
      n.tokens.assign(block.begin(), block.end());
      lru_.push_front(key);
      n.lru = lru_.begin();
      e = &n;
    } else {
      Touch(e, key);
    }
    chain->blocks = b + 1;
    chain->key = key;
    chain->serial = e->serial;
  }
}

bool PrefixCache::EvictFor(int64_t n_free) {
  PagePool* pool = kv_->pool();
  std::vector<int32_t> one(1);
  // Passes from the least recently used end; a pass that evicts a leaf may turn its parent into
  // one, which the next pass can take.
  for (bool progress = true; progress && pool->n_free() < n_free;) {
    progress = false;
    for (auto it = lru_.end(); pool->n_free() < n_free && it != lru_.begin();) {
      --it;
      auto e = entries_.find(*it);
      CHORUS_CHECK(e != entries_.end());
      Entry& victim = e->second;
      if (victim.children > 0 || kv_->RefCount(victim.block) != 1) continue;  // not free
      if (victim.parent_serial != 0) --entries_.at(victim.parent_key).children;
      kv_->SetCacheMark(victim.block, false);
      one.assign(1, victim.block);
      kv_->Release(&one);
      entries_.erase(e);
      it = lru_.erase(it);
      ++evictions_;
      progress = true;
    }
  }
  return pool->n_free() >= n_free;
}

// Kept by the KvCache as references change (an engine step publishes it as a gauge; a walk
// over every cached block here took ~20 % of a small model's serving time once the cache was
// full: docs/status.md, "Issue 16").
int64_t PrefixCache::n_evictable() const { return kv_->n_cache_only(); }

}  // namespace chorus::memory

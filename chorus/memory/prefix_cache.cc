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

PrefixCache::PrefixCache(KvCache* kv)
    : kv_(kv), block_size_(kv->layout().block_size), n_groups_(kv->n_groups()) {}

PrefixCache::~PrefixCache() {
  for (auto& [key, e] : entries_) {
    for (int32_t b : e.blocks)
      if (b != KvCache::kDroppedBlock) kv_->SetCacheMark(b, false);
    kv_->Release(&e.blocks);
  }
}

bool PrefixCache::OnlyCacheHolds(const Entry& e) const {
  for (int32_t b : e.blocks)
    if (b != KvCache::kDroppedBlock && kv_->RefCount(b) != 1) return false;
  return true;
}

bool PrefixCache::TrimWindows(Entry* e) {
  bool freed = false;
  std::vector<int32_t> one(1);
  for (int64_t g = 0; g < n_groups_; ++g) {
    int32_t& b = e->blocks[static_cast<size_t>(g)];
    if (kv_->groups().window[static_cast<size_t>(g)] <= 0 || b == KvCache::kDroppedBlock ||
        kv_->RefCount(b) != 1)
      continue;
    kv_->SetCacheMark(b, false);
    one.assign(1, b);
    kv_->Release(&one);
    b = KvCache::kDroppedBlock;
    freed = true;
  }
  return freed;
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
  uint64_t parent_key = 0, parent_serial = 0;
  for (int64_t b = 0; b < n_blocks; ++b) {
    uint64_t key = 0;
    Entry* e =
        Find(parent_key, parent_serial, variant,
             tokens.subspan(static_cast<size_t>(b * block_size_), static_cast<size_t>(block_size_)),
             &key);
    if (e == nullptr) break;
    hits.emplace_back(e, key);
    parent_key = key;
    parent_serial = e->serial;
  }
  // Windowed blocks may have been given up (TrimWindows): the match ends at the longest m whose
  // next row finds, in every windowed group of window w, the blocks of keys (m·bs − w, m·bs).
  int64_t m = static_cast<int64_t>(hits.size());
  for (; m > 0; --m) {
    bool complete = true;
    for (int64_t g = 0; g < n_groups_ && complete; ++g) {
      const int64_t w = kv_->groups().window[static_cast<size_t>(g)];
      if (w <= 0) continue;
      for (int64_t b = std::max<int64_t>(0, m * block_size_ - w) / block_size_; b < m; ++b) {
        if (hits[static_cast<size_t>(b)].first->blocks[static_cast<size_t>(g)] ==
            KvCache::kDroppedBlock) {
          complete = false;
          break;
        }
      }
    }
    if (complete) break;
  }
  hits.resize(static_cast<size_t>(m));
  for (auto& [e, key] : hits) {
    table->insert(table->end(), e->blocks.begin(), e->blocks.end());
    chain->blocks += 1;
    chain->key = key;
    chain->serial = e->serial;
    Touch(e, key);
  }
  *table = kv_->Fork(*table);  // this sequence's own reference on each matched block
  return chain->blocks * block_size_;
}

void PrefixCache::Insert(uint64_t variant, std::span<const int32_t> tokens, int64_t n_computed,
                         const std::vector<int32_t>& table, PrefixChain* chain) {
  const int64_t full =
      std::min<int64_t>(n_computed / block_size_, static_cast<int64_t>(table.size()) / n_groups_);
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
      const auto first = table.begin() + static_cast<std::ptrdiff_t>(b * n_groups_);
      const std::vector<int32_t> blocks(first, first + n_groups_);
      if (std::find(blocks.begin(), blocks.end(), KvCache::kDroppedBlock) != blocks.end())
        return;  // behind a sliding window: gone
      Entry& n = entries_[key];
      n.blocks = kv_->Fork(blocks);  // the cache's own reference on each
      for (int32_t blk : n.blocks) kv_->SetCacheMark(blk, true);
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
      // Windowed blocks the cache gave up (TrimWindows) come back from this sequence's copy.
      for (int64_t g = 0; g < n_groups_; ++g) {
        int32_t& held = e->blocks[static_cast<size_t>(g)];
        const int32_t blk = table[static_cast<size_t>(b * n_groups_ + g)];
        if (held != KvCache::kDroppedBlock || blk == KvCache::kDroppedBlock) continue;
        held = kv_->Fork({blk})[0];
        kv_->SetCacheMark(held, true);
      }
    }
    chain->blocks = b + 1;
    chain->key = key;
    chain->serial = e->serial;
  }
}

bool PrefixCache::EvictFor(int64_t n_free) {
  PagePool* pool = kv_->pool();
  // Passes from the least recently used end; a pass that evicts a leaf may turn its parent into
  // one, which the next pass can take.
  for (bool progress = true; progress && pool->n_free() < n_free;) {
    progress = false;
    for (auto it = lru_.end(); pool->n_free() < n_free && it != lru_.begin();) {
      --it;
      auto e = entries_.find(*it);
      CHORUS_CHECK(e != entries_.end());
      Entry& victim = e->second;
      if (victim.children > 0 || !OnlyCacheHolds(victim)) continue;  // not free
      if (victim.parent_serial != 0) --entries_.at(victim.parent_key).children;
      for (int32_t b : victim.blocks)
        if (b != KvCache::kDroppedBlock) kv_->SetCacheMark(b, false);
      kv_->Release(&victim.blocks);
      entries_.erase(e);
      it = lru_.erase(it);
      ++evictions_;
      progress = true;
    }
  }
  // Still short: windowed blocks of entries a running sequence holds in part (its global
  // blocks), least recently used first.
  if (kv_->groups().any_window()) {
    for (auto it = lru_.end(); pool->n_free() < n_free && it != lru_.begin();) {
      --it;
      TrimWindows(&entries_.at(*it));
    }
  }
  return pool->n_free() >= n_free;
}

// Kept by the KvCache as references change (an engine step publishes it as a gauge; a walk
// over every cached block here took ~20 % of a small model's serving time once the cache was
// full: docs/status.md, "Issue 16").
int64_t PrefixCache::n_evictable() const { return kv_->n_cache_only(); }

}  // namespace chorus::memory

// PrefixCache: automatic prefix caching over the paged KV cache (docs/architecture.md, "Memory
// tiers"; vLLM's automatic prefix caching, keyed by variant as S-LoRA's and CaraServe's settings
// require). Prompts that share a prefix — a system prompt, few-shot examples, a chat history —
// reuse the K/V blocks an earlier request computed instead of computing them again.
//
// What is cached: FULL KV blocks, content-addressed by (variant, every token up to the block's
// end). The key of block i chains the key of block i-1 with the variant and block i's tokens;
// an entry also stores its own tokens and the serial of its parent entry (serials are never
// reused), so a lookup verifies each block exactly — a hash collision is a miss, never another
// prompt's K/V. The variant is part of the key because an adapter changes K and V (a LoRA on
// k/v directly, any adapter through the layers below): a variant never reuses another's blocks.
//
// Layer groups (memory/kv_cache.h): an entry holds the block of every group for its tokens. Under
// pool pressure, after whole entries, the cache gives up the blocks of windowed groups it alone
// holds (a long prompt's windowed blocks far behind its end are of use only to a match that ends
// near them); Match then ends where every windowed group still has the blocks its window needs.
//
// References: the cache holds one KvCache reference on each cached block, so the block outlives
// the sequence that computed it. A sequence that matches a prefix takes its own reference on
// the matched blocks (as n > 1 choices share a prompt, copy-on-write when written). A cached
// block that no sequence holds and that has no cached continuation is evictable; EvictFor() frees
// such blocks least recently used first (so chains shrink from their ends and a cached prefix
// never has a hole) — the scheduler does so before it preempts anyone.
//
// Reuse never changes an output: K/V of a position do not depend on the step, the batch or the
// chunking that computed them (batch-invariant kernels), so a request computes bitwise the same
// tokens with or without the cache (tested end to end).
//
// Thread-safety: engine thread only (as the KvCache).
#pragma once

#include <cstdint>
#include <list>
#include <span>
#include <unordered_map>
#include <vector>

#include "chorus/memory/kv_cache.h"

namespace chorus::memory {

// How far one sequence's blocks are registered in the cache (kept by the sequence).
struct PrefixChain {
  int64_t blocks = 0;   // full blocks of the sequence already matched or registered
  uint64_t key = 0;     // key of the last of them (0 before the first)
  uint64_t serial = 0;  // serial of the cache entry of the last of them (0 before the first)
};

class PrefixCache {
 public:
  explicit PrefixCache(KvCache* kv);
  ~PrefixCache();  // gives the cached blocks' references back to the KvCache
  PrefixCache(const PrefixCache&) = delete;
  PrefixCache& operator=(const PrefixCache&) = delete;

  // The longest cached prefix of `tokens` under `variant` (0 = the base model), in whole blocks
  // covering at most `max_tokens` tokens. Requires: `table` is empty. Appends the matched blocks
  // to it (one reference each), sets `*chain` to the match, returns the tokens covered.
  int64_t Match(uint64_t variant, std::span<const int32_t> tokens, int64_t max_tokens,
                std::vector<int32_t>* table, PrefixChain* chain);

  // Registers the full blocks of a sequence computed so far — tokens [0, n_computed) in `table`
  // — from `chain->blocks` on, and advances `chain`. A block whose content is cached already
  // (computed concurrently by another sequence) is not registered twice: the chain continues
  // through the cached entry.
  void Insert(uint64_t variant, std::span<const int32_t> tokens, int64_t n_computed,
              const std::vector<int32_t>& table, PrefixChain* chain);

  // Frees cached blocks that no sequence holds, least recently used first, until the pool has at
  // least `n_free` free pages: whole entries first, then windowed groups' blocks of entries that
  // sequences still hold in part. Returns whether it has.
  bool EvictFor(int64_t n_free);

  int64_t n_cached() const { return static_cast<int64_t>(entries_.size()); }
  // Cached blocks held by no sequence (free for the taking): O(n_cached).
  int64_t n_evictable() const;
  uint64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    std::vector<int32_t>
        blocks;  // [n_groups] the block of each layer group (kDroppedBlock: given up)
    uint64_t serial = 0, parent_serial = 0;
    uint64_t parent_key = 0;  // key of the parent entry (0 for a first block)
    int32_t children = 0;     // cached entries whose parent this is: only leaves are evicted
    uint64_t variant = 0;
    std::vector<int32_t> tokens;        // the block's tokens (block_size of them)
    std::list<uint64_t>::iterator lru;  // position in lru_ (front = most recently used)
  };
  uint64_t KeyOf(uint64_t parent_key, uint64_t variant, std::span<const int32_t> block) const;
  // The entry for block `block` of a chain at (parent_key, parent_serial), verified; or null.
  Entry* Find(uint64_t parent_key, uint64_t parent_serial, uint64_t variant,
              std::span<const int32_t> block, uint64_t* key);
  void Touch(Entry* e, uint64_t key);
  // Whether the cache alone holds every block of `e` it has.
  bool OnlyCacheHolds(const Entry& e) const;
  // Gives up `e`'s windowed blocks the cache alone holds; returns whether it freed any.
  bool TrimWindows(Entry* e);

  KvCache* const kv_;
  const int64_t block_size_;
  const int64_t n_groups_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::list<uint64_t> lru_;
  uint64_t next_serial_ = 1;
  uint64_t evictions_ = 0;
};

// The key of a variant identity for Match/Insert: 0 for the base model, else a mix of the
// identity's two words that is never 0.
uint64_t PrefixVariantKey(uint64_t content_hash, uint64_t version);

}  // namespace chorus::memory

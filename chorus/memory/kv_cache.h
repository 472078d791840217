// KvCache: the paged KV cache over a PagePool (docs/architecture.md, "Memory tiers", Punica §5.4,
// vLLM PagedAttention). One KV block = one page = `block_size` tokens of K and V for every layer:
//   page bytes = n_layers × 2 × block_size × n_kv_heads × head_dim × element bytes
// (4 for f32, 2 for bf16: KvLayout::dtype, `--kv-dtype`), laid out
// [layer][K|V][kv_head][slot][head_dim]: head-major, so the K (or V) of one KV head of a
// block is block_size × head_dim contiguous elements (4 KiB of f32 at the TinyLlama shape), which a
// decode step streams with whole cache lines and the hardware prefetcher's help. (Token-major
// blocks, [slot][kv_head][head_dim], put one head's rows 256 bytes every 1 KiB at that shape,
// and one thread read them at about half the rate: docs/kernels.md, "Attention".)
// A sequence owns a block table (block ids in position order); token t lives in block
// table[t / block_size], slot t % block_size.
//
// Blocks are reference counted so several sequences can share them (the `n` > 1 choices of one
// request share their prompt's blocks, vLLM's parallel sampling): Fork() copies a table and
// takes a reference on each block; Release() drops one and returns a block to the pool only when
// its last holder lets go; PrepareWrite() gives a sequence its own copy of any shared block it is
// about to write into (copy-on-write), so no holder ever sees another's tokens.
//
// Sliding-window models (every layer attends only the last W keys) drop the blocks behind the
// window: DropBefore() releases them and leaves kDroppedBlock in their table slots, so later
// positions keep their indices; every operation skips dropped slots, and nothing reads them
// (the attention of such models starts at the window, docs/models.md).
//
// bf16 caches round each K/V value to nearest even when the token is written (WriteToken); the
// attention kernels widen the stored values exactly, so a row's result is a function of the
// rounded values alone and every batch-invariance property of f32 holds within the dtype
// (docs/architecture.md, "Attention").
//
// Thread-safety: owned by the engine thread; kernels read it during a step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "chorus/base/status.h"
#include "chorus/kernels/attention.h"
#include "chorus/memory/page_pool.h"

namespace chorus::memory {

struct KvLayout {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  kernels::KvDtype dtype = kernels::KvDtype::kF32;  // element type of the stored K and V
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t ElementBytes() const { return dtype == kernels::KvDtype::kBf16 ? 2 : 4; }
  // K and V bytes of one token over every layer (what a decode step reads per context token).
  int64_t TokenBytes() const { return n_layers * 2 * kv_dim() * ElementBytes(); }
  int64_t PageBytes() const;  // rounded up to 64
};

// "f32" / "bf16" (the `--kv-dtype` flag).
const char* KvDtypeName(kernels::KvDtype dtype);
// The dtype named `name`; kInvalidArgument naming the accepted values otherwise.
Result<kernels::KvDtype> ParseKvDtype(const std::string& name);

class KvCache {
 public:
  // The pool's page size must be >= layout.PageBytes(). The cache does not own the pool.
  KvCache(const KvLayout& layout, PagePool* pool);

  const KvLayout& layout() const { return layout_; }
  PagePool* pool() { return pool_; }

  // Blocks needed to hold `n_tokens` tokens.
  int64_t BlocksFor(int64_t n_tokens) const {
    return (n_tokens + layout_.block_size - 1) / layout_.block_size;
  }

  // Grows `table` so it covers `n_tokens` tokens. kResourceExhausted (nothing allocated) when
  // the pool lacks pages.
  Status Reserve(std::vector<int32_t>* table, int64_t n_tokens);
  // Makes tokens [write_from, n_tokens) writable by the holder of `table`: grows it like
  // Reserve() and replaces every shared block in that range by a private copy (copy-on-write).
  // All or nothing: kResourceExhausted leaves `table` and the pool unchanged.
  Status PrepareWrite(std::vector<int32_t>* table, int64_t write_from, int64_t n_tokens);
  // Pages PrepareWrite(table, write_from, n_tokens) would take from the pool.
  int64_t PagesToWrite(const std::vector<int32_t>& table, int64_t write_from,
                       int64_t n_tokens) const;
  // A new table holding the same blocks as `table` (one more reference on each).
  std::vector<int32_t> Fork(const std::vector<int32_t>& table);
  // Drops this holder's reference on every block of `table` (a block whose last reference goes
  // returns to the pool; dropped slots are skipped) and clears it.
  void Release(std::vector<int32_t>* table);
  // Releases the blocks of `table` that hold only tokens before `n_tokens` (whole blocks; slots
  // already dropped are skipped) and marks their slots kDroppedBlock. Returns the blocks dropped.
  int64_t DropBefore(std::vector<int32_t>* table, int64_t n_tokens);
  static constexpr int32_t kDroppedBlock = -1;

  // Holders of `block` (0 when it is free).
  int32_t RefCount(int32_t block) const { return refs_[static_cast<size_t>(block)]; }
  // Blocks with more than one holder (for tests and metrics).
  int64_t n_shared() const { return n_shared_; }
  // Marks `block` as held by the prefix cache (memory/prefix_cache.h) or clears the mark. The
  // cache keeps one reference on each block it holds; n_cache_only() counts the marked blocks no
  // one else holds (reference count 1), kept as references change so that a per-step gauge costs
  // O(1) rather than a walk over every cached block.
  void SetCacheMark(int32_t block, bool marked);
  int64_t n_cache_only() const { return n_cache_only_; }

  // K / V of KV head `kv_head` of token slot `slot` of `block` in `layer`: head_dim floats.
  // Requires: an f32 cache (tests write single values through these).
  float* K(int64_t layer, int32_t block, int64_t slot, int64_t kv_head);
  float* V(int64_t layer, int32_t block, int64_t slot, int64_t kv_head);
  // Stores one token's K and V rows ([n_kv_heads × head_dim] floats each, heads side by side,
  // as the projections produce them) at slot `slot` of `block` in `layer`; a bf16 cache stores
  // each value rounded to nearest even (F32ToBF16).
  void WriteToken(int64_t layer, int32_t block, int64_t slot, const float* k, const float* v);
  // The stored K (V) row of KV head `kv_head` at that slot, as f32 (exact: bf16 widens exactly)
  // into out[head_dim].
  void ReadK(int64_t layer, int32_t block, int64_t slot, int64_t kv_head, float* out) const;
  void ReadV(int64_t layer, int32_t block, int64_t slot, int64_t kv_head, float* out) const;

  // PagedKv for the attention kernel restricted to kv head `kv_head` of `layer` (so the kernel
  // can be called per kv-head group, which lets threads split heads at batch 1).
  kernels::PagedKv View(int64_t layer, int64_t kv_head, const int32_t* block_table) const;

 private:
  // Byte offset of element 0 of that row in its page (`which`: 0 = K, 1 = V).
  int64_t RowOffset(int64_t layer, int which, int64_t slot, int64_t kv_head) const {
    return (((layer * 2 + which) * layout_.n_kv_heads + kv_head) * layout_.block_size + slot) *
           layout_.head_dim * layout_.ElementBytes();
  }
  void ReadRow(int64_t layer, int which, int32_t block, int64_t slot, int64_t kv_head,
               float* out) const;

  KvLayout layout_;
  PagePool* pool_;
  // [layer][kv_head][page] base pointers of K and V, precomputed once (bf16 pages: the
  // addresses of uint16_t rows, as kernels::PagedKv takes them).
  std::vector<const float*> k_ptrs_, v_ptrs_;
  std::vector<int32_t> refs_;  // [n_pages] holders of each KV block
  int64_t n_shared_ = 0;
  std::vector<uint8_t> cache_mark_;  // per block: held by the prefix cache
  int64_t n_cache_only_ = 0;  // marked blocks with reference count 1       // blocks with refs_ > 1
};

}  // namespace chorus::memory

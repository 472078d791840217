// KvCache: the paged KV cache over a PagePool (docs/architecture.md, "Memory tiers", Punica §5.4,
// vLLM PagedAttention). One KV block = one page = `block_size` tokens of K and V for the layers of
// one layer group (below):
//   page bytes = layers_per_page × 2 × block_size × n_kv_heads × head_dim × element bytes
// (4 for f32, 2 for bf16: KvLayout::dtype, `--kv-dtype`), laid out
// [layer in page][K|V][kv_head][…]: head-major, so the K (or V) of one KV head of a block is
// block_size × head_dim contiguous elements (4 KiB of f32 at the TinyLlama shape), which a
// decode step streams with whole cache lines and the hardware prefetcher's help. (Token-major
// blocks, [slot][kv_head][head_dim], put one head's rows 256 bytes every 1 KiB at that shape,
// and one thread read them at about half the rate: docs/kernels.md, "Attention".) Within a
// head, V is [slot][head_dim] and K is in columns, [head_dim][slot] (kernels::PagedKv::
// k_columns): element d of 16 consecutive keys is one line, so a decode row computes 16 keys'
// scores per vector straight from the cache (docs/kernels.md, "K in columns").
//
// Layer groups (docs/models.md, "KV blocks behind the window"). Layers that attend every key
// (global) and layers with a sliding window need their keys for different lengths of time, so
// they do not share blocks: the layers are cut into groups of one kind (one window, 0 = global)
// and at most layers_per_page layers each, and a sequence holds one block per group per
// `block_size` tokens. Its block table interleaves the groups: the block of group g for tokens
// [i·block_size, (i+1)·block_size) is table[i·n_groups + g]. A model without windows has one
// group of every layer (the layout before groups existed, unchanged); Phi-3 (every layer slides)
// one windowed group; Gemma 2/3 a global group and windowed ones (KvLayout::Groups() says how
// layers_per_page is chosen so no page of a global group is padded).
//
// Blocks are reference counted so several sequences can share them (the `n` > 1 choices of one
// request share their prompt's blocks, vLLM's parallel sampling): Fork() copies a table and
// takes a reference on each block; Release() drops one and returns a block to the pool only when
// its last holder lets go; PrepareWrite() gives a sequence its own copy of any shared block it is
// about to write into (copy-on-write), so no holder ever sees another's tokens.
//
// Windowed groups drop the blocks behind their window: DropBehindWindows() releases them and
// leaves kDroppedBlock in their table slots, so later positions keep their indices; every
// operation skips dropped slots, and nothing reads them (windowed layers' attention starts at
// the window, docs/models.md). Global groups keep every block.
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

// How the layers are cut into groups of blocks (KvLayout::Groups()).
struct KvGroups {
  int64_t layers_per_page = 0;
  std::vector<int64_t> window;    // [n_groups] the sliding window of the group's layers, 0 = global
  std::vector<int32_t> group_of;  // [n_layers] the layer's group
  std::vector<int32_t> slot_of;   // [n_layers] the layer's place in its group's pages
  int64_t n_groups() const { return static_cast<int64_t>(window.size()); }
  bool any_window() const;
  // The most pages one sequence of `n_tokens` tokens holds at once when it is computed in
  // chunks of at most `chunk` tokens: every block of a global group; a windowed group's window
  // plus the chunk being written.
  int64_t PagesFor(int64_t n_tokens, int64_t chunk, int64_t block_size) const;
};

struct KvLayout {
  int64_t n_layers = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t block_size = 16;
  kernels::KvDtype dtype = kernels::KvDtype::kF32;  // element type of the stored K and V
  // [n_layers] the sliding window of each layer's attention (a row at p reads keys (p − w, p]),
  // 0 = every key; empty = every layer global. Layers of different windows never share a block.
  std::vector<int64_t> layer_windows = {};
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t ElementBytes() const { return dtype == kernels::KvDtype::kBf16 ? 2 : 4; }
  // K and V bytes of one token over every layer (what a decode step reads per context token).
  int64_t TokenBytes() const { return n_layers * 2 * kv_dim() * ElementBytes(); }
  int64_t PageBytes() const;  // rounded up to 64
  // Groups of one window each, in this order: the global layers (if any), then each window's
  // layers, every kind in layer order and cut into groups of layers_per_page. layers_per_page
  // is the number of global layers when there are any (their group, the one that grows with the
  // sequence, is never padded; only windowed groups, bounded by their window, may be), else
  // that of the largest windowed kind; without windows, n_layers (one group).
  KvGroups Groups() const;
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

  const KvGroups& groups() const { return groups_; }
  int64_t n_groups() const { return groups_.n_groups(); }

  // Blocks per group needed to hold `n_tokens` tokens (table entries: BlocksFor × n_groups()).
  int64_t BlocksFor(int64_t n_tokens) const {
    return (n_tokens + layout_.block_size - 1) / layout_.block_size;
  }
  // KvGroups::PagesFor for this cache.
  int64_t PagesFor(int64_t n_tokens, int64_t chunk) const {
    return groups_.PagesFor(n_tokens, chunk, layout_.block_size);
  }

  // Grows `table` so it covers `n_tokens` tokens (a block per group). kResourceExhausted
  // (nothing allocated) when the pool lacks pages.
  Status Reserve(std::vector<int32_t>* table, int64_t n_tokens);
  // Makes tokens [write_from, n_tokens) writable by the holder of `table`: grows it like
  // Reserve() and replaces every shared block in that range by a private copy (copy-on-write).
  // All or nothing: kResourceExhausted leaves `table` and the pool unchanged.
  Status PrepareWrite(std::vector<int32_t>* table, int64_t write_from, int64_t n_tokens);
  // Under tensor parallelism the other ranks mirror this cache's pages (same block ids, their own
  // KV heads): with recording on, every page copy PrepareWrite makes is noted as (source,
  // destination) block ids, in order, until ClearCopies(), so that the step plan can carry them
  // (model::StepChannel) and each rank copies its own pages the same way.
  void RecordCopies(bool on) { record_copies_ = on; }
  const std::vector<int32_t>& copies() const { return copies_; }  // [src, dst, src, dst, ...]
  void ClearCopies() { copies_.clear(); }
  // Pages PrepareWrite(table, write_from, n_tokens) would take from the pool.
  int64_t PagesToWrite(const std::vector<int32_t>& table, int64_t write_from,
                       int64_t n_tokens) const;
  // A new table holding the same blocks as `table` (one more reference on each).
  std::vector<int32_t> Fork(const std::vector<int32_t>& table);
  // Drops this holder's reference on every block of `table` (a block whose last reference goes
  // returns to the pool; dropped slots are skipped) and clears it.
  void Release(std::vector<int32_t>* table);
  // For each windowed group of window w: releases the blocks of `table` that hold only tokens
  // before n_computed − w (whole blocks; slots already dropped are skipped) and marks their slots
  // kDroppedBlock. Rows from n_computed on read keys > n_computed − w; the one more key kept lets
  // a sequence recompute its last token (a waiting n > 1 choice does, Scheduler::ForkChoices).
  // Returns the blocks dropped.
  int64_t DropBehindWindows(std::vector<int32_t>* table, int64_t n_computed);
  static constexpr int32_t kDroppedBlock = -1;
  // The block of `table` holding token `pos` of `layer`.
  int32_t BlockAt(const int32_t* table, int64_t layer, int64_t pos) const {
    return table[pos / layout_.block_size * groups_.n_groups() +
                 groups_.group_of[static_cast<size_t>(layer)]];
  }

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

  // K / V of KV head `kv_head` of token slot `slot` of `block` in `layer`: element 0 of its
  // head_dim floats, which are consecutive for V and block_size floats apart for K (K in
  // columns). Requires: an f32 cache (tests write single values through these); `block` one of
  // the layer's group.
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
  // can be called per kv-head group, which lets threads split heads at batch 1); `block_table`
  // is the sequence's whole table (the view reads the layer's group's entries). A bf16 cache's
  // view asks for bf16 dot products (PagedKv::bf16_dot).
  kernels::PagedKv View(int64_t layer, int64_t kv_head, const int32_t* block_table) const;

 private:
  // Byte offset of element 0 of that row in its page (`which`: 0 = K, 1 = V); the page holds the
  // layers of `layer`'s group, `layer` at its place in it. Element d of the row is
  // ElementStride(which) elements further.
  int64_t RowOffset(int64_t layer, int which, int64_t slot, int64_t kv_head) const {
    const int64_t in_page = groups_.slot_of[static_cast<size_t>(layer)];
    const int64_t head = ((in_page * 2 + which) * layout_.n_kv_heads + kv_head) *
                         layout_.block_size * layout_.head_dim;
    return (head + slot * (which == 0 ? 1 : layout_.head_dim)) * layout_.ElementBytes();
  }
  int64_t ElementStride(int which) const { return which == 0 ? layout_.block_size : 1; }
  void ReadRow(int64_t layer, int which, int32_t block, int64_t slot, int64_t kv_head,
               float* out) const;

  KvLayout layout_;
  KvGroups groups_;
  PagePool* pool_;
  // [layer][kv_head][page] base pointers of K and V, precomputed once (bf16 pages: the
  // addresses of uint16_t rows, as kernels::PagedKv takes them).
  std::vector<const float*> k_ptrs_, v_ptrs_;
  std::vector<int32_t> refs_;        // [n_pages] holders of each KV block
  int64_t n_shared_ = 0;             // blocks with refs_ > 1
  std::vector<uint8_t> cache_mark_;  // per block: held by the prefix cache
  int64_t n_cache_only_ = 0;         // marked blocks with reference count 1
  bool record_copies_ = false;
  std::vector<int32_t> copies_;  // recorded page copies (RecordCopies)
};

}  // namespace chorus::memory

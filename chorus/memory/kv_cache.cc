#include "chorus/memory/kv_cache.h"

#include <algorithm>
#include <cstring>

#include "chorus/tensor/dtype.h"

namespace chorus::memory {

bool KvGroups::any_window() const {
  return std::any_of(window.begin(), window.end(), [](int64_t w) { return w > 0; });
}

int64_t KvGroups::PagesFor(int64_t n_tokens, int64_t chunk, int64_t block_size) const {
  auto blocks = [&](int64_t n) { return (n + block_size - 1) / block_size; };
  int64_t pages = 0;
  for (int64_t w : window) {
    // A windowed group holds the keys from n_computed − w on (DropBehindWindows) and the chunk
    // being written; each end may fall inside a block.
    pages += w > 0 ? std::min(blocks(n_tokens), blocks(w + chunk) + 1) : blocks(n_tokens);
  }
  return pages;
}

KvGroups KvLayout::Groups() const {
  CHORUS_CHECK(layer_windows.empty() || static_cast<int64_t>(layer_windows.size()) == n_layers)
      << "layer_windows has " << layer_windows.size() << " entries for " << n_layers << " layers";
  auto window_of = [&](int64_t l) {
    return layer_windows.empty() ? int64_t{0} : layer_windows[static_cast<size_t>(l)];
  };
  // The kinds: global first, then each window in order of its first layer.
  std::vector<int64_t> kinds;
  std::vector<int64_t> counts;
  for (int64_t l = 0; l < n_layers; ++l) {
    const int64_t w = std::max<int64_t>(0, window_of(l));
    auto it = std::find(kinds.begin(), kinds.end(), w);
    if (it == kinds.end()) {
      kinds.push_back(w);
      counts.push_back(1);
    } else {
      ++counts[static_cast<size_t>(it - kinds.begin())];
    }
  }
  for (size_t i = 1; i < kinds.size(); ++i) {  // global (0) first, the others stay in order
    if (kinds[i] == 0) {
      std::rotate(kinds.begin(), kinds.begin() + static_cast<std::ptrdiff_t>(i),
                  kinds.begin() + static_cast<std::ptrdiff_t>(i) + 1);
      std::rotate(counts.begin(), counts.begin() + static_cast<std::ptrdiff_t>(i),
                  counts.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
  }
  KvGroups g;
  g.layers_per_page = kinds.empty()   ? 0
                      : kinds[0] == 0 ? counts[0]
                                      : *std::max_element(counts.begin(), counts.end());
  g.group_of.assign(static_cast<size_t>(n_layers), 0);
  g.slot_of.assign(static_cast<size_t>(n_layers), 0);
  for (int64_t w : kinds) {
    int64_t in_group = g.layers_per_page;  // a new group at the kind's first layer
    for (int64_t l = 0; l < n_layers; ++l) {
      if (std::max<int64_t>(0, window_of(l)) != w) continue;
      if (in_group == g.layers_per_page) {
        g.window.push_back(w);
        in_group = 0;
      }
      g.group_of[static_cast<size_t>(l)] = static_cast<int32_t>(g.window.size() - 1);
      g.slot_of[static_cast<size_t>(l)] = static_cast<int32_t>(in_group++);
    }
  }
  return g;
}

int64_t KvLayout::PageBytes() const {
  const int64_t layers = layer_windows.empty() ? n_layers : Groups().layers_per_page;
  const int64_t b = layers * 2 * block_size * kv_dim() * ElementBytes();
  return (b + 63) / 64 * 64;
}

const char* KvDtypeName(kernels::KvDtype dtype) {
  return dtype == kernels::KvDtype::kBf16 ? "bf16" : "f32";
}

Result<kernels::KvDtype> ParseKvDtype(const std::string& name) {
  if (name == "f32") return kernels::KvDtype::kF32;
  if (name == "bf16") return kernels::KvDtype::kBf16;
  return InvalidArgumentError("KV cache dtype '" + name.substr(0, 32) + "': expected f32 or bf16");
}

KvCache::KvCache(const KvLayout& layout, PagePool* pool)
    : layout_(layout), groups_(layout.Groups()), pool_(pool) {
  CHORUS_CHECK(pool->page_bytes() >= layout.PageBytes())
      << "pages of " << pool->page_bytes() << " bytes, the layout needs " << layout.PageBytes();
  const int64_t n_pages = pool->n_pages();
  k_ptrs_.resize(static_cast<size_t>(layout.n_layers * layout.n_kv_heads * n_pages));
  v_ptrs_.resize(k_ptrs_.size());
  refs_.assign(static_cast<size_t>(n_pages), 0);
  cache_mark_.assign(static_cast<size_t>(n_pages), 0);
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
      for (int64_t p = 0; p < n_pages; ++p) {
        size_t idx = static_cast<size_t>((l * layout.n_kv_heads + h) * n_pages + p);
        const uint8_t* page = pool->PageData(static_cast<int32_t>(p));
        k_ptrs_[idx] = reinterpret_cast<const float*>(page + RowOffset(l, 0, 0, h));
        v_ptrs_[idx] = reinterpret_cast<const float*>(page + RowOffset(l, 1, 0, h));
      }
    }
  }
}

Status KvCache::Reserve(std::vector<int32_t>* table, int64_t n_tokens) {
  int64_t need = BlocksFor(n_tokens) * n_groups() - static_cast<int64_t>(table->size());
  if (need <= 0) return OkStatus();
  CHORUS_ASSIGN_OR_RETURN(std::vector<int32_t> pages, pool_->Allocate(need, PageKind::kKv));
  for (int32_t p : pages) refs_[static_cast<size_t>(p)] = 1;
  table->insert(table->end(), pages.begin(), pages.end());
  return OkStatus();
}

int64_t KvCache::PagesToWrite(const std::vector<int32_t>& table, int64_t write_from,
                              int64_t n_tokens) const {
  const int64_t have = static_cast<int64_t>(table.size());
  const int64_t end = BlocksFor(n_tokens) * n_groups();
  int64_t pages = std::max<int64_t>(0, end - have);
  if (n_tokens > write_from) {
    for (int64_t b = write_from / layout_.block_size * n_groups(); b < std::min(end, have); ++b) {
      const int32_t blk = table[static_cast<size_t>(b)];
      CHORUS_CHECK(blk != kDroppedBlock) << "write into a dropped block " << b;
      if (refs_[static_cast<size_t>(blk)] > 1) ++pages;
    }
  }
  return pages;
}

Status KvCache::PrepareWrite(std::vector<int32_t>* table, int64_t write_from, int64_t n_tokens) {
  const int64_t need = PagesToWrite(*table, write_from, n_tokens);
  if (need > pool_->n_free()) {
    return ResourceExhaustedError("pool has " + std::to_string(pool_->n_free()) + " free pages, " +
                                  std::to_string(need) + " needed");
  }
  if (n_tokens > write_from) {
    const int64_t have =
        std::min(static_cast<int64_t>(table->size()), BlocksFor(n_tokens) * n_groups());
    for (int64_t b = write_from / layout_.block_size * n_groups(); b < have; ++b) {
      int32_t& blk = (*table)[static_cast<size_t>(b)];
      if (refs_[static_cast<size_t>(blk)] <= 1) continue;
      const int32_t copy = pool_->AllocateOne(PageKind::kKv);
      CHORUS_CHECK(copy >= 0);  // counted above
      // The whole page: the slots before `write_from` hold this holder's history.
      std::memcpy(pool_->PageData(copy), pool_->PageData(blk),
                  static_cast<size_t>(pool_->page_bytes()));
      if (record_copies_) copies_.insert(copies_.end(), {blk, copy});
      if (--refs_[static_cast<size_t>(blk)] == 1) {
        --n_shared_;
        if (cache_mark_[static_cast<size_t>(blk)]) ++n_cache_only_;
      }
      refs_[static_cast<size_t>(copy)] = 1;
      blk = copy;
    }
  }
  Status s = Reserve(table, n_tokens);
  CHORUS_CHECK(s.ok()) << s.ToString();  // counted above
  return OkStatus();
}

void KvCache::SetCacheMark(int32_t block, bool marked) {
  uint8_t& m = cache_mark_[static_cast<size_t>(block)];
  if (static_cast<bool>(m) == marked) return;
  m = marked ? 1 : 0;
  if (refs_[static_cast<size_t>(block)] == 1) n_cache_only_ += marked ? 1 : -1;
}

std::vector<int32_t> KvCache::Fork(const std::vector<int32_t>& table) {
  for (int32_t b : table) {
    if (b == kDroppedBlock) continue;
    CHORUS_CHECK(refs_[static_cast<size_t>(b)] >= 1) << "fork of a free block " << b;
    if (++refs_[static_cast<size_t>(b)] == 2) {
      ++n_shared_;
      if (cache_mark_[static_cast<size_t>(b)]) --n_cache_only_;
    }
  }
  return table;
}

int64_t KvCache::DropBehindWindows(std::vector<int32_t>* table, int64_t n_computed) {
  const int64_t n_g = n_groups();
  const int64_t have = static_cast<int64_t>(table->size()) / n_g;
  int64_t dropped = 0;
  std::vector<int32_t> one(1);
  for (int64_t g = 0; g < n_g; ++g) {
    const int64_t w = groups_.window[static_cast<size_t>(g)];
    if (w <= 0) continue;
    const int64_t n = std::min(std::max<int64_t>(0, n_computed - w) / layout_.block_size, have);
    for (int64_t i = 0; i < n; ++i) {
      int32_t& b = (*table)[static_cast<size_t>(i * n_g + g)];
      if (b == kDroppedBlock) continue;
      one.assign(1, b);
      Release(&one);
      b = kDroppedBlock;
      ++dropped;
    }
  }
  return dropped;
}

void KvCache::Release(std::vector<int32_t>* table) {
  for (int32_t b : *table) {
    if (b == kDroppedBlock) continue;
    int32_t& r = refs_[static_cast<size_t>(b)];
    CHORUS_CHECK(r >= 1) << "release of a free block " << b;
    if (--r == 0) {
      if (cache_mark_[static_cast<size_t>(b)]) {  // the cache let go without clearing its mark
        cache_mark_[static_cast<size_t>(b)] = 0;
        --n_cache_only_;
      }
      pool_->FreeOne(b);
    } else if (r == 1) {
      --n_shared_;
      if (cache_mark_[static_cast<size_t>(b)]) ++n_cache_only_;
    }
  }
  table->clear();
}

float* KvCache::K(int64_t layer, int32_t block, int64_t slot, int64_t kv_head) {
  CHORUS_CHECK(layout_.dtype == kernels::KvDtype::kF32) << "KvCache::K of a bf16 cache";
  return reinterpret_cast<float*>(pool_->PageData(block) + RowOffset(layer, 0, slot, kv_head));
}

float* KvCache::V(int64_t layer, int32_t block, int64_t slot, int64_t kv_head) {
  CHORUS_CHECK(layout_.dtype == kernels::KvDtype::kF32) << "KvCache::V of a bf16 cache";
  return reinterpret_cast<float*>(pool_->PageData(block) + RowOffset(layer, 1, slot, kv_head));
}

void KvCache::WriteToken(int64_t layer, int32_t block, int64_t slot, const float* k,
                         const float* v) {
  const int64_t hd = layout_.head_dim;
  uint8_t* page = pool_->PageData(block);
  for (int64_t g = 0; g < layout_.n_kv_heads; ++g) {
    for (int which = 0; which < 2; ++which) {
      const float* src = (which == 0 ? k : v) + g * hd;
      uint8_t* dst = page + RowOffset(layer, which, slot, g);
      const int64_t es = ElementStride(which);
      if (layout_.dtype == kernels::KvDtype::kF32) {
        auto* f = reinterpret_cast<float*>(dst);
        for (int64_t d = 0; d < hd; ++d) f[d * es] = src[d];
      } else {
        auto* h = reinterpret_cast<uint16_t*>(dst);  // round to nearest even, NaN kept
        for (int64_t d = 0; d < hd; ++d) h[d * es] = F32ToBF16(src[d]);
      }
    }
  }
}

void KvCache::ReadRow(int64_t layer, int which, int32_t block, int64_t slot, int64_t kv_head,
                      float* out) const {
  const uint8_t* row = pool_->PageData(block) + RowOffset(layer, which, slot, kv_head);
  const int64_t hd = layout_.head_dim, es = ElementStride(which);
  if (layout_.dtype == kernels::KvDtype::kF32) {
    const auto* f = reinterpret_cast<const float*>(row);
    for (int64_t d = 0; d < hd; ++d) out[d] = f[d * es];
    return;
  }
  const auto* h = reinterpret_cast<const uint16_t*>(row);
  for (int64_t d = 0; d < hd; ++d) out[d] = BF16ToF32(h[d * es]);
}

void KvCache::ReadK(int64_t layer, int32_t block, int64_t slot, int64_t kv_head, float* out) const {
  ReadRow(layer, 0, block, slot, kv_head, out);
}

void KvCache::ReadV(int64_t layer, int32_t block, int64_t slot, int64_t kv_head, float* out) const {
  ReadRow(layer, 1, block, slot, kv_head, out);
}

kernels::PagedKv KvCache::View(int64_t layer, int64_t kv_head, const int32_t* block_table) const {
  size_t off = static_cast<size_t>((layer * layout_.n_kv_heads + kv_head) * pool_->n_pages());
  kernels::PagedKv kv;
  kv.k_blocks = k_ptrs_.data() + off;
  kv.v_blocks = v_ptrs_.data() + off;
  kv.block_table = block_table + groups_.group_of[static_cast<size_t>(layer)];
  kv.table_stride = groups_.n_groups();
  kv.block_size = layout_.block_size;
  kv.kv_stride = layout_.head_dim;  // head-major blocks: a head's V rows follow each other
  kv.head_stride = layout_.block_size * layout_.head_dim;
  kv.dtype = layout_.dtype;  // strides count elements of this type
  kv.k_columns = true;
  kv.bf16_dot = layout_.dtype == kernels::KvDtype::kBf16;  // bf16 products where the level has them
  return kv;
}

}  // namespace chorus::memory

#include "chorus/memory/kv_cache.h"

namespace chorus::memory {

int64_t KvLayout::PageBytes() const {
  int64_t b = n_layers * 2 * block_size * kv_dim() * static_cast<int64_t>(sizeof(float));
  return (b + 63) / 64 * 64;
}

KvCache::KvCache(const KvLayout& layout, PagePool* pool) : layout_(layout), pool_(pool) {
  CHORUS_CHECK(pool->page_bytes() >= layout.PageBytes());
  const int64_t n_pages = pool->n_pages();
  k_ptrs_.resize(static_cast<size_t>(layout.n_layers * layout.n_kv_heads * n_pages));
  v_ptrs_.resize(k_ptrs_.size());
  for (int64_t l = 0; l < layout.n_layers; ++l) {
    for (int64_t h = 0; h < layout.n_kv_heads; ++h) {
      for (int64_t p = 0; p < n_pages; ++p) {
        size_t idx = static_cast<size_t>((l * layout.n_kv_heads + h) * n_pages + p);
        k_ptrs_[idx] = K(l, static_cast<int32_t>(p), 0) + h * layout.head_dim;
        v_ptrs_[idx] = V(l, static_cast<int32_t>(p), 0) + h * layout.head_dim;
      }
    }
  }
}

Status KvCache::Reserve(std::vector<int32_t>* table, int64_t n_tokens) {
  int64_t need = BlocksFor(n_tokens) - static_cast<int64_t>(table->size());
  if (need <= 0) return OkStatus();
  CHORUS_ASSIGN_OR_RETURN(std::vector<int32_t> pages, pool_->Allocate(need, PageKind::kKv));
  table->insert(table->end(), pages.begin(), pages.end());
  return OkStatus();
}

void KvCache::Release(std::vector<int32_t>* table) {
  pool_->Free(*table);
  table->clear();
}

float* KvCache::K(int64_t layer, int32_t block, int64_t slot) {
  auto* base = reinterpret_cast<float*>(pool_->PageData(block));
  return base + ((layer * 2 + 0) * layout_.block_size + slot) * layout_.kv_dim();
}

float* KvCache::V(int64_t layer, int32_t block, int64_t slot) {
  auto* base = reinterpret_cast<float*>(pool_->PageData(block));
  return base + ((layer * 2 + 1) * layout_.block_size + slot) * layout_.kv_dim();
}

kernels::PagedKv KvCache::View(int64_t layer, int64_t kv_head, const int32_t* block_table) const {
  size_t off = static_cast<size_t>((layer * layout_.n_kv_heads + kv_head) * pool_->n_pages());
  kernels::PagedKv kv;
  kv.k_blocks = k_ptrs_.data() + off;
  kv.v_blocks = v_ptrs_.data() + off;
  kv.block_table = block_table;
  kv.block_size = layout_.block_size;
  kv.kv_stride = layout_.kv_dim();
  return kv;
}

}  // namespace chorus::memory

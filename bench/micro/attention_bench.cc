// Attention kernels (attention.h) at the TinyLlama-1.1B shape (32 query heads, 4 KV heads,
// head_dim 64, 16-token KV blocks), one layer, on the calling thread:
//   BM_Prefill/N/C  — a prompt of N tokens in blocks of 8 tokens per KV head (what a prefill
//                     step runs); counter: causal GFLOP/s (4·head_dim FLOPs per (query head, key))
//   BM_Decode/D/C   — one token at depth D, every KV head; counter: KV bytes read per second
//                     (C = 0: head-major blocks with K in rows, C = 1: K in columns, KvCache's
//                     layout and the column decode; C = 2 / 3: K in columns, bf16 blocks, the
//                     f32 arithmetic on widened values / bf16 dot products, as KvCache asks)
//   BM_DecodeDram/L — one token at depth 4000 over 22 layers' KV (180 MB, so it comes from
//                     DRAM as in a real decode step), segment by segment over the 4 KV heads as
//                     a split-K decode thread does; L = 0: token-major blocks
//                     ([slot][kv_head][head_dim]), L = 1: head-major ([kv_head][slot][head_dim]),
//                     L = 2: head-major bf16 (90 MB), L = 3 / 4: head-major with K in columns
//                     ([kv_head][head_dim][slot], KvCache's layout), f32 / bf16 (dot products,
//                     as KvCache asks); counter: KV bytes read per second
//   BM_DecodePages/B/H/T — the same over KvCache's own page layout (all layers of 16 tokens
//                     in one page), f32 or bf16 dot (B), head by head or all heads together (H),
//                     on T threads splitting the segments as Forward's split-K does
//
//   ./attention_bench --benchmark_filter=Prefill --benchmark_min_time=1
//
// The machine is shared: quote medians and compare runs of one invocation. ATTN_ISA=avx2|scalar
// caps the kernels' ISA level.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chorus/base/large_alloc.h"
#include "chorus/base/thread_pool.h"
#include "chorus/kernels/attention.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/tensor/dtype.h"

namespace chorus::kernels {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 4, kHd = 64, kGroup = kHeads / kKvHeads, kBs = 16;
constexpr int64_t kBlockTokens = 8;

void CapIsa() {
  if (const char* e = std::getenv("ATTN_ISA")) {
    if (auto level = ParseIsaLevel(e)) SetMaxIsa(*level);
  }
}

// One layer's KV of n tokens, in head-major blocks ([block][kv_head][slot][head_dim], KvCache's
// layout) or token-major ones ([block][slot][kv_head][head_dim]).
struct Cache {
  std::vector<float> k, v;
  std::vector<const float*> kp, vp;
  std::vector<int32_t> table;
  std::vector<uint16_t> k16, v16;  // bf16 copies (round to nearest even), when asked for
  bool head_major, bf16 = false, columns = false, dot = false;
  explicit Cache(int64_t n, bool head_major_ = true, uint32_t seed = 1) : head_major(head_major_) {
    const int64_t blocks = (n + kBs - 1) / kBs, kv_dim = kKvHeads * kHd;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd;
    k.resize(static_cast<size_t>(blocks * kBs * kv_dim));
    v.resize(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (int64_t b = 0; b < blocks; ++b) {
      kp.push_back(k.data() + b * kBs * kv_dim);
      vp.push_back(v.data() + b * kBs * kv_dim);
      table.push_back(static_cast<int32_t>(b));
    }
  }
  // K of each head-major block in columns ([kv_head][d][slot], KvCache's layout).
  void ToColumns() {
    columns = true;
    std::vector<float> col(static_cast<size_t>(kBs * kHd));
    for (const float* b : kp) {
      for (int64_t g = 0; g < kKvHeads; ++g) {
        float* head = const_cast<float*>(b) + g * kBs * kHd;
        for (int64_t t = 0; t < kBs; ++t) {
          for (int64_t d = 0; d < kHd; ++d)
            col[static_cast<size_t>(d * kBs + t)] = head[t * kHd + d];
        }
        std::copy(col.begin(), col.end(), head);
      }
    }
  }
  // Keeps only bf16 copies of K and V (the f32 ones are freed, so only bf16 bytes are read).
  void ToBf16() {
    bf16 = true;
    k16.resize(k.size());
    v16.resize(v.size());
    for (size_t i = 0; i < k.size(); ++i) k16[i] = F32ToBF16(k[i]), v16[i] = F32ToBF16(v[i]);
    for (size_t b = 0; b < kp.size(); ++b) {
      kp[b] = reinterpret_cast<const float*>(k16.data() + (kp[b] - k.data()));
      vp[b] = reinterpret_cast<const float*>(v16.data() + (vp[b] - v.data()));
    }
    k = {}, v = {};
  }
  PagedKv View() const {
    PagedKv kv;
    kv.dtype = bf16 ? KvDtype::kBf16 : KvDtype::kF32;
    kv.k_blocks = kp.data();
    kv.v_blocks = vp.data();
    kv.block_table = table.data();
    kv.block_size = kBs;
    kv.kv_stride = head_major ? kHd : kKvHeads * kHd;
    kv.head_stride = head_major ? kBs * kHd : kHd;
    kv.k_columns = columns;
    kv.bf16_dot = dot;
    return kv;
  }
};

std::vector<float> RandomQ(int64_t n) {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd;
  std::vector<float> q(static_cast<size_t>(n));
  for (auto& x : q) x = nd(rng);
  return q;
}

// BM_Prefill / BM_Decode's C: 0 K rows, 1 K columns (f32), 2 K columns bf16 widened, 3 K
// columns bf16 dot products.
void Configure(Cache* cache, int64_t c) {
  if (c >= 1) cache->ToColumns();
  if (c >= 2) cache->ToBf16();
  cache->dot = c == 3;
}
std::string ConfigName(int64_t c) {
  const char* names[] = {" K rows", " K columns", " K columns bf16", " K columns bf16 dot"};
  return names[c];
}

void BM_Prefill(benchmark::State& state) {
  CapIsa();
  const int64_t n = state.range(0), stride = kHeads * kHd;
  Cache cache(n);
  Configure(&cache, state.range(1));
  const std::vector<float> q = RandomQ(n * stride);
  std::vector<float> out(q.size());
  std::vector<float> scratch(
      static_cast<size_t>(AttentionScratchFloats(kBlockTokens, kGroup, kHd)));
  for (auto _ : state) {
    for (int64_t pos0 = 0; pos0 < n; pos0 += kBlockTokens) {
      for (int64_t g = 0; g < kKvHeads; ++g) {
        const int64_t off = pos0 * stride + g * kGroup * kHd;
        AttentionBlock(q.data() + off, stride, std::min(kBlockTokens, n - pos0), pos0, cache.View(),
                       g, kGroup, kHd, 0.125f, scratch.data(), out.data() + off, stride);
      }
    }
    benchmark::DoNotOptimize(out.data());
  }
  const double flops = 4.0 * kHeads * kHd * (static_cast<double>(n) * (n + 1) / 2);
  state.counters["GFLOP/s"] = benchmark::Counter(
      flops * 1e-9 * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  state.SetLabel(std::string(IsaName(ActiveIsa())) + ConfigName(state.range(1)));
}
BENCHMARK(BM_Prefill)
    ->ArgsProduct({{512, 2048, 4096}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  CapIsa();
  const int64_t depth = state.range(0);
  Cache cache(depth);
  Configure(&cache, state.range(1));
  const std::vector<float> q = RandomQ(kHeads * kHd);
  std::vector<float> out(q.size());
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, kGroup, kHd)));
  for (auto _ : state) {
    AttentionRow(q.data(), cache.View(), depth, kHeads, kKvHeads, kHd, 0.125f, scratch.data(),
                 out.data());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * depth * kKvHeads * kHd * (state.range(1) >= 2 ? 2.0 : 4.0) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(IsaName(ActiveIsa())) + ConfigName(state.range(1)));
}
BENCHMARK(BM_Decode)->ArgsProduct({{128, 4000}, {0, 1, 2, 3}})->Unit(benchmark::kMicrosecond);

void BM_DecodeDram(benchmark::State& state) {
  CapIsa();
  constexpr int64_t kLayers = 22, kDepth = 4000;
  const int64_t layout = state.range(0);
  const bool head_major = layout >= 1, bf16 = layout == 2 || layout == 4, columns = layout >= 3;
  std::vector<Cache> layers;
  for (int64_t l = 0; l < kLayers; ++l) {
    layers.emplace_back(kDepth, head_major, static_cast<uint32_t>(l + 1));
    if (columns) layers.back().ToColumns();
    if (bf16) layers.back().ToBf16(), layers.back().dot = true;
  }
  const std::vector<float> q = RandomQ(kHeads * kHd);
  std::vector<float> out(q.size());
  std::vector<float> scratch(static_cast<size_t>(AttentionScratchFloats(1, kGroup, kHd)));
  const int64_t n_seg = AttentionSegments(kDepth), pf = AttentionPartialFloats(kGroup, kHd);
  std::vector<float> partials(static_cast<size_t>(kKvHeads * n_seg * pf));
  for (auto _ : state) {
    for (const Cache& cache : layers) {
      const PagedKv kv = cache.View();
      for (int64_t s = 0; s < n_seg; ++s) {
        for (int64_t g = 0; g < kKvHeads; ++g) {
          AttentionPartials(q.data() + g * kGroup * kHd, kDepth - 1, kv, g, kGroup, kHd, 0.125f, s,
                            s + 1, scratch.data(), partials.data() + (g * n_seg + s) * pf);
        }
      }
      for (int64_t g = 0; g < kKvHeads; ++g) {
        AttentionMerge(partials.data() + g * n_seg * pf, n_seg, kGroup, kHd,
                       out.data() + g * kGroup * kHd);
      }
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * kLayers * kDepth * kKvHeads * kHd * (bf16 ? 2.0 : 4.0) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(IsaName(ActiveIsa())) + (head_major ? " head-major" : " token-major") +
                 (columns ? " K columns" : "") + (bf16 ? " bf16" : " f32"));
}
BENCHMARK(BM_DecodeDram)->DenseRange(0, 4)->Unit(benchmark::kMillisecond);

// KvCache's own page layout: page p holds kBs tokens of every layer, [layer][K|V][kv_head]
// [kBs × head_dim] (K in columns), so one layer's block is a run of K then V for all heads,
// and consecutive blocks of a sequence are a page (22 layers) apart. Views are per KV head, as
// KvCache::View gives them.
struct Pages {
  static constexpr int64_t kLayers = 22;
  int64_t n_pages, elem, page_elems;
  // Huge pages, as KvCache's page pool (AllocateLarge): with 4 KiB pages every block of every
  // layer (352 KB apart in bf16) would be its own TLB miss, which the engine never pays.
  std::unique_ptr<uint8_t, decltype(&std::free)> bytes{nullptr, &std::free};
  std::vector<const float*> kp, vp;  // [(layer · kKvHeads + g) · n_pages + page]
  std::vector<int32_t> table;
  bool bf16;
  Pages(int64_t depth, bool bf16_) : bf16(bf16_) {
    n_pages = (depth + kBs - 1) / kBs;
    elem = bf16 ? 2 : 4;
    page_elems = kLayers * 2 * kKvHeads * kBs * kHd;
    bytes.reset(static_cast<uint8_t*>(
        AllocateLarge(static_cast<size_t>(n_pages * page_elems * elem), "the KV pages")));
    std::mt19937 rng(3);
    std::normal_distribution<float> nd;
    for (int64_t i = 0; i < n_pages * page_elems; ++i) {
      const float x = nd(rng);
      if (bf16) {
        const uint16_t h = F32ToBF16(x);
        std::memcpy(bytes.get() + i * 2, &h, 2);
      } else {
        std::memcpy(bytes.get() + i * 4, &x, 4);
      }
    }
    for (int64_t l = 0; l < kLayers; ++l) {
      for (int64_t g = 0; g < kKvHeads; ++g) {
        for (int64_t p = 0; p < n_pages; ++p) {
          const uint8_t* page = bytes.get() + p * page_elems * elem;
          const int64_t k_off = ((l * 2 + 0) * kKvHeads + g) * kBs * kHd;
          const int64_t v_off = ((l * 2 + 1) * kKvHeads + g) * kBs * kHd;
          kp.push_back(reinterpret_cast<const float*>(page + k_off * elem));
          vp.push_back(reinterpret_cast<const float*>(page + v_off * elem));
        }
      }
    }
    for (int64_t p = 0; p < n_pages; ++p) table.push_back(static_cast<int32_t>(p));
  }
  PagedKv View(int64_t layer, int64_t g) const {
    PagedKv kv;
    const size_t off = static_cast<size_t>((layer * kKvHeads + g) * n_pages);
    kv.k_blocks = kp.data() + off;
    kv.v_blocks = vp.data() + off;
    kv.block_table = table.data();
    kv.block_size = kBs;
    kv.kv_stride = kHd;
    kv.head_stride = kBs * kHd;
    kv.dtype = bf16 ? KvDtype::kBf16 : KvDtype::kF32;
    kv.k_columns = true;
    kv.bf16_dot = bf16;
    return kv;
  }
};

// BM_DecodePages/B/H/T — one token at depth 4000 over 22 layers of KvCache's pages (B = 0: f32,
// 180 MB; B = 1: bf16 dot products, 90 MB), split-K as one thread of Forward's decode runs it:
// H = 0: segment by segment, each KV head in turn over the segment (AttentionPartials);
// H = 1: all KV heads tile by tile together (AttentionPartialsHeads); T threads, each a
// contiguous range of the segments. Counter: KV bytes/s.
void BM_DecodePages(benchmark::State& state) {
  CapIsa();
  constexpr int64_t kDepth = 4000;
  const bool bf16 = state.range(0) == 1, together = state.range(1) == 1;
  const int threads = static_cast<int>(state.range(2));
  const Pages pages(kDepth, bf16);
  const std::vector<float> q = RandomQ(kHeads * kHd);
  std::vector<float> out(q.size());
  const int64_t scratch_floats =
      std::max(AttentionScratchFloats(1, kGroup, kHd),
               AttentionPartialsHeadsScratchFloats(kKvHeads, kGroup, kHd));
  std::vector<float> scratch(static_cast<size_t>(scratch_floats * threads));
  const int64_t n_seg = AttentionSegments(kDepth), pf = AttentionPartialFloats(kGroup, kHd);
  std::vector<float> partials(static_cast<size_t>(kKvHeads * n_seg * pf));
  ThreadPool pool(threads);
  for (auto _ : state) {
    for (int64_t l = 0; l < Pages::kLayers; ++l) {
      PagedKv views[kKvHeads];
      for (int64_t g = 0; g < kKvHeads; ++g) views[g] = pages.View(l, g);
      // Each thread a contiguous range of segments, as Forward's split-K tasks.
      pool.Run([&](int ti, int nt) {
        const int64_t s0 = ti * n_seg / nt, s1 = (ti + 1) * n_seg / nt;
        float* sc = scratch.data() + ti * scratch_floats;
        if (s0 == s1) return;
        if (together) {
          AttentionPartialsHeads(q.data(), kDepth - 1, views, kKvHeads, kGroup, kHd, 0.125f, s0, s1,
                                 sc, partials.data() + s0 * pf, n_seg * pf);
          return;
        }
        for (int64_t s = s0; s < s1; ++s) {
          for (int64_t g = 0; g < kKvHeads; ++g) {
            AttentionPartials(q.data() + g * kGroup * kHd, kDepth - 1, views[g], 0, kGroup, kHd,
                              0.125f, s, s + 1, sc, partials.data() + (g * n_seg + s) * pf);
          }
        }
      });
      for (int64_t g = 0; g < kKvHeads; ++g) {
        AttentionMerge(partials.data() + g * n_seg * pf, n_seg, kGroup, kHd,
                       out.data() + g * kGroup * kHd);
      }
      benchmark::DoNotOptimize(out.data());
    }
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * Pages::kLayers * kDepth * kKvHeads * kHd * (bf16 ? 2.0 : 4.0) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
  state.SetLabel(std::string(IsaName(ActiveIsa())) + (bf16 ? " bf16 dot" : " f32") +
                 (together ? ", heads together" : ", head by head"));
}
BENCHMARK(BM_DecodePages)
    ->ArgsProduct({{0, 1}, {0, 1}, {1, 2}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The same 180 MB read by a plain sum (what one thread can pull from memory right now): the
// scale BM_DecodeDram is judged against on a shared host.
void BM_ReadDram(benchmark::State& state) {
  constexpr int64_t kLayers = 22, kDepth = 4000;
  std::vector<Cache> layers;
  for (int64_t l = 0; l < kLayers; ++l)
    layers.emplace_back(kDepth, true, static_cast<uint32_t>(l + 1));
  for (auto _ : state) {
    float acc[16] = {};
    for (const Cache& cache : layers) {
      for (const std::vector<float>* x : {&cache.k, &cache.v}) {
        const float* p = x->data();
        const size_t n = x->size() / 16 * 16;
        for (size_t i = 0; i < n; i += 16) {
          for (int j = 0; j < 16; ++j) acc[j] += p[i + static_cast<size_t>(j)];
        }
      }
    }
    benchmark::DoNotOptimize(acc);
  }
  state.counters["bytes/s"] =
      benchmark::Counter(2.0 * kLayers * kDepth * kKvHeads * kHd * sizeof(float) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_ReadDram)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace chorus::kernels

BENCHMARK_MAIN();

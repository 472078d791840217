// LoRA adapters (docs/architecture.md, "The one equation"): y = x·Wᵀ + s·(x·Aᵀ)·Bᵀ per targeted
// linear, s = alpha/r (rsLoRA: alpha/√r).
//
// Three representations:
//   * LoraWeights — the tensors as a file holds them (PEFT / GGUF / synthetic): A [r, in] and
//     B [out, r] per (layer, linear), any of f32/f16/bf16 (GGUF also q8_0/q4_0), q/k lora_B rows
//     in the pair order `qk_layout` of the file. What readers produce and writers consume.
//   * LoraAdapter — validated against one base ModelConfig and converted to the compute layout
//     of the segment kernels (kernels/lora.h): f32 or bf16, A [r, in] row-major with the A of
//     linears that share an input concatenated (q|k|v, gate|up) for the fused shrink, Bᵀ [r, out],
//     q/k rows permuted to the base's rope_layout, scale folded per module. The host-tier copy.
//   * LoraView — what the kernels read: per (layer, linear) rank, scale and row tables (one
//     pointer per row of A / Bᵀ). A LoraAdapter is a view over its contiguous storage; a
//     PagedLora (paged_lora.h) is a view over rows packed into pool pages. Both hold the same
//     values (f32 or bf16 storage), so a step computes bitwise the same result from either.
//
// Thread-safety: LoraWeights is a value type; LoraAdapter is immutable after Build() and shared
// (`std::shared_ptr<const LoraAdapter>`).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/adapters/variant.h"
#include "chorus/base/status.h"
#include "chorus/kernels/ops.h"
#include "chorus/memory/host_arena.h"
#include "chorus/model/model.h"
#include "chorus/tensor/tensor.h"

namespace chorus::adapters {

// "layers.3.self_attn.q_proj" — how errors and PEFT patterns name a module.
std::string LoraModuleName(int64_t layer, model::Linear which);
using model::LinearIn;
using model::LinearOut;

struct LoraModuleWeights {
  Tensor a;         // [r, in]; empty = this linear is not targeted
  Tensor b;         // [out, r]
  float alpha = 0;  // lora_alpha of this module (alpha_pattern applied)
  bool present() const { return !a.empty(); }
  int64_t rank() const { return a.empty() ? 0 : a.shape()[0]; }
};

struct LoraWeights {
  int64_t n_layers = 0;
  std::vector<LoraModuleWeights> modules;  // [n_layers × kNumLinears], layer-major
  bool use_rslora = false;                 // s = alpha/√r instead of alpha/r
  // Pair order of q_proj / k_proj lora_B rows: rotate-half for PEFT (Hugging Face order),
  // interleaved for GGUF llama files from llama.cpp's converter.
  kernels::RopeLayout qk_layout = kernels::RopeLayout::kHalf;
  std::string base_model;  // informational (adapter_config.json base_model_name_or_path)

  // Empty weights for `n_layers` layers.
  static LoraWeights Empty(int64_t n_layers);
  LoraModuleWeights& at(int64_t layer, model::Linear which) {
    return modules[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  }
  const LoraModuleWeights& at(int64_t layer, model::Linear which) const {
    return modules[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  }
  // s of a module (0 when absent).
  float Scale(int64_t layer, model::Linear which) const;
  int64_t MaxRank() const;
};

// Element type of the compute copy. bf16 is rounded once at Build (round to nearest even) and
// halves the bytes a step streams per adapter; the kernels widen it exactly and accumulate in f32.
enum class LoraStorage { kF32, kBF16 };
const char* LoraStorageName(LoraStorage s);  // "f32", "bf16"

struct LoraLimits {
  int64_t max_rank = 256;  // modules of larger rank are refused (kInvalidArgument)
  // Not a limit but how the compute copy is stored; carried here because every path that builds
  // an adapter (files, the host cache) takes LoraLimits.
  LoraStorage storage = LoraStorage::kF32;
  // Likewise not a limit: where the compute copy is built. The host tier's prefaulted arena
  // (memory/host_arena.h) when set and not full; otherwise freshly allocated memory.
  std::shared_ptr<memory::HostArena> arena = nullptr;
};

// Checks `w` against the base: layer count, every present module's shapes (A [r, in],
// B [out, r], 1 ≤ r ≤ max_rank), dtypes (f32, f16, bf16, q8_0, q4_0), finite alpha. Errors say
// what does not fit, e.g. "lora_A of layers.3.self_attn.q_proj has 96 columns, base q_proj has
// 64 inputs (hint: adapter for another base model?)". Values are checked in Build().
Status ValidateLoraWeights(const LoraWeights& w, const model::ModelConfig& base,
                           const LoraLimits& limits = {});

class LoraView {
 public:
  // One targeted linear in compute layout. In a tensor-parallel shard (tp_size() > 1: S-LoRA
  // §6's split, docs/scaleout.md) a module holds only part of A and Bᵀ:
  //   q, k, v, gate, up: A rows [a_first, a_first + a_rank) of the r rows (a chunk of the rank;
  //     the shrink is all-gathered), Bᵀ [r, out] for this rank's output rows of the base;
  //   o, down: A [r, in] for this rank's input columns (the shrink is all-reduced), Bᵀ [r, out]
  //     for output columns [out_first, out_first + out) of the whole output.
  // Otherwise a_rank = rank, a_first = out_first = 0 and in / out are the base linear's shape.
  struct Module {
    int64_t rank = 0;                       // r: rows of Bᵀ; 0 = not targeted
    int64_t a_rank = 0;                     // rows of A held here
    int64_t a_first = 0;                    // the first of them among the r rows
    float scale = 0.0f;                     // s
    int64_t in = 0, out = 0;                // widths of the A rows and Bᵀ rows held
    int64_t out_first = 0;                  // first output column of the term
    const float* a = nullptr;               // [a_rank, in] contiguous (host copy only; else null)
    const float* bt = nullptr;              // [rank, out] contiguous (host copy only; else null)
    const float* const* a_rows = nullptr;   // [a_rank] rows of A, each [in] (f32 storage)
    const float* const* bt_rows = nullptr;  // [rank] rows of Bᵀ (lora_B transposed), each [out]
    const uint16_t* const* a_rows_bf16 = nullptr;   // the same for bf16 storage (else null)
    const uint16_t* const* bt_rows_bf16 = nullptr;  //
    // First column of this module's rank values in the group's fused shrink output (Σ r of the
    // members before it): where its expand reads them.
    int64_t fused_col = 0;
  };
  // The A of the linears of one model::LinearGroup (they read the same input), concatenated by
  // rows in LinearGroupMembers() order. Absent modules contribute no rows.
  using Group = model::LinearGroup;
  struct Fused {
    int64_t rank = 0;                      // Σ a_rank of the group's modules (rows held here)
    const float* a = nullptr;              // [rank, in] contiguous (host copy only; else null)
    const float* const* a_rows = nullptr;  // [rank] rows (the members' a_rows, concatenated)
    const uint16_t* const* a_rows_bf16 = nullptr;  // the same for bf16 storage
  };

  LoraView(const LoraView&) = delete;
  LoraView& operator=(const LoraView&) = delete;
  virtual ~LoraView() = default;

  const std::string& name() const { return name_; }
  // The weights' VariantId (adapters/variant.h; set by the host cache from the registration):
  // two copies with the same non-empty id hold the same values, so a pool copy made from one
  // serves the other. Empty for adapters built in memory (benchmarks, kernel tests): such a
  // copy is only ever the same as itself.
  const VariantId& id() const { return id_; }
  int64_t n_layers() const { return n_layers_; }
  const Module& module(int64_t layer, model::Linear which) const {
    return modules_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  }
  const Fused& fused(int64_t layer, Group g) const {
    return fused_[static_cast<size_t>(layer * model::kNumLinearGroups + static_cast<int>(g))];
  }
  int64_t max_rank() const { return max_rank_; }
  // Largest Σ r of a fused group (what a row of the whole fused shrink output holds).
  int64_t max_fused_rank() const { return max_fused_rank_; }
  // This copy is part tp_rank() of tp_size() of the adapter (S-LoRA §6's split); 0 of 1: whole.
  int tp_rank() const { return tp_rank_; }
  int tp_size() const { return tp_size_; }
  LoraStorage storage() const { return storage_type_; }
  int64_t element_bytes() const { return storage_type_ == LoraStorage::kBF16 ? 2 : 4; }
  // Rows of A and Bᵀ of every module: Σ (a_rank + rank) (2 × Σ ranks for a whole adapter).
  int64_t n_rows() const { return static_cast<int64_t>(row_elems_.size()); }
  // Row `i` of the flat row order (per layer: q|k|v A rows, gate|up A rows, o A, down A, then
  // every linear's Bᵀ rows in linear order): its data, elements and bytes.
  const void* row_data(int64_t i) const {
    return storage_type_ == LoraStorage::kBF16
               ? static_cast<const void*>(rows16_[static_cast<size_t>(i)])
               : static_cast<const void*>(rows_[static_cast<size_t>(i)]);
  }
  int64_t row_elems(int64_t i) const { return row_elems_[static_cast<size_t>(i)]; }
  int64_t row_bytes(int64_t i) const { return row_elems(i) * element_bytes(); }

 protected:
  LoraView() = default;
  // Copies shape, ranks, scales and fused columns of `other` (not its pointers).
  void CopyShapeFrom(const LoraView& other);
  // Sizes the row tables from the modules' ranks / shapes and points every Module / Fused at
  // its slice (in the flat row order above). Rows are then set with SetRow().
  void LayoutRowTables();
  // `p` points at row_elems(i) elements of storage().
  void SetRow(int64_t i, const void* p) {
    if (storage_type_ == LoraStorage::kBF16) {
      rows16_[static_cast<size_t>(i)] = static_cast<const uint16_t*>(p);
    } else {
      rows_[static_cast<size_t>(i)] = static_cast<const float*>(p);
    }
  }

  std::string name_;
  VariantId id_;
  int64_t n_layers_ = 0, max_rank_ = 0, max_fused_rank_ = 0;
  int tp_rank_ = 0, tp_size_ = 1;
  std::vector<Module> modules_;                   // [n_layers × kNumLinears]
  std::vector<Fused> fused_;                      // [n_layers × 2]
  LoraStorage storage_type_ = LoraStorage::kF32;  // set before LayoutRowTables()

 private:
  std::vector<const float*> rows_;       // the row tables, [n_rows()] (f32 storage; else empty)
  std::vector<const uint16_t*> rows16_;  // the row tables, [n_rows()] (bf16 storage; else empty)
  std::vector<int64_t> row_elems_;       // [n_rows()]
};

// The host-tier copy: a LoraView over one contiguous allocation of storage() elements.
class LoraAdapter : public LoraView {
 public:
  // Validates (ValidateLoraWeights + every value finite — NaN/Inf refused naming the tensor and
  // the element) and converts. Each tensor is read once: decoded, checked, moved to the base's
  // pair order / transposed and rounded in one pass straight into the storage (this is the CPU
  // work of a cold adapter load; bench/micro/lora_load_bench.cc). `name` is used in messages
  // and logs; `id` becomes id().
  static Result<std::shared_ptr<const LoraAdapter>> Build(const LoraWeights& w,
                                                          const model::ModelConfig& base,
                                                          std::string name,
                                                          const LoraLimits& limits = {},
                                                          VariantId id = {});
  // Part `tp_rank` of `tp_size` of the adapter `w` of the whole model `base` (S-LoRA §6's split,
  // Module above), for a LoraHook over model::ShardModel's shard of `base` under a communicator
  // of that size. Reads only the parts of `w` it keeps (a quantized A of o/down is decoded and
  // sliced, so no block boundary constrains the split); validation and errors as Build.
  // tp_size 1: Build.
  static Result<std::shared_ptr<const LoraAdapter>> BuildShard(
      const LoraWeights& w, const model::ModelConfig& base, int tp_rank, int tp_size,
      std::string name, const LoraLimits& limits = {}, VariantId id = {});

  // Bytes of compute weights held.
  int64_t memory_bytes() const { return static_cast<int64_t>(storage_.size()); }

 private:
  LoraAdapter() = default;
  // Every A and Bᵀ in the flat row order, in storage() elements (f32, or bf16 rounded once at
  // Build); never resized after Build. Uninitialized: Build writes every byte once.
  memory::HostBuffer storage_;
};

// The part [first, first + count) of n items that rank p of `size` holds under S-LoRA's split:
// n·p/size rounded down to n·(p+1)/size (a rank may hold nothing when n < size).
struct TpPart {
  int64_t first = 0, count = 0;
};
TpPart LoraTpPart(int64_t n, int p, int size);

// ---- Test oracles and synthetic adapters ----

// Random LoRA weights in Hugging Face order (qk_layout = kHalf) for `base`: A ~ N(0, 1/in),
// B ~ N(0, b_std²), f32, for each listed target module of every layer.
struct RandomLoraSpec {
  int64_t rank = 8;
  float alpha = 16.0f;
  bool use_rslora = false;
  float b_std = 0.02f;  // PEFT initialises B to 0; a non-zero B makes the adapter visible
  std::vector<model::Linear> targets = {
      model::Linear::kQ,    model::Linear::kK,  model::Linear::kV,   model::Linear::kO,
      model::Linear::kGate, model::Linear::kUp, model::Linear::kDown};
  uint64_t seed = 1;
};
LoraWeights MakeRandomLora(const model::ModelConfig& base, const RandomLoraSpec& spec);

// `w` with every A / B value replaced by what a compute copy of `storage` holds (bf16: rounded to
// nearest even; f32: unchanged), as f32 tensors. Oracles (MergeLora) built from it see exactly
// the weights the unmerged path uses.
LoraWeights RoundedAsStored(const LoraWeights& w, LoraStorage storage);

// The merged-weights oracle: the base's canonical tensors with W + s·B·A added to every
// targeted linear (in f32; q/k rows in the base's order), rebuilt through Model::Build.
// Serving never merges (docs/architecture.md, "The one equation"); tests compare the unmerged path
// against this.
Result<std::shared_ptr<const model::Model>> MergeLora(const model::Model& base,
                                                      const LoraWeights& w);

}  // namespace chorus::adapters

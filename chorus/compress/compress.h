// `chorus compress`: a full fine-tune F of a base B into a delta file (docs/deltas.md).
//
//   * rtn       — RtnCompress of every linear's Δ = W_F − W_B; no calibration.
//   * deltazip  — ΔCompress (DeltaZip Alg. 1): layer by layer, and inside a layer in the order
//                 the inputs are produced (q|k|v, o, gate|up, down), the calibration text is run
//                 through B + the deltas already compressed (a DenseDeltaHook) to collect the
//                 linear's inputs X, H = 2·XᵀX / n, and ObsCompress chooses mask and codes.
//   * bitdelta  — SignCompress of every linear, then scale distillation (BitDelta §3.2): the
//                 per-matrix scales are trained with Adam to minimise the mean KL(F ‖ B + Δ̃) of
//                 the next-token distributions on calibration text, B + Δ̃ run as served (the
//                 packed signs through delta::DeltaHook). The gradient is estimated by
//                 simultaneous perturbation (SPSA: two evaluations per step on the same
//                 minibatch, whatever the number of scales), since Chorus has no backward pass
//                 through a delta.
//
// Non-linear tensors that differ (embeddings, output head, norms) become extra deltas: vectors
// exact, matrices int8 per row (or exact with extras_exact).
//
// Thread-safety: functions; the models are shared and immutable.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/base/thread_pool.h"
#include "chorus/kernels/matmul.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"

namespace chorus::compress {

struct CompressOptions {
  delta::Method method = delta::Method::kDeltaZip;
  int bits = 4;                 // 1 for bitdelta
  bool sparse24 = true;         // 2:4 structured sparsity (bitdelta default none)
  int64_t group_size = 64;      // columns per scale; 0 = one per matrix (bitdelta)
  double damp = 0.01;           // deltazip: damping × mean diag(H)
  int refine_sweeps = 4;        // deltazip: local-search sweeps after OBS (quantize.h)
  int64_t calib_seq_len = 128;  // calibration sequences (BOS + text), tokens each
  int distill_steps = 200;      // bitdelta: Adam steps
  int64_t distill_batch = 4;    // bitdelta: sequences per step
  double distill_lr = 0.02;     // bitdelta: Adam step on log-scale
  bool extras_exact = false;    // keep matrix extras (embeddings, head) exact f32, not int8
  uint64_t seed = 1;
  // Progress lines ("layer 3/5 ...", "distill step 50/200 kl=..."); may be empty.
  std::function<void(const std::string&)> progress;
};
Status ValidateCompressOptions(const CompressOptions& o);

// B and F must have the same configuration and tensors (names, shapes); the error names the
// first tensor that differs.
Status CheckSameArchitecture(const model::ModelFile& base, const model::ModelFile& finetuned);
Status CheckSameArchitecture(const model::Model& base, const model::Model& finetuned);

// Cuts calibration tokens (the whole text tokenized, BOS first) into sequences of
// `seq_len` tokens, each starting with BOS (when bos ≥ 0).
std::vector<std::vector<int32_t>> CalibrationSequences(std::span<const int32_t> tokens,
                                                       int64_t seq_len, int32_t bos);

// Adds x·Dᵀ for every (layer, linear) that has a dense delta D, and optionally accumulates
// H += 2·xᵀx of one linear's inputs (the capture target). The calibration engine of ΔCompress
// and of BitDelta's distillation. Both products run on the f32 MatMul kernel (the scalar loops
// they replaced made `chorus compress --method deltazip` take hours at TinyLlama shape).
// Not thread-safe: Apply uses scratch of the hook's own.
class DenseDeltaHook : public model::LinearHook {
 public:
  explicit DenseDeltaHook(const model::ModelConfig& c);
  // d: [out, in] f32 for (layer, which), or empty to remove.
  void Set(int64_t layer, model::Linear which, std::vector<float> d);
  const std::vector<float>& Get(int64_t layer, model::Linear which) const;
  // Capture the inputs of (layer, which) into h [in, in] (+= 2·xᵀx per row; counts rows).
  void Capture(int64_t layer, model::Linear which, std::vector<double>* h, int64_t* n_rows);
  void StopCapture();
  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override;

 private:
  model::ModelConfig config_;
  std::vector<std::shared_ptr<std::vector<float>>> d_;  // [n_layers × kNumLinears]
  std::vector<kernels::PackedWeight> packed_;           // f32 views of d_, used in place
  mutable std::vector<float> xt_, xtx_;                 // Apply's scratch
  int64_t cap_layer_ = -1;
  model::Linear cap_which_ = model::Linear::kQ;
  std::vector<double>* cap_h_ = nullptr;
  int64_t* cap_n_ = nullptr;
};

struct CompressReport {
  int64_t finetuned_matrix_bf16_bytes = 0;  // Σ linear matrices of F × 2 bytes
  int64_t finetuned_bf16_bytes = 0;         // every tensor of F × 2 bytes
  double base_kl_calib = 0,
         final_kl_calib = 0;  // bitdelta: calibration KL before / after distillation
};

// Compresses F against B. `calib_tokens` (the calibration text, tokenized) is needed by deltazip
// and bitdelta (kInvalidArgument when empty). The result's base_hash is BaseWeightsHash(B).
//
// Memory: both models are read from their files (model::ReadModelFile), one matrix at a time,
// and each source matrix's pages are released once read; every compressed matrix is packed as
// soon as it is final. B is prepared for the kernels only when a method runs it (deltazip,
// bitdelta's distillation; never rtn), F only for bitdelta's reference pass, before B and
// dropped after it — never both (docs/deltas.md "How it runs").
Result<delta::Delta> CompressDelta(const model::ModelFile& base, const model::ModelFile& finetuned,
                                   std::span<const int32_t> calib_tokens, int32_t bos,
                                   const CompressOptions& opts, ThreadPool* pool,
                                   CompressReport* report = nullptr);
// The same for models already loaded (tests, tools that hold them): their prepared weights serve
// the passes that run them.
Result<delta::Delta> CompressDelta(std::shared_ptr<const model::Model> base,
                                   std::shared_ptr<const model::Model> finetuned,
                                   std::span<const int32_t> calib_tokens, int32_t bos,
                                   const CompressOptions& opts, ThreadPool* pool,
                                   CompressReport* report = nullptr);

// A synthetic full fine-tune for benchmarks: every linear matrix of `base` plus Gaussian noise
// whose Frobenius norm is a fraction of the matrix's own, drawn per matrix uniformly from
// [rel_lo, rel_hi] (seeded; DeltaZip §3.1 observes 2–6 % for real fine-tunes); other tensors
// unchanged; stored in the base's dtypes. The ModelFile form reads the base's tensors without
// preparing either model for the kernels (`chorus convert --finetune-delta`): each matrix of a
// base read from a file has its pages released once its noisy copy is made, so the peak is about
// one copy of the weights.
Result<model::ModelFile> MakeSyntheticFineTune(const model::ModelFile& base, double rel_lo,
                                               double rel_hi, uint64_t seed);
Result<std::shared_ptr<const model::Model>> MakeSyntheticFineTune(const model::Model& base,
                                                                  double rel_lo, double rel_hi,
                                                                  uint64_t seed);

}  // namespace chorus::compress

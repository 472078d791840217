// The forward pass over one step (docs/architecture.md, "One request"): any mix of prefill chunks
// and decode rows of many sequences, computed as one batch. Each row is one token of one sequence
// at one position; its K/V are written into the sequence's paged KV blocks, then attention reads
// positions [0, pos].
//
// Every linear layer is computed once for all rows of the step (x·Wᵀ streams W once), after
// which an optional LinearHook adds per-row terms — the seam where LoRA / delta adapters plug
// in (docs/architecture.md, "The one equation") without the model knowing about them.
//
// Thread-safety: a Forward object is used by one thread (the engine thread) at a time; it uses
// the ThreadPool for parallel kernels. The Model is shared and immutable.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "chorus/base/thread_pool.h"
#include "chorus/dist/communicator.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/model.h"

namespace chorus::model {

// Implemented by adapters (a higher module): adds the adapter terms of `layer`'s linear `which`
//   y[i, :] += Δ_{adapter(i)}(x[i, :])   for every row i of the step
// x: [n_rows, in] with stride x_stride; y: [n_rows, out] with stride y_stride.
class LinearHook {
 public:
  virtual ~LinearHook() = default;
  virtual void Apply(int64_t layer, Linear which, const float* x, int64_t x_stride, float* y,
                     int64_t y_stride, int64_t n_rows, ThreadPool* pool) const = 0;

  // One output of ApplyGroup.
  struct Target {
    Linear which;
    float* y;
    int64_t y_stride;
  };
  // The terms of one LinearGroup of `layer` (model.h: q|k|v or gate|up, which read the same x),
  // in one call so that an implementation can share work between them. `targets` are the
  // group's members in LinearGroupMembers() order. Default: Apply for each, in order.
  virtual void ApplyGroup(int64_t layer, LinearGroup group, std::span<const Target> targets,
                          const float* x, int64_t x_stride, int64_t n_rows,
                          ThreadPool* pool) const {
    (void)group;
    for (const Target& t : targets)
      Apply(layer, t.which, x, x_stride, t.y, t.y_stride, n_rows, pool);
  }

  // The parts of the model other than the layer linears that a variant may change (a full
  // fine-tune's norms, embeddings and output head: docs/variants.md). Defaults: no change.
  //
  // After the embedding lookup: rows whose variant changes the token embeddings add their
  // change to x [tokens.size(), d].
  virtual void AdjustEmbeddings(std::span<const int32_t> tokens, float* x, int64_t d) const {
    (void)tokens, (void)x, (void)d;
  }
  enum class Norm { kAttn, kFfn, kOutput };  // kOutput: layer is ignored
  // After the base RMSNorm wrote y[j] = RmsNorm(x[rows[j]]) ⊙ base_weight for j < rows.size():
  // rows whose variant has its own weight for this norm are rewritten with it (x and y are
  // [*, d]; rows[j] is the step row of y's row j).
  virtual void AdjustNorm(int64_t layer, Norm which, std::span<const int32_t> rows, const float* x,
                          float* y, const float* base_weight, int64_t d, float eps) const {
    (void)layer, (void)which, (void)rows, (void)x, (void)y, (void)base_weight, (void)d, (void)eps;
  }
  // After the output head: logits[j, :] (+)= the variant's term for step row logit_rows[j],
  // h: the final-normed rows [logit_rows.size(), d].
  virtual void ApplyOutput(std::span<const int32_t> logit_rows, const float* h, int64_t d,
                           float* logits, int64_t vocab, ThreadPool* pool) const {
    (void)logit_rows, (void)h, (void)d, (void)logits, (void)vocab, (void)pool;
  }
};

// The KV cache layout for `config`: its layers' sliding windows (so the blocks of windowed layers
// are grouped apart and released behind the window, memory/kv_cache.h) and `block_size`. A
// layout without the windows serves the model as well, keeping every block.
memory::KvLayout KvLayoutFor(const ModelConfig& config, int64_t block_size = 16,
                             kernels::KvDtype dtype = kernels::KvDtype::kF32);

struct StepInput {
  std::span<const int32_t> tokens;     // [n_rows] token ids (validated < vocab by the caller)
  std::span<const int32_t> positions;  // [n_rows] position of each row in its sequence
  std::span<const int32_t> seq;        // [n_rows] index into block_tables
  // [n_seqs] block table of each sequence (KvCache's, every layer group's blocks interleaved);
  // must cover position+1 tokens of each of its rows.
  std::span<const int32_t* const> block_tables;
  // Rows whose logits are wanted, in output order (e.g. the last row of each sequence).
  std::span<const int32_t> logit_rows;
  const LinearHook* hook = nullptr;  // adapter terms; null = base model only
  // Rows whose final-normed hidden states are wanted (embeddings), in output order: the input
  // of the output head, with the variant's output-norm adjustment, as the logit rows get it.
  std::span<const int32_t> hidden_rows = {};
  // A slice of the layers, [first_layer, end_layer) (end_layer −1 = to the last), for ΔCompress's
  // layer-by-layer calibration (chorus/compress): with `residual_in` [n_rows, n_embd] the rows
  // enter first_layer with these residual-stream values instead of their embeddings; with
  // `residual_out` the residual stream after the slice is written there and nothing follows
  // (no final norm, no logits: logit_rows and hidden_rows must be empty). A slice computes
  // exactly what the same layers compute inside a whole pass.
  int64_t first_layer = 0;
  int64_t end_layer = -1;
  const float* residual_in = nullptr;
  float* residual_out = nullptr;
};

class Forward {
 public:
  // Preallocates every buffer for steps of up to `max_rows` rows and `max_logit_rows` logits.
  // With `comm` of size > 1, `model` is this rank's tensor-parallel shard
  // (model/tensor_parallel.h): the outputs of o and of down are partial sums, all-reduced over
  // the ranks before the residual add (every rank must run the same steps).
  Forward(std::shared_ptr<const Model> model, int64_t max_rows, int64_t max_logit_rows,
          dist::Communicator* comm = nullptr);

  const Model& model() const { return *model_; }
  int64_t max_rows() const { return max_rows_; }

  // Runs one step. logits: [logit_rows.size(), vocab] floats; hidden: [hidden_rows.size(),
  // n_embd] floats (may be null when there are no hidden rows).
  // Requires: rows ≤ max_rows, logit rows ≤ max_logit_rows, positions < config.max_seq_len.
  void Run(const StepInput& in, memory::KvCache* kv, ThreadPool* pool, float* logits,
           float* hidden = nullptr);

 private:
  // One unit of a layer's attention (docs/architecture.md, "Attention"): a block of consecutive
  // tokens of one sequence over one KV head, or (split-K) a range of segments of one decode row
  // over every KV head, whose partials a merge task then folds.
  struct AttnTask {
    int32_t row = 0;                     // first row of the block / the split row
    int32_t n_tokens = 0;                // block: tokens; split: 0
    int32_t kv_head = 0;                 // block only
    int32_t seg_begin = 0, seg_end = 0;  // split: absolute segments; merge: segments to fold
    int64_t partials = 0;                // split: offset of the row's partials in partials_
  };
  // A step's attention plan for the layers of one window (0: none): tasks run in phase 1
  // (blocks and split ranges, costliest first, taken from next_task_ by whichever thread is
  // free); merges in phase 2 (split rows × KV head).
  struct AttnPlan {
    int64_t window = 0;
    std::vector<AttnTask> tasks, merges;
  };
  // Cuts the step's rows into attention tasks for the layers of plan->window (once per step and
  // window, the same for every such layer); returns the floats of partials it needs.
  int64_t PlanAttention(const StepInput& in, int n_threads, AttnPlan* plan);
  void Attention(const StepInput& in, memory::KvCache* kv, int64_t layer, ThreadPool* pool);
  void Linear(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
              int64_t y_stride, int64_t n, const StepInput& in, ThreadPool* pool);
  // The linears of `group` (model.h's LinearGroup: q|k|v, gate|up) of `layer` over their
  // shared input x, computed in one fused MatMulMulti dispatch when their weights agree in k and
  // dtype, then their hook terms in one ApplyGroup call.
  using LinearOut = LinearHook::Target;
  void Linears(int64_t layer, LinearGroup group, const float* x, int64_t x_stride, int64_t n,
               const StepInput& in, ThreadPool* pool);
  LinearOut OutputOf(model::Linear which);  // the step buffer a grouped linear writes

  std::shared_ptr<const Model> model_;
  int64_t max_rows_, max_logit_rows_;
  dist::Communicator* comm_ = nullptr;      // null or size 1: no tensor parallelism
  std::vector<float> inv_freq_;             // [rotary_dim / 2]
  std::vector<float> rope_cos_, rope_sin_;  // [max_rows, rotary_dim / 2]: this step's rotations
  // Sliding layers with their own RoPE base (Gemma 3): their inv_freq and tables; empty = same.
  std::vector<float> inv_freq_local_, rope_cos_local_, rope_sin_local_;
  // Step buffers, [max_rows, width] each.
  std::vector<float> x_, xb_, q_, k_, v_, att_, gate_, up_, logit_in_;
  std::vector<int32_t> step_rows_;  // 0, 1, …, max_rows − 1: the rows of a layer norm
  int64_t attn_block_tokens_ = 1;   // tokens per attention block (≈ 64 rows of (token, head))
  int64_t attn_scratch_floats_ = 0;
  std::vector<float> scratch_;  // [n_threads][attn_scratch_floats_] attention block scratch
  int64_t scratch_threads_ = 0;
  std::vector<kernels::PagedKv> head_views_;  // [n_threads][n_kv_heads] a split task's views
  // This step's attention plans, one per window the tiled layers use (Gemma 3: local and global).
  std::vector<AttnPlan> plans_;
  std::vector<int32_t> layer_plan_;  // [n_layers] index of each layer's plan (its window's)
  std::vector<float> partials_;      // split rows' segment partials; grows to the largest step seen
  std::atomic<int64_t> next_task_{0};
};

}  // namespace chorus::model

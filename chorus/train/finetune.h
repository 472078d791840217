// The fine-tuning loop behind `chorus finetune` (docs/finetuning.md): data → packed sequences →
// micro-batches → TrainModel forward/backward → gradient accumulation, clipping, AdamW with a
// warm-up + decay schedule → PEFT checkpoints, resumable.
//
// Reproducibility: the sample order of epoch e is a Fisher–Yates shuffle seeded by (seed, e),
// packing is deterministic, every kernel reduces in a fixed order independent of the thread
// count (grad_kernels.h, layer_ops.h, kernels/matmul.h and kernels/lora.h), and the optimizer
// runs sequentially: the same options and data give bitwise the same adapter, with any
// --threads, and a run resumed from a checkpoint ends where the uninterrupted run ends. (The
// kernel ISA level is the one thing that changes the rounding: kernels/lora.h's AVX variants
// sum in another order than the scalar one.)
//
// Output directory:
//   adapter_config.json, adapter_model.safetensors   the final adapter (PEFT; loads with
//                                                      `chorus serve --lora` and with PEFT)
//   checkpoint-<step>/                                 the same plus optimizer.safetensors
//                                                      (A, Bᵀ, AdamW moments) and
//                                                      trainer_state.json; written to a temporary
//                                                      directory and renamed (atomic); the
//                                                      latest two are kept
//   loss.csv                                           one row per optimizer step
//   .lock                                              flock(2) of the running run (one run per
//                                                      directory); a run first removes the
//                                                      `.tmp-*` and `*.tmp.<pid>` leftovers of a
//                                                      killed one (docs/finetuning.md,
//                                                      "Durability")
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "chorus/model/model.h"
#include "chorus/tokenizer/tokenizer.h"
#include "chorus/train/data.h"
#include "chorus/train/lora_model.h"
#include "chorus/train/optimizer.h"

namespace chorus::train {

struct FinetuneOptions {
  std::string data_path;
  std::string eval_path;  // optional held-out data (same formats)
  std::string output_dir;
  LoraSpec lora;  // rank, alpha, targets, seed (also seeds the data order)
  double lr = 2e-4;
  int64_t epochs = 1;
  int64_t steps = 0;  // > 0: stop after this many optimizer steps (epochs repeat as needed)
  int64_t batch = 4;  // packed sequences per micro-batch
  int64_t grad_accum = 1;
  int64_t warmup = 0;
  Schedule schedule = Schedule::kCosine;
  double clip = 1.0;  // max global gradient norm (≤ 0: off)
  AdamWOptions adamw;
  int64_t save_every = 0;       // checkpoint every N steps (0: only at the end)
  bool resume = false;          // continue from the latest checkpoint in output_dir
  DataOptions data;             // seq_len, size limit, chat template
  std::string base_model_name;  // adapter_config.json base_model_name_or_path
  // Checked before each optimizer step (may be null): when set, the run stops with kCancelled
  // and writes no final adapter (checkpoints already written stay).
  const std::atomic<bool>* cancel = nullptr;
  // Called once the data files are read and validated (may be empty), with the sample counts.
  std::function<void(int64_t train_samples, int64_t eval_samples, int64_t total_steps)>
      on_validated;
  // Training as a scheduler client (engine/training_gate.h; both may be empty): called on the
  // training thread around each optimizer step — its forward/backward passes, update, held-out
  // evaluation and checkpoint — so that a step is atomic with respect to whoever grants it.
  // before_step blocks until the step may run and returns the pool to run it on (null: stop,
  // as a cancel); after_step ends the step.
  std::function<ThreadPool*()> before_step;
  std::function<void()> after_step;
};

struct StepReport {
  int64_t step = 0, total_steps = 0;  // step: 1-based, just finished
  double epoch = 0;                   // fractional epoch
  double loss = 0;                    // mean loss of the step's loss tokens
  double lr = 0, grad_norm = 0;
  int64_t tokens = 0;       // rows (tokens) processed so far in this process
  double tokens_per_s = 0;  // since this process started training
  double elapsed_s = 0, eta_s = 0;
  std::optional<double> eval_loss;  // when this step evaluated --eval
  bool checkpoint = false;
};

struct FinetuneResult {
  int64_t steps = 0;
  int64_t samples = 0, sequences_per_epoch = 0;
  double final_loss = 0;
  std::optional<double> eval_loss;
  double tokens_per_s = 0;
  int64_t activation_bytes = 0, trainable_params = 0;
};

Result<FinetuneResult> RunFinetune(std::shared_ptr<const model::Model> model,
                                   const tokenizer::Tokenizer& tok, const FinetuneOptions& opts,
                                   ThreadPool* pool,
                                   const std::function<void(const StepReport&)>& progress = {});

// Mean loss of `samples` (packed in order, `batch` sequences per forward) under `params`.
Result<double> EvalLoss(TrainModel& tm, const LoraParams& params,
                        const std::vector<Sample>& samples, int64_t seq_len, int64_t batch,
                        ThreadPool* pool);

}  // namespace chorus::train

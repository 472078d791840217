// FullModels: the `--swap-full-models` baseline (docs/deltas.md, "Swapping full models"): each
// fine-tune is served as a whole model of its own, at most `max_resident` of them in memory at a
// time, swapped in from disk when a waiting request needs one and none of the resident ones can
// give its place. It is the CPU stand-in for DeltaZip's vLLM-SCB baseline (DeltaZip §6): whole
// models swapped in and out, requests of the same model batched together, the resident models'
// batches computed one model after the other inside a step (a model's weights cannot serve the
// rows of another), no sharing of the base's weights between fine-tunes.
//
//   disk ──(swap thread: model::LoadModel — read, convert, repack)──▶ resident Model + its Forward
//
// * Identity: each fine-tune is a variant of kind "full" (adapters::VariantRef) named on the
//   command line; the server resolves a request's `model` to it and the engine to its Entry.
// * Residency: an Entry is absent, loading or resident. Want() starts a swap-in when fewer than
//   max_resident models are resident or loading, else evicts the least recently used resident
//   model that no running sequence uses (Pin/Unpin) and starts it then; otherwise the request
//   waits. A loading model counts against max_resident, so at most max_resident whole models
//   (plus the base) are ever in memory. Evicting drops the model's weights at once.
// * Cost: the swap is real — the file is read and its weights converted and repacked exactly as
//   at start-up — and measured: seconds, file bytes, and the bytes the process read from storage
//   meanwhile (/proc/self/io read_bytes: page-cache hits do not count), exported in /metrics.
//
// Thread-safety: the set of entries is fixed at Create, so refs() and Find() may be called from
// any thread; Want, Poll, Pin, Unpin and the Entry fields other than `ref` are engine-thread
// only; the swap thread reads only `ref` and hands finished loads over through a locked list,
// which Poll applies.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "chorus/adapters/variant.h"
#include "chorus/base/mutex.h"
#include "chorus/base/status.h"
#include "chorus/engine/metrics.h"
#include "chorus/model/forward.h"
#include "chorus/model/model.h"

namespace chorus::engine {

// One fine-tune served as a whole model: `--full-model NAME=PATH`.
struct FullModelSpec {
  std::string name;
  std::string path;  // any format model::LoadModel reads (GGUF, Hugging Face directory, llama2.c)
};

// Returns the first difference that keeps `m` from sharing the engine's KV cache, steps and
// tokenizer with `base` (architecture, shapes, vocabulary, context, RoPE, norms), or OK.
// The weights' dtypes may differ.
Status CheckSameShape(const model::ModelConfig& base, const model::ModelConfig& m,
                      const std::string& what);

class FullModels {
 public:
  struct Options {
    int64_t max_resident = 1;  // whole fine-tunes in memory at a time (besides the base)
    int64_t max_rows = 512;    // the engine's step sizes, for each model's Forward
    int64_t max_logit_rows = 64;
  };
  enum class State { kAbsent, kLoading, kResident, kFailed };
  struct Entry {
    adapters::VariantRef ref;  // kind "full"
    State state = State::kAbsent;
    std::shared_ptr<const model::Model> model;  // resident only
    std::unique_ptr<model::Forward> forward;    // resident only: this model's step
    int users = 0;                              // running sequences using it
    uint64_t last_use = 0;
    Status error;  // kFailed: why the last swap-in failed
  };

  // Checks every spec before serving (a missing file, a model another shape or architecture
  // than `base`, a repeated or reserved name: kInvalidArgument naming the model and the path)
  // by loading each one as a swap-in will, then dropping it. `base_name`: the served name of
  // the base, which no fine-tune may take. `wake` is called on the swap thread when a swap-in
  // finishes (the engine re-plans).
  static Result<std::unique_ptr<FullModels>> Create(const std::vector<FullModelSpec>& specs,
                                                    const model::ModelConfig& base,
                                                    const std::string& base_name, Options opts,
                                                    EngineMetrics* metrics,
                                                    std::function<void()> wake);
  ~FullModels();  // waits for a swap-in in flight
  FullModels(const FullModels&) = delete;
  FullModels& operator=(const FullModels&) = delete;

  // Any thread: what requests may name (fixed at Create).
  const std::vector<adapters::VariantRef>& refs() const { return refs_; }

  Entry* Find(const std::string& name);  // null when no such model

  // Engine thread.
  // Applies finished swap-ins (they become resident, or failed).
  void Poll();
  // Whether `e` can run now (resident); if it is absent, starts its swap-in when a slot is free
  // or can be freed by evicting the least recently used resident model without users.
  bool Want(Entry* e);
  void Pin(Entry* e);
  void Unpin(Entry* e);
  int64_t resident() const;

 private:
  FullModels(Options opts, EngineMetrics* metrics, std::function<void()> wake);
  void SwapMain();
  void Evict(Entry* e);

  const Options opts_;
  EngineMetrics* const metrics_;
  const std::function<void()> wake_;
  std::vector<adapters::VariantRef> refs_;
  std::map<std::string, Entry> entries_;  // by name; node-based, so Entry pointers stay valid
  uint64_t tick_ = 0;

  struct Done {
    Entry* entry;
    std::shared_ptr<const model::Model> model;
    std::unique_ptr<model::Forward> forward;
    Status status;
  };
  Mutex mu_;
  CondVar cv_;
  std::deque<Entry*> jobs_ GUARDED_BY(mu_);
  std::vector<Done> done_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Bytes this process has read from storage so far (/proc/self/io read_bytes; 0 if unknown).
int64_t ProcessReadBytes();

}  // namespace chorus::engine

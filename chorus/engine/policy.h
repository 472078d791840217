// Policy: the engine's admission rule, one object per engine, asked once per waiting sequence
// and step. The engine keeps the mechanics (rows, sequences and pool pages that fit, pinning,
// preemption); a policy only decides, in queue order, which waiting sequences may join the
// step. A new scheduling rule (adapter clustering, SLO-aware early abort, fine-tuning
// deferral) is a new Policy; nothing else in the engine changes.
//
// Thread-safety: called only from the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace chorus::engine {

// What a policy sees of a waiting sequence. `adapter` identifies its variant's weights
// (null = the base model); equal pointers mean the same adapter. `passes` is the policy's own
// per-sequence counter, kept by the engine with the sequence (0 when it arrives).
struct Candidate {
  const void* adapter = nullptr;
  int* passes = nullptr;
  bool delta = false;  // the variant is a compressed full fine-tune (docs/deltas.md)
};

class Policy {
 public:
  virtual ~Policy() = default;
  // A new admission round; `step_adapters` are the distinct LoRA adapters and `step_deltas` the
  // distinct deltas already in the step (its running sequences').
  virtual void BeginRound(const std::vector<const void*>& step_adapters,
                          const std::vector<const void*>& step_deltas) = 0;
  // May `c`, the next waiting sequence in queue order, be admitted now? false passes over it
  // (it keeps its place in the queue).
  virtual bool MayAdmit(const Candidate& c) = 0;
  // `c` was admitted (it fit).
  virtual void Admitted(const Candidate& c) = 0;
};

// First come, first served, with optional caps on distinct LoRA adapters and on distinct deltas
// per step (0 = none; the delta cap is DeltaZip's N-delta rule: requests for deltas already in
// the step skip the line, others wait until a delta leaves the step).
// A sequence whose adapter would exceed the cap is passed over, and later ones may overtake it,
// but only kMaxPasses times: then it becomes a barrier and no newer sequence with an adapter is
// admitted before it (newer base-model sequences still are: they take no adapter slot), so the
// adapters in the step cannot keep it out forever.
class FcfsPolicy : public Policy {
 public:
  static constexpr int kMaxPasses = 8;
  explicit FcfsPolicy(int64_t max_adapters_per_step, int64_t max_deltas_per_step = 0);
  void BeginRound(const std::vector<const void*>& step_adapters,
                  const std::vector<const void*>& step_deltas) override;
  bool MayAdmit(const Candidate& c) override;
  void Admitted(const Candidate& c) override;

 private:
  bool InStep(const Candidate& c) const;
  const int64_t cap_, delta_cap_;
  // The step's distinct LoRA adapters and deltas (reserved; no allocation per round once warm).
  std::vector<const void*> step_adapters_, step_deltas_;
  bool barrier_ = false;
};

}  // namespace chorus::engine

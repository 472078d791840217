// Test support (not used by serving): runs the same steps through the whole model in this thread
// and through a tensor-parallel group whose other ranks are threads of this process
// (dist::MakeThreadCommunicators), and reports how far the logits and greedy tokens differ.
// model/tensor_parallel_test.cc and adapters/lora/lora_tp_test.cc use it; tests/tp runs the
// same comparison over MPI.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/dist/thread_communicator.h"
#include "chorus/memory/page_pool.h"
#include "chorus/model/step_builder.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::model::testing {

struct TpComparison {
  float max_abs_diff = 0;      // over every logit of every step
  int token_mismatches = 0;    // greedy tokens that differ
  std::string first_mismatch;  // "step 3 sequence 1: 17 vs 42"
};

// Variants under test, each a TpHookForRows giving the step's hook for the rows' slots: the
// reference's (whole model), and rank r's for its shard (index r), made for the communicator
// rank r's forward pass uses (a LoRA hook runs its collectives on it); every row of sequence s
// uses slot seq_slots[s]. Empty: base model only.
using TpHookFactory = std::function<TpHookForRows(dist::Communicator* comm)>;
struct TpVariants {
  TpHookForRows ref;
  std::vector<TpHookFactory> ranks;
  std::vector<int32_t> seq_slots;
};

// Two sequences (prompts of 11 and 3 tokens, the first in chunks of 6 beside the second's decode
// rows), `steps` steps, greedy continuation of each from the reference's token.
// shards[r] is rank r's shard of `full`.
inline TpComparison CompareTensorParallel(std::shared_ptr<const Model> full,
                                          const std::vector<std::shared_ptr<const Model>>& shards,
                                          int steps = 8, const TpVariants& variants = {}) {
  const int n = static_cast<int>(shards.size());
  auto comms = dist::MakeThreadCommunicators(n);
  std::vector<TpHookForRows> hooks;
  for (size_t r = 0; r < variants.ranks.size(); ++r)
    hooks.push_back(variants.ranks[r](comms[r].get()));
  std::vector<Status> worker_status(static_cast<size_t>(n));
  std::vector<std::thread> workers;
  for (int r = 1; r < n; ++r) {
    workers.emplace_back([&, r] {
      worker_status[static_cast<size_t>(r)] =
          RunTpWorker(comms[static_cast<size_t>(r)].get(), shards[static_cast<size_t>(r)],
                      hooks.empty() ? TpHookForRows() : hooks[static_cast<size_t>(r)]);
    });
  }
  TpComparison out;
  const ModelConfig& c = full->config();
  constexpr int64_t kPages = 32, kRows = 16, kSeqs = 2;
  {
    TpLeader leader(comms[0].get());
    leader.Start({.max_rows = kRows,
                  .max_seqs = kSeqs,
                  .max_logit_rows = kSeqs,
                  .n_pages = kPages,
                  .block_size = 16,
                  .kv_dtype = 0,
                  .threads = 1});
    const memory::KvLayout lr = KvLayoutFor(c), lt = KvLayoutFor(shards[0]->config());
    memory::PagePool pr(kPages, lr.PageBytes()), pt(kPages, lt.PageBytes());
    memory::KvCache kr(lr, &pr), kt(lt, &pt);
    std::vector<std::vector<int32_t>> tr(2), tt(2);
    for (int s = 0; s < 2; ++s) {
      CHORUS_CHECK(kr.Reserve(&tr[static_cast<size_t>(s)], 40).ok());
      CHORUS_CHECK(kt.Reserve(&tt[static_cast<size_t>(s)], 40).ok());
    }
    Forward fr(full, kRows, kSeqs), ft(shards[0], kRows, kSeqs, comms[0].get());
    ThreadPool pool(1);
    std::vector<std::vector<int32_t>> toks = {{1, 10, 20, 30, 40, 50, 60, 70, 80, 90, 11},
                                              {1, 7, 3}};
    std::vector<int64_t> done(2, 0);
    std::vector<float> lg_r(static_cast<size_t>(kSeqs * c.vocab_size)), lg_t(lg_r.size());
    StepBuilder br(kRows, kSeqs), bt(kRows, kSeqs);
    std::vector<int32_t> slots;
    for (int step = 0; step < steps; ++step) {
      br.Clear();
      bt.Clear();
      slots.clear();
      for (int s = 0; s < 2; ++s) {
        auto& tk = toks[static_cast<size_t>(s)];
        const int64_t from = done[static_cast<size_t>(s)];
        const int64_t count = std::min<int64_t>(static_cast<int64_t>(tk.size()) - from, 6);
        const std::span<const int32_t> rows(tk.data() + from, static_cast<size_t>(count));
        br.AddSequence(rows, from, tr[static_cast<size_t>(s)].data(), true);
        bt.AddSequence(rows, from, tt[static_cast<size_t>(s)].data(), true);
        done[static_cast<size_t>(s)] += count;
        if (!variants.seq_slots.empty())
          slots.insert(slots.end(), static_cast<size_t>(count),
                       variants.seq_slots[static_cast<size_t>(s)]);
      }
      const LinearHook* ref_hook = nullptr;
      const LinearHook* rank0_hook = nullptr;
      if (!slots.empty()) {
        ref_hook = variants.ref(slots).value();
        rank0_hook = hooks[0](slots).value();
      }
      fr.Run(br.Input(ref_hook), &kr, &pool, lg_r.data());
      leader.Step(bt.Input(), kt, slots);
      ft.Run(bt.Input(rank0_hook), &kt, &pool, lg_t.data());
      for (int s = 0; s < 2; ++s) {
        const float* a = lg_r.data() + s * c.vocab_size;
        const float* b = lg_t.data() + s * c.vocab_size;
        for (int64_t v = 0; v < c.vocab_size; ++v)
          out.max_abs_diff = std::max(out.max_abs_diff, std::fabs(a[v] - b[v]));
        const auto ta = static_cast<int32_t>(std::max_element(a, a + c.vocab_size) - a);
        const auto tb = static_cast<int32_t>(std::max_element(b, b + c.vocab_size) - b);
        if (ta != tb && out.token_mismatches++ == 0) {
          out.first_mismatch = "step " + std::to_string(step) + " sequence " + std::to_string(s) +
                               ": " + std::to_string(ta) + " vs " + std::to_string(tb);
        }
        auto& tk = toks[static_cast<size_t>(s)];
        if (done[static_cast<size_t>(s)] == static_cast<int64_t>(tk.size())) tk.push_back(ta);
      }
    }
  }  // the leader's destructor stops the workers
  for (auto& w : workers) w.join();
  for (int r = 1; r < n; ++r)
    CHORUS_CHECK(worker_status[static_cast<size_t>(r)].ok())
        << worker_status[static_cast<size_t>(r)].ToString();
  return out;
}

// CompareTensorParallel with `v`, and how far the TP run is from a reference whose rows all run
// on the base model (2 steps): that distance shows the variants change the logits, so the first
// comparison could have failed.
struct TpVariantComparison {
  TpComparison with;
  float without_variants_max_abs_diff = 0;
};
inline TpVariantComparison CompareVariantsUnderTp(
    std::shared_ptr<const Model> full, const std::vector<std::shared_ptr<const Model>>& shards,
    const TpVariants& v) {
  TpVariantComparison out;
  out.with = CompareTensorParallel(full, shards, 8, v);
  TpVariants base = v;
  base.ref = [ref = v.ref](std::span<const int32_t> s) {
    const std::vector<int32_t> none(s.size(), -1);
    return ref(none);
  };
  out.without_variants_max_abs_diff = CompareTensorParallel(full, shards, 2, base).max_abs_diff;
  return out;
}

}  // namespace chorus::model::testing

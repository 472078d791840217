// `chorus eval`: perplexity of a model or variant over a text file in llama.cpp's windows, and
// with --kl-reference the KL divergence and same-top-token rate against a reference model
// (docs/eval.md).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/eval/eval.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/loader.h"

namespace chorus::apps {
namespace {

// Every row of every step uses one variant (a LoRA adapter through LoraHook, a delta through
// DeltaHook): re-points the hook's rows when a step's row count changes (the last step of a
// chunk may be shorter). The embedding seam comes first in a step and names its rows; the norm
// and output seams follow within the same step.
template <class Hook, class Variant>
class AllRows : public model::LinearHook {
 public:
  template <class... Args>
  explicit AllRows(const Variant* v, Args&&... hook_args)
      : hook_(std::forward<Args>(hook_args)...), variant_(v) {}
  void Apply(int64_t layer, model::Linear which, const float* x, int64_t x_stride, float* y,
             int64_t y_stride, int64_t n_rows, ThreadPool* pool) const override {
    Ensure(n_rows);
    hook_.Apply(layer, which, x, x_stride, y, y_stride, n_rows, pool);
  }
  void ApplyGroup(int64_t layer, model::LinearGroup group, std::span<const Target> targets,
                  const float* x, int64_t x_stride, int64_t n_rows,
                  ThreadPool* pool) const override {
    Ensure(n_rows);
    hook_.ApplyGroup(layer, group, targets, x, x_stride, n_rows, pool);
  }
  void AdjustEmbeddings(std::span<const int32_t> tokens, float* x, int64_t d) const override {
    Ensure(static_cast<int64_t>(tokens.size()));
    hook_.AdjustEmbeddings(tokens, x, d);
  }
  void AdjustNorm(int64_t layer, Norm which, std::span<const int32_t> rows, const float* x,
                  float* y, const float* base_weight, int64_t d, float eps) const override {
    hook_.AdjustNorm(layer, which, rows, x, y, base_weight, d, eps);
  }
  void ApplyOutput(std::span<const int32_t> logit_rows, const float* h, int64_t d, float* logits,
                   int64_t vocab, ThreadPool* pool) const override {
    hook_.ApplyOutput(logit_rows, h, d, logits, vocab, pool);
  }

 private:
  void Ensure(int64_t n) const {
    if (n == n_) return;
    rows_.assign(static_cast<size_t>(n), variant_);
    CHORUS_CHECK(hook_.SetRows(std::span<const Variant* const>(rows_)).ok());
    n_ = n;
  }
  mutable Hook hook_;
  const Variant* variant_;
  mutable std::vector<const Variant*> rows_;
  mutable int64_t n_ = -1;
};

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFoundError("flag --data: cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

int EvalCommand(int argc, char** argv) {
  Flags f("eval",
          "Perplexity of a model (or a variant: a LoRA adapter or a delta) over a text file, in\n"
          "llama.cpp llama-perplexity windows (chunks of --ctx tokens, the second half of each\n"
          "scored; docs/eval.md). With --kl-reference, also the mean KL(reference || evaluated)\n"
          "per scored token and the fraction of positions whose top token equals the reference's.");
  f.String("model", "", "base model: GGUF file, Hugging Face directory or llama2.c .bin");
  f.String("variant", "", "a LoRA adapter (PEFT dir / GGUF) or a delta (chorus compress output)");
  f.String("delta-mode", "dense",
           "how a delta --variant runs: dense (W_b + delta decoded into a copy of the base in f32, "
           "the oracle) or served (the base plus the delta term per row, as chorus serve runs it; "
           "a fraction of the memory)");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.String("data", "", "text file to evaluate on (required)");
  f.Int("ctx", 0, "chunk length in tokens (0 = min(512, the model's context))");
  f.String("kl-reference", "", "reference model for KL / same-top-token (e.g. the full fine-tune)");
  f.Repeated("greedy-prompt", "also print the greedy continuation of this prompt (task checks)");
  f.Int("greedy-tokens", 12, "tokens of each --greedy-prompt continuation");
  f.Bool("json", "print one JSON object on the last line");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  f.String("isa", "best", "highest kernel level: best, amx, avx512, avx2 or scalar");
  f.String("kv-dtype", "f32",
           "KV cache elements of the evaluated model: f32 or bf16 (as chorus serve --kv-dtype; "
           "the --kl-reference model always runs with f32)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  if (f.GetString("data").empty())
    return Fail("eval", InvalidArgumentError("flag --data is required"));
  if (f.GetString("model").empty())
    return Fail("eval", InvalidArgumentError("flag --model is required"));

  auto loaded = LoadModelAndTokenizer(f.GetString("model"), f.GetString("tokenizer"));
  if (!loaded.ok()) return Fail("eval", loaded.status());
  std::shared_ptr<const model::Model> m = loaded->model;
  const auto& cfg = m->config();
  int64_t ctx = f.GetInt("ctx");
  if (ctx == 0) ctx = std::min<int64_t>(512, cfg.max_seq_len);
  constexpr int64_t kMaxRows = 256;

  // The variant's term (null: the base alone or a dense reconstruction), and what it reads.
  std::unique_ptr<model::LinearHook> hook;
  std::shared_ptr<const adapters::LoraAdapter> lora;
  std::shared_ptr<const delta::DeltaWeights> delta_weights;
  const std::string variant = f.GetString("variant");
  const std::string delta_mode = f.GetString("delta-mode");
  if (delta_mode != "dense" && delta_mode != "served") {
    return Fail("eval", InvalidArgumentError("flag --delta-mode: '" + delta_mode +
                                             "' is not dense or served"));
  }
  std::string variant_kind = "base";
  if (!variant.empty()) {
    if (delta::LooksLikeDeltaPath(variant) && delta_mode == "served") {
      // Checked against the base's content hash as `chorus serve` checks it, then run through
      // DeltaHook: the base's matmuls plus the delta term, extras through the hook's seams.
      auto w = delta::LoadDeltaWeights(variant, cfg, delta::BaseWeightsHash(*m), variant);
      if (!w.ok()) return Fail("eval", w.status().WithContext("flag --variant"));
      delta_weights = *w;
      hook = std::make_unique<AllRows<delta::DeltaHook, delta::DeltaView>>(delta_weights.get(),
                                                                           kMaxRows);
      variant_kind =
          std::string("delta (") + delta::MethodName(delta_weights->delta().method) +
          ", served: " + kernels::DeltaActivationsName(kernels::DefaultDeltaActivations()) +
          " activations)";
    } else if (delta::LooksLikeDeltaPath(variant)) {
      auto d = delta::ReadDelta(variant);
      if (!d.ok()) return Fail("eval", d.status().WithContext("flag --variant"));
      // The dense reconstruction W_b + Δ̃: the oracle the served delta path is checked against.
      auto rebuilt = delta::ApplyDeltaDense(*m, *d, variant);
      if (!rebuilt.ok()) return Fail("eval", rebuilt.status().WithContext("flag --variant"));
      m = *rebuilt;
      variant_kind =
          std::string("delta (") + delta::MethodName(d->method) + ", dense reconstruction)";
    } else {
      auto a = adapters::LoadLoraAdapter(variant, cfg);
      if (!a.ok()) return Fail("eval", a.status().WithContext("flag --variant"));
      lora = *a;
      hook = std::make_unique<AllRows<adapters::LoraHook, adapters::LoraAdapter>>(lora.get(), cfg,
                                                                                  kMaxRows);
      variant_kind = "lora";
    }
  }
  std::shared_ptr<const model::Model> ref;
  if (!f.GetString("kl-reference").empty()) {
    auto r = model::LoadModel(f.GetString("kl-reference"));
    if (!r.ok()) return Fail("eval", r.status().WithContext("flag --kl-reference"));
    ref = *r;
  }
  auto text = ReadText(f.GetString("data"));
  if (!text.ok()) return Fail("eval", text.status());
  const auto& tok = *loaded->tokenizer;
  tokenizer::EncodeOptions eo;
  eo.add_bos = tok.add_bos();
  std::vector<int32_t> tokens = tok.Encode(*text, eo);

  eval::EvalOptions eopts;
  if (Status si = ApplyIsaFlag(f); !si.ok()) return Fail("eval", si);
  if (auto kv_dtype = memory::ParseKvDtype(f.GetString("kv-dtype")); kv_dtype.ok()) {
    eopts.kv_dtype = *kv_dtype;
  } else {
    return Fail("eval", kv_dtype.status().WithContext("flag --kv-dtype"));
  }
  eopts.ctx = ctx;
  eopts.bos_id = tok.add_bos() ? tok.bos_id() : -1;
  eopts.max_rows = kMaxRows;
  ThreadPool pool(ThreadsFlag(f));
  std::fprintf(stderr, "chorus eval: %s%s, %zu tokens, ctx %lld, KV cache %s\n",
               m->source().c_str(),
               variant.empty() ? "" : (" + " + variant_kind + " " + variant).c_str(), tokens.size(),
               static_cast<long long>(ctx), memory::KvDtypeName(eopts.kv_dtype));
  auto res =
      eval::Evaluate(m, hook.get(), ref, tokens, eopts, &pool, [](int64_t done, int64_t total) {
        std::fprintf(stderr, "\rchorus eval: chunk %lld/%lld", static_cast<long long>(done),
                     static_cast<long long>(total));
        if (done == total) std::fputc('\n', stderr);
      });
  if (!res.ok()) return Fail("eval", res.status());
  const eval::Scores& s = res->scores;
  std::printf("chunks %lld x %lld tokens, %lld scored\n",
              static_cast<long long>(res->windows.n_chunks),
              static_cast<long long>(res->windows.ctx), static_cast<long long>(s.tokens()));
  std::printf("perplexity %.4f\n", s.perplexity());
  if (ref) {
    std::printf("kl_divergence %.6f (vs %s)\n", s.mean_kl(), ref->source().c_str());
    std::printf("same_top_token %.4f\n", s.same_top());
  }
  // Greedy continuations, recomputed from scratch for each token (a check, not a server).
  const int64_t n_greedy = f.GetInt("greedy-tokens");
  for (const std::string& prompt : f.GetRepeated("greedy-prompt")) {
    std::vector<int32_t> seq = tok.Encode(prompt, eo);
    if (seq.empty() || static_cast<int64_t>(seq.size()) + n_greedy > cfg.max_seq_len) {
      return Fail("eval", InvalidArgumentError("flag --greedy-prompt: '" + prompt.substr(0, 64) +
                                               "' is empty or too long for the context"));
    }
    const size_t n_prompt = seq.size();
    eval::LogitsRunner runner(m, cfg.max_seq_len, kMaxRows, eopts.kv_dtype);
    std::vector<float> logits;
    for (int64_t i = 0; i < n_greedy; ++i) {
      if (Status st =
              runner.Run(seq, static_cast<int64_t>(seq.size()) - 1, hook.get(), &pool, &logits);
          !st.ok()) {
        return Fail("eval", st);
      }
      seq.push_back(
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()));
    }
    const std::string cont = tok.Decode(std::span<const int32_t>(seq).subspan(n_prompt));
    std::string quoted;
    for (char ch : cont) {
      if (ch == '"' || ch == '\\') quoted += '\\';
      if (ch == '\n') {
        quoted += "\\n";
        continue;
      }
      quoted += ch;
    }
    std::printf("greedy \"%s\" -> \"%s\"\n", prompt.c_str(), quoted.c_str());
  }
  if (f.GetBool("json")) {
    char kl[32] = "null", same[32] = "null";
    if (ref) {
      std::snprintf(kl, sizeof(kl), "%.9g", s.mean_kl());
      std::snprintf(same, sizeof(same), "%.9g", s.same_top());
    }
    std::printf(
        "{\"perplexity\": %.9g, \"kl_divergence\": %s, \"same_top_token\": %s, \"tokens\": %lld}\n",
        s.perplexity(), kl, same, static_cast<long long>(s.tokens()));
  }
  return 0;
}

}  // namespace chorus::apps

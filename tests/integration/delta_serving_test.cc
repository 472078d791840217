// The served delta path (docs/deltas.md, docs/variants.md): base matmul + the delta term added by
// DeltaHook (kernels/delta.h) gives the logits of the dense reconstruction W_b + Δ̃ within 1e-4
// relative, for every packing chorus compress writes (rtn 2/4/8-bit, dense and 2:4, bitdelta's
// one scale per matrix); rows of a delta, of another delta and of the base share one step and
// each row is bitwise what it is alone. Synthetic model (no shared assets needed).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <future>
#include <random>
#include <thread>

#include "chorus/adapters/adapter_cache.h"
#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/adapters/variant_hook.h"
#include "chorus/compress/compress.h"
#include "chorus/engine/engine.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/step_builder.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

using ModelPtr = std::shared_ptr<const model::Model>;

// Prefills each sequence (its own tokens) in one step and returns each row's logits, [rows × vocab]
// per sequence, with `deltas[s]` as sequence s's delta and `loras[s]` its LoRA (null = none).
std::vector<std::vector<float>> RunStep(
    const ModelPtr& m, const std::vector<std::vector<int32_t>>& seqs,
    const std::vector<const delta::DeltaWeights*>& deltas, int threads,
    const std::vector<const adapters::LoraAdapter*>& loras = {}) {
  const auto& c = m->config();
  int64_t rows = 0;
  for (const auto& s : seqs) rows += static_cast<int64_t>(s.size());
  model::Forward fwd(m, rows, rows);
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  memory::PagePool pages(64, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  ThreadPool pool(threads);
  model::StepBuilder step(rows, static_cast<int64_t>(seqs.size()) * 64);
  std::vector<std::vector<int32_t>> tables(seqs.size());
  std::vector<const delta::DeltaView*> row_deltas;
  std::vector<const adapters::LoraAdapter*> row_loras;
  // Every row's logits: add each token as its own one-token "sequence" view over the same table.
  for (size_t s = 0; s < seqs.size(); ++s) {
    CHORUS_CHECK(kv.Reserve(&tables[s], static_cast<int64_t>(seqs[s].size())).ok());
    for (size_t t = 0; t < seqs[s].size(); ++t) {
      step.AddSequence(std::span<const int32_t>(seqs[s]).subspan(t, 1), static_cast<int64_t>(t),
                       tables[s].data(), /*want_logits=*/true);
      row_deltas.push_back(deltas[s]);
      row_loras.push_back(loras.empty() ? nullptr : loras[s]);
    }
  }
  // Every kind with rows in the step, as the engine gives them to the forward pass.
  delta::DeltaHook delta_hook(rows);
  CHORUS_CHECK(delta_hook.SetRows(row_deltas).ok());
  adapters::LoraHook lora_hook(c, rows);
  CHORUS_CHECK(lora_hook.SetRows(row_loras).ok());
  adapters::VariantHook hook;
  if (!delta_hook.empty()) hook.Add(&delta_hook);
  if (!lora_hook.segments().empty()) hook.Add(&lora_hook);
  std::vector<float> logits(static_cast<size_t>(rows * c.vocab_size));
  fwd.Run(step.Input(hook.empty() ? nullptr : &hook), &kv, &pool, logits.data());
  std::vector<std::vector<float>> out;
  size_t r = 0;
  for (const auto& s : seqs) {
    out.emplace_back(logits.begin() + static_cast<std::ptrdiff_t>(r * c.vocab_size),
                     logits.begin() + static_cast<std::ptrdiff_t>((r + s.size()) * c.vocab_size));
    r += s.size();
  }
  return out;
}

double MaxRelError(const std::vector<float>& got, const std::vector<float>& want) {
  double max_abs = 0, err = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(want[i])));
    err = std::max(err, std::fabs(static_cast<double>(got[i]) - want[i]));
  }
  return err / std::max(max_abs, 1e-30);
}

TEST(DeltaServingTest, ServedEqualsDenseReconstructionAndMixesWithTheBaseBitwise) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  auto ft = compress::MakeSyntheticFineTune(**base, 0.02, 0.06, 7);
  ASSERT_TRUE(ft.ok()) << ft.status().ToString();
  const std::vector<int32_t> prompt = {1, 45, 300, 12, 7, 99, 250, 3, 18, 400, 77, 5};
  const std::vector<int32_t> other = {1, 8, 9, 10, 200, 201};
  ThreadPool pool(2);
  struct Case {
    delta::Method method;
    int bits;
    bool sparse;
    int64_t group;
  } cases[] = {{delta::Method::kRtn, 4, true, 64},
               {delta::Method::kRtn, 2, true, 32},
               {delta::Method::kRtn, 8, false, 64},
               {delta::Method::kRtn, 4, false, 0},
               {delta::Method::kBitDelta, 1, false, 0}};
  std::vector<int32_t> calib;  // bitdelta distils its scales on some text: any tokens will do
  for (int i = 0; i < 512; ++i) calib.push_back(i == 0 ? 1 : 3 + (i * 37) % 500);
  const auto base_alone = RunStep(*base, {prompt}, {nullptr}, 2);
  for (const Case& cs : cases) {
    compress::CompressOptions o;
    o.method = cs.method;
    o.bits = cs.bits;
    o.sparse24 = cs.sparse;
    o.group_size = cs.group;
    o.distill_steps = 3;
    o.calib_seq_len = 64;
    auto d = compress::CompressDelta(*base, *ft, calib, 1, o, &pool);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    auto shared = std::make_shared<delta::Delta>(*std::move(d));
    shared->extras.clear();  // the synthetic fine-tune changes matrices only
    auto weights = delta::DeltaWeights::Build(shared, (*base)->config(), "d");
    ASSERT_TRUE(weights.ok()) << weights.status().ToString();
    auto dense = delta::ApplyDeltaDense(**base, *shared, "d");
    ASSERT_TRUE(dense.ok()) << dense.status().ToString();

    const auto want = RunStep(*dense, {prompt}, {nullptr}, 2);
    const auto served = RunStep(*base, {prompt}, {weights->get()}, 2);
    const double rel = MaxRelError(served[0], want[0]);
    EXPECT_LT(rel, 1e-4) << cs.bits << " bits, sparse " << cs.sparse << ", group " << cs.group;
    EXPECT_GT(MaxRelError(base_alone[0], want[0]), 1e-3);  // the delta matters

    // One step: the base, this delta and the base again; each row as when alone.
    const auto mixed =
        RunStep(*base, {other, prompt, prompt}, {nullptr, weights->get(), nullptr}, 2);
    EXPECT_EQ(mixed[1], served[0]);
    EXPECT_EQ(mixed[2], base_alone[0]);
    EXPECT_EQ(mixed[0], RunStep(*base, {other}, {nullptr}, 1)[0]);
  }
}

// Two deltas, a LoRA adapter and the base in one step (docs/variants.md): every row is bitwise
// what it is alone, so its greedy tokens are too.
TEST(DeltaServingTest, DeltasLoraAndBaseShareOneStep) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const auto& c = (*base)->config();
  ThreadPool pool(2);
  std::vector<std::shared_ptr<const delta::DeltaWeights>> deltas;
  for (uint64_t seed : {7u, 8u}) {
    auto ft = compress::MakeSyntheticFineTune(**base, 0.02, 0.06, seed);
    ASSERT_TRUE(ft.ok());
    compress::CompressOptions o;
    o.method = delta::Method::kRtn;
    o.bits = seed == 7 ? 4 : 2;
    auto d = compress::CompressDelta(*base, *ft, {}, 1, o, &pool);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    auto shared = std::make_shared<delta::Delta>(*std::move(d));
    shared->extras.clear();
    auto w = delta::DeltaWeights::Build(shared, c, "d" + std::to_string(seed));
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    deltas.push_back(*w);
  }
  adapters::RandomLoraSpec spec;
  spec.rank = 8;
  spec.b_std = 0.2f;
  auto lora = adapters::LoraAdapter::Build(adapters::MakeRandomLora(c, spec), c, "l");
  ASSERT_TRUE(lora.ok());
  const std::vector<std::vector<int32_t>> prompts = {
      {1, 45, 300, 12, 7}, {1, 8, 9}, {1, 200, 201, 202}, {1, 60, 61, 62, 63, 64}};
  const std::vector<const delta::DeltaWeights*> row_delta = {deltas[0].get(), nullptr,
                                                             deltas[1].get(), nullptr};
  const std::vector<const adapters::LoraAdapter*> row_lora = {nullptr, lora->get(), nullptr,
                                                              nullptr};
  const auto mixed = RunStep(*base, prompts, row_delta, 2, row_lora);
  for (size_t s = 0; s < prompts.size(); ++s) {
    const auto alone = RunStep(*base, {prompts[s]}, {row_delta[s]}, 1, {row_lora[s]});
    EXPECT_EQ(mixed[s], alone[0]) << "sequence " << s;
  }
  // And the variants differ from each other (the comparison above is not vacuous).
  const auto base_only = RunStep(*base, {prompts[0]}, {nullptr}, 1);
  EXPECT_NE(mixed[0], base_only[0]);
}

// A full fine-tune also changes norms, embeddings and the output head (its extras): served
// through the hook's non-linear seams, the logits equal the dense reconstruction's within 1e-4,
// for extras stored exact and as int8 rows, with tied and untied embeddings; rows of the base in
// the same step are bitwise as alone.
TEST(DeltaServingTest, ServedExtrasEqualDenseReconstruction) {
  for (const bool tied : {false, true}) {
    auto base = model::MakeSyntheticModel(
        {.shape = tied ? "stories260k" : "tiny", .dtype = DType::kF32, .seed = 3});
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    const auto& c = (*base)->config();
    ASSERT_EQ(c.tie_embeddings, tied);
    auto ft = compress::MakeSyntheticFineTune(**base, 0.02, 0.06, 7);
    ASSERT_TRUE(ft.ok());
    ThreadPool pool(2);
    compress::CompressOptions o;
    o.method = delta::Method::kRtn;
    auto d = compress::CompressDelta(*base, *ft, {}, 1, o, &pool);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    auto shared = std::make_shared<delta::Delta>(*std::move(d));
    shared->extras.clear();
    std::mt19937 rng(5);
    std::normal_distribution<float> nd(0.0f, 0.05f);
    auto vector_extra = [&](const std::string& name) {
      delta::ExtraDelta e;
      e.name = name;
      e.shape = {c.n_embd};
      for (int64_t k = 0; k < c.n_embd; ++k) e.values.push_back(nd(rng));
      shared->extras.push_back(e);
    };
    for (int64_t l = 0; l < c.n_layers; ++l) {
      vector_extra(model::HfLayerNormName(l, false));
      vector_extra(model::HfLayerNormName(l, true));
    }
    vector_extra("model.norm.weight");
    delta::ExtraDelta emb;  // exact
    emb.name = "model.embed_tokens.weight";
    emb.shape = {c.vocab_size, c.n_embd};
    for (int64_t i = 0; i < c.vocab_size * c.n_embd; ++i) emb.values.push_back(nd(rng));
    shared->extras.push_back(emb);
    if (!tied) {  // int8 rows
      delta::ExtraDelta out;
      out.name = "lm_head.weight";
      out.kind = delta::ExtraDelta::Kind::kInt8Rows;
      out.shape = {c.vocab_size, c.n_embd};
      std::uniform_int_distribution<int> q(-127, 127);
      for (int64_t i = 0; i < c.vocab_size * c.n_embd; ++i)
        out.q.push_back(static_cast<int8_t>(q(rng)));
      for (int64_t v = 0; v < c.vocab_size; ++v) out.row_scales.push_back(2e-4f);
      shared->extras.push_back(out);
    }
    auto weights = delta::DeltaWeights::Build(shared, c, "d");
    ASSERT_TRUE(weights.ok()) << weights.status().ToString();
    auto dense = delta::ApplyDeltaDense(**base, *shared, "d");
    ASSERT_TRUE(dense.ok()) << dense.status().ToString();
    const std::vector<int32_t> prompt = {1, 45, 300, 12, 7, 99, 250, 3, 18, 400, 77, 5};
    const auto want = RunStep(*dense, {prompt}, {nullptr}, 2);
    const auto served = RunStep(*base, {prompt}, {weights->get()}, 2);
    EXPECT_LT(MaxRelError(served[0], want[0]), 1e-4) << "tied " << tied;
    // Without the extras the served logits are measurably off: they are applied.
    auto matrices_only = std::make_shared<delta::Delta>(*shared);
    matrices_only->extras.clear();
    auto w2 = delta::DeltaWeights::Build(matrices_only, c, "m");
    ASSERT_TRUE(w2.ok());
    EXPECT_GT(MaxRelError(RunStep(*base, {prompt}, {w2->get()}, 2)[0], want[0]), 1e-3);
    const auto base_alone = RunStep(*base, {prompt}, {nullptr}, 1);
    const auto mixed = RunStep(*base, {prompt, prompt}, {nullptr, weights->get()}, 2);
    EXPECT_EQ(mixed[0], base_alone[0]);
    EXPECT_EQ(mixed[1], served[0]);
  }
}

TEST(DeltaServingTest, DeltasThatChangeOtherTensorsOrOtherShapesAreRefused) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  auto ft = compress::MakeSyntheticFineTune(**base, 0.02, 0.06, 7);
  ASSERT_TRUE(ft.ok());
  ThreadPool pool(1);
  compress::CompressOptions o;
  o.method = delta::Method::kRtn;
  auto d = compress::CompressDelta(*base, *ft, {}, 1, o, &pool);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  auto with_extra = std::make_shared<delta::Delta>(*d);
  delta::ExtraDelta e;
  e.name = "model.layers.0.self_attn.q_proj.bias";
  e.shape = {(*base)->config().q_dim()};
  e.values.assign(static_cast<size_t>(e.shape[0]), 0.1f);
  with_extra->extras = {e};
  auto r = delta::DeltaWeights::Build(with_extra, (*base)->config(), "x");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("q_proj.bias"), std::string::npos);
  e.name = "model.norm.weight";
  e.shape = {(*base)->config().n_embd + 1};
  e.values.assign(static_cast<size_t>(e.shape[0]), 0.1f);
  with_extra->extras = {e};
  auto r1 = delta::DeltaWeights::Build(with_extra, (*base)->config(), "x");
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("model.norm.weight"), std::string::npos);
  auto wrong = std::make_shared<delta::Delta>(*d);
  wrong->extras.clear();
  wrong->matrices[0].packed.layout.rows += 1;
  auto r2 = delta::DeltaWeights::Build(wrong, (*base)->config(), "x");
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.status().message().find(wrong->matrices[0].name), std::string::npos);
}

}  // namespace
}  // namespace chorus

namespace chorus {
namespace {

// What the engine tests share: stories260K and its tokenizer, rtn deltas of synthetic
// fine-tunes written as files, engine options, and a greedy reader of one request.
struct EngineSetup {
  std::shared_ptr<const model::Model> base;
  std::shared_ptr<const tokenizer::Tokenizer> tok;

  // False (with a skip or a failure recorded) when the assets are missing or do not load.
  bool Load() {
    const std::string models = testing::SharedModelsDir();
    auto b = model::LoadModel(models + "/stories260K/stories260K.bin");
    auto t = tokenizer::LoadTokenizer(models + "/stories260K/tok512.bin");
    EXPECT_TRUE(b.ok() && t.ok());
    if (!b.ok() || !t.ok()) return false;
    base = std::move(*b);
    tok = std::move(*t);
    return true;
  }
  // An rtn delta of a synthetic fine-tune (seed), without extras, written to TempDir()/`name`.
  delta::Delta WriteDelta(uint64_t seed, const std::string& name, adapters::VariantRef* ref) {
    ThreadPool pool(2);
    auto ft = compress::MakeSyntheticFineTune(*base, 0.03, 0.06, seed);
    EXPECT_TRUE(ft.ok());
    if (!ft.ok()) return {};
    compress::CompressOptions o;
    o.method = delta::Method::kRtn;
    auto d = compress::CompressDelta(base, *ft, {}, 1, o, &pool);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    if (!d.ok()) return {};
    d->extras.clear();
    const std::string dir = testing::TempDir() + "/" + name;
    std::filesystem::remove_all(dir);
    EXPECT_TRUE(delta::WriteDelta(dir, *d).ok());
    *ref = {.name = name, .id = {seed, 1}, .kind = "delta", .path = dir};
    return std::move(*d);
  }
  engine::EngineOptions Options(int64_t max_deltas_per_step = 0,
                                const std::string& base_hash = "") const {
    engine::EngineOptions eo;
    eo.threads = 2;
    eo.max_batch_tokens = 64;
    eo.max_running = 8;
    eo.pool_bytes = 32 << 20;
    eo.max_deltas_per_step = max_deltas_per_step;
    eo.adapter_cache = std::make_shared<adapters::AdapterCache>(
        base->config(), int64_t{64} << 20, adapters::LoraLimits{},
        base_hash.empty() ? delta::BaseWeightsHash(*base) : base_hash);
    return eo;
  }
  static engine::GenerationRequest Request(int i, int max_tokens,
                                           std::optional<adapters::VariantRef> v) {
    engine::GenerationRequest r;
    r.prompt = {1, static_cast<int32_t>(300 + i), 400, 17};
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    r.variant = std::move(v);
    return r;
  }
  // The request's tokens.
  static std::vector<int32_t> Run(engine::RequestHandle& h) {
    std::vector<int32_t> toks;
    for (;;) {
      auto ev = h.Next(std::chrono::milliseconds(30000));
      if (!ev) return toks;
      EXPECT_NE(ev->finish, engine::FinishReason::kError) << ev->error;
      if (ev->token >= 0) toks.push_back(ev->token);
      if (ev->finish != engine::FinishReason::kNone) return toks;
    }
  }
  // The tokens of `r` on an engine of its own.
  std::vector<int32_t> RunAlone(const engine::GenerationRequest& r,
                                const engine::EngineOptions& eo) const {
    auto e = engine::Engine::Create(base, tok, eo);
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? Run(**(*e)->Submit(r)) : std::vector<int32_t>{};
  }
};

// Through the engine (the serving path): a delta registered as a variant — its file written,
// referenced by a VariantRef of kind "delta", loaded by the engine's loader threads through the
// host cache — runs in the same steps as a LoRA adapter and the base: every request's greedy
// tokens equal those it gets alone, and the delta request's equal the dense reconstruction's.
TEST(DeltaServingTest, EngineServesDeltaLoraAndBaseTogether) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  EngineSetup setup;
  ASSERT_TRUE(setup.Load());
  adapters::VariantRef delta_ref;
  const delta::Delta d = setup.WriteDelta(0xde17a, "engine_delta", &delta_ref);
  const std::string lora_dir = testing::TempDir() + "/engine_delta_lora";
  std::filesystem::remove_all(lora_dir);
  adapters::RandomLoraSpec spec;
  spec.rank = 8;
  spec.b_std = 0.2f;
  const auto& c = setup.base->config();
  ASSERT_TRUE(adapters::WritePeftLora(lora_dir, adapters::MakeRandomLora(c, spec), c).ok());
  const adapters::VariantRef lora_ref{.name = "lora", .id = {0x10ea, 1}, .path = lora_dir};

  const std::vector<std::optional<adapters::VariantRef>> variants = {
      delta_ref, std::nullopt, lora_ref, delta_ref, std::nullopt};
  auto request = [&](size_t i) {
    return EngineSetup::Request(static_cast<int>(i), 24, variants[i]);
  };
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < variants.size(); ++i)
    alone.push_back(setup.RunAlone(request(i), setup.Options()));
  auto e = engine::Engine::Create(setup.base, setup.tok, setup.Options());
  ASSERT_TRUE(e.ok());
  std::vector<std::shared_ptr<engine::RequestHandle>> hs;
  for (size_t i = 0; i < variants.size(); ++i) hs.push_back(*(*e)->Submit(request(i)));
  for (size_t i = 0; i < variants.size(); ++i)
    EXPECT_EQ(EngineSetup::Run(*hs[i]), alone[i]) << "request " << i;
  // The delta changes the output, and it is the dense reconstruction's.
  auto dense = delta::ApplyDeltaDense(*setup.base, d, delta_ref.path);
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  auto de = engine::Engine::Create(*dense, setup.tok, setup.Options());
  ASSERT_TRUE(de.ok());
  const auto base_request = EngineSetup::Request(0, 24, std::nullopt);
  EXPECT_EQ(EngineSetup::Run(**(*de)->Submit(base_request)), alone[0]);
  EXPECT_NE(setup.RunAlone(base_request, setup.Options()), alone[0]);
  // A delta made for other weights is refused when it loads: that request ends in an error.
  auto other =
      engine::Engine::Create(setup.base, setup.tok, setup.Options(0, "fnv1a64:0000000000000000"));
  auto h = *(*other)->Submit(request(0));
  auto ev = h->Next(std::chrono::milliseconds(30000));
  ASSERT_TRUE(ev.has_value());
  EXPECT_EQ(ev->finish, engine::FinishReason::kError);
  EXPECT_NE(ev->error.find("fnv1a64:0000000000000000"), std::string::npos) << ev->error;
}

// The pool tier for deltas (docs/deltas.md "Tiers"): a delta request first reads the host copy
// while the loader thread bands the delta into pool pages; once resident, the same request reads
// the pool copy. Both give exactly the tokens of an engine that never makes pool copies.
TEST(DeltaServingTest, ADeltasPoolCopyServesTheTokensOfItsHostCopy) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  EngineSetup setup;
  ASSERT_TRUE(setup.Load());
  adapters::VariantRef ref;
  setup.WriteDelta(0xde1a, "pooled_delta", &ref);
  engine::EngineOptions host_only = setup.Options();
  host_only.adapter_pool_copies = false;
  const auto request = EngineSetup::Request(3, 24, ref);
  std::vector<int32_t> host_tokens;
  {
    auto e = engine::Engine::Create(setup.base, setup.tok, host_only);
    ASSERT_TRUE(e.ok());
    host_tokens = EngineSetup::Run(**(*e)->Submit(request));
    EXPECT_EQ((*e)->metrics().pool_pages_adapter.load(), 0);
  }
  ASSERT_EQ(host_tokens.size(), 24u);
  auto e = engine::Engine::Create(setup.base, setup.tok, setup.Options());
  ASSERT_TRUE(e.ok());
  const auto& m = (*e)->metrics();
  EXPECT_EQ(EngineSetup::Run(**(*e)->Submit(request)), host_tokens);
  EXPECT_EQ(m.adapter_pool_misses.load(), 1u);
  EXPECT_GT(m.pool_pages_adapter.load(), 0);  // the delta's banded copy (pages of kind kAdapter)
  for (int i = 0; i < 100 && m.adapter_pool_hits.load() == 0; ++i) {
    EXPECT_EQ(EngineSetup::Run(**(*e)->Submit(request)), host_tokens) << "run " << i;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_GE(m.adapter_pool_hits.load(), 1u);
  EXPECT_EQ(m.adapter_pool_loads.load(), 1u);
  EXPECT_EQ(m.adapters_resident.load(), 1);
  // A base request beside it in the same steps leaves it unchanged.
  auto with_delta = (*e)->Submit(request);
  auto base = (*e)->Submit(EngineSetup::Request(3, 24, std::nullopt));
  EXPECT_EQ(EngineSetup::Run(**with_delta), host_tokens);
  EXPECT_NE(EngineSetup::Run(**base), host_tokens);
}

// DeltaZip's N-delta rule with line skipping and its preemption (--max-deltas 1): A (delta D1)
// runs; B (D2) must wait for the cap; C and C2 (D1, arriving after B) skip the line and run
// beside A. When A, their parent, finishes, both are preempted so that B runs; they resume after
// B. Without the preemption they would run their 64 and 48 tokens to the end first. Every request's
// tokens are those it gets alone (preemption recomputes).
TEST(DeltaServingTest, LineSkipperIsPreemptedWhenItsParentFinishes) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  EngineSetup setup;
  ASSERT_TRUE(setup.Load());
  adapters::VariantRef refs[2];
  setup.WriteDelta(0xd1, "line_skip_d1", &refs[0]);
  setup.WriteDelta(0xd2, "line_skip_d2", &refs[1]);
  struct Ask {
    int delta;
    int max_tokens;
  };
  // A runs long enough (16 steps) for B and C, submitted right after it, to arrive while it runs.
  const std::vector<Ask> asks = {{0, 16}, {1, 6}, {0, 64}, {0, 48}};  // A, B, C, C2
  auto request = [&](size_t i) {
    return EngineSetup::Request(static_cast<int>(i), asks[i].max_tokens,
                                refs[static_cast<size_t>(asks[i].delta)]);
  };
  std::vector<std::vector<int32_t>> alone;
  for (size_t i = 0; i < asks.size(); ++i)
    alone.push_back(setup.RunAlone(request(i), setup.Options(1)));
  auto e = engine::Engine::Create(setup.base, setup.tok, setup.Options(1));
  ASSERT_TRUE(e.ok());
  // Both deltas loaded (host cache) first, so that admission, not loading, orders the requests.
  for (size_t i = 0; i < 2; ++i) EngineSetup::Run(**(*e)->Submit(request(i)));
  std::vector<std::shared_ptr<engine::RequestHandle>> hs;
  for (size_t i = 0; i < asks.size(); ++i) hs.push_back(*(*e)->Submit(request(i)));
  std::vector<std::future<std::vector<int32_t>>> got;
  for (size_t i = 0; i < asks.size(); ++i)
    got.push_back(std::async(std::launch::async, [&, i] { return EngineSetup::Run(*hs[i]); }));
  // The order in which the engine finished them: a request is finished once its last token is
  // pushed (completion_tokens counts on the engine thread), polled here. Timing the readers
  // instead reordered them once in CI, a reader thread descheduled on a busy host. A poll that
  // sleeps through two finishes sees them in the same round, so the checks allow ties.
  std::vector<int64_t> finished_round(asks.size(), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int64_t round = 0; std::count(finished_round.begin(), finished_round.end(), -1) > 0 &&
                          std::chrono::steady_clock::now() < deadline;
       ++round) {
    for (size_t i = 0; i < asks.size(); ++i) {
      if (finished_round[i] < 0 &&
          hs[i]->completion_tokens() >= static_cast<int64_t>(alone[i].size()))
        finished_round[i] = round;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (size_t i = 0; i < asks.size(); ++i) EXPECT_EQ(got[i].get(), alone[i]) << "request " << i;
  ASSERT_EQ(std::count(finished_round.begin(), finished_round.end(), -1), 0);
  EXPECT_LE(finished_round[1], finished_round[2])
      << "B (another delta) must run before the line-skipper C ends";
  EXPECT_LE(finished_round[1], finished_round[3]) << "… and before C2 ends";
  EXPECT_GE((*e)->metrics().line_skippers_preempted.load(), 1u);
}

}  // namespace
}  // namespace chorus

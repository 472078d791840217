// Mixed-adapter batches through the engine: each request's tokens are the same whether it runs
// alone or in a batch with other adapters and the base model (issue 4 correctness bar).
#include <thread>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/engine/engine.h"
#include "chorus/model/loader.h"
#include "tests/testutil/testutil.h"

namespace chorus::engine {
namespace {

const char* kModel = "stories260K/stories260K.bin";

std::vector<int32_t> RunToEnd(RequestHandle& h) {
  std::vector<int32_t> toks;
  for (;;) {
    auto ev = h.Next(std::chrono::milliseconds(30000));
    if (!ev) {
      ADD_FAILURE() << "timeout";
      return toks;
    }
    if (ev->token >= 0) toks.push_back(ev->token);
    if (ev->finish != FinishReason::kNone) return toks;
  }
}

TEST(EngineLoraTest, SixteenRequestsOverEightAdaptersMatchAlone) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  const std::string dir = testing::SharedModelsDir() + "/stories260K/";
  auto m = model::LoadModel(dir + "stories260K.bin");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto t = tokenizer::LoadTokenizer(dir + "tok512.bin");
  ASSERT_TRUE(t.ok());
  std::shared_ptr<const tokenizer::Tokenizer> tok(std::move(*t));
  // Eight adapters of mixed ranks (and one with only attention targets).
  std::vector<std::shared_ptr<const adapters::LoraAdapter>> loras;
  const int64_t ranks[] = {1, 8, 16, 64, 4, 8, 32, 2};
  for (int i = 0; i < 8; ++i) {
    adapters::RandomLoraSpec spec;
    spec.rank = ranks[i];
    spec.seed = 1000 + static_cast<uint64_t>(i);
    spec.b_std = 0.2f;  // visible effect on the tiny model
    if (i == 4) spec.targets = {model::Linear::kQ, model::Linear::kV};
    auto w = adapters::MakeRandomLora((*m)->config(), spec);
    auto a = adapters::LoraAdapter::Build(w, (*m)->config(), "a" + std::to_string(i));
    ASSERT_TRUE(a.ok()) << a.status().ToString();
    loras.push_back(*a);
  }
  auto request = [&](int i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int j = 0; j < 2 + i % 5; ++j) r.prompt.push_back(static_cast<int32_t>(300 + (i * 13 + j * 7) % 200));
    r.max_tokens = 24;
    r.sampling.temperature = 0;
    if (i % 2 == 0) {  // 8 requests on the base model, 8 on the eight adapters
      r.lora = nullptr;
    } else {
      r.lora = loras[static_cast<size_t>(i / 2)];
      r.adapter = r.lora->name();
    }
    return r;
  };
  EngineOptions o;
  o.threads = 2;
  o.max_batch_tokens = 64;
  o.max_running = 16;
  o.pool_bytes = 64 << 20;
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = Engine::Create(*m, tok, o);
    ASSERT_TRUE(e.ok());
    for (int i = 0; i < 16; ++i) alone.push_back(RunToEnd(**(*e)->Submit(request(i))));
  }
  // Adapters must change the output, or the comparison below proves nothing.
  int differs = 0;
  for (int i = 1; i < 16; i += 2) differs += alone[static_cast<size_t>(i)] != alone[static_cast<size_t>(i - 1)] ? 1 : 0;
  EXPECT_GE(differs, 4);
  auto e = Engine::Create(*m, tok, o);
  ASSERT_TRUE(e.ok());
  std::vector<std::shared_ptr<RequestHandle>> hs;
  for (int i = 0; i < 16; ++i) hs.push_back(*(*e)->Submit(request(i)));
  for (int i = 0; i < 16; ++i) EXPECT_EQ(RunToEnd(*hs[static_cast<size_t>(i)]), alone[static_cast<size_t>(i)]) << "request " << i;
}

}  // namespace
}  // namespace chorus::engine

// Deltas on a real full fine-tune (stories260K "things", docs/deltas.md): chorus compress's
// library path (rtn, deltazip, bitdelta) writes files that read back and rebuild W_b + Δ̃ closer to
// the fine-tune than the base; deltazip beats rtn at the same size; the evaluation of a LoRA
// variant goes through the model's LinearHook; a delta is refused on another base and a
// fine-tune of another architecture is refused naming it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/lora/lora_hook.h"
#include "chorus/compress/compress.h"
#include "chorus/eval/eval.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

const char* kBase = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";
const char* kThings = "stories260K-finetunes/things";

std::string P(const std::string& rel) { return testing::SharedModelsDir() + "/" + rel; }

std::vector<int32_t> Tokenize(const tokenizer::Tokenizer& tok, const std::string& path,
                              size_t limit) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  tokenizer::EncodeOptions eo;
  eo.add_bos = tok.add_bos();
  auto t = tok.Encode(ss.str(), eo);
  if (limit && t.size() > limit) t.resize(limit);
  return t;
}

class DeltaStoriesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CHORUS_REQUIRE_SHARED_MODEL(kBase);
    CHORUS_REQUIRE_SHARED_MODEL(std::string(kThings) + "/full.bin");
    base_ = *model::LoadModel(P(kBase));
    ft_ = *model::LoadModel(P(std::string(kThings) + "/full.bin"));
    auto tok = model::LoadTokenizerFor(*base_, P(kTok));
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    tok_ = std::shared_ptr<const tokenizer::Tokenizer>(std::move(*tok));
    calib_ = Tokenize(*tok_, P(std::string(kThings) + "/data/train.txt"), 4096);
    held_ = Tokenize(*tok_, P(std::string(kThings) + "/data/heldout.txt"), 0);
  }
  eval::EvalResult Eval(std::shared_ptr<const model::Model> m,
                        const model::LinearHook* hook = nullptr) {
    auto r = eval::Evaluate(m, hook, ft_, held_,
                            {.ctx = 256, .bos_id = tok_->bos_id(), .max_rows = 256}, &pool_);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return *std::move(r);
  }
  double CompressedKl(const compress::CompressOptions& o, const std::string& out) {
    auto d = compress::CompressDelta(base_, ft_, calib_, tok_->bos_id(), o, &pool_);
    EXPECT_TRUE(d.ok()) << d.status().ToString();
    EXPECT_TRUE(delta::WriteDelta(out, *d).ok());
    auto back = delta::ReadDelta(out);
    EXPECT_TRUE(back.ok()) << back.status().ToString();
    auto m = delta::ApplyDeltaDense(*base_, *back, out);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return Eval(*m).scores.mean_kl();
  }
  ThreadPool pool_{2};
  std::shared_ptr<const model::Model> base_, ft_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::vector<int32_t> calib_, held_;
};

TEST_F(DeltaStoriesTest, CompressedDeltasApproachTheFineTune) {
  const double base_kl = Eval(base_).scores.mean_kl();
  const auto self = Eval(ft_).scores;
  EXPECT_NEAR(self.mean_kl(), 0.0, 1e-9);
  EXPECT_EQ(self.same_top(), 1.0);
  ASSERT_GT(base_kl, 0.05);
  compress::CompressOptions o;
  o.method = delta::Method::kRtn;
  o.bits = 4;
  const double rtn = CompressedKl(o, testing::TempDir() + "/rtn");
  o.method = delta::Method::kDeltaZip;
  const double dz = CompressedKl(o, testing::TempDir() + "/dz.safetensors");
  o.method = delta::Method::kBitDelta;
  o.bits = 1;
  o.group_size = 0;
  o.sparse24 = false;
  o.distill_steps = 0;
  const double sign = CompressedKl(o, testing::TempDir() + "/bd");
  EXPECT_LT(rtn, 0.1 * base_kl);
  EXPECT_LT(dz, rtn);
  EXPECT_LT(sign, 0.25 * base_kl);
}

TEST_F(DeltaStoriesTest, LoraVariantEvaluatesThroughTheHook) {
  CHORUS_REQUIRE_SHARED_MODEL(std::string(kThings) + "/lora");
  auto a = adapters::LoadLoraAdapter(P(std::string(kThings) + "/lora"), base_->config());
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  // One step of 256 rows per chunk (ctx 256): every row uses the adapter.
  adapters::LoraHook hook(base_->config(), 256);
  std::vector<const adapters::LoraAdapter*> rows(256, a->get());
  ASSERT_TRUE(hook.SetRows(std::span<const adapters::LoraAdapter* const>(rows)).ok());
  const double lora_kl = Eval(base_, &hook).scores.mean_kl();
  const double base_kl = Eval(base_).scores.mean_kl();
  EXPECT_LT(lora_kl, base_kl);  // the trained adapter moves the base toward the fine-tune
}

// The real full fine-tune changes every norm and the (tied) embeddings too: served through the
// delta hook (base matmuls + delta terms + the extras' seams) it scores as its dense
// reconstruction does, and far closer to the fine-tune than the base.
TEST_F(DeltaStoriesTest, ServedFullFineTuneWithItsExtrasScoresAsItsDenseReconstruction) {
  compress::CompressOptions o;
  o.method = delta::Method::kRtn;
  auto d = compress::CompressDelta(base_, ft_, {}, -1, o, &pool_);
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ASSERT_FALSE(d->extras.empty());  // norms and embeddings changed
  auto shared = std::make_shared<const delta::Delta>(*std::move(d));
  auto weights = delta::DeltaWeights::Build(shared, base_->config(), "things");
  ASSERT_TRUE(weights.ok()) << weights.status().ToString();
  delta::DeltaHook hook(256);
  std::vector<const delta::DeltaView*> rows(256, weights->get());
  ASSERT_TRUE(hook.SetRows(rows).ok());
  const auto served = Eval(base_, &hook).scores;
  auto dense = delta::ApplyDeltaDense(*base_, *shared, "things");
  ASSERT_TRUE(dense.ok()) << dense.status().ToString();
  const auto want = Eval(*dense).scores;
  EXPECT_NEAR(served.mean_kl(), want.mean_kl(), 1e-4 * (1 + want.mean_kl()));
  EXPECT_NEAR(served.same_top(), want.same_top(), 0.002);
  EXPECT_LT(served.mean_kl(), 0.1 * Eval(base_).scores.mean_kl());
}

TEST_F(DeltaStoriesTest, RefusesAnotherBaseAndAnotherArchitecture) {
  compress::CompressOptions o;
  o.method = delta::Method::kRtn;
  auto d = compress::CompressDelta(base_, ft_, {}, -1, o, &pool_);
  ASSERT_TRUE(d.ok());
  // The fine-tune itself is another base: same shapes, other weights.
  auto r = delta::ApplyDeltaDense(*ft_, *d, "things.delta");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find(d->base_hash), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(delta::BaseWeightsHash(*ft_)), std::string::npos);
  model::SyntheticSpec spec;
  spec.shape = "tiny";
  auto tiny = *model::MakeSyntheticModel(spec);
  auto bad = compress::CompressDelta(base_, tiny, {}, -1, o, &pool_);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("architecture"), std::string::npos)
      << bad.status().message();
}

}  // namespace
}  // namespace chorus

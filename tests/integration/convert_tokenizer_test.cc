// Self-contained converted models: stories260K.bin (llama2.c, no tokenizer inside) + tok512.bin
// converted to GGUF (tokenizer exported into the metadata) and to a Hugging Face directory
// (tokenizer.json + tokenizer_config.json written beside the weights). Each is then loaded with
// only its own embedded/bundled tokenizer, and greedy generation from BOS must reproduce
// llama2.c's expected text exactly.
#include <fstream>
#include <sstream>

#include "chorus/base/thread_pool.h"
#include "chorus/formats/gguf.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/convert.h"
#include "chorus/model/forward.h"
#include "chorus/model/loader.h"
#include "chorus/model/step_builder.h"
#include "chorus/tokenizer/export.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

const char* kModel = "stories260K/stories260K.bin";
const char* kTok = "stories260K/tok512.bin";

std::string ModelsPath(const std::string& rel) { return testing::SharedModelsDir() + "/" + rel; }

std::string ReadText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Greedy generation of `n` tokens after `prompt` (prefill in one step, then one token per step).
std::vector<int32_t> Greedy(std::shared_ptr<const model::Model> m,
                            const std::vector<int32_t>& prompt, int n) {
  const auto& c = m->config();
  model::Forward fwd(m, 512, 8);
  memory::KvLayout layout{
      .n_layers = c.n_layers, .n_kv_heads = c.n_kv_heads, .head_dim = c.head_dim, .block_size = 16};
  memory::PagePool pages(64, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  ThreadPool pool(2);
  std::vector<int32_t> table;
  std::vector<float> logits(static_cast<size_t>(c.vocab_size));
  std::vector<int32_t> toks = prompt, out;
  int64_t computed = 0;
  for (int step = 0; step < n; ++step) {
    EXPECT_TRUE(kv.Reserve(&table, static_cast<int64_t>(toks.size())).ok());
    model::StepBuilder builder(512, 1);
    builder.AddSequence(std::span<const int32_t>(toks).subspan(static_cast<size_t>(computed)),
                        computed, table.data(), /*want_logits=*/true);
    fwd.Run(builder.Input(), &kv, &pool, logits.data());
    computed = static_cast<int64_t>(toks.size());
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    toks.push_back(next);
  }
  return out;
}

// Loads `path` with the tokenizer it carries and checks the 200-step greedy text from BOS.
void ExpectStoriesText(const std::string& path) {
  SCOPED_TRACE(path);
  auto m = model::LoadModel(path);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto tok = model::LoadTokenizerFor(**m, /*override_path=*/"");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->kind(), "spm-bpe");
  EXPECT_EQ((*tok)->vocab_size(), 512);
  const int32_t bos = (*tok)->bos_id();
  ASSERT_EQ(bos, 1);
  EXPECT_TRUE((*tok)->IsEos(2));
  // What an empty prompt encodes to: BOS alone.
  EXPECT_EQ((*tok)->Encode("", {}), std::vector<int32_t>{bos});
  std::vector<int32_t> ids = {bos};
  const auto gen = Greedy(*m, ids, 200);
  ids.insert(ids.end(), gen.begin(), gen.end());
  EXPECT_EQ((*tok)->Decode(ids),
            ReadText(ModelsPath("stories260K/expected_greedy_t0_200steps.txt")));
}

TEST(ConvertTokenizerTest, GgufCarriesTheTokenizer) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CHORUS_REQUIRE_SHARED_MODEL(kTok);
  auto m = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto tok = tokenizer::LoadTokenizer(ModelsPath(kTok));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // Before: the llama2.c checkpoint has no tokenizer of its own (tok512.bin is not tokenizer.bin).
  EXPECT_FALSE(model::LoadTokenizerFor(**m, "").ok());

  model::ConvertOptions o;
  o.format = model::OutputFormat::kGguf;
  o.output = testing::TempDir() + "/stories260K.gguf";
  const tokenizer::GgufExportOptions eo{.pad_to_vocab_size = (*m)->config().vocab_size};
  CHORUS_ASSERT_OK(model::ConvertModel(
      **m, o, [&](formats::GgufWriter* w) { return tokenizer::ExportToGguf(**tok, w, eo); }));
  auto g = formats::GgufFile::Open(o.output);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*(*g)->GetString("tokenizer.ggml.model"), "llama");
  EXPECT_EQ((*(*g)->GetStringArray("tokenizer.ggml.tokens"))[1], "<s>");
  ExpectStoriesText(o.output);
}

TEST(ConvertTokenizerTest, HfDirectoryCarriesTheTokenizer) {
  CHORUS_REQUIRE_SHARED_MODEL(kModel);
  CHORUS_REQUIRE_SHARED_MODEL(kTok);
  auto m = model::LoadModel(ModelsPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  auto tok = tokenizer::LoadTokenizer(ModelsPath(kTok));
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  model::ConvertOptions o;
  o.format = model::OutputFormat::kHfDirectory;
  o.output = testing::TempDir() + "/stories260K-hf";
  CHORUS_ASSERT_OK(model::ConvertModel(**m, o));
  CHORUS_ASSERT_OK(tokenizer::ExportToHfDirectory(**tok, o.output));
  ExpectStoriesText(o.output);

  // And back: the HF directory (weights + exported tokenizer) converted to GGUF with the
  // tokenizer it bundles.
  auto hf = model::LoadModel(o.output);
  ASSERT_TRUE(hf.ok()) << hf.status().ToString();
  auto hf_tok = model::LoadTokenizerFor(**hf, "");
  ASSERT_TRUE(hf_tok.ok()) << hf_tok.status().ToString();
  model::ConvertOptions o2;
  o2.format = model::OutputFormat::kGguf;
  o2.output = testing::TempDir() + "/from-hf.gguf";
  CHORUS_ASSERT_OK(model::ConvertModel(
      **hf, o2, [&](formats::GgufWriter* w) { return tokenizer::ExportToGguf(**hf_tok, w); }));
  ExpectStoriesText(o2.output);
}

}  // namespace
}  // namespace chorus

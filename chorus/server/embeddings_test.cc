#include "chorus/server/embeddings.h"

#include <gtest/gtest.h>

#include <cstring>

#include "chorus/server/template_routes.h"
#include "tests/testutil/testutil.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;

TEST(Base64Test, Rfc4648Vectors) {
  EXPECT_EQ(Base64Encode(""), "");
  EXPECT_EQ(Base64Encode("f"), "Zg==");
  EXPECT_EQ(Base64Encode("fo"), "Zm8=");
  EXPECT_EQ(Base64Encode("foo"), "Zm9v");
  EXPECT_EQ(Base64Encode("foob"), "Zm9vYg==");
  EXPECT_EQ(Base64Encode("fooba"), "Zm9vYmE=");
  EXPECT_EQ(Base64Encode("foobar"), "Zm9vYmFy");
  EXPECT_EQ(Base64Encode(std::string("\xff\xfe\x00", 3)), "//4A");
}

TEST(EmbeddingResponseTest, FloatAndBase64Forms) {
  const std::vector<std::vector<float>> v = {{1.0f, -0.5f}, {0.25f, 3.0f}};
  const json f = json::parse(EmbeddingResponseJson(v, false, "m", 7, "embd-1", 1700000000));
  EXPECT_EQ(f["id"], "embd-1");
  EXPECT_EQ(f["created"], 1700000000);
  EXPECT_EQ(f["object"], "list");
  EXPECT_EQ(f["model"], "m");
  EXPECT_EQ(f["usage"]["prompt_tokens"], 7);
  EXPECT_EQ(f["usage"]["total_tokens"], 7);
  ASSERT_EQ(f["data"].size(), 2u);
  EXPECT_EQ(f["data"][1]["object"], "embedding");
  EXPECT_EQ(f["data"][1]["index"], 1);
  EXPECT_EQ(f["data"][1]["embedding"], json::array({0.25, 3.0}));
  const json b = json::parse(EmbeddingResponseJson(v, true, "m", 7, "embd-1", 1700000000));
  // 1.0f = 00 00 80 3f, -0.5f = 00 00 00 bf (little-endian float32).
  EXPECT_EQ(b["data"][0]["embedding"],
            Base64Encode(std::string("\x00\x00\x80\x3f\x00\x00\x00\xbf", 8)));
}

class EmbeddingParseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
    auto t = tokenizer::LoadTokenizer(testing::SharedModelsDir() + "/stories260K/tok512.bin");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::move(*t);
    ctx_.tok = tok_.get();
    ctx_.vocab_size = 512;
    ctx_.max_context = 16;
    ctx_.served_model = "stories";
    ctx_.serves_variants = true;
  }
  std::optional<ApiError> Parse(const std::string& body) {
    return ParseEmbeddingRequest(body, ctx_, engine::Pooling::kMean, 64, &req_);
  }
  void ExpectBad(const std::string& body, const std::string& param) {
    auto e = Parse(body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http_status, 400) << body;
    EXPECT_EQ(e->param, param) << body << " -> " << e->message;
  }
  std::unique_ptr<tokenizer::Tokenizer> tok_;
  tokenizer::ChatTemplate template_ = tokenizer::DefaultChatTemplate();
  ApiContext ctx_;
  EmbeddingApiRequest req_;
};

TEST_F(EmbeddingParseTest, InputFormsModelAndOptions) {
  ASSERT_FALSE(Parse(R"({"input":"Once upon a time"})"));
  ASSERT_EQ(req_.inputs.size(), 1u);
  EXPECT_EQ(req_.inputs[0].front(), 1);                     // BOS, as completions' prompts get it
  EXPECT_EQ(req_.options.pooling, engine::Pooling::kMean);  // the server's
  EXPECT_TRUE(req_.options.normalize);
  EXPECT_FALSE(req_.base64);
  EXPECT_TRUE(req_.variant_name.empty());
  ASSERT_FALSE(Parse(
      R"({"input":["a","b c"],"model":"stories","encoding_format":"base64","dimensions":64,"user":"u"})"));
  EXPECT_EQ(req_.inputs.size(), 2u);
  EXPECT_TRUE(req_.base64);
  ASSERT_FALSE(Parse(R"({"input":[5,6,7],"model":"my-lora","normalize":false})"));
  EXPECT_EQ(req_.inputs, (std::vector<std::vector<int32_t>>{{5, 6, 7}}));
  EXPECT_EQ(req_.variant_name, "my-lora");
  EXPECT_FALSE(req_.options.normalize);
  ASSERT_FALSE(Parse(R"({"input":[[5],[6,7]]})"));
  EXPECT_EQ(req_.inputs.size(), 2u);
  // truncate_prompt_tokens keeps the last tokens (vLLM).
  ASSERT_FALSE(Parse(R"({"input":[[1,2,3,4,5,6]],"truncate_prompt_tokens":2})"));
  EXPECT_EQ(req_.inputs, (std::vector<std::vector<int32_t>>{{5, 6}}));
  // OpenAI's limit on entries.
  json many = {{"input", json::array()}};
  for (int i = 0; i < kMaxEmbeddingInputs; ++i) many["input"].push_back("x");
  EXPECT_FALSE(Parse(many.dump()));
  EXPECT_EQ(req_.inputs.size(), static_cast<size_t>(kMaxEmbeddingInputs));
}

// vLLM's chat embeddings: the conversation as chat completions renders it, one input.
TEST_F(EmbeddingParseTest, MessagesAreRenderedByTheChatTemplate) {
  ctx_.chat_template = &template_;
  ctx_.max_context = 512;
  const std::string messages = R"("messages":[{"role":"user","content":"Hi there"}])";
  ASSERT_FALSE(Parse("{" + messages + "}"));
  ASSERT_EQ(req_.inputs.size(), 1u);
  std::string rendered;
  ASSERT_FALSE(RenderChatPrompt("{" + messages + "}", ctx_, &rendered));
  EXPECT_EQ(req_.inputs[0], EncodeChatPrompt(*tok_, rendered));
  ASSERT_FALSE(Parse("{" + messages + R"(,"add_generation_prompt":false})"));
  EXPECT_LT(req_.inputs[0].size(), EncodeChatPrompt(*tok_, rendered).size());
  ExpectBad("{" + messages + R"(,"input":"x"})", "input");
  ExpectBad(R"({"messages":[]})", "messages");
  ExpectBad(R"({"messages":"hi"})", "messages");
}

TEST_F(EmbeddingParseTest, BadInputIsRefusedNamingTheField) {
  ExpectBad(R"({})", "input");
  ExpectBad(R"({"input":""})", "input");
  ExpectBad(R"({"input":[]})", "input");
  ExpectBad(R"({"input":[[]]})", "input");
  ExpectBad(R"({"input":3})", "input");
  ExpectBad(R"({"input":[1,"a"]})", "input");
  ExpectBad(R"({"input":[600]})", "input");  // outside the vocabulary
  ExpectBad(R"({"input":["a",[1]]})", "input");
  ExpectBad(R"({"input":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]]})", "input");  // > 16
  EXPECT_EQ(Parse(R"({"input":[[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]]})")->code,
            "context_length_exceeded");
  ExpectBad(R"({"input":"a","encoding_format":"int8"})", "encoding_format");
  ExpectBad(R"({"input":"a","dimensions":32})", "dimensions");
  ExpectBad(R"({"input":"a","normalize":1})", "normalize");
  ExpectBad(R"({"input":"a","model":3})", "model");
  ExpectBad(R"({"input":"a","user":3})", "user");
  ExpectBad(R"({"input":"a","truncate_prompt_tokens":0})", "truncate_prompt_tokens");
  ExpectBad(R"({"input":"a","truncate_prompt_tokens":17})", "truncate_prompt_tokens");
  json many = {{"input", json::array()}};
  for (int i = 0; i <= kMaxEmbeddingInputs; ++i) many["input"].push_back("x");
  ExpectBad(many.dump(), "input");
  EXPECT_TRUE(Parse("not json").has_value());
  EXPECT_TRUE(Parse("[]").has_value());
  ctx_.serves_variants = false;
  auto e = Parse(R"({"input":"a","model":"other"})");
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->http_status, 404);
}

}  // namespace
}  // namespace chorus::server

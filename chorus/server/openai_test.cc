// test-labels: unit
// Request parsing and response shapes of the OpenAI API layer, on the real stories260K
// tokenizer (read in place from ../shared/models).
#include "chorus/server/openai.h"

#include <gtest/gtest.h>

#include <map>

#include "chorus/grammar/matcher.h"
#include "chorus/server/api_error.h"
#include "chorus/server/prometheus.h"
#include "tests/testutil/testutil.h"

namespace chorus::server {
namespace {

using json = nlohmann::json;

class OpenAiTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
    auto t = tokenizer::LoadTokenizer(testing::SharedModelsDir() + "/stories260K/tok512.bin");
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::move(*t);
    ctx_.tok = tok_.get();
    ctx_.chat_template = &template_;
    ctx_.vocab_size = 512;
    ctx_.max_context = 512;
    ctx_.served_model = "stories";
  }

  std::optional<ApiError> Parse(ApiKind kind, const std::string& body) {
    return ParseApiRequest(kind, body, ctx_, &req_);
  }
  // Expects a 400 naming `param`.
  void ExpectBad(ApiKind kind, const std::string& body, const std::string& param) {
    auto e = Parse(kind, body);
    ASSERT_TRUE(e.has_value()) << body;
    EXPECT_EQ(e->http_status, 400) << body;
    EXPECT_EQ(e->param, param) << body << " -> " << e->message;
    EXPECT_LT(e->message.size(), 300u);
  }

  std::unique_ptr<tokenizer::Tokenizer> tok_;
  tokenizer::ChatTemplate template_ = tokenizer::DefaultChatTemplate();
  ApiContext ctx_;
  ApiRequest req_;
};

TEST(ApiErrorTest, StatusMappingAndBody) {
  EXPECT_EQ(ErrorFromStatus(InvalidArgumentError("x")).http_status, 400);
  auto ctx = ErrorFromStatus(OutOfRangeError("long"));
  EXPECT_EQ(ctx.http_status, 400);
  EXPECT_EQ(ctx.code, "context_length_exceeded");
  EXPECT_EQ(ErrorFromStatus(NotFoundError("x")).http_status, 404);
  EXPECT_EQ(ErrorFromStatus(UnauthenticatedError("x")).http_status, 401);
  auto busy = ErrorFromStatus(ResourceExhaustedError("queue"));
  EXPECT_EQ(busy.http_status, 429);
  EXPECT_GT(busy.retry_after_s, 0);
  auto down = ErrorFromStatus(UnavailableError("draining"));
  EXPECT_EQ(down.http_status, 503);
  EXPECT_GT(down.retry_after_s, 0);
  EXPECT_EQ(ErrorFromStatus(InternalError("bug")).http_status, 500);

  json body = json::parse(BadRequest("bad \xff value", "temperature").ToJson());
  ASSERT_TRUE(body.contains("error"));
  const json& e = body["error"];
  EXPECT_EQ(e["type"], "invalid_request_error");
  EXPECT_EQ(e["param"], "temperature");
  EXPECT_TRUE(e["code"].is_null());
  EXPECT_TRUE(e["message"].is_string());  // invalid UTF-8 replaced, not thrown
}

TEST(JsonDepthTest, CountsOutsideStrings) {
  EXPECT_EQ(JsonNestingDepth(R"({"a":[1,[2]]})", 100), 3);
  EXPECT_EQ(JsonNestingDepth(R"({"a":"[[[[\"[["})", 100), 1);
  EXPECT_GT(JsonNestingDepth(std::string(100000, '['), 64), 64);
}

TEST_F(OpenAiTest, CompletionDefaults) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"model":"stories","prompt":"Once upon a time"})"));
  ASSERT_EQ(req_.prompts.size(), 1u);
  EXPECT_EQ(req_.prompts[0], tok_->Encode("Once upon a time", {}));
  EXPECT_EQ(req_.prompts[0][0], 1);  // BOS, as the tokenizer asks
  EXPECT_EQ(req_.gen.n, 1);
  EXPECT_EQ(req_.gen.max_tokens, -1);
  EXPECT_FALSE(req_.stream);
  EXPECT_EQ(req_.logprobs, -1);
  EXPECT_FALSE(req_.gen.sampling.logprobs.has_value());
  engine::GenerationRequest g;
  ASSERT_FALSE(MakeGenerationRequest(req_, 0, ctx_, &g));
  EXPECT_EQ(g.max_tokens, kDefaultCompletionTokens);  // 16, as OpenAI and vLLM
  EXPECT_EQ(g.prompt, req_.prompts[0]);
}

TEST_F(OpenAiTest, CompletionFieldsAndPromptForms) {
  ASSERT_FALSE(
      Parse(ApiKind::kCompletion,
            R"({"prompt":["a","b c"],"n":2,"max_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":5,
                         "min_p":0.1,"presence_penalty":0.5,"frequency_penalty":-0.5,"repetition_penalty":1.2,
                         "seed":-3,"stop":["x","yz"],"ignore_eos":true,"stream":true,
                         "stream_options":{"include_usage":true},"logprobs":3,"user":"u","stop_token_ids":[5]})"));
  EXPECT_EQ(req_.prompts.size(), 2u);
  EXPECT_EQ(req_.gen.n, 2);
  EXPECT_EQ(req_.gen.max_tokens, 7);
  EXPECT_FLOAT_EQ(req_.gen.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(req_.gen.sampling.top_p, 0.9f);
  EXPECT_EQ(req_.gen.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(req_.gen.sampling.min_p, 0.1f);
  EXPECT_FLOAT_EQ(req_.gen.sampling.repetition_penalty, 1.2f);
  EXPECT_EQ(*req_.gen.sampling.seed, static_cast<uint64_t>(int64_t{-3}));
  EXPECT_EQ(req_.gen.stop, (std::vector<std::string>{"x", "yz"}));
  EXPECT_EQ(req_.gen.stop_token_ids, std::vector<int32_t>{5});
  EXPECT_TRUE(req_.gen.ignore_eos);
  EXPECT_TRUE(req_.stream);
  EXPECT_TRUE(req_.include_usage);
  EXPECT_EQ(req_.logprobs, 3);
  EXPECT_EQ(*req_.gen.sampling.logprobs, 3);

  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"prompt":[1,403,407],"stop":"s"})"));
  EXPECT_EQ(req_.prompts, (std::vector<std::vector<int32_t>>{{1, 403, 407}}));  // ids as given
  EXPECT_EQ(req_.gen.stop, std::vector<std::string>{"s"});
  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"prompt":[[1,2.0],[3]]})"));
  EXPECT_EQ(req_.prompts, (std::vector<std::vector<int32_t>>{{1, 2}, {3}}));
}

TEST_F(OpenAiTest, CompletionErrors) {
  const auto C = ApiKind::kCompletion;
  auto e = Parse(C, R"({"prompt": "x",)");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  ASSERT_TRUE(Parse(C, "[1,2]"));
  ASSERT_TRUE(Parse(C, "{\"prompt\":\"\xc3\x28\"}"));  // invalid UTF-8
  ASSERT_TRUE(Parse(C, std::string(5000, '[') + std::string(5000, ']')));
  ExpectBad(C, R"({})", "prompt");
  ExpectBad(C, R"({"prompt":""})", "prompt");
  ExpectBad(C, R"({"prompt":[]})", "prompt");
  ExpectBad(C, R"({"prompt":[[]]})", "prompt");
  ExpectBad(C, R"({"prompt":["a",1]})", "prompt");
  ExpectBad(C, R"({"prompt":{"a":1}})", "prompt");
  ExpectBad(C, R"({"prompt":[1,512]})", "prompt");
  ExpectBad(C, R"({"prompt":[-1]})", "prompt");
  ExpectBad(C, R"({"prompt":[1.5]})", "prompt");
  ExpectBad(C, R"({"prompt":"a","max_tokens":0})", "max_tokens");  // 0 only with echo
  ExpectBad(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"max_tokens":0})",
            "max_tokens");
  ExpectBad(C, R"({"prompt":"a","max_tokens":"5"})", "max_tokens");
  ExpectBad(C, R"({"prompt":"a","max_tokens":1e30})", "max_tokens");
  ExpectBad(C, R"({"prompt":"a","temperature":-1})", "temperature");
  ExpectBad(C, R"({"prompt":"a","temperature":"hot"})", "temperature");
  ExpectBad(C, R"({"prompt":"a","top_p":0})", "top_p");
  ExpectBad(C, R"({"prompt":"a","top_p":1.5})", "top_p");
  ExpectBad(C, R"({"prompt":"a","top_k":-2})", "top_k");
  ExpectBad(C, R"({"prompt":"a","min_p":2})", "min_p");
  ExpectBad(C, R"({"prompt":"a","presence_penalty":3})", "presence_penalty");
  ExpectBad(C, R"({"prompt":"a","frequency_penalty":-3})", "frequency_penalty");
  ExpectBad(C, R"({"prompt":"a","repetition_penalty":0})", "repetition_penalty");
  ExpectBad(C, R"({"prompt":"a","n":0})", "n");
  ExpectBad(C, R"({"prompt":"a","n":17})", "n");
  ExpectBad(C, R"({"prompt":"a","seed":"x"})", "seed");
  ExpectBad(C, R"({"prompt":"a","stop":5})", "stop");
  ExpectBad(C, R"({"prompt":"a","stop":[""]})", "stop");
  ExpectBad(C, R"({"prompt":"a","stream":"yes"})", "stream");
  ExpectBad(C, R"({"prompt":"a","stream_options":{"include_usage":true}})", "stream_options");
  ExpectBad(C, R"({"prompt":"a","logprobs":21})", "logprobs");
  ExpectBad(C, R"({"prompt":"a","logprobs":true})", "logprobs");
  ExpectBad(C, R"({"prompt":"a","prompt_logprobs":21})", "prompt_logprobs");
  ExpectBad(C, R"({"prompt":"a","prompt_logprobs":"1"})", "prompt_logprobs");
  ExpectBad(C, R"({"prompt":"a","prompt_logprobs":1,"stream":true})", "prompt_logprobs");
  ExpectBad(C, R"({"prompt":"a","ignore_eos":1})", "ignore_eos");
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"x":1}})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"512":1}})", "logit_bias");  // vocab is 512
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"-1":1}})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"5 ":1}})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"5":101}})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","logit_bias":{"5":"1"}})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","logit_bias":[5]})", "logit_bias");
  ExpectBad(C, R"({"prompt":"a","min_tokens":-1})", "min_tokens");
  ExpectBad(C, R"({"prompt":"a","min_tokens":5,"max_tokens":4})", "min_tokens");
  ExpectBad(C, R"({"prompt":"a","model":5})", "model");
  e = Parse(C, R"({"prompt":"a","model":"gpt-4"})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 404);
  EXPECT_EQ(e->code, "model_not_found");

  // Context: the engine-facing limit.
  ASSERT_FALSE(Parse(C, R"({"prompt":[1,2,3],"max_tokens":510})"));
  engine::GenerationRequest g;
  auto ce = MakeGenerationRequest(req_, 0, ctx_, &g);
  ASSERT_TRUE(ce);
  EXPECT_EQ(ce->http_status, 400);
  EXPECT_EQ(ce->code, "context_length_exceeded");
  ASSERT_FALSE(Parse(C, R"({"prompt":[1,2,3],"max_tokens":509})"));
  EXPECT_FALSE(MakeGenerationRequest(req_, 0, ctx_, &g));
  std::string long_prompt = "[";
  for (int i = 0; i < 512; ++i) long_prompt += (i ? ",5" : "5");
  ASSERT_FALSE(Parse(C, R"({"prompt":)" + long_prompt + "]}"));
  ce = MakeGenerationRequest(req_, 0, ctx_, &g);
  ASSERT_TRUE(ce);
  EXPECT_EQ(ce->code, "context_length_exceeded");
}

// Structured outputs: response_format on both routes, llama.cpp's grammar and json_schema; a
// constraint that does not compile is a 400 naming the field and the keyword.
TEST_F(OpenAiTest, StructuredOutputFields) {
  const auto C = ApiKind::kCompletion;
  const auto H = ApiKind::kChat;
  const std::string msgs = R"("messages":[{"role":"user","content":"hi"}])";
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","response_format":{"type":"text"}})"));
  EXPECT_FALSE(req_.gen.grammar.valid());
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","response_format":{"type":"json_object"}})"));
  EXPECT_TRUE(req_.gen.grammar.valid());
  ASSERT_FALSE(Parse(H, "{" + msgs +
                            R"(,"response_format":{"type":"json_schema","json_schema":{"name":"x",
                            "strict":true,"schema":{"type":"object","properties":{"a":{"type":"integer"}}}}}})"));
  ASSERT_TRUE(req_.gen.grammar.valid());
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, R"({"a":5})"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, R"({"b":5})"), -1);
  // Properties in the order the request wrote them.
  ASSERT_FALSE(Parse(
      C,
      R"({"prompt":"a","json_schema":{"type":"object","properties":{"b":{"type":"null"},"a":{"type":"null"}},"required":["b","a"]}})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, R"({"b":null,"a":null})"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, R"({"a":null,"b":null})"), -1);
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","grammar":"root ::= \"yes\" | \"no\""})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "no"), 1);
  ASSERT_FALSE(Parse(H, "{" + msgs + R"(,"json_schema":{"enum":[1,2]}})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "2"), 1);

  ExpectBad(C, R"({"prompt":"a","response_format":"json"})", "response_format");
  ExpectBad(C, R"({"prompt":"a","response_format":{"type":"xml"}})", "response_format.type");
  ExpectBad(H, "{" + msgs + R"(,"response_format":{}})", "response_format.type");
  ExpectBad(H, "{" + msgs + R"(,"response_format":{"type":"json_schema"}})",
            "response_format.json_schema");
  ExpectBad(
      H,
      "{" + msgs +
          R"(,"response_format":{"type":"json_schema","json_schema":{"name":1,"schema":{}}}})",
      "response_format.json_schema.name");
  ExpectBad(H,
            "{" + msgs + R"(,"response_format":{"type":"json_schema","json_schema":{"name":"n"}}})",
            "response_format.json_schema.schema");
  ExpectBad(
      C,
      R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","patternProperties":{}}}}})",
      "response_format.json_schema.schema");
  auto e = Parse(
      C,
      R"({"prompt":"a","response_format":{"type":"json_schema","json_schema":{"schema":{"type":"object","properties":{"x":{"not":{}}}}}}})");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("'not'"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("#/properties/x"), std::string::npos) << e->message;
  ExpectBad(C, R"({"prompt":"a","grammar":"root ::= nothing"})", "grammar");
  e = Parse(C, R"({"prompt":"a","grammar":"root ::= \"a\"\nb ::= (\"x\""})");
  ASSERT_TRUE(e);
  EXPECT_NE(e->message.find("line 2"), std::string::npos) << e->message;
  ExpectBad(C, R"({"prompt":"a","grammar":5})", "grammar");
  ExpectBad(C, R"({"prompt":"a","json_schema":{"type":"strin"}})", "json_schema");
  ExpectBad(C, R"({"prompt":"a","json_schema":"x"})", "json_schema");
  ExpectBad(C, R"({"prompt":"a","json_schema":{},"grammar":"root ::= \"a\""})", "json_schema");
  ExpectBad(C, R"({"prompt":"a","response_format":{"type":"json_object"},"json_schema":{}})",
            "json_schema");
}

TEST_F(OpenAiTest, ChatRendersWithTemplate) {
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"system","content":"Be brief."},
      {"role":"user","content":[{"type":"text","text":"Hi"},{"type":"text","text":"there"}]}],
      "max_completion_tokens":5,"max_tokens":9,"logprobs":true,"top_logprobs":2})"));
  ASSERT_EQ(req_.prompts.size(), 1u);
  // ChatML default template, BOS prepended by the tokenizer's rule.
  const std::string expected =
      "<|im_start|>system\nBe "
      "brief.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(req_.prompts[0], tok_->Encode(expected, {}));
  EXPECT_EQ(req_.gen.max_tokens, 5);  // max_completion_tokens wins
  EXPECT_EQ(req_.logprobs, 2);

  const auto K = ApiKind::kChat;
  ExpectBad(K, R"({})", "messages");
  ExpectBad(K, R"({"messages":[]})", "messages");
  ExpectBad(K, R"({"messages":"hi"})", "messages");
  ExpectBad(K, R"({"messages":[{"content":"x"}]})", "messages");
  ExpectBad(K, R"({"messages":[{"role":"user","content":5}]})", "messages");
  ExpectBad(K, R"({"messages":[{"role":"user","content":[{"type":"image_url","image_url":{}}]}]})",
            "messages");
  ExpectBad(K, R"({"messages":[{"role":"user","content":"x"}],"top_logprobs":2})", "top_logprobs");
  ExpectBad(K, R"({"messages":[{"role":"user","content":"x"}],"logprobs":1})", "logprobs");
  ExpectBad(K, R"({"messages":[{"role":"user","content":"x"}],"max_completion_tokens":-1})",
            "max_completion_tokens");
}

// Tools: the fields reach ApiRequest; the ChatML default never reads `tools`, so the generic
// form describes them in a system message; Mistral/Llama syntaxes keep special tokens.
TEST_F(OpenAiTest, ChatToolFields) {
  const std::string tools =
      R"("tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}])";
  ASSERT_FALSE(
      Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],)" + tools + "}"));
  EXPECT_TRUE(req_.tools.active());
  EXPECT_EQ(req_.tool_syntax, ToolSyntax::kGeneric);
  EXPECT_TRUE(req_.gen.skip_special_tokens);
  const std::string text = tok_->Decode(req_.prompts[0]);
  EXPECT_NE(text.find("<|im_start|>system\n# Tools\n"), std::string::npos) << text;
  EXPECT_NE(text.find(R"({"type":"function","function":{"name":"f")"), std::string::npos);

  ctx_.tool_syntax = ToolSyntax::kMistral;
  ASSERT_FALSE(
      Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],)" + tools + "}"));
  EXPECT_EQ(req_.tool_syntax, ToolSyntax::kMistral);
  EXPECT_FALSE(req_.gen.skip_special_tokens);
  req_ = ApiRequest{};
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                         R"(,"tool_choice":"none"})"));
  EXPECT_FALSE(req_.tools.active());
  EXPECT_TRUE(req_.gen.skip_special_tokens);
  EXPECT_EQ(tok_->Decode(req_.prompts[0]).find("# Tools"), std::string::npos);

  const auto K = ApiKind::kChat;
  ExpectBad(K, R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function"}]})",
            "tools[0].function");
  ExpectBad(K, R"({"messages":[{"role":"user","content":"x"}],"tool_choice":"required"})",
            "tool_choice");
  ExpectBad(K,
            R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                R"(,"tool_choice":{"type":"function","function":{"name":"g"}}})",
            "tool_choice.function.name");
  ExpectBad(K, R"({"messages":[{"role":"tool","content":"x"}]})", "messages[0].tool_call_id");
  // A forced call is itself a constraint: not together with response_format.
  ExpectBad(K,
            R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                R"(,"tool_choice":"required","response_format":{"type":"json_object"}})",
            "tool_choice");
  // Forced: the grammar is set and the hermes-syntax opening ends the prompt.
  ctx_.tool_syntax = std::nullopt;
  req_ = ApiRequest{};
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],)" + tools +
                                         R"(,"tool_choice":"required"})"));
  EXPECT_TRUE(req_.gen.grammar.valid());
  EXPECT_EQ(req_.tool_opening, "<tool_call>\n");
  EXPECT_TRUE(tok_->Decode(req_.prompts[0]).ends_with("<|im_start|>assistant\n<tool_call>\n"));
}

TEST_F(OpenAiTest, ChatTemplateErrorsAreBadRequests) {
  auto t = tokenizer::ChatTemplate::Parse("{{ raise_exception('roles must alternate') }}");
  ASSERT_TRUE(t.ok()) << t.status().ToString();
  template_ = *t;
  auto e = Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}]})");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->http_status, 400);
  EXPECT_NE(e->message.find("roles must alternate"), std::string::npos);
}

engine::StreamEvent Ev(int index, int32_t token, std::string text,
                       engine::FinishReason f = engine::FinishReason::kNone) {
  engine::StreamEvent ev;
  ev.index = index;
  ev.token = token;
  ev.text = std::move(text);
  ev.finish = f;
  return ev;
}

TEST_F(OpenAiTest, CompletionResponseShapes) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"prompt":["a","b"],"n":2,"logprobs":1})"));
  ResponseBuilder b(req_, ctx_, "cmpl-1", 42);
  for (size_t p = 0; p < 2; ++p) {
    for (int i = 0; i < 2; ++i) {
      auto ev = Ev(i, 403, "Once");
      ev.logprob = -0.5f;
      ev.top_logprobs = {{403, -0.5f}};
      b.Add(p, ev);
      auto last = Ev(i, 407, " upon", engine::FinishReason::kLength);
      last.logprob = -std::numeric_limits<float>::infinity();
      b.Add(p, last);
    }
  }
  json r = json::parse(b.FinalJson({10, 8}));
  EXPECT_EQ(r["id"], "cmpl-1");
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["created"], 42);
  EXPECT_EQ(r["model"], "stories");
  ASSERT_EQ(r["choices"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const json& c = r["choices"][i];
    EXPECT_EQ(c["index"], i);
    EXPECT_EQ(c["text"], "Once upon");
    EXPECT_EQ(c["finish_reason"], "length");
    EXPECT_EQ(c["logprobs"]["tokens"].size(), 2u);
    EXPECT_EQ(c["logprobs"]["token_logprobs"][0], -0.5);
    EXPECT_EQ(c["logprobs"]["token_logprobs"][1], -9999.0);  // -inf clamped
    EXPECT_TRUE(c["logprobs"]["top_logprobs"][0].is_object());
    EXPECT_EQ(c["logprobs"]["text_offset"][1], 4);
  }
  EXPECT_EQ(r["usage"]["prompt_tokens"], 10);
  EXPECT_EQ(r["usage"]["completion_tokens"], 8);
  EXPECT_EQ(r["usage"]["total_tokens"], 18);
}

// Parses "data: ...\n\n" events.
std::vector<std::string> SseData(const std::string& s) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < s.size()) {
    size_t end = s.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    std::string ev = s.substr(pos, end - pos);
    EXPECT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    out.push_back(ev.substr(6));
    pos = end + 2;
  }
  return out;
}

engine::StreamEvent PromptEv(int64_t position, int32_t token, float logprob,
                             std::vector<engine::TokenLogprob> top, int64_t rank) {
  engine::StreamEvent ev;
  ev.prompt = true;
  ev.position = position;
  ev.token = token;
  ev.logprob = logprob;
  ev.top_logprobs = std::move(top);
  ev.rank = rank;
  return ev;
}

// vLLM's guided_json / guided_choice / guided_grammar (extra body fields of its OpenAI server).
TEST_F(OpenAiTest, VllmGuidedFields) {
  const auto C = ApiKind::kCompletion;
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","guided_choice":["yes","no","a \"quoted\"\n\\ one"]})"));
  ASSERT_TRUE(req_.gen.grammar.valid());
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "yes"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "no"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "a \"quoted\"\n\\ one"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "yesno"), -1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "maybe"), -1);
  ASSERT_FALSE(
      Parse(C, R"({"prompt":"a","guided_json":{"type":"integer","minimum":3,"maximum":4}})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "4"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "5"), -1);
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","guided_json":"{\"enum\": [\"x\"]}"})"));  // as text
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, R"("x")"), 1);
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","guided_grammar":"root ::= [0-9]+"})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "42"), 1);
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","guided_regex":"\\d{3}-[a-z]+"})"));
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "123-ab"), 1);
  EXPECT_EQ(grammar::ReferenceRecognize(req_.gen.grammar, "12-ab"), -1);
  ASSERT_FALSE(Parse(C, R"({"prompt":"a","guided_choice":null})"));
  EXPECT_FALSE(req_.gen.grammar.valid());

  ExpectBad(C, R"({"prompt":"a","guided_choice":[]})", "guided_choice");
  ExpectBad(C, R"({"prompt":"a","guided_choice":"yes"})", "guided_choice");
  ExpectBad(C, R"({"prompt":"a","guided_choice":["yes",""]})", "guided_choice");
  ExpectBad(C, R"({"prompt":"a","guided_choice":["yes",1]})", "guided_choice");
  ExpectBad(C, R"({"prompt":"a","guided_json":"{not json"})", "guided_json");
  ExpectBad(C, R"({"prompt":"a","guided_json":{"type":"nope"}})", "guided_json");
  ExpectBad(C, R"({"prompt":"a","guided_json":5})", "guided_json");
  ExpectBad(C, R"({"prompt":"a","guided_grammar":"root ::= undefined"})", "guided_grammar");
  ExpectBad(C, R"({"prompt":"a","guided_regex":"(a"})", "guided_regex");
  ExpectBad(C, R"({"prompt":"a","guided_regex":""})", "guided_regex");
  ExpectBad(C, R"({"prompt":"a","guided_regex":5})", "guided_regex");
  ExpectBad(C, R"({"prompt":"a","guided_regex":"a","guided_choice":["a"]})", "guided_regex");
  ExpectBad(C, R"({"prompt":"a","guided_choice":["a"],"grammar":"root ::= \"a\""})",
            "guided_choice");
}

TEST_F(OpenAiTest, LogitBiasAndMinTokens) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion,
                     R"({"prompt":"a","logit_bias":{"5":-100,"300":2.5},"min_tokens":3})"));
  ASSERT_EQ(req_.gen.sampling.logit_bias.size(), 2u);
  std::map<int32_t, float> bias;
  for (const auto& b : req_.gen.sampling.logit_bias) bias[b.token] = b.bias;
  EXPECT_EQ(bias[5], -100.0f);
  EXPECT_EQ(bias[300], 2.5f);
  EXPECT_EQ(req_.gen.min_tokens, 3);
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                         "logit_bias":{},"min_tokens":0})"));
  EXPECT_TRUE(req_.gen.sampling.logit_bias.empty());
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],
                                         "logit_bias":null})"));
}

// Echo with logprobs (lm-evaluation-harness's loglikelihood request): the prompt's tokens come
// first, the first with null entries, then the generated ones; every choice of the prompt shows
// the prompt's part; offsets count token texts, the generated ones continuing after them.
TEST_F(OpenAiTest, EchoWithLogprobsReturnsThePromptsLogprobs) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion,
                     R"({"prompt":[[1,403,407]],"echo":true,"logprobs":1,"max_tokens":1,"n":2})"));
  EXPECT_EQ(req_.gen.prompt_logprobs, 1);
  EXPECT_FALSE(req_.echo_only);
  ResponseBuilder b(req_, ctx_, "cmpl-2", 42);
  b.Add(0, PromptEv(1, 403, -0.25f, {{403, -0.25f}, {450, -1.5f}}, 1));
  b.Add(0, PromptEv(2, 407, -2.0f, {{300, -0.5f}, {407, -2.0f}}, 2));
  for (int i = 0; i < 2; ++i) {
    auto ev = Ev(i, 261, " a", engine::FinishReason::kLength);
    ev.logprob = -0.125f;
    ev.top_logprobs = {{261, -0.125f}};
    b.Add(0, ev);
  }
  json r = json::parse(b.FinalJson({3, 2}));
  ASSERT_EQ(r["choices"].size(), 2u);
  const std::string bos = tok_->TokenBytes(-1, 1, true);
  for (const json& c : r["choices"]) {
    EXPECT_EQ(c["text"], "Once upon a");
    const json& lp = c["logprobs"];
    EXPECT_EQ(lp["tokens"], json({bos, "Once", " upon", " a"}));
    EXPECT_EQ(lp["token_logprobs"], json({nullptr, -0.25, -2.0, -0.125}));
    EXPECT_TRUE(lp["top_logprobs"][0].is_null());
    // logprobs = 1: the most likely token, plus the prompt token itself when it is not that.
    EXPECT_EQ(lp["top_logprobs"][1], json({{"Once", -0.25}}));
    EXPECT_EQ(lp["top_logprobs"][2].size(), 2u);
    EXPECT_EQ(lp["top_logprobs"][2][" upon"], -2.0);
    const auto b0 = static_cast<int64_t>(bos.size());
    EXPECT_EQ(lp["text_offset"], json({0, b0, b0 + 4, b0 + 9}));
    EXPECT_FALSE(c.contains("prompt_logprobs"));
  }
  EXPECT_EQ(r["usage"]["completion_tokens"], 2);
}

// max_tokens 0 with echo: the prompt alone, "length", no completion tokens counted.
TEST_F(OpenAiTest, EchoWithZeroMaxTokensReturnsThePromptAlone) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion,
                     R"({"prompt":[1,403,407],"echo":true,"logprobs":0,"max_tokens":0})"));
  EXPECT_TRUE(req_.echo_only);
  EXPECT_EQ(req_.gen.max_tokens, 1);  // the engine samples one token; the answer drops it
  ResponseBuilder b(req_, ctx_, "cmpl-3", 42);
  b.Add(0, PromptEv(1, 403, -0.25f, {}, 1));
  b.Add(0, PromptEv(2, 407, -2.0f, {}, 3));
  b.Add(0, Ev(0, 261, " a", engine::FinishReason::kStop));
  json r = json::parse(b.FinalJson({3, 0}));
  const json& c = r["choices"][0];
  EXPECT_EQ(c["text"], "Once upon");
  EXPECT_EQ(c["finish_reason"], "length");
  EXPECT_EQ(c["logprobs"]["token_logprobs"], json({nullptr, -0.25, -2.0}));
  EXPECT_EQ(c["logprobs"]["tokens"].size(), 3u);

  // Streamed: the echo chunk waits for the prompt's logprobs, then the final chunk is empty.
  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"prompt":[1,403,407],"echo":true,"logprobs":0,
                                               "max_tokens":0,"stream":true})"));
  ResponseBuilder sb(req_, ctx_, "cmpl-4", 42);
  EXPECT_EQ(sb.OpeningChunks(), "");
  EXPECT_EQ(sb.Chunk(0, PromptEv(1, 403, -0.25f, {}, 1)), "");
  EXPECT_EQ(sb.Chunk(0, PromptEv(2, 407, -2.0f, {}, 3)), "");
  auto chunks = SseData(sb.Chunk(0, Ev(0, 261, " a", engine::FinishReason::kLength)));
  ASSERT_EQ(chunks.size(), 2u);
  json first = json::parse(chunks[0]), last = json::parse(chunks[1]);
  EXPECT_EQ(first["choices"][0]["text"], "Once upon");
  EXPECT_EQ(first["choices"][0]["logprobs"]["token_logprobs"], json({nullptr, -0.25, -2.0}));
  EXPECT_EQ(last["choices"][0]["text"], "");
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
}

// vLLM's prompt_logprobs: per choice for completions, per response for chat; keyed by token id,
// the prompt token first with its rank, then the most likely ones.
TEST_F(OpenAiTest, VllmPromptLogprobsShape) {
  ASSERT_FALSE(Parse(ApiKind::kCompletion, R"({"prompt":[1,403,407],"prompt_logprobs":1})"));
  EXPECT_EQ(req_.gen.prompt_logprobs, 1);
  ResponseBuilder b(req_, ctx_, "cmpl-5", 42);
  b.Add(0, PromptEv(1, 403, -0.25f, {{403, -0.25f}}, 1));
  b.Add(0, PromptEv(2, 407, -2.0f, {{300, -0.5f}}, 4));
  b.Add(0, Ev(0, 261, " a", engine::FinishReason::kLength));
  json r = json::parse(b.FinalJson({3, 1}));
  const json& pl = r["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), 3u);
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_EQ(pl[1], json({{"403", {{"logprob", -0.25}, {"rank", 1}, {"decoded_token", "Once"}}}}));
  EXPECT_EQ(pl[2]["407"]["rank"], 4);
  EXPECT_EQ(pl[2]["300"]["rank"], 1);
  EXPECT_EQ(pl[2]["300"]["logprob"], -0.5);
  EXPECT_TRUE(r["choices"][0]["logprobs"].is_null());  // logprobs not asked for

  ASSERT_FALSE(
      Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"prompt_logprobs":0})"));
  ResponseBuilder cb(req_, ctx_, "chatcmpl-5", 42);
  const int64_t n = static_cast<int64_t>(req_.prompts[0].size());
  for (int64_t p = 1; p < n; ++p) cb.Add(0, PromptEv(p, req_.prompts[0][p], -1.0f, {}, 2));
  cb.Add(0, Ev(0, 261, " a", engine::FinishReason::kLength));
  json cr = json::parse(cb.FinalJson({n, 1}));
  ASSERT_EQ(cr["prompt_logprobs"].size(), static_cast<size_t>(n));
  EXPECT_FALSE(cr["choices"][0].contains("prompt_logprobs"));
}

TEST_F(OpenAiTest, ChatChunkShapes) {
  ASSERT_FALSE(Parse(ApiKind::kChat, R"({"messages":[{"role":"user","content":"x"}],"stream":true,
                                         "stream_options":{"include_usage":true}})"));
  ResponseBuilder b(req_, ctx_, "chatcmpl-1", 7);
  std::string s = b.OpeningChunks();
  s += b.Chunk(0, Ev(0, 403, "Once"));
  EXPECT_EQ(b.Chunk(0, Ev(0, 300, "")), "");  // nothing to send
  s += b.Chunk(0, Ev(0, 2, "", engine::FinishReason::kStop));
  s += b.ClosingChunks({5, 3});
  auto events = SseData(s);
  ASSERT_EQ(events.size(), 5u);
  json first = json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_TRUE(first["usage"].is_null());
  json second = json::parse(events[1]);
  EXPECT_EQ(second["choices"][0]["delta"]["content"], "Once");
  EXPECT_FALSE(second["choices"][0]["delta"].contains("role"));
  EXPECT_TRUE(second["choices"][0]["finish_reason"].is_null());
  json third = json::parse(events[2]);
  EXPECT_TRUE(third["choices"][0]["delta"].empty());
  EXPECT_EQ(third["choices"][0]["finish_reason"], "stop");
  json usage = json::parse(events[3]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 8);
  EXPECT_EQ(events[4], "[DONE]");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(json::parse(events[i])["id"], "chatcmpl-1");
}

TEST_F(OpenAiTest, ChatLogprobsShape) {
  ASSERT_FALSE(
      Parse(ApiKind::kChat,
            R"({"messages":[{"role":"user","content":"x"}],"logprobs":true,"top_logprobs":2})"));
  ResponseBuilder b(req_, ctx_, "chatcmpl-2", 7);
  auto ev = Ev(0, 403, "Once", engine::FinishReason::kLength);
  ev.logprob = -0.25f;
  ev.top_logprobs = {{403, -0.25f}, {407, -2.0f}};
  b.Add(0, ev);
  json r = json::parse(b.FinalJson({1, 1}));
  const json& c = r["choices"][0];
  EXPECT_EQ(r["object"], "chat.completion");
  EXPECT_EQ(c["message"]["role"], "assistant");
  EXPECT_EQ(c["message"]["content"], "Once");
  const json& lp = c["logprobs"]["content"];
  ASSERT_EQ(lp.size(), 1u);
  EXPECT_EQ(lp[0]["logprob"], -0.25);
  EXPECT_TRUE(lp[0]["token"].is_string());
  EXPECT_TRUE(lp[0]["bytes"].is_array());
  ASSERT_EQ(lp[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(lp[0]["top_logprobs"][1]["logprob"], -2.0);
}

TEST(PrometheusTest, RendersEngineAndHttpSeries) {
  engine::EngineMetrics m;
  m.queue_length = 3;
  m.kv_blocks_total = 10;
  m.kv_blocks_used = 4;
  m.ttft_seconds.Observe(0.02);
  m.ttft_seconds.Observe(100);
  HttpCounters http;
  http.Add("/v1/completions", 200);
  http.Add("/v1/completions", 200);
  http.Add("other", 404);
  std::string t = RenderPrometheus(&m, http, 1024);
  EXPECT_NE(t.find("chorus_queue_length 3\n"), std::string::npos);
  EXPECT_NE(t.find("chorus_kv_blocks_free 6\n"), std::string::npos);
  EXPECT_NE(t.find("# TYPE chorus_time_to_first_token_seconds histogram"), std::string::npos);
  EXPECT_NE(t.find("chorus_time_to_first_token_seconds_bucket{le=\"0.025\"} 1\n"),
            std::string::npos);
  EXPECT_NE(t.find("chorus_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("chorus_time_to_first_token_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(t.find("chorus_http_requests_total{route=\"/v1/completions\",status=\"200\"} 2\n"),
            std::string::npos);
  EXPECT_NE(t.find("chorus_http_requests_total{route=\"other\",status=\"404\"} 1\n"),
            std::string::npos);
  EXPECT_EQ(RenderPrometheus(nullptr, http, 0).find("chorus_queue_length"), std::string::npos);
}

}  // namespace
}  // namespace chorus::server

namespace chorus::server {
namespace {

TEST_F(OpenAiTest, SloFields) {
  for (ApiKind kind : {ApiKind::kCompletion, ApiKind::kChat}) {
    const std::string head = kind == ApiKind::kChat
                                 ? R"({"messages":[{"role":"user","content":"hi"}],)"
                                 : R"({"prompt":"hi",)";
    ASSERT_FALSE(Parse(kind, head + R"("ttft_slo_ms":250,"tpot_slo_ms":40.5})"));
    EXPECT_EQ(req_.gen.ttft_slo_ms, 250);
    EXPECT_EQ(req_.gen.tpot_slo_ms, 40.5);
    ASSERT_FALSE(Parse(kind, head + R"("ttft_slo_ms":0})"));
    EXPECT_EQ(req_.gen.ttft_slo_ms, 0);  // explicitly none
    EXPECT_LT(req_.gen.tpot_slo_ms, 0);  // absent: the server's default
    ASSERT_FALSE(Parse(kind, head + R"("ttft_slo_ms":null})"));
    EXPECT_LT(req_.gen.ttft_slo_ms, 0);
    for (const char* field : {"ttft_slo_ms", "tpot_slo_ms"}) {
      for (const char* bad : {"-1", "\"fast\"", "true", "[5]", "1e300", "{}"})
        ExpectBad(kind, head + "\"" + field + "\":" + bad + "}", field);
    }
  }
}

}  // namespace
}  // namespace chorus::server

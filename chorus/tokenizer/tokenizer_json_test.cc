// tokenizer.json parsing (small hand-made files), side-file config, format detection in
// LoadTokenizer, and clean errors for bad input.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"
#include "chorus/tokenizer/fuzz_entry.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using Json = nlohmann::json;
using ::chorus::testing::SharedModelsDir;
using ::chorus::testing::TempDir;

// Substring check with the full message on failure (no gmock dependency).
#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "[" << (haystack) << "] does not contain [" << (needle) << "]"

constexpr EncodeOptions kNoBos{.add_bos = false, .parse_special = true};

std::unique_ptr<Tokenizer> Small(const std::string& json, std::string_view config = {}) {
  auto t = TokenizerFromJsonString(json, config);
  CHORUS_CHECK(t.ok()) << t.status().ToString();
  return std::move(t).value();
}

int32_t Id(const Tokenizer& t, std::string_view piece) {
  auto id = t.PieceToId(piece);
  CHORUS_CHECK(id.has_value()) << piece;
  return *id;
}

TEST(SmallSpm, EncodesByScoresOfMergesAndFallsBackToBytes) {
  auto tok = Small(SmallSpmTokenizerJson());
  EXPECT_EQ(tok->kind(), "spm-bpe");
  EXPECT_TRUE(tok->add_bos());  // from the TemplateProcessing post-processor
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->IsEos(2));
  const int32_t hello = Id(*tok, "\u2581hello"), world = Id(*tok, "\u2581world");
  EXPECT_EQ(tok->Encode("hello world", EncodeOptions{}), (std::vector<int32_t>{1, hello, world}));
  EXPECT_EQ(tok->Encode("hello world", kNoBos), (std::vector<int32_t>{hello, world}));
  // "é" is not in the vocabulary: its two UTF-8 bytes become <0xC3> <0xA9>.
  EXPECT_EQ(tok->Encode("h\xC3\xA9", kNoBos),
            (std::vector<int32_t>{Id(*tok, "\u2581h"), 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok->Decode(tok->Encode("h\xC3\xA9 world", EncodeOptions{})), "h\xC3\xA9 world");
}

TEST(SmallSpm, SpecialTokensInTextAndPerSegmentPrefix) {
  auto tok = Small(SmallSpmTokenizerJson());
  const int32_t hello = Id(*tok, "\u2581hello");
  // HF's Prepend normalizer runs on every segment between added tokens.
  EXPECT_EQ(tok->Encode("hello</s>hello", kNoBos), (std::vector<int32_t>{hello, 2, hello}));
  const auto plain = tok->Encode("</s>", EncodeOptions{.add_bos = false, .parse_special = false});
  EXPECT_EQ(std::count(plain.begin(), plain.end(), 2), 0);
  EXPECT_EQ(tok->Decode(plain), "</s>");
}

TEST(SmallByteLevel, MergesRanksAddedTokensAndStrip) {
  auto tok = Small(SmallByteLevelTokenizerJson());
  EXPECT_EQ(tok->kind(), "byte-bpe");
  EXPECT_FALSE(tok->add_bos());
  const int32_t he = Id(*tok, "he"), gworld = Id(*tok, "\u0120world");
  EXPECT_EQ(tok->Encode("the world", kNoBos), (std::vector<int32_t>{'t', he, gworld}));
  // "  " is a non-special added token (matched even without parse_special), like phi-2's.
  EXPECT_EQ(tok->Encode("a  b", EncodeOptions{.add_bos = false, .parse_special = false}),
            (std::vector<int32_t>{'a', 268, 'b'}));
  // <|im_start|> has rstrip: the spaces after it are swallowed.
  EXPECT_EQ(tok->Encode("<|im_start|>   the", kNoBos), (std::vector<int32_t>{267, 't', he}));
  const auto plain =
      tok->Encode("<|endoftext|>", EncodeOptions{.add_bos = false, .parse_special = false});
  EXPECT_GT(plain.size(), 1u);
  EXPECT_EQ(tok->Decode(plain), "<|endoftext|>");
  EXPECT_EQ(tok->Encode("<|endoftext|>", kNoBos), (std::vector<int32_t>{266}));
  EXPECT_TRUE(tok->IsSpecial(266));
  EXPECT_FALSE(tok->IsSpecial(268));
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{266, 't', 268}), "t  ");
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{266, 't'}, true), "<|endoftext|>t");
  // Invalid UTF-8 in the input is still encoded byte by byte and decodes back.
  const std::string bad = "x\xFF\xC3 y";
  EXPECT_EQ(tok->Decode(tok->Encode(bad, kNoBos)), "x\xEF\xBF\xBD\xEF\xBF\xBD y");
  EXPECT_EQ(tok->TokenBytes(-1, 0xFF, false), "\xFF");
}

TEST(SmallByteLevel, FuzzEntryAcceptsSeeds) {
  for (const std::string& seed : TokenizerJsonFuzzSeeds()) {
    EXPECT_TRUE(FuzzTokenizerJsonInput(reinterpret_cast<const uint8_t*>(seed.data()), seed.size()));
  }
}

// ---- config ---------------------------------------------------------------------------------

TEST(Config, TokenizerConfigOverridesAndCarriesChatTemplate) {
  const Json config = {{"add_bos_token", false},
                       {"add_eos_token", true},
                       {"eos_token", {{"content", "</s>"}, {"special", true}}},
                       {"bos_token", "<s>"},
                       {"chat_template", "{{ messages }}"},
                       {"added_tokens_decoder", {{"260", {{"content", "h"}, {"special", true}}}}}};
  auto tok = Small(SmallSpmTokenizerJson(), config.dump());
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->add_eos());
  EXPECT_EQ(tok->chat_template(), "{{ messages }}");
  EXPECT_EQ(tok->Encode("hello", EncodeOptions{}),
            (std::vector<int32_t>{Id(*tok, "\u2581hello"), 2}));
  EXPECT_TRUE(tok->IsSpecial(260));
  // List form: the "default" template is chosen.
  const Json list = {
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "T"}}, {{"name", "default"}, {"template", "D"}}}}};
  EXPECT_EQ(Small(SmallSpmTokenizerJson(), list.dump())->chat_template(), "D");
}

TEST(Config, BadConfigIsAnError) {
  auto r = TokenizerFromJsonString(SmallSpmTokenizerJson(), "{\"add_bos_token\": \"yes\"}");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "add_bos_token");
  r = TokenizerFromJsonString(SmallSpmTokenizerJson(), "{not json");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "malformed JSON");
  r = TokenizerFromJsonString(SmallSpmTokenizerJson(), "{\"chat_template\": 5}");
  EXPECT_FALSE(r.ok());
  r = TokenizerFromJsonString(SmallSpmTokenizerJson(), "{\"added_tokens_decoder\": {\"x\": {}}}");
  EXPECT_FALSE(r.ok());
}

void Write(const std::string& path, std::string_view data) {
  CHORUS_CHECK(WriteFileAtomically(path, data).ok()) << path;
}

TEST(Loader, DirectoryWithSideFiles) {
  const std::string dir = TempDir() + "/hf";
  std::filesystem::create_directories(dir);
  Write(dir + "/tokenizer.json", SmallSpmTokenizerJson());
  Write(dir + "/tokenizer_config.json",
        R"({"add_bos_token": true, "eos_token": "</s>", "chat_template": "X"})");
  Write(dir + "/generation_config.json", R"({"eos_token_id": [2, 0], "bos_token_id": 1})");
  Write(dir + "/special_tokens_map.json", R"({"bos_token": {"content": "<s>"}})");
  auto tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->eos_ids(), (std::vector<int32_t>{2, 0}));
  EXPECT_EQ((*tok)->chat_template(), "X");
  EXPECT_EQ((*tok)->bos_id(), 1);
  Write(dir + "/generation_config.json", R"({"eos_token_id": 2})");
  tok = LoadTokenizer(dir);
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ((*tok)->eos_ids(), (std::vector<int32_t>{2}));
  Write(dir + "/generation_config.json", R"({"eos_token_id": "2"})");
  tok = LoadTokenizer(dir);
  ASSERT_FALSE(tok.ok());
  EXPECT_CONTAINS(tok.status().message(), "generation_config.json");
  Write(dir + "/generation_config.json", R"({"eos_token_id": [99999999]})");
  EXPECT_FALSE(LoadTokenizer(dir).ok());
}

TEST(Loader, DetectsFormatByContentNotName) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  const std::string dir = TempDir() + "/misnamed";
  std::filesystem::create_directories(dir);
  auto copy = [&](const std::string& rel, const std::string& name) {
    auto bytes = ReadFileToString(SharedModelsDir() + "/" + rel);
    CHORUS_CHECK(bytes.ok());
    Write(dir + "/" + name, *bytes);
    return dir + "/" + name;
  };
  auto a = LoadTokenizer(copy("stories260K/tok512.bin", "vocab.dat"));
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->kind(), "llama2c");
  auto b = LoadTokenizer(copy("llama2-tokenizer/tokenizer.model", "tokenizer.bin"));
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ((*b)->kind(), "sentencepiece");
  Write(dir + "/spm.txt", SmallSpmTokenizerJson());
  auto c = LoadTokenizer(dir + "/spm.txt");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->kind(), "spm-bpe");
}

TEST(Loader, MissingAndUnrecognized) {
  const std::string tmp = TempDir();
  auto r = LoadTokenizer(tmp + "/does-not-exist.json");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  const std::string empty_dir = tmp + "/empty";
  std::filesystem::create_directories(empty_dir);
  r = LoadTokenizer(empty_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_CONTAINS(r.status().message(), "tokenizer.json");
  Write(tmp + "/garbage.bin", "\x01\x02\x03 this is not a tokenizer at all");
  r = LoadTokenizer(tmp + "/garbage.bin");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "unrecognized tokenizer format");
  Write(tmp + "/broken.json", "{\"model\": {\"type\": \"BPE\", ");
  r = LoadTokenizer(tmp + "/broken.json");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "malformed JSON");
  EXPECT_CONTAINS(r.status().message(), "broken.json");
  const std::string lone = tmp + "/lone";
  std::filesystem::create_directories(lone);
  Write(lone + "/vocab.json", R"({"a": 0, "b": 1})");
  r = LoadTokenizer(lone + "/vocab.json");
  ASSERT_FALSE(r.ok());
  EXPECT_CONTAINS(r.status().message(), "merges.txt");
}

// A directory whose tokenizer.json is broken: the tokenizer.model beside it serves (the
// broken file is named in a warning); with nothing to fall back to, the error names the file.
TEST(Loader, DirectoryWithBrokenTokenizerJsonFallsBackOrNamesTheFile) {
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  const std::string dir = TempDir() + "/broken-json-dir";
  std::filesystem::create_directories(dir);
  Write(dir + "/tokenizer.json", "{\"model\": {\"type\": \"BPE\", ");
  auto alone = LoadTokenizer(dir);
  ASSERT_FALSE(alone.ok());
  EXPECT_CONTAINS(alone.status().message(), dir + "/tokenizer.json");
  EXPECT_CONTAINS(alone.status().message(), "malformed JSON");
  auto spm = ReadFileToString(SharedModelsDir() + "/llama2-tokenizer/tokenizer.model");
  ASSERT_TRUE(spm.ok());
  Write(dir + "/tokenizer.model", *spm);
  auto fallback = LoadTokenizer(dir);
  ASSERT_TRUE(fallback.ok()) << fallback.status().ToString();
  EXPECT_EQ((*fallback)->kind(), "sentencepiece");
  EXPECT_EQ((*fallback)->vocab_size(), 32000);
}

// ---- malformed tokenizer.json ----------------------------------------------------------------

Json SpmJson() { return Json::parse(SmallSpmTokenizerJson()); }

Status Load(const Json& j) { return TokenizerFromJsonString(j.dump()).status(); }

TEST(BadJson, UnsupportedModelTypesAreNamed) {
  Json j = SpmJson();
  j["model"]["type"] = "Unigram";
  Status s = Load(j);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(s.message(), "tokenizer.json model type 'Unigram' is not supported");
  j["model"]["type"] = "WordPiece";
  EXPECT_CONTAINS(Load(j).message(), "'WordPiece' is not supported");
  j = SpmJson();
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_CONTAINS(Load(j).message(), "pre_tokenizer type 'BertPreTokenizer'");
  j = SpmJson();
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_CONTAINS(Load(j).message(), "normalizer type 'Lowercase'");
}

TEST(BadJson, WrongTypesAndRangesAreCleanErrors) {
  std::vector<std::pair<std::string, Json>> cases;
  auto add = [&](const std::string& what, auto mutate) {
    Json j = SpmJson();
    mutate(j);
    cases.emplace_back(what, j);
  };
  add("root array", [](Json& j) { j = Json::array({1, 2}); });
  add("no model", [](Json& j) { j.erase("model"); });
  add("model string", [](Json& j) { j["model"] = "BPE"; });
  add("vocab array", [](Json& j) { j["model"]["vocab"] = Json::array(); });
  add("vocab empty", [](Json& j) { j["model"]["vocab"] = Json::object(); });
  add("vocab id string", [](Json& j) { j["model"]["vocab"]["h"] = "260"; });
  add("vocab id negative", [](Json& j) { j["model"]["vocab"]["h"] = -1; });
  add("vocab id huge", [](Json& j) { j["model"]["vocab"]["h"] = 2000000000; });
  add("vocab id float", [](Json& j) { j["model"]["vocab"]["h"] = 1.5; });
  add("duplicate id", [](Json& j) { j["model"]["vocab"]["h"] = 261; });
  add("merges object", [](Json& j) { j["model"]["merges"] = Json::object(); });
  add("merge number", [](Json& j) { j["model"]["merges"][0] = 7; });
  add("merge one piece", [](Json& j) { j["model"]["merges"][0] = "ab"; });
  add("merge unknown piece", [](Json& j) { j["model"]["merges"][0] = "x y"; });
  add("byte_fallback string", [](Json& j) { j["model"]["byte_fallback"] = "true"; });
  add("added_tokens object", [](Json& j) { j["added_tokens"] = Json::object(); });
  add("added id huge", [](Json& j) { j["added_tokens"][0]["id"] = int64_t{1} << 40; });
  add("added content number", [](Json& j) { j["added_tokens"][0]["content"] = 5; });
  add("added content empty", [](Json& j) { j["added_tokens"][0]["content"] = ""; });
  add("normalizer string", [](Json& j) { j["normalizer"] = "Prepend"; });
  add("normalizers not array", [](Json& j) { j["normalizer"]["normalizers"] = 3; });
  add("bad regex", [](Json& j) {
    j["normalizer"] = nullptr;
    j["decoder"] = {{"type", "ByteLevel"}};
    j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}};
  });
  add("continuing_subword_prefix", [](Json& j) { j["model"]["continuing_subword_prefix"] = "##"; });
  add("no spm and no byte-level", [](Json& j) { j["normalizer"] = nullptr; });
  add("deep nesting", [](Json& j) {
    Json n = {{"type", "Prepend"}, {"prepend", "\u2581"}};
    for (int i = 0; i < 100; ++i) n = {{"type", "Sequence"}, {"normalizers", {n}}};
    j["normalizer"] = n;
  });
  for (const auto& [what, j] : cases) {
    const Status s = Load(j);
    EXPECT_FALSE(s.ok()) << what;
    EXPECT_CONTAINS(s.message(), "tokenizer.json") << what << ": " << s.ToString();
  }
  for (std::string_view text : {"", "{", "[]", "null", "{\"model\": {\"type\": \"BPE\"}}",
                                "\xFF\xFE{}", "{\"model\": {\"vocab\": {\"a\": 0}}}"}) {
    EXPECT_FALSE(TokenizerFromJsonString(text).ok()) << text;
  }
}

TEST(BadJson, MergesAsPairsAndMetaspaceAreAccepted) {
  Json j = SpmJson();
  Json pairs = Json::array();
  for (const Json& m : j["model"]["merges"]) {
    const std::string s = m;
    pairs.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  j["model"]["merges"] = pairs;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "first"},
                        {"split", false}};
  auto tok = TokenizerFromJsonString(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const int32_t hello = Id(**tok, "\u2581hello"), world = Id(**tok, "\u2581world");
  EXPECT_EQ((*tok)->Encode("hello world", kNoBos), (std::vector<int32_t>{hello, world}));
  // Metaspace does not add a second "▁" when the text starts with a space, and "first" only
  // prefixes the segment at the start of the text.
  EXPECT_EQ((*tok)->Encode(" hello", kNoBos), (std::vector<int32_t>{hello}));
  const auto after = (*tok)->Encode("</s>hello", kNoBos);
  ASSERT_EQ(after.size(), 4u);  // </s> h el lo: no "▁" prefix after the special token
  EXPECT_EQ(after[0], 2);
  EXPECT_EQ((*tok)->Decode(after), "hello");
}

}  // namespace
}  // namespace chorus::tokenizer

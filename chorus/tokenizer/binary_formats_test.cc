// llama2.c .bin and GGUF tokenizers: the encode algorithm on hand-made vocabularies, and clean
// errors for truncated / corrupted / unsupported input.
#include <cstring>
#include <filesystem>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using ::chorus::testing::SharedModelsDir;
using ::chorus::testing::TempDir;

// Substring check with the full message on failure (no gmock dependency).
#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "[" << (haystack) << "] does not contain [" << (needle) << "]"

void AppendI32(std::string* s, int32_t v) { s->append(reinterpret_cast<const char*>(&v), 4); }
void AppendF32(std::string* s, float v) { s->append(reinterpret_cast<const char*>(&v), 4); }

// A llama2.c tokenizer: <unk>, BOS, EOS, 256 byte tokens, then `extra` (piece, score).
std::string Llama2cBin(const std::vector<std::pair<std::string, float>>& extra) {
  std::string s;
  AppendI32(&s, 16);
  auto add = [&](const std::string& p, float score) {
    AppendF32(&s, score);
    AppendI32(&s, static_cast<int32_t>(p.size()));
    s += p;
  };
  add("<unk>", 0);
  add("\n<s>\n", 0);
  add("\n</s>\n", 0);
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    add(buf, 0);
  }
  for (const auto& [p, sc] : extra) add(p, sc);
  return s;
}

Result<std::unique_ptr<Tokenizer>> LoadBytes(const std::string& name, const std::string& bytes) {
  const std::string path = TempDir() + "/" + name;
  CHORUS_CHECK(WriteFileAtomically(path, bytes).ok());
  return LoadTokenizer(path);
}

TEST(Llama2c, EncodeMergesHighestScoreFirstWithDummyPrefix) {
  // ids: 259 " ", 260 "a", 261 "b", 262 " a", 263 "ab", 264 " ab"
  const auto bin =
      Llama2cBin({{" ", -1}, {"a", -1}, {"b", -1}, {" a", -3}, {"ab", -2}, {" ab", -1}});
  auto tok = LoadBytes("l2c.bin", bin);
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->kind(), "llama2c");
  // " ab": "ab" (-2) beats " a" (-3), then " " + "ab" -> " ab" exists.
  EXPECT_EQ((*tok)->Encode("ab", EncodeOptions{}), (std::vector<int32_t>{1, 264}));
  // "ba": neither " b" nor "ba" is a piece, so nothing merges.
  EXPECT_EQ((*tok)->Encode("ba", EncodeOptions{}), (std::vector<int32_t>{1, 259, 261, 260}));
  // "é" is not in the vocabulary: bytes C3 A9 -> ids 0xC3+3, 0xA9+3.
  EXPECT_EQ((*tok)->Encode("\xC3\xA9", EncodeOptions{.add_bos = false}),
            (std::vector<int32_t>{259, 0xC3 + 3, 0xA9 + 3}));
  EXPECT_EQ((*tok)->Encode("", EncodeOptions{}), (std::vector<int32_t>{1}));
  // Decoding strips the space of the first piece after BOS only (llama2.c's rule).
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{1, 264, 264}), "ab ab");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{264}), " ab");
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{1, 264, 2}, true), "\n<s>\nab\n</s>\n");
}

TEST(Llama2c, TruncatedAndCorruptFilesAreCleanErrors) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto good = ReadFileToString(SharedModelsDir() + "/stories260K/tok512.bin");
  ASSERT_TRUE(good.ok());
  ASSERT_EQ(good->size(), 6227u);
  // Every truncation point inside a record fails (cuts exactly at a record boundary give a
  // smaller valid vocabulary, which is fine).
  int errors = 0;
  for (size_t cut : {size_t{2}, size_t{6}, size_t{10}, size_t{14}, size_t{101}, size_t{6226}}) {
    auto r = LoadBytes("cut.bin", good->substr(0, cut));
    if (!r.ok()) {
      ++errors;
      EXPECT_NE(r.status().message().find("cut.bin"), std::string::npos) << r.status().ToString();
    }
  }
  EXPECT_EQ(errors, 6);
  auto corrupt = [&](size_t offset, int32_t value) {
    std::string b = *good;
    std::memcpy(&b[offset], &value, 4);
    return LoadBytes("corrupt.bin", b);
  };
  for (int32_t len : {0x7FFFFFF0, -1, 1 << 17}) {
    auto r = corrupt(8, len);  // length of token 0
    ASSERT_FALSE(r.ok()) << len;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    EXPECT_CONTAINS(r.status().message(), "token 0");
  }
  for (int32_t max_len : {0, -7, 1 << 20}) {
    auto r = corrupt(0, max_len);
    ASSERT_FALSE(r.ok()) << max_len;
  }
  EXPECT_FALSE(LoadBytes("empty.bin", "").ok());
  EXPECT_FALSE(LoadBytes("tiny.bin", std::string("\x07\0\0\0", 4)).ok());  // no tokens
}

// ---- GGUF ------------------------------------------------------------------------------------

formats::GgufWriter SpmGguf() {
  formats::GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("tokenizer.ggml.model", "llama");
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    tokens.push_back(buf);
    scores.push_back(0);
    types.push_back(6);
  }
  for (const char* p : {"\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "<|user|>"}) {
    tokens.push_back(p);
    scores.push_back(-static_cast<float>(tokens.size()));
    types.push_back(std::string_view(p) == "<|user|>" ? 4 : 1);
  }
  w.SetStringArray("tokenizer.ggml.tokens", tokens);
  w.SetFloat32Array("tokenizer.ggml.scores", scores);
  w.SetInt32Array("tokenizer.ggml.token_type", types);
  w.SetUint32("tokenizer.ggml.bos_token_id", 1);
  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetUint32("tokenizer.ggml.eot_token_id", 2);
  w.SetBool("tokenizer.ggml.add_bos_token", true);
  w.SetString("tokenizer.chat_template", "{{ bos_token }}");
  return w;
}

Result<std::unique_ptr<Tokenizer>> FromWriter(const formats::GgufWriter& w) {
  auto bytes = w.Serialize();
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto f = formats::GgufFile::FromBytes("test.gguf", *bytes);
  CHORUS_CHECK(f.ok()) << f.status().ToString();
  return TokenizerFromGguf(**f);
}

TEST(Gguf, SpmVocabularyWithUserDefinedTokens) {
  auto tok = FromWriter(SpmGguf());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  EXPECT_EQ((*tok)->chat_template(), "{{ bos_token }}");
  EXPECT_EQ((*tok)->eos_ids(), (std::vector<int32_t>{2}));
  // 259 "▁", 260 "a", 261 "b", 262 "▁a", 263 "ab", 264 "▁ab" (scores favour the earlier),
  // 265 "<|user|>" user-defined: matched even without parse_special.
  // "▁ab": "▁a" (-263) beats "ab" (-264), then "▁a" + "b" -> "▁ab".
  EXPECT_EQ((*tok)->Encode("ab", EncodeOptions{}), (std::vector<int32_t>{1, 264}));
  EXPECT_EQ((*tok)->Encode("bab", EncodeOptions{.add_bos = false}),
            (std::vector<int32_t>{259, 261, 263}));
  EXPECT_EQ((*tok)->Encode("a<|user|>b", EncodeOptions{.add_bos = false, .parse_special = false}),
            (std::vector<int32_t>{262, 265, 259, 261}));
  EXPECT_EQ((*tok)->Encode("</s>", EncodeOptions{.add_bos = false}), (std::vector<int32_t>{2}));
  EXPECT_EQ((*tok)->Decode(std::vector<int32_t>{1, 262, 265, 259, 261}), "a<|user|> b");
}

TEST(Gguf, UnsupportedAndInconsistentMetadataAreErrors) {
  {
    auto w = SpmGguf();
    w.SetString("tokenizer.ggml.model", "bert");
    auto r = FromWriter(w);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
    EXPECT_CONTAINS(r.status().message(), "'bert'");
  }
  {
    auto w = SpmGguf();
    w.SetFloat32Array("tokenizer.ggml.scores", {1.0f, 2.0f});
    auto r = FromWriter(w);
    ASSERT_FALSE(r.ok());
    EXPECT_CONTAINS(r.status().message(), "tokenizer.ggml.scores");
  }
  {
    auto w = SpmGguf();
    w.SetInt32Array("tokenizer.ggml.token_type", {1});
    EXPECT_FALSE(FromWriter(w).ok());
  }
  {
    auto w = SpmGguf();
    w.SetUint32("tokenizer.ggml.tokens", 5);  // wrong type
    EXPECT_FALSE(FromWriter(w).ok());
  }
  {
    formats::GgufWriter w;  // no tokenizer at all
    w.SetString("general.architecture", "llama");
    auto r = FromWriter(w);
    ASSERT_FALSE(r.ok());
    EXPECT_CONTAINS(r.status().message(), "tokenizer.ggml.model");
  }
  {
    formats::GgufWriter w;
    w.SetString("tokenizer.ggml.model", "gpt2");
    w.SetStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.SetStringArray("tokenizer.ggml.merges", {"a b"});
    w.SetString("tokenizer.ggml.pre", "made-up-pre");
    auto r = FromWriter(w);
    ASSERT_FALSE(r.ok());
    EXPECT_CONTAINS(r.status().message(), "made-up-pre");
    w.SetString("tokenizer.ggml.pre", "qwen2");
    w.SetStringArray("tokenizer.ggml.merges", {"a c"});
    EXPECT_FALSE(FromWriter(w).ok());  // merge with an unknown piece
    w.SetStringArray("tokenizer.ggml.merges", {"ab"});
    EXPECT_FALSE(FromWriter(w).ok());
    w.SetStringArray("tokenizer.ggml.merges", {"a b"});
    r = FromWriter(w);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ((*r)->Encode("ab", EncodeOptions{}), (std::vector<int32_t>{2}));
  }
}

TEST(Gguf, LoadTokenizerOpensGgufFiles) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");
  auto r = LoadTokenizer(SharedModelsDir() + "/ggml-vocab/ggml-vocab-gpt-2.gguf");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->kind(), "byte-bpe");
  EXPECT_EQ((*r)->Encode("Hello world", EncodeOptions{}), (std::vector<int32_t>{15496, 995}));
}

}  // namespace
}  // namespace chorus::tokenizer

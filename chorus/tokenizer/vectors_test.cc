// Real tokenizers against independent reference vectors (../shared/models, see each
// PROVENANCE.md): llama.cpp test-tokenizer-0 (.inp/.out), swift-transformers (HF transformers
// output) and llama2.c test.c. Every case must match exactly.
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using Json = nlohmann::json;
using ::chorus::testing::SharedModelsDir;

std::string Models(const std::string& rel) { return SharedModelsDir() + "/" + rel; }

std::string ReadOrDie(const std::string& rel) {
  auto r = ReadFileToString(Models(rel));
  CHORUS_CHECK(r.ok()) << r.status().ToString();
  return *r;
}

Json ReadJson(const std::string& rel) { return Json::parse(ReadOrDie(rel)); }

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& rel) {
  auto r = LoadTokenizer(Models(rel));
  CHORUS_CHECK(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

std::unique_ptr<Tokenizer> GgufOrDie(const std::string& rel) {
  auto f = formats::GgufFile::Open(Models(rel));
  CHORUS_CHECK(f.ok()) << f.status().ToString();
  auto r = TokenizerFromGguf(**f);
  CHORUS_CHECK(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp test-tokenizer-0 format: strings each followed by "\n__ggml_vocab_test__\n"; one
// line of space-separated ids per string.
std::vector<Case> ReadLlamaCppVectors(const std::string& stem) {
  const std::string inp = ReadOrDie("ggml-vocab/" + stem + ".inp");
  const std::string out = ReadOrDie("ggml-vocab/" + stem + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t end = inp.find(sep, pos);
    CHORUS_CHECK(end != std::string::npos);
    cases.push_back(Case{inp.substr(pos, end - pos), {}});
    pos = end + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  size_t i = 0;
  while (std::getline(lines, line)) {
    CHORUS_CHECK(i < cases.size());
    std::istringstream nums(line);
    int32_t id;
    while (nums >> id) cases[i].ids.push_back(id);
    ++i;
  }
  CHORUS_CHECK(i == cases.size()) << i << " vs " << cases.size();
  return cases;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

// Encodes every case without BOS (as the vectors were made) and checks ids, and that decoding
// gives the text back.
void CheckLlamaCppVectors(const Tokenizer& tok, const std::string& stem, bool check_decode) {
  const auto cases = ReadLlamaCppVectors(stem);
  ASSERT_EQ(cases.size(), 46u);
  int failures = 0;
  for (const Case& c : cases) {
    const auto ids = tok.Encode(c.text, EncodeOptions{.add_bos = false, .parse_special = true});
    EXPECT_EQ(ids, c.ids) << "text: [" << c.text << "]\n got: " << Show(ids)
                          << "\nwant: " << Show(c.ids);
    failures += ids != c.ids;
    if (check_decode) {
      EXPECT_EQ(tok.Decode(c.ids), c.text);
    }
  }
  EXPECT_EQ(failures, 0) << stem << " (" << tok.kind() << ")";
}

// ---- llama.cpp test-tokenizer-0 ------------------------------------------------------------

TEST(LlamaCppVectors, LlamaSpmFromGguf) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  auto tok = GgufOrDie("ggml-vocab/ggml-vocab-llama-spm.gguf");
  EXPECT_EQ(tok->kind(), "spm-bpe");
  EXPECT_EQ(tok->vocab_size(), 32000);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_TRUE(tok->IsEos(2));
  EXPECT_TRUE(tok->add_bos());
  CheckLlamaCppVectors(*tok, "ggml-vocab-llama-spm.gguf", /*check_decode=*/true);
}

TEST(LlamaCppVectors, LlamaSpmFromSentencePieceModel) {
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  auto tok = LoadOrDie("llama2-tokenizer/tokenizer.model");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  CheckLlamaCppVectors(*tok, "ggml-vocab-llama-spm.gguf", /*check_decode=*/true);
}

TEST(LlamaCppVectors, LlamaSpmFromPhi3TokenizerJson) {
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer.json");
  auto tok = LoadOrDie("phi3-tokenizer/tokenizer.json");
  EXPECT_EQ(tok->kind(), "spm-bpe");
  CheckLlamaCppVectors(*tok, "ggml-vocab-llama-spm.gguf", /*check_decode=*/true);
}

TEST(LlamaCppVectors, Gpt2FromGguf) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");
  auto tok = GgufOrDie("ggml-vocab/ggml-vocab-gpt-2.gguf");
  EXPECT_EQ(tok->kind(), "byte-bpe");
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->IsEos(50256));
  CheckLlamaCppVectors(*tok, "ggml-vocab-gpt-2.gguf", /*check_decode=*/true);
}

TEST(LlamaCppVectors, Gpt2FromVocabAndMerges) {
  CHORUS_REQUIRE_SHARED_MODEL("gpt2-tokenizer/vocab.json");
  auto tok = LoadOrDie("gpt2-tokenizer");  // the directory: vocab.json + merges.txt
  EXPECT_EQ(tok->kind(), "byte-bpe");
  CheckLlamaCppVectors(*tok, "ggml-vocab-gpt-2.gguf", /*check_decode=*/true);
  auto tok2 = LoadOrDie("gpt2-tokenizer/vocab.json");  // the file, merges.txt found beside it
  CheckLlamaCppVectors(*tok2, "ggml-vocab-gpt-2.gguf", /*check_decode=*/false);
}

TEST(LlamaCppVectors, Phi2FromTokenizerJson) {
  CHORUS_REQUIRE_SHARED_MODEL("phi2-tokenizer/tokenizer.json");
  auto tok = LoadOrDie("phi2-tokenizer");
  EXPECT_EQ(tok->kind(), "byte-bpe");
  EXPECT_EQ(tok->vocab_size(), 50295);
  CheckLlamaCppVectors(*tok, "ggml-vocab-phi-2.gguf", /*check_decode=*/true);
}

// ---- swift-transformers (HF transformers output) --------------------------------------------

// The Llama 2 tokenizer in every form Chorus reads it.
std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> LlamaTokenizers() {
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> v;
  v.emplace_back("tokenizer.model", LoadOrDie("llama2-tokenizer/tokenizer.model"));
  v.emplace_back("phi3 tokenizer.json", LoadOrDie("phi3-tokenizer/tokenizer.json"));
  v.emplace_back("gguf", GgufOrDie("ggml-vocab/ggml-vocab-llama-spm.gguf"));
  v.emplace_back("llama2.c tokenizer.bin", LoadOrDie("llama2-tokenizer/tokenizer.bin"));
  return v;
}

std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> Gpt2Tokenizers() {
  std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> v;
  v.emplace_back("vocab.json+merges.txt", LoadOrDie("gpt2-tokenizer"));
  v.emplace_back("gguf", GgufOrDie("ggml-vocab/ggml-vocab-gpt-2.gguf"));
  return v;
}

#define REQUIRE_ALL_TOKENIZERS()                                       \
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");     \
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.bin");       \
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer.json");        \
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf"); \
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");     \
  CHORUS_REQUIRE_SHARED_MODEL("gpt2-tokenizer/vocab.json");            \
  CHORUS_REQUIRE_SHARED_MODEL("tokenizer-test-vectors/tokenizer_tests.json")

std::vector<int32_t> Ids(const Json& j) { return j.get<std::vector<int32_t>>(); }

TEST(SwiftTransformersVectors, LlamaEncoded) {
  REQUIRE_ALL_TOKENIZERS();
  const Json v = ReadJson("tokenizer-test-vectors/llama_encoded.json");
  const std::string text = v["text"];
  for (const auto& [name, tok] : LlamaTokenizers()) {
    ASSERT_TRUE(tok->add_bos()) << name;
    const auto ids = tok->Encode(text, EncodeOptions{});
    EXPECT_EQ(ids, Ids(v["token_ids"])) << name;
    // decoded_text was decoded with special tokens ("<s> Fatouville...").
    if (name != "llama2.c tokenizer.bin") {  // llama2.c spells BOS "\n<s>\n"
      EXPECT_EQ(tok->Decode(ids, /*include_special=*/true), v["decoded_text"].get<std::string>())
          << name;
    }
    EXPECT_EQ(tok->Decode(ids), text) << name;
    // The "tokens" strings are the raw vocabulary pieces.
    const auto& pieces = v["bpe_tokens"];
    ASSERT_EQ(pieces.size() + 1, ids.size()) << name;
    if (name == "llama2.c tokenizer.bin") continue;  // its pieces spell "▁" as " "
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(tok->Piece(ids[i + 1]), pieces[i].get<std::string>()) << name << " " << i;
    }
  }
}

TEST(SwiftTransformersVectors, Gpt2Encoded) {
  REQUIRE_ALL_TOKENIZERS();
  const Json v = ReadJson("tokenizer-test-vectors/gpt2_encoded_tokens.json");
  const std::string text = v["text"];
  for (const auto& [name, tok] : Gpt2Tokenizers()) {
    const auto ids = tok->Encode(text, EncodeOptions{});
    EXPECT_EQ(ids, Ids(v["token_ids"])) << name;
    EXPECT_EQ(tok->Decode(ids), v["decoded_text"].get<std::string>()) << name;
    const auto& pieces = v["bpe_tokens"];
    ASSERT_EQ(pieces.size(), ids.size());
    for (size_t i = 0; i < pieces.size(); ++i) {
      EXPECT_EQ(tok->Piece(ids[i]), pieces[i].get<std::string>()) << name << " " << i;
      EXPECT_EQ(tok->PieceToId(pieces[i].get<std::string>()), ids[i]) << name << " " << i;
    }
  }
}

TEST(SwiftTransformersVectors, TokenizerTestsLlama2Chat) {
  REQUIRE_ALL_TOKENIZERS();
  const Json all = ReadJson("tokenizer-test-vectors/tokenizer_tests.json");
  const Json& cases = all["coreml-projects/Llama-2-7b-chat-coreml"];
  ASSERT_EQ(cases.size(), 18u);
  for (const auto& [name, tok] : LlamaTokenizers()) {
    for (const Json& c : cases) {
      const std::string input = c["input"];
      const auto want = Ids(c["encoded"]["input_ids"]);
      EXPECT_EQ(tok->Encode(input, EncodeOptions{}), want) << name << ": [" << input << "]";
      EXPECT_EQ(tok->Decode(want, /*include_special=*/false),
                c["decoded_without_special"].get<std::string>())
          << name << ": [" << input << "]";
      if (name != "llama2.c tokenizer.bin") {  // llama2.c pieces are "\n<s>\n", not "<s>"
        EXPECT_EQ(tok->Decode(want, /*include_special=*/true),
                  c["decoded_with_special"].get<std::string>())
            << name << ": [" << input << "]";
      }
    }
  }
}

TEST(SwiftTransformersVectors, TokenizerTestsDistilGpt2) {
  REQUIRE_ALL_TOKENIZERS();
  const Json all = ReadJson("tokenizer-test-vectors/tokenizer_tests.json");
  const Json& cases = all["distilgpt2"];
  ASSERT_EQ(cases.size(), 18u);
  for (const auto& [name, tok] : Gpt2Tokenizers()) {
    for (const Json& c : cases) {
      const std::string input = c["input"];
      const auto want = Ids(c["encoded"]["input_ids"]);
      EXPECT_EQ(tok->Encode(input, EncodeOptions{}), want) << name << ": [" << input << "]";
      const std::string raw = tok->Decode(want);
      EXPECT_EQ(raw, input) << name;  // byte-level BPE is lossless
      // transformers applies clean_up_tokenization_spaces for GPT-2.
      EXPECT_EQ(CleanUpTokenizationSpaces(raw), c["decoded_without_special"].get<std::string>())
          << name << ": [" << input << "]";
      EXPECT_EQ(CleanUpTokenizationSpaces(tok->Decode(want, true)),
                c["decoded_with_special"].get<std::string>())
          << name << ": [" << input << "]";
    }
  }
}

void CheckMultilingual(const std::string& baseline,
                       std::vector<std::pair<std::string, std::unique_ptr<Tokenizer>>> toks,
                       bool check_with_special) {
  const Json inputs = ReadJson("tokenizer-test-vectors/multilingual_inputs.json");
  std::map<std::string, std::string> text_by_id;
  for (const Json& in : inputs) text_by_id[in["id"]] = in["text"];
  const Json base = ReadJson("tokenizer-test-vectors/" + baseline);
  const Json& entries = base["entries"];
  ASSERT_EQ(entries.size(), 83u);
  for (const auto& [name, tok] : toks) {
    int failures = 0;
    for (const Json& e : entries) {
      const std::string id = e["id"];
      ASSERT_TRUE(text_by_id.count(id)) << id;
      const std::string& text = text_by_id[id];
      const auto want = Ids(e["input_ids"]);
      const auto got = tok->Encode(text, EncodeOptions{});
      EXPECT_EQ(got, want) << name << " " << id << ": [" << text << "]\n got: " << Show(got)
                           << "\nwant: " << Show(want);
      failures += got != want;
      EXPECT_EQ(tok->Decode(want), e["decoded_skip_special"].get<std::string>())
          << name << " " << id;
      if (check_with_special && name != "llama2.c tokenizer.bin") {
        EXPECT_EQ(tok->Decode(want, true), e["decoded_with_special"].get<std::string>())
            << name << " " << id;
      }
      // The "tokens" are the raw vocabulary pieces.
      const auto& pieces = e["tokens"];
      ASSERT_EQ(pieces.size(), want.size());
      if (name != "llama2.c tokenizer.bin") {
        for (size_t i = 0; i < pieces.size(); ++i) {
          EXPECT_EQ(tok->Piece(want[i]), pieces[i].get<std::string>()) << name << " " << id;
        }
      }
    }
    EXPECT_EQ(failures, 0) << name;
  }
}

TEST(SwiftTransformersVectors, TinyLlamaMultilingual) {
  REQUIRE_ALL_TOKENIZERS();
  CheckMultilingual("tinyllama_multilingual.json", LlamaTokenizers(), true);
}

TEST(SwiftTransformersVectors, Gpt2Multilingual) {
  REQUIRE_ALL_TOKENIZERS();
  CheckMultilingual("gpt2_multilingual.json", Gpt2Tokenizers(), true);
}

// ---- llama2.c test.c ------------------------------------------------------------------------

TEST(Llama2cVectors, TestCPrompts) {
  REQUIRE_ALL_TOKENIZERS();
  const Json v = ReadJson("llama2-tokenizer/llama2c_test_c_vectors.json");
  ASSERT_EQ(v["cases"].size(), 5u);
  for (const auto& [name, tok] : LlamaTokenizers()) {
    for (const Json& c : v["cases"]) {
      const std::string text = c["text"];
      EXPECT_EQ(tok->Encode(text, EncodeOptions{}), Ids(c["ids_with_bos"]))
          << name << ": [" << text << "]";
    }
  }
}

TEST(Llama2cVectors, Stories260KGreedyOutputDecodes) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto tok = LoadOrDie("stories260K/tok512.bin");
  EXPECT_EQ(tok->kind(), "llama2c");
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  std::istringstream in(ReadOrDie("stories260K/expected_greedy_t0_200steps.ids.txt"));
  std::vector<int32_t> ids;
  int32_t id;
  while (in >> id) ids.push_back(id);
  ASSERT_EQ(ids.size(), 200u);
  const std::string want = ReadOrDie("stories260K/expected_greedy_t0_200steps.txt");
  // llama2.c decodes each token after the previous one, starting after BOS.
  std::vector<int32_t> with_bos = {1};
  with_bos.insert(with_bos.end(), ids.begin(), ids.end());
  EXPECT_EQ(tok->Decode(with_bos), want);
  StreamingDetokenizer detok(tok.get());
  std::string streamed;
  for (int32_t t : with_bos) streamed += detok.Push(t);
  streamed += detok.Flush();
  EXPECT_EQ(streamed, want);
  // And the text encodes back to the same ids (a greedy sample is not always the canonical
  // encoding, so only check the first sentence, which is).
  const auto first = tok->Encode("Once upon a time", EncodeOptions{});
  ASSERT_GE(first.size(), 2u);
  EXPECT_EQ(first[0], 1);
  EXPECT_EQ(tok->Decode(first), "Once upon a time");
}

}  // namespace
}  // namespace chorus::tokenizer

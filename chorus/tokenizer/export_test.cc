// Tokenizer export (export.h): every real tokenizer in ../shared/models is exported to GGUF
// metadata and to a Hugging Face directory, reloaded by Chorus's own readers, and must give the
// same ids and the same decoded text as the original on llama.cpp's test-tokenizer-0 inputs and the
// stories260K text; the special tokens must survive. Plus the structure of the llama2.c
// conversion, hand-made SentencePiece models (user-defined pieces, refused unigram), merges that
// scores cannot express, GGUF pre-tokenizer names and vocabulary padding.
#include "chorus/tokenizer/export.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "chorus/base/mapped_file.h"
#include "chorus/formats/gguf.h"
#include "chorus/tokenizer/bpe_tokenizer.h"
#include "chorus/tokenizer/internal.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using ::chorus::testing::SharedModelsDir;
using ::chorus::testing::TempDir;
using Json = nlohmann::json;

#define EXPECT_CONTAINS(haystack, needle)                          \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) \
      << "[" << (haystack) << "] does not contain [" << (needle) << "]"

std::string Models(const std::string& rel) { return SharedModelsDir() + "/" + rel; }

std::unique_ptr<Tokenizer> LoadOrDie(const std::string& path) {
  auto r = LoadTokenizer(path);
  CHORUS_CHECK(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

std::shared_ptr<const formats::GgufFile> GgufOf(const Tokenizer& tok,
                                                const GgufExportOptions& opts = {}) {
  formats::GgufWriter w;
  const Status s = ExportToGguf(tok, &w, opts);
  CHORUS_CHECK(s.ok()) << s.ToString();
  auto bytes = w.Serialize();
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto f = formats::GgufFile::FromBytes("exported.gguf", std::move(bytes).value());
  CHORUS_CHECK(f.ok()) << f.status().ToString();
  return *f;
}

std::unique_ptr<Tokenizer> ViaGguf(const Tokenizer& tok, const GgufExportOptions& opts = {}) {
  auto r = TokenizerFromGguf(*GgufOf(tok, opts));
  CHORUS_CHECK(r.ok()) << r.status().ToString();
  return std::move(r).value();
}

std::unique_ptr<Tokenizer> ViaHf(const Tokenizer& tok, const std::string& name) {
  const std::string dir = TempDir() + "/" + name;
  const Status s = ExportToHfDirectory(tok, dir);
  CHORUS_CHECK(s.ok()) << s.ToString();
  return LoadOrDie(dir);
}

// The 46 llama.cpp test-tokenizer-0 inputs and the stories260K greedy text.
std::vector<std::string> Inputs() {
  auto inp = ReadFileToString(Models("ggml-vocab/ggml-vocab-llama-spm.gguf.inp"));
  CHORUS_CHECK(inp.ok()) << inp.status().ToString();
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> out;
  for (size_t pos = 0; pos < inp->size();) {
    const size_t end = inp->find(sep, pos);
    CHORUS_CHECK(end != std::string::npos);
    out.push_back(inp->substr(pos, end - pos));
    pos = end + sep.size();
  }
  CHORUS_CHECK(out.size() == 46) << out.size();
  auto story = ReadFileToString(Models("stories260K/expected_greedy_t0_200steps.txt"));
  CHORUS_CHECK(story.ok()) << story.status().ToString();
  out.push_back(*story);
  return out;
}

std::string Show(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += std::to_string(id) + " ";
  return s;
}

struct CompareOptions {
  bool parse_special = true;
  bool include_special_decode = true;  // also compare Decode(..., include_special=true)
};

// Same ids for every input (with BOS as the tokenizer adds it), same decoded text, same special
// tokens and flags.
void ExpectSameTokenizer(const Tokenizer& want, const Tokenizer& got, const std::string& what,
                         const CompareOptions& o = {}) {
  SCOPED_TRACE(what);
  EXPECT_EQ(got.bos_id(), want.bos_id());
  EXPECT_EQ(got.eos_ids(), want.eos_ids());
  EXPECT_EQ(got.add_bos(), want.add_bos());
  EXPECT_EQ(got.add_eos(), want.add_eos());
  EXPECT_EQ(got.chat_template(), want.chat_template());
  int failures = 0;
  for (const std::string& text : Inputs()) {
    const EncodeOptions eo{.add_bos = true, .parse_special = o.parse_special};
    const auto a = want.Encode(text, eo);
    const auto b = got.Encode(text, eo);
    EXPECT_EQ(b, a) << "text: [" << text << "]\nwant: " << Show(a) << "\n got: " << Show(b);
    failures += a != b;
    EXPECT_EQ(got.Decode(a), want.Decode(a)) << "text: [" << text << "]";
    if (o.include_special_decode) {
      EXPECT_EQ(got.Decode(a, true), want.Decode(a, true)) << "text: [" << text << "]";
    }
  }
  EXPECT_EQ(failures, 0);
}

// ---- real tokenizers ---------------------------------------------------------------------------

TEST(ExportRoundTrip, Llama2cTok512) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto src = LoadOrDie(Models("stories260K/tok512.bin"));
  ASSERT_EQ(src->kind(), "llama2c");
  // llama2.c has no special tokens in the text (its pieces are "\n<s>\n"), and its specials are
  // renamed, so special parsing and special decoding are not compared (export.h).
  const CompareOptions o{.parse_special = false, .include_special_decode = false};
  auto g = ViaGguf(*src);
  EXPECT_EQ(g->kind(), "spm-bpe");
  ExpectSameTokenizer(*src, *g, "gguf", o);
  auto h = ViaHf(*src, "tok512");
  EXPECT_EQ(h->kind(), "spm-bpe");
  ExpectSameTokenizer(*src, *h, "hf", o);
  // The stories260K text as llama2.c decodes it (BOS first).
  auto ids =
      src->Encode(*ReadFileToString(Models("stories260K/expected_greedy_t0_200steps.txt")), {});
  ASSERT_EQ(ids.front(), 1);
  for (const Tokenizer* t : {g.get(), h.get()}) {
    EXPECT_EQ(t->Decode(ids),
              *ReadFileToString(Models("stories260K/expected_greedy_t0_200steps.txt")));
    EXPECT_EQ(t->Piece(1), "<s>");
    EXPECT_EQ(t->Piece(2), "</s>");
    // With special tokens shown, SentencePiece keeps the space after "<s>" (as HF does).
    EXPECT_EQ(t->Decode(ids, /*include_special=*/true).substr(0, 8), "<s> Once");
  }
}

TEST(ExportRoundTrip, Llama2cBecomesSentencePieceVocabulary) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto src = LoadOrDie(Models("stories260K/tok512.bin"));
  auto f = GgufOf(*src);
  EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "llama");
  const auto tokens = *f->GetStringArray("tokenizer.ggml.tokens");
  const auto types = *f->GetIntArray("tokenizer.ggml.token_type");
  const auto scores = *f->GetFloatArray("tokenizer.ggml.scores");
  ASSERT_EQ(tokens.size(), 512u);
  ASSERT_EQ(types.size(), 512u);
  ASSERT_EQ(scores.size(), 512u);
  EXPECT_EQ(tokens[0], "<unk>");
  EXPECT_EQ(types[0], 2);
  EXPECT_EQ(tokens[1], "<s>");
  EXPECT_EQ(types[1], 3);
  EXPECT_EQ(tokens[2], "</s>");
  EXPECT_EQ(types[2], 3);
  EXPECT_EQ(tokens[3], "<0x00>");
  EXPECT_EQ(types[3], 6);
  EXPECT_EQ(tokens[258], "<0xFF>");
  EXPECT_EQ(types[258], 6);
  // tok512.bin: id 259 is " t" with score -0, id 260 "he" with -1 (PROVENANCE.md).
  EXPECT_EQ(tokens[259], "\xE2\x96\x81t");
  EXPECT_EQ(types[259], 1);
  EXPECT_EQ(tokens[260], "he");
  EXPECT_EQ(scores[260], -1.0);
  for (const auto& t : tokens) EXPECT_EQ(t.find(' '), std::string::npos) << t;
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.bos_token_id"), 1);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.eos_token_id"), 2);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.unknown_token_id"), 0);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.add_bos_token"), 1);
  EXPECT_EQ(*f->GetInt("tokenizer.ggml.add_eos_token"), 0);
  EXPECT_FALSE(f->Has("tokenizer.ggml.padding_token_id"));

  // The HF form: BPE with byte fallback, merges from the scores in score order (" t" first).
  auto files = ExportToHfFiles(*src);
  ASSERT_TRUE(files.ok()) << files.status().ToString();
  const Json j = Json::parse(files->tokenizer_json);
  EXPECT_EQ(j["model"]["type"], "BPE");
  EXPECT_EQ(j["model"]["byte_fallback"], true);
  EXPECT_EQ(j["model"]["vocab"]["<s>"], 1);
  EXPECT_EQ(j["model"]["merges"][0], "\xE2\x96\x81 t");
  EXPECT_EQ(j["model"]["merges"][1], "h e");
  EXPECT_EQ(j["added_tokens"].size(), 3u);
  const Json c = Json::parse(files->tokenizer_config_json);
  EXPECT_EQ(c["bos_token"], "<s>");
  EXPECT_EQ(c["eos_token"], "</s>");
  EXPECT_EQ(c["add_bos_token"], true);
  // llama2.c stops at BOS as well as EOS: both travel as the generation config's stop ids.
  EXPECT_EQ(Json::parse(files->generation_config_json)["eos_token_id"], Json::array({2, 1}));
}

TEST(ExportRoundTrip, SentencePieceModel) {
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  auto src = LoadOrDie(Models("llama2-tokenizer/tokenizer.model"));
  ASSERT_EQ(src->kind(), "sentencepiece");
  ExpectSameTokenizer(*src, *ViaGguf(*src), "gguf");
  ExpectSameTokenizer(*src, *ViaHf(*src, "llama2-sp"), "hf");
}

TEST(ExportRoundTrip, SentencePieceModelMatchesLlamaCppGguf) {
  // The GGUF export of tokenizer.model has the same tokens, scores and types as the GGUF
  // llama.cpp's converter wrote for the same vocabulary.
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  auto src = LoadOrDie(Models("llama2-tokenizer/tokenizer.model"));
  auto mine = GgufOf(*src);
  auto ref = formats::GgufFile::Open(Models("ggml-vocab/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(ref.ok()) << ref.status().ToString();
  for (const char* key :
       {"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type"}) {
    const auto& a = mine->metadata().at(key);
    const auto& b = (*ref)->metadata().at(key);
    EXPECT_EQ(a.value, b.value) << key;
  }
}

TEST(ExportRoundTrip, Phi3TokenizerJson) {
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer.json");
  auto src = LoadOrDie(Models("phi3-tokenizer/tokenizer.json"));
  ASSERT_EQ(src->kind(), "spm-bpe");
  ExpectSameTokenizer(*src, *ViaGguf(*src), "gguf");
  ExpectSameTokenizer(*src, *ViaHf(*src, "phi3"), "hf");
  // Added tokens beyond the model vocabulary survive as specials.
  auto g = ViaGguf(*src);
  const auto ids = g->Encode("<|user|>\nHi<|end|>", {.add_bos = false});
  EXPECT_EQ(ids.front(), 32010);
  EXPECT_TRUE(g->IsSpecial(32010));
}

TEST(ExportRoundTrip, LlamaSpmGguf) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-llama-spm.gguf");
  auto src = LoadOrDie(Models("ggml-vocab/ggml-vocab-llama-spm.gguf"));
  ExpectSameTokenizer(*src, *ViaGguf(*src), "gguf");
  ExpectSameTokenizer(*src, *ViaHf(*src, "llama-spm-gguf"), "hf");
}

TEST(ExportRoundTrip, Gpt2Gguf) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");
  auto src = LoadOrDie(Models("ggml-vocab/ggml-vocab-gpt-2.gguf"));
  ASSERT_EQ(src->kind(), "byte-bpe");
  ExpectSameTokenizer(*src, *ViaGguf(*src), "gguf");
  ExpectSameTokenizer(*src, *ViaHf(*src, "gpt2-gguf"), "hf");
  auto f = GgufOf(*src);
  EXPECT_EQ(*f->GetString("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(*f->GetString("tokenizer.ggml.pre"), "gpt-2");
  EXPECT_FALSE(f->Has("tokenizer.ggml.scores"));
  // Same merges, in the same order, as llama.cpp's GGUF.
  auto ref = formats::GgufFile::Open(Models("ggml-vocab/ggml-vocab-gpt-2.gguf"));
  ASSERT_TRUE(ref.ok());
  EXPECT_EQ(*f->GetStringArray("tokenizer.ggml.merges"),
            *(*ref)->GetStringArray("tokenizer.ggml.merges"));
  EXPECT_EQ(*f->GetStringArray("tokenizer.ggml.tokens"),
            *(*ref)->GetStringArray("tokenizer.ggml.tokens"));
}

TEST(ExportRoundTrip, Gpt2VocabAndMerges) {
  CHORUS_REQUIRE_SHARED_MODEL("gpt2-tokenizer/vocab.json");
  auto src = LoadOrDie(Models("gpt2-tokenizer"));
  ExpectSameTokenizer(*src, *ViaGguf(*src), "gguf");
  ExpectSameTokenizer(*src, *ViaHf(*src, "gpt2-vocab"), "hf");
}

TEST(ExportRoundTrip, ChatTemplatePadAndSeveralEosIds) {
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer.json");
  auto src = LoadOrDie(Models("phi3-tokenizer/tokenizer.json"));
  src->set_chat_template(
      "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}");
  src->set_eos_ids({32007, 32000, 2});
  src->set_pad_id(32000);
  auto g = ViaGguf(*src);
  auto h = ViaHf(*src, "phi3-extra");
  for (const Tokenizer* t : {g.get(), h.get()}) {
    EXPECT_EQ(t->chat_template(), src->chat_template());
    EXPECT_EQ(t->eos_ids(), src->eos_ids());
  }
  EXPECT_EQ(h->pad_id(), 32000);
  EXPECT_EQ(*GgufOf(*src)->GetInt("tokenizer.ggml.padding_token_id"), 32000);
  EXPECT_EQ(*GgufOf(*src)->GetInt("tokenizer.ggml.eot_token_id"), 32000);
}

TEST(ExportRoundTrip, RebuildFromSpecIsEquivalent) {
  CHORUS_REQUIRE_SHARED_MODEL("phi3-tokenizer/tokenizer.json");
  for (const char* rel :
       {"phi3-tokenizer/tokenizer.json", "stories260K/tok512.bin", "gpt2-tokenizer"}) {
    auto src = LoadOrDie(Models(rel));
    const auto* bpe = dynamic_cast<const internal::BpeTokenizer*>(src.get());
    ASSERT_NE(bpe, nullptr) << rel;
    auto re = internal::BpeTokenizer::Create(bpe->ToSpec());
    ASSERT_TRUE(re.ok()) << re.status().ToString();
    (*re)->set_bos_id(src->bos_id());
    (*re)->set_eos_ids(src->eos_ids());
    (*re)->set_add_bos(src->add_bos());
    (*re)->set_add_eos(src->add_eos());
    (*re)->set_chat_template(src->chat_template());
    ExpectSameTokenizer(*src, **re, rel);
  }
}

// ---- GGUF details ------------------------------------------------------------------------------

TEST(ExportGguf, PadsVocabularyWithUnusedTokens) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin");
  auto src = LoadOrDie(Models("stories260K/tok512.bin"));
  auto f = GgufOf(*src, {.pad_to_vocab_size = 520});
  const auto tokens = *f->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 520u);
  EXPECT_EQ(tokens[515], "[PAD515]");
  EXPECT_EQ((*f->GetIntArray("tokenizer.ggml.token_type"))[515], 5);
  auto g = TokenizerFromGguf(*f);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ((*g)->vocab_size(), 520);
  EXPECT_EQ((*g)->Decode(std::vector<int32_t>{515}), "");
  ExpectSameTokenizer(*src, **g, "padded",
                      {.parse_special = false, .include_special_decode = false});

  formats::GgufWriter w;
  const Status s = ExportToGguf(*src, &w, {.pad_to_vocab_size = 100});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_CONTAINS(s.message(), "512 tokens");
}

// A GGUF byte-level vocabulary with the given pre-tokenizer name, from the gpt-2 GGUF.
std::unique_ptr<Tokenizer> Gpt2WithPre(const std::string& pre) {
  auto ref = formats::GgufFile::Open(Models("ggml-vocab/ggml-vocab-gpt-2.gguf"));
  CHORUS_CHECK(ref.ok());
  formats::GgufWriter w;
  for (const auto& [k, v] : (*ref)->metadata()) {
    if (k.starts_with("tokenizer.")) w.Set(k, v);
  }
  w.SetString("tokenizer.ggml.pre", pre);
  auto f = formats::GgufFile::FromBytes("gpt2-" + pre, *w.Serialize());
  CHORUS_CHECK(f.ok());
  auto tok = TokenizerFromGguf(**f);
  CHORUS_CHECK(tok.ok()) << tok.status().ToString();
  return std::move(tok).value();
}

TEST(ExportGguf, PreTokenizerNamesRoundTrip) {
  CHORUS_REQUIRE_SHARED_MODEL("ggml-vocab/ggml-vocab-gpt-2.gguf");
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "qwen2"}) {
    auto src = Gpt2WithPre(pre);
    EXPECT_EQ(*GgufOf(*src)->GetString("tokenizer.ggml.pre"), pre);
    ExpectSameTokenizer(*src, *ViaGguf(*src), std::string("gguf ") + pre);
    // HF: the regexes become Split pre-tokenizers.
    ExpectSameTokenizer(*src, *ViaHf(*src, std::string("pre-") + pre), std::string("hf ") + pre);
  }
}

// ---- hand-made vocabularies ----------------------------------------------------------------

// Protobuf writer for a hand-made SentencePiece ModelProto.
void Varint(std::string* s, uint64_t v) {
  while (v >= 0x80) {
    s->push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  s->push_back(static_cast<char>(v));
}
void Field(std::string* s, int field, const std::string& bytes) {
  Varint(s, static_cast<uint64_t>(field) << 3 | 2);
  Varint(s, bytes.size());
  *s += bytes;
}
void FieldVarint(std::string* s, int field, uint64_t v) {
  Varint(s, static_cast<uint64_t>(field) << 3);
  Varint(s, v);
}

struct SpPiece {
  std::string piece;
  float score;
  int type;
};

std::string SentencePieceProto(const std::vector<SpPiece>& pieces, int model_type) {
  std::string m;
  for (const auto& p : pieces) {
    std::string sp;
    Field(&sp, 1, p.piece);
    Varint(&sp, 2 << 3 | 5);
    sp.append(reinterpret_cast<const char*>(&p.score), 4);
    FieldVarint(&sp, 3, static_cast<uint64_t>(p.type));
    Field(&m, 1, sp);
  }
  std::string trainer;
  FieldVarint(&trainer, 3, static_cast<uint64_t>(model_type));
  FieldVarint(&trainer, 35, 1);  // byte_fallback
  Field(&m, 2, trainer);
  std::string norm;
  Field(&norm, 1, "identity");
  FieldVarint(&norm, 3, 1);  // add_dummy_prefix
  FieldVarint(&norm, 4, 0);  // remove_extra_whitespaces
  Field(&m, 3, norm);
  return m;
}

std::vector<SpPiece> SmallSpVocab() {
  std::vector<SpPiece> v = {{"<unk>", 0, 2}, {"<s>", 0, 3}, {"</s>", 0, 3}, {"<sep>", 0, 4}};
  char buf[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    v.push_back({buf, 0, 6});
  }
  const char* merged[] = {"\xE2\x96\x81h", "el", "\xE2\x96\x81hel", "lo", "\xE2\x96\x81hello",
                          "\xE2\x96\x81w", "or"};
  float score = 0;
  for (const char* p : merged) v.push_back({p, score--, 1});
  for (const char* c : {"\xE2\x96\x81", "h", "e", "l", "o", "w", "r", "d"})
    v.push_back({c, score--, 1});
  return v;
}

TEST(ExportSentencePiece, UserDefinedPiecesStayAtomic) {
  auto src = internal::SentencePieceFromBytes(SentencePieceProto(SmallSpVocab(), /*BPE*/ 2),
                                              "small.model");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  // (After a user-defined piece libsentencepiece adds no "▁" to the following text while the
  // exported tokenizers do, as for every added token — export.h; so the piece ends the text.)
  const std::string text = "hello world<sep>";
  const auto want = (*src)->Encode(text, {});
  ASSERT_EQ(want.size(), 7u);  // BOS ▁hello ▁w or l d <sep>
  EXPECT_EQ(want.back(), 3);   // <sep> is one token
  auto g = ViaGguf(**src);
  auto h = ViaHf(**src, "small-sp");
  EXPECT_EQ(g->Encode(text, {}), want);
  EXPECT_EQ(h->Encode(text, {}), want);
  EXPECT_EQ(g->Decode(want), (*src)->Decode(want));
  EXPECT_EQ(h->Decode(want), (*src)->Decode(want));
  EXPECT_EQ((*GgufOf(**src)->GetIntArray("tokenizer.ggml.token_type"))[3], 4);
}

TEST(ExportSentencePiece, UnigramIsRefused) {
  auto src = internal::SentencePieceFromBytes(SentencePieceProto(SmallSpVocab(), /*UNIGRAM*/ 1),
                                              "uni.model");
  ASSERT_TRUE(src.ok()) << src.status().ToString();
  formats::GgufWriter w;
  const Status s = ExportToGguf(**src, &w);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(s.message(), "only BPE");
  EXPECT_EQ(ExportToHfFiles(**src).status().code(), StatusCode::kUnimplemented);
}

// A SentencePiece-style tokenizer.json with the given merges over a tiny vocabulary.
std::string SpmJson(const std::string& merges) {
  return R"({"normalizer": {"type": "Sequence", "normalizers": [
      {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "byte_fallback": true,
      "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3, "bc": 4, "abc": 5, "\u2581": 6},
      "merges": )" +
         merges + "}}";
}

TEST(ExportSpmJson, MergesThatScoresCannotExpressAreRefusedForGguf) {
  // "abc" comes only from "ab" + "c": score-based merging would also take "a" + "bc".
  auto bad = TokenizerFromJsonString(SpmJson(R"(["b c", "a b", "ab c"])"));
  ASSERT_TRUE(bad.ok()) << bad.status().ToString();
  formats::GgufWriter w;
  const Status s = ExportToGguf(**bad, &w);
  EXPECT_EQ(s.code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(s.message(), "'a' + 'bc'");
  // tokenizer.json keeps ranks, so the HF export is exact.
  auto h = ViaHf(**bad, "bad-merges");
  for (const char* text : {"abc", "aabcbc", "cab bca"}) {
    EXPECT_EQ(h->Encode(text, {}), (*bad)->Encode(text, {})) << text;
  }

  // With every split listed, the derived scores reproduce the ranks.
  auto good = TokenizerFromJsonString(SpmJson(R"(["b c", "a b", "a bc", "ab c"])"));
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  auto g = ViaGguf(**good);
  for (const char* text : {"abc", "aabcbc", "cab bca", "ababc"}) {
    EXPECT_EQ(g->Encode(text, {}), (*good)->Encode(text, {})) << text;
  }
  // "bc" (rank 0) outranks "ab" (rank 1): "abc" -> a + bc -> abc.
  EXPECT_EQ((*GgufOf(**good)->GetFloatArray("tokenizer.ggml.scores"))[4], 0.0);
  EXPECT_EQ((*GgufOf(**good)->GetFloatArray("tokenizer.ggml.scores"))[3], -1.0);
}

TEST(ExportHf, InvalidUtf8PieceIsRefused) {
  // llama2.c pieces are raw bytes; tokenizer.json cannot hold invalid UTF-8 (GGUF can).
  std::string bin;
  auto i32 = [&](int32_t v) { bin.append(reinterpret_cast<const char*>(&v), 4); };
  auto add = [&](const std::string& p, float score) {
    bin.append(reinterpret_cast<const char*>(&score), 4);
    i32(static_cast<int32_t>(p.size()));
    bin += p;
  };
  i32(8);
  add("<unk>", 0);
  add("\n<s>\n", 0);
  add("\n</s>\n", 0);
  add("a", -1);
  add("\xFF\xFE", -2);
  auto tok = internal::Llama2cTokenizerFromBytes(bin, "bad.bin");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const auto r = ExportToHfFiles(**tok);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_CONTAINS(r.status().message(), "token 4 is not valid UTF-8");
  formats::GgufWriter w;
  EXPECT_TRUE(ExportToGguf(**tok, &w).ok());
}

TEST(ExportHf, DirectoryIsCreatedAndFilesParse) {
  CHORUS_REQUIRE_SHARED_MODEL("gpt2-tokenizer/vocab.json");
  auto src = LoadOrDie(Models("gpt2-tokenizer"));
  const std::string dir = TempDir() + "/nested/dir";
  CHORUS_ASSERT_OK(ExportToHfDirectory(*src, dir));
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    auto text = ReadFileToString(dir + "/" + f);
    ASSERT_TRUE(text.ok()) << f;
    EXPECT_TRUE(Json::accept(*text)) << f;
  }
  const Json j = Json::parse(*ReadFileToString(dir + "/tokenizer.json"));
  EXPECT_EQ(j["pre_tokenizer"]["type"], "ByteLevel");
  EXPECT_EQ(j["decoder"]["type"], "ByteLevel");
  EXPECT_EQ(j["model"]["vocab"].size(), 50257u);
  EXPECT_EQ(j["model"]["merges"][0], "\xC4\xA0 t");
  // A regular file where the directory should go is an error, not a crash.
  const std::string file = TempDir() + "/plainfile";
  ASSERT_TRUE(WriteFileAtomically(file, "x").ok());
  EXPECT_FALSE(ExportToHfDirectory(*src, file).ok());
}

}  // namespace
}  // namespace chorus::tokenizer

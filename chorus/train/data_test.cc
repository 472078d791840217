// Training data: formats, loss masks, validation errors with line numbers, packing.
#include "chorus/train/data.h"

#include <gtest/gtest.h>

#include <fstream>

#include "tests/testutil/testutil.h"

namespace chorus::train {
namespace {

std::unique_ptr<tokenizer::Tokenizer> Tok() {
  auto t = tokenizer::LoadTokenizer(testing::SharedModelsDir() + "/stories260K/tok512.bin");
  return t.ok() ? std::move(*t) : nullptr;
}

#define NEED_TOKENIZER() CHORUS_REQUIRE_SHARED_MODEL("stories260K/tok512.bin")

std::string ErrorOf(std::string_view text, bool jsonl, int64_t seq_len = 256) {
  auto tok = Tok();
  DataOptions o;
  o.seq_len = seq_len;
  auto r = ParseSamples(text, jsonl, *tok, o);
  return r.ok() ? "ok" : r.status().message();
}

TEST(DataTest, PromptCompletionLossOnCompletionOnly) {
  NEED_TOKENIZER();
  auto tok = Tok();
  auto r = ParseSamples(R"({"prompt": "Once upon a time", "completion": " there was a cat."})",
                        true, *tok, {});
  CHORUS_ASSERT_OK(r.status());
  ASSERT_EQ(r->size(), 1u);
  const Sample& s = (*r)[0];
  tokenizer::EncodeOptions eo;
  eo.add_eos = false;
  const auto prompt = tok->Encode("Once upon a time", eo);
  ASSERT_GT(s.tokens.size(), prompt.size() + 1);
  for (size_t i = 0; i < prompt.size(); ++i) {
    EXPECT_EQ(s.tokens[i], prompt[i]);
    EXPECT_EQ(s.loss[i], 0) << i;
  }
  for (size_t i = prompt.size(); i < s.tokens.size(); ++i) EXPECT_EQ(s.loss[i], 1) << i;
  EXPECT_TRUE(tok->IsEos(s.tokens.back()));
  EXPECT_EQ(s.line, 1);
}

TEST(DataTest, ChatLossOnAssistantTurnsOnly) {
  NEED_TOKENIZER();
  auto tok = Tok();
  const std::string line =
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello there"},)"
      R"( {"role": "user", "content": "Bye"}, {"role": "assistant", "content": "See you"}]})";
  auto r = ParseSamples(line, true, *tok, {});
  CHORUS_ASSERT_OK(r.status());
  const Sample& s = (*r)[0];
  // Decode the learned spans: both assistant contents, and no user text.
  std::string learned, other;
  for (size_t i = 0; i < s.tokens.size(); ++i) {
    const std::string piece = tok->Decode(std::span<const int32_t>(&s.tokens[i], 1), true);
    (s.loss[i] ? learned : other) += piece;
  }
  EXPECT_NE(learned.find("Hello"), std::string::npos) << learned;
  EXPECT_NE(learned.find("See"), std::string::npos) << learned;
  EXPECT_EQ(learned.find("Bye"), std::string::npos) << learned;
  EXPECT_NE(other.find("Bye"), std::string::npos) << other;
}

TEST(DataTest, PlainTextDocumentsAndLongDocumentsAreCut) {
  NEED_TOKENIZER();
  auto tok = Tok();
  std::string long_doc;
  for (int i = 0; i < 40; ++i) long_doc += "The cat sat on the mat. ";
  const std::string text = "One day a dog ran.\n\n\n" + long_doc + "\n\nThe end.\n";
  DataOptions o;
  o.seq_len = 32;
  auto r = ParseSamples(text, false, *tok, o);
  CHORUS_ASSERT_OK(r.status());
  ASSERT_GE(r->size(), 4u);
  EXPECT_EQ((*r)[0].line, 1);
  EXPECT_EQ((*r)[1].line, 4);
  EXPECT_EQ(r->back().line, 6);
  for (const Sample& s : *r) {
    EXPECT_LE(s.tokens.size(), 32u);
    EXPECT_EQ(s.loss[0], 0);
  }
}

TEST(DataTest, ErrorsNameTheLine) {
  NEED_TOKENIZER();
  const std::string ok = R"({"prompt": "a", "completion": "b"})";
  EXPECT_EQ(ErrorOf(ok + "\n{not json\n", true).substr(0, 21), "line 2: invalid JSON ");
  EXPECT_EQ(ErrorOf(ok + "\n\n[1, 2]\n", true), "line 3: expected a JSON object");
  EXPECT_EQ(ErrorOf(R"({"prompt": "a"})", true), "line 1: missing field \"completion\"");
  EXPECT_EQ(ErrorOf(ok + "\n" + R"({"prompt": "a", "completion": ""})", true),
            "line 2: empty completion");
  EXPECT_EQ(ErrorOf(R"({"prompt": 3, "completion": "b"})", true),
            "line 1: field \"prompt\" must be a string");
  EXPECT_EQ(ErrorOf(R"({"foo": 1})", true),
            "line 1: expected \"prompt\" and \"completion\", \"messages\", or \"text\"");
  EXPECT_EQ(ErrorOf(R"({"messages": [{"role": "user", "content": "hi"}]})", true),
            "line 1: no assistant message to learn");
  EXPECT_EQ(
      ErrorOf(ok + "\n" + R"({"prompt": "a", "completion": "b)" + std::string("\xff") + R"("})",
              true),
      "line 2: not valid UTF-8 (byte 33)");
  EXPECT_EQ(ErrorOf("fine\n\nbad \xc3\x28 text\n", false), "line 3: not valid UTF-8 (byte 5)");
  std::string long_completion;
  for (int i = 0; i < 50; ++i) long_completion += "cat ";
  const std::string err =
      ErrorOf(ok + "\n" + R"({"prompt": "a", "completion": ")" + long_completion + "\"}", true, 16);
  EXPECT_EQ(err.substr(0, 15), "line 2: sample ") << err;
  EXPECT_NE(err.find("longer than --seq-len 16"), std::string::npos) << err;
  EXPECT_EQ(ErrorOf("\n\n", true), "no training sample in the data");
}

TEST(DataTest, FileOverTheLimitIsRefused) {
  NEED_TOKENIZER();
  auto tok = Tok();
  const std::string path = testing::TempDir() + "/big.jsonl";
  {
    std::ofstream out(path);
    for (int i = 0; i < 100; ++i)
      out << R"({"prompt": "a", "completion": "b"})"
          << "\n";
  }
  DataOptions o;
  o.max_file_bytes = 1000;
  auto r = LoadSamples(path, *tok, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
  EXPECT_NE(r.status().message().find("1000 bytes"), std::string::npos) << r.status().message();
  o.max_file_bytes = 1 << 20;
  EXPECT_TRUE(LoadSamples(path, *tok, o).ok());
}

TEST(DataTest, PackingKeepsSamplesApart) {
  std::vector<Sample> s(4);
  const int lens[] = {5, 3, 4, 2};
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < lens[i]; ++j) {
      s[i].tokens.push_back(10 * i + j);
      s[i].loss.push_back(j > 0);
    }
  }
  const std::vector<int64_t> order = {0, 1, 2, 3};
  const std::vector<PackedSeq> seqs = Pack(s, order, 8);
  ASSERT_EQ(seqs.size(), 2u);
  EXPECT_EQ(seqs[0], (PackedSeq{0, 1}));
  EXPECT_EQ(seqs[1], (PackedSeq{2, 3}));
  Batch b;
  AppendSequence(s, seqs[0], &b);
  EXPECT_EQ(b.tokens, (std::vector<int32_t>{0, 1, 2, 3, 4, 10, 11, 12}));
  EXPECT_EQ(b.positions, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 1, 2}));
  EXPECT_EQ(b.seg_start, (std::vector<int32_t>{0, 0, 0, 0, 0, 5, 5, 5}));
  EXPECT_EQ(b.targets, (std::vector<int32_t>{1, 2, 3, 4, -1, 11, 12, -1}));
}

}  // namespace
}  // namespace chorus::train

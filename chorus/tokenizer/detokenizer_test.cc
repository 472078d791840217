// UTF-8 helpers, the byte-level alphabet and the streaming detokenizer.
#include <string>
#include <vector>

#include "chorus/tokenizer/fuzz_entry.h"
#include "chorus/tokenizer/tokenizer.h"
#include "chorus/tokenizer/utf8.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using internal::SanitizeUtf8;
using internal::ValidUtf8CharLen;

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8, ValidCharLenFollowsTable3_7) {
  EXPECT_EQ(ValidUtf8CharLen("A"), 1u);
  EXPECT_EQ(ValidUtf8CharLen("\xC3\xA9"), 2u);
  EXPECT_EQ(ValidUtf8CharLen("\xE7\x94\x9F"), 3u);
  EXPECT_EQ(ValidUtf8CharLen("\xF0\x9F\x98\x80"), 4u);
  EXPECT_EQ(ValidUtf8CharLen("\xC0\x80"), 0u);          // overlong
  EXPECT_EQ(ValidUtf8CharLen("\xE0\x80\x80"), 0u);      // overlong
  EXPECT_EQ(ValidUtf8CharLen("\xED\xA0\x80"), 0u);      // surrogate
  EXPECT_EQ(ValidUtf8CharLen("\xF4\x90\x80\x80"), 0u);  // > U+10FFFF
  EXPECT_EQ(ValidUtf8CharLen("\x80"), 0u);              // lone continuation
  EXPECT_EQ(ValidUtf8CharLen("\xF0\x9F\x98"), 0u);      // truncated
}

TEST(Utf8, SanitizeReplacesMaximalSubparts) {
  // Same results as Python's bytes.decode("utf-8", "replace").
  EXPECT_EQ(SanitizeUtf8("ok"), "ok");
  EXPECT_EQ(SanitizeUtf8("\xF0\x9F\x98"
                         "A"),
            kFffd + "A");
  EXPECT_EQ(SanitizeUtf8("\xE0\x80"), kFffd + kFffd);
  EXPECT_EQ(SanitizeUtf8("\xED\xA0\x80"), kFffd + kFffd + kFffd);
  EXPECT_EQ(SanitizeUtf8("a\xFF"
                         "b"),
            "a" + kFffd + "b");
  EXPECT_EQ(SanitizeUtf8("\xC3"), kFffd);
}

TEST(Utf8, ByteLevelAlphabetIsGpt2s) {
  EXPECT_EQ(internal::ByteToUnicode(' '), 0x120u);   // "Ġ"
  EXPECT_EQ(internal::ByteToUnicode('\n'), 0x10Au);  // "Ċ"
  EXPECT_EQ(internal::ByteToUnicode('A'), static_cast<uint32_t>('A'));
  EXPECT_EQ(internal::ByteToUnicode(0xAD), 0x143u);  // soft hyphen is remapped (last one)
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(internal::ByteLevelDecode(internal::ByteLevelEncode(all)), all);
  EXPECT_EQ(internal::ByteLevelEncode(" hello"), "\xC4\xA0hello");
}

class StreamingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto t = TokenizerFromJsonString(SmallSpmTokenizerJson());
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tok_ = std::move(t).value();
  }
  // Byte-fallback token of byte b in the small SPM tokenizer.
  static int32_t Byte(uint8_t b) { return 3 + b; }
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(StreamingTest, EmojiArrivesOneByteAtATime) {
  StreamingDetokenizer d(tok_.get());
  EXPECT_EQ(d.Push(Byte(0xF0)), "");
  EXPECT_EQ(d.Push(Byte(0x9F)), "");
  EXPECT_EQ(d.Push(Byte(0x98)), "");
  EXPECT_EQ(d.Push(Byte(0x80)), "\xF0\x9F\x98\x80");
  EXPECT_EQ(d.Flush(), "");
}

TEST_F(StreamingTest, CjkAfterTextAndBeforeText) {
  const int32_t hello = *tok_->PieceToId("\u2581hello");
  const int32_t world = *tok_->PieceToId("\u2581world");
  StreamingDetokenizer d(tok_.get());
  EXPECT_EQ(d.Push(hello), "hello");  // first piece: leading space stripped
  EXPECT_EQ(d.Push(Byte(0xE7)), "");
  EXPECT_EQ(d.Push(Byte(0x94)), "");
  EXPECT_EQ(d.Push(Byte(0x9F)), "\xE7\x94\x9F");  // 生
  EXPECT_EQ(d.Push(world), " world");
  EXPECT_EQ(d.Flush(), "");
}

TEST_F(StreamingTest, InvalidSequencesBecomeReplacementCharacters) {
  const int32_t h = *tok_->PieceToId("h");
  StreamingDetokenizer d(tok_.get());
  EXPECT_EQ(d.Push(Byte(0x80)), kFffd);  // can never start a sequence: replaced at once
  EXPECT_EQ(d.Push(Byte(0xF0)), "");
  EXPECT_EQ(d.Push(Byte(0x9F)), "");
  EXPECT_EQ(d.Push(h), kFffd + "h");  // the sequence was cut by an ASCII letter
  EXPECT_EQ(d.Push(Byte(0xE0)), "");
  EXPECT_EQ(d.Push(Byte(0x80)), kFffd + kFffd);  // E0 80 is invalid at its second byte
  EXPECT_EQ(d.Push(Byte(0xE7)), "");
  EXPECT_EQ(d.Flush(), kFffd);  // still incomplete at the end
  EXPECT_EQ(d.Flush(), "");
}

TEST_F(StreamingTest, StreamEqualsDecodeAndIsAlwaysValid) {
  const std::string text = "hello \xE7\x94\x9F\xE6\xB4\xBB \xF0\x9F\x98\x80 world caf\xC3\xA9";
  const auto ids = tok_->Encode(text, EncodeOptions{});
  StreamingDetokenizer d(tok_.get());
  std::string streamed;
  for (int32_t id : ids) {
    const std::string chunk = d.Push(id);
    EXPECT_EQ(SanitizeUtf8(chunk), chunk);
    streamed += chunk;
  }
  streamed += d.Flush();
  EXPECT_EQ(streamed, text);
  EXPECT_EQ(tok_->Decode(ids), text);
}

TEST_F(StreamingTest, SpecialTokensOnlyWhenAsked) {
  const std::vector<int32_t> ids = {1, *tok_->PieceToId("\u2581hello"), 2};
  EXPECT_EQ(tok_->Decode(ids), "hello");
  EXPECT_EQ(tok_->Decode(ids, /*include_special=*/true), "<s> hello</s>");
  StreamingDetokenizer d(tok_.get(), /*include_special=*/true);
  std::string s;
  for (int32_t id : ids) s += d.Push(id);
  EXPECT_EQ(s, "<s> hello</s>");
}

TEST_F(StreamingTest, OutOfRangeIdsDecodeToNothing) {
  StreamingDetokenizer d(tok_.get());
  EXPECT_EQ(d.Push(-5), "");
  EXPECT_EQ(d.Push(1 << 30), "");
  EXPECT_EQ(tok_->Piece(1 << 30), "");
  EXPECT_EQ(tok_->TokenBytes(-1, tok_->vocab_size(), true), "");
}

TEST(StreamingReal, Llama2EmojiAndCjkThroughByteFallback) {
  CHORUS_REQUIRE_SHARED_MODEL("llama2-tokenizer/tokenizer.model");
  auto tok =
      LoadTokenizer(::chorus::testing::SharedModelsDir() + "/llama2-tokenizer/tokenizer.model");
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  // 😀 is not in the Llama 2 vocabulary: it is four byte-fallback tokens.
  const std::string text =
      "Smile \xF0\x9F\x98\x80 \xE7\x94\x9F\xE6\xB4\xBB\xE7\x9A\x84\xE7\x9C\x9F\xE8\xB0\x9B";
  const auto ids = (*tok)->Encode(text, EncodeOptions{});
  int byte_tokens = 0;
  StreamingDetokenizer d(tok->get());
  std::string streamed;
  for (int32_t id : ids) {
    byte_tokens += (*tok)->Piece(id).starts_with("<0x");
    const std::string chunk = d.Push(id);
    EXPECT_EQ(SanitizeUtf8(chunk), chunk) << "chunk after id " << id;
    streamed += chunk;
  }
  streamed += d.Flush();
  EXPECT_GE(byte_tokens, 4);
  EXPECT_EQ(streamed, text);
}

TEST(CleanUp, MatchesTransformersRules) {
  EXPECT_EQ(CleanUpTokenizationSpaces("A\n'll !!to?'d''d of, can't ."),
            "A\n'll!!to?'d''d of, can't.");
  EXPECT_EQ(CleanUpTokenizationSpaces("do n't , 's 've 're 'm"), "don't,'s've're'm");
}

}  // namespace
}  // namespace chorus::tokenizer

// The byte-level pre-tokenizer regexes (PCRE2, UTF + UCP): word splits worked out by hand from
// the patterns' alternation order (the same as HF tokenizers / llama.cpp produce).
#include "chorus/tokenizer/pretokenizer.h"

#include <string>
#include <vector>

#include "tests/testutil/testutil.h"

namespace chorus::tokenizer::internal {
namespace {

std::vector<std::string> SplitWith(std::string_view pattern, std::string_view text) {
  PreTokenizer pre;
  CHORUS_CHECK(pre.Init({{std::string(pattern), false}}).ok());
  std::vector<std::string_view> words;
  pre.Split(text, &words);
  return std::vector<std::string>(words.begin(), words.end());
}

using Words = std::vector<std::string>;
constexpr std::string_view kText = "Hello  world 12345 I'M\n\n x";

TEST(PreTokenizer, Gpt2) {
  EXPECT_EQ(SplitWith(kGpt2Pattern, kText),
            (Words{"Hello", " ", " world", " 12345", " I", "'", "M", "\n\n", " x"}));
  EXPECT_EQ(SplitWith(kGpt2Pattern, "you're 3.14"), (Words{"you", "'re", " 3", ".", "14"}));
}

TEST(PreTokenizer, Llama3GroupsDigitsByThreeAndIgnoresCaseInContractions) {
  EXPECT_EQ(SplitWith(kLlama3Pattern, kText),
            (Words{"Hello", " ", " world", " ", "123", "45", " I", "'M", "\n\n", " x"}));
}

TEST(PreTokenizer, Qwen2SplitsEveryDigit) {
  EXPECT_EQ(SplitWith(kQwen2Pattern, kText), (Words{"Hello", " ", " world", " ", "1", "2", "3", "4",
                                                    "5", " I", "'M", "\n\n", " x"}));
}

TEST(PreTokenizer, UnicodeClassesAndInvalidBytes) {
  // \p{L} covers CJK and accented letters; NBSP is \s (a Unicode space).
  EXPECT_EQ(SplitWith(kGpt2Pattern, "caf\xC3\xA9 \xE7\x94\x9F\xE6\xB4\xBB"),
            (Words{"caf\xC3\xA9", " \xE7\x94\x9F\xE6\xB4\xBB"}));
  EXPECT_EQ(SplitWith(kGpt2Pattern, "a\xC2\xA0\xC2\xA0"), (Words{"a", "\xC2\xA0\xC2\xA0"}));
  // Invalid UTF-8 never matches: it becomes a word of its own, nothing is lost.
  const Words w = SplitWith(kGpt2Pattern, "ab\xFF\xFE cd");
  std::string joined;
  for (const auto& s : w) joined += s;
  EXPECT_EQ(joined, "ab\xFF\xFE cd");
  EXPECT_EQ(w.front(), "ab");
  EXPECT_EQ(w.back(), " cd");
}

TEST(PreTokenizer, RemovedBehaviourAndBadPattern) {
  PreTokenizer pre;
  ASSERT_TRUE(pre.Init({{"\\s+", true}}).ok());
  std::vector<std::string_view> words;
  pre.Split("a  b c", &words);
  EXPECT_EQ(std::vector<std::string>(words.begin(), words.end()), (Words{"a", "b", "c"}));
  EXPECT_FALSE(pre.Init({{"(unclosed", false}}).ok());
  // A pattern that can match the empty string must not loop.
  ASSERT_TRUE(pre.Init({{"x*", false}}).ok());
  pre.Split("abxxc", &words);
  EXPECT_EQ(std::vector<std::string>(words.begin(), words.end()), (Words{"ab", "xx", "c"}));
}

}  // namespace
}  // namespace chorus::tokenizer::internal

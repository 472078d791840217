// The token matcher against the brute-force reference (an Earley recognizer trying every
// token's bytes) on random grammars and random vocabularies, plus targeted cases: tokens that
// span terminals, partial UTF-8 tokens, EOS only where the grammar accepts, forks.
#include "chorus/grammar/matcher.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdio>
#include <random>

#include "chorus/grammar/json_schema.h"

namespace chorus::grammar {
namespace {

// Random AST over a small alphabet that includes a two-byte and a three-byte character, so
// random tokens cut characters in the middle.
class RandomGrammar {
 public:
  explicit RandomGrammar(uint64_t seed) : rng_(seed) {}

  GrammarAst Make() {
    GrammarAst ast;
    const int n_rules = Int(1, 4);
    for (int r = 0; r < n_rules; ++r) ast.RuleId(std::string("r").append(std::to_string(r)));
    for (int r = 0; r < n_rules; ++r)
      ast.Define(std::string("r").append(std::to_string(r)), Gen(n_rules, 3));
    ast.root = 0;
    return ast;
  }

 private:
  int Int(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  Expr Gen(int n_rules, int depth) {
    const int k = depth <= 0 ? Int(0, 1) : Int(0, 6);
    switch (k) {
      case 0: {
        static const char* kLits[] = {"a", "b", "ab", "ba", "c", "\xC3\xA9", "\xE2\x82\xAC", "aa"};
        return Expr::Literal(kLits[Int(0, 7)]);
      }
      case 1: {
        std::vector<std::pair<uint32_t, uint32_t>> r = {
            {'a', static_cast<uint32_t>('a' + Int(0, 2))}};
        if (Int(0, 2) == 0) r.push_back({0xE9, 0xE9});
        if (Int(0, 3) == 0) r.push_back({0x20AC, 0x20AC});
        return Expr::Chars(r, Int(0, 5) == 0);
      }
      case 2:
        return Expr::Ref(Int(0, n_rules - 1));
      case 3: {
        std::vector<Expr> kids;
        for (int i = Int(1, 3); i > 0; --i) kids.push_back(Gen(n_rules, depth - 1));
        return Expr::Seq(std::move(kids));
      }
      case 4: {
        std::vector<Expr> kids;
        for (int i = Int(2, 3); i > 0; --i) kids.push_back(Gen(n_rules, depth - 1));
        return Expr::Alt(std::move(kids));
      }
      default: {
        const int min = Int(0, 2);
        const int max = Int(0, 2) == 0 ? kUnbounded : min + Int(0, 2);
        return Expr::Repeat(Gen(n_rules, depth - 1), min, max);
      }
    }
  }

  std::mt19937_64 rng_;
};

std::shared_ptr<const Vocabulary> RandomVocab(std::mt19937_64* rng, int n) {
  static const std::vector<std::string> kPieces = {
      "a", "b", "c", "d", "\xC3", "\xA9", "\xC3\xA9", "\xE2", "\x82", "\xAC", "\xE2\x82", " "};
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::uniform_int_distribution<int> piece(0, static_cast<int>(kPieces.size()) - 1);
  std::uniform_int_distribution<int> len(1, 4);
  for (int i = 3; i < n; ++i) {
    for (int k = len(*rng); k > 0; --k)
      bytes[static_cast<size_t>(i)] += kPieces[static_cast<size_t>(piece(*rng))];
  }
  // 0: EOS, 1: a special token (never allowed), 2: a token with no bytes.
  bytes[1] = "a";
  return Vocabulary::Create(std::move(bytes), {0}, {1});
}

std::string MaskString(const TokenMask& m) {
  std::string s;
  for (int64_t i = 0; i < m.size(); ++i) {
    if (m.Test(i)) s += std::to_string(i) + " ";
  }
  return s;
}

TEST(MatcherDifferential, RandomGrammarsAndVocabularies) {
  int compiled = 0, steps = 0;
  for (uint64_t seed = 1; seed <= 1000; ++seed) {
    RandomGrammar rg(seed);
    const GrammarAst ast = rg.Make();
    Result<Grammar> g = Grammar::FromAst(ast);
    if (!g.ok()) continue;  // left-recursive draws are rejected (tested separately)
    ++compiled;
    std::mt19937_64 rng(seed * 7919);
    auto vocab = RandomVocab(&rng, 60 + static_cast<int>(seed % 100));
    Matcher m(*g, vocab);
    std::string prefix;
    TokenMask mask;
    for (int step = 0; step < 20; ++step) {
      m.FillMask(&mask);
      const TokenMask ref = ReferenceMask(*g, *vocab, prefix);
      ASSERT_EQ(MaskString(mask), MaskString(ref))
          << "seed " << seed << " step " << step << " prefix '" << prefix << "'";
      EXPECT_EQ(m.CanEnd(), ReferenceRecognize(*g, prefix) == 1);
      ++steps;
      // Every token outside the mask is refused, and refusing leaves the state unchanged.
      Matcher probe = m;
      for (int32_t i = 0; i < vocab->size(); ++i) {
        if (!mask.Test(i)) {
          ASSERT_FALSE(probe.Accept(i)) << "seed " << seed << " token " << i;
        }
      }
      std::vector<int32_t> allowed;
      for (int32_t i = 0; i < mask.size(); ++i) {
        if (mask.Test(i)) allowed.push_back(i);
      }
      if (allowed.empty()) break;
      // Prefer continuing over ending, so walks go deep.
      if (allowed.size() > 1 && vocab->IsEos(allowed[0]) && rng() % 4 != 0)
        allowed.erase(allowed.begin());
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.Accept(t));
      if (vocab->IsEos(t)) {
        EXPECT_TRUE(m.Done());
        break;
      }
      prefix += vocab->bytes(t);
    }
    EXPECT_EQ(m.truncated(), 0) << "seed " << seed;  // the equality above is not by luck
  }
  EXPECT_GT(compiled, 500);
  EXPECT_GT(steps, 3000);
  std::printf("%d grammars, %d steps compared\n", compiled, steps);
}

std::shared_ptr<const Vocabulary> ByteVocab() {
  // Every single byte, plus some multi-byte tokens; id 256 = EOS.
  std::vector<std::string> b;
  for (int i = 0; i < 256; ++i) b.push_back(std::string(1, static_cast<char>(i)));
  b.push_back("");  // 256: EOS
  for (const char* s : {"{\"", "\":", "\"}", "\": \"", "true", "ab", "\xC3"}) b.push_back(s);
  return Vocabulary::Create(std::move(b), {256});
}

TEST(Matcher, TokensSpanTerminalsAndEosOnlyWhenComplete) {
  auto g = CompileGbnf("root ::= \"{\" \"\\\"\" [a-z]+ \"\\\":\" (\"true\" | \"1\") \"}\"");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto v = ByteVocab();
  Matcher m(*g, v);
  TokenMask mask;
  m.FillMask(&mask);
  EXPECT_TRUE(mask.Test('{'));
  EXPECT_TRUE(mask.Test(257));  // {"  spans two literals
  EXPECT_FALSE(mask.Test(256));
  ASSERT_TRUE(m.Accept(257));
  ASSERT_TRUE(m.AcceptBytes("ab"));
  m.FillMask(&mask);
  EXPECT_TRUE(mask.Test(258));   // ":
  EXPECT_FALSE(mask.Test(260));  // ": " — a space is not in the grammar
  ASSERT_TRUE(m.Accept(258));
  ASSERT_TRUE(m.Accept(261));  // true
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept('}'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.Done());
  m.FillMask(&mask);
  EXPECT_EQ(mask.Count(), 1);  // only EOS
  EXPECT_TRUE(mask.Test(256));
}

TEST(Matcher, PartialUtf8Tokens) {
  auto g = CompileGbnf("root ::= [é€]+");
  ASSERT_TRUE(g.ok());
  auto v = ByteVocab();
  Matcher m(*g, v);
  TokenMask mask;
  m.FillMask(&mask);
  EXPECT_TRUE(mask.Test(0xC3));
  EXPECT_TRUE(mask.Test(263));  // "\xC3" as a multi-byte token id too
  EXPECT_TRUE(mask.Test(0xE2));
  EXPECT_FALSE(mask.Test(0xA9));
  ASSERT_TRUE(m.Accept(0xC3));
  m.FillMask(&mask);
  EXPECT_EQ(mask.Count(), 1);
  EXPECT_TRUE(mask.Test(0xA9));
  EXPECT_FALSE(m.Accept(0xAC));
  ASSERT_TRUE(m.Accept(0xA9));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.Done());
}

TEST(Matcher, ForksAreIndependent) {
  auto g = CompileGbnf("root ::= \"a\" (\"b\" | \"c\")");
  ASSERT_TRUE(g.ok());
  auto v = ByteVocab();
  Matcher a(*g, v);
  ASSERT_TRUE(a.Accept('a'));
  Matcher b = a;
  ASSERT_TRUE(a.Accept('b'));
  EXPECT_TRUE(a.Done());
  EXPECT_FALSE(b.Done());
  ASSERT_TRUE(b.Accept('c'));
  EXPECT_TRUE(b.Done());
  EXPECT_FALSE(b.Accept('c'));
}

TEST(Matcher, MaskCacheGivesTheSameMask) {
  auto g = CompileJsonSchema(nlohmann::json{{"type", "string"}});
  ASSERT_TRUE(g.ok());
  auto v = ByteVocab();
  Matcher m(*g, v);
  ASSERT_TRUE(m.AcceptBytes("\"x"));
  TokenMask first, second;
  m.FillMask(&first);
  ASSERT_TRUE(m.AcceptBytes("y"));  // same state inside the string
  m.FillMask(&second);
  EXPECT_EQ(first, second);
  EXPECT_GE(m.mask_cache_hits(), 1);
  EXPECT_EQ(MaskString(second), MaskString(ReferenceMask(*g, *v, "\"xy")));
}

TEST(Matcher, LongRepetitionKeepsStacksFlat) {
  auto g = CompileGbnf("root ::= (\"ab\" | \"c\")*");
  ASSERT_TRUE(g.ok());
  auto v = ByteVocab();
  Matcher m(*g, v);
  for (int i = 0; i < 20000; ++i) ASSERT_TRUE(m.AcceptBytes(i % 2 ? "ab" : "c"));
  EXPECT_LT(m.n_stacks(), 16);
  EXPECT_LT(m.n_states(), 16);
}

TEST(Matcher, ManyEmptyAlternativesStayPolynomial) {
  // 40 nullable rules of two empty alternatives in a row: 2^40 expansion paths if each were
  // followed; the matcher expands each (position, stack) once per step.
  std::string text = "root ::=";
  for (int i = 0; i < 40; ++i) text += " x";
  text += " \"c\" | x x \"d\"\nx ::= \"\" | \"\" | (\"\")";
  auto g = CompileGbnf(text);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto v = ByteVocab();
  Matcher m(*g, v);
  TokenMask mask;
  m.FillMask(&mask);
  EXPECT_EQ(MaskString(mask), "99 100 ");
  ASSERT_TRUE(m.Accept('c'));
  EXPECT_TRUE(m.Done());
}

// Bytes no class tells apart share one equivalence class; classes split them.
TEST(Matcher, ByteClassesPartitionTheBytes) {
  auto g = CompileGbnf("root ::= [a-z]+ [0-9] | \"x\" [^a-z]");
  ASSERT_TRUE(g.ok());
  const LoweredGrammar& l = g->lowered();
  // ASCII falls into {x}, {a-w, y, z}, {0-9} and the rest; [^a-z] also takes the lead and
  // continuation bytes of multi-byte characters, in ranges of their own.
  EXPECT_GT(l.n_byte_classes, 4);
  EXPECT_LT(l.n_byte_classes, 32);
  EXPECT_EQ(l.byte_class['a'], l.byte_class['q']);
  EXPECT_NE(l.byte_class['a'], l.byte_class['x']);
  EXPECT_NE(l.byte_class['0'], l.byte_class['a']);
  EXPECT_EQ(l.byte_class['0'], l.byte_class['9']);
  EXPECT_EQ(l.byte_class['A'], l.byte_class['!']);
  EXPECT_NE(l.byte_class['A'], l.byte_class['a']);
}

// A nullable item repeated many times: after each byte the next may belong to any later copy,
// so a set holds a stack per copy and every transition passes every copy. Found by fuzz_gbnf
// (tests/data/fuzz_regressions/gbnf/: 19 s for 24 tokens before the work bounds). The bounded
// matcher must stay a narrowing: for texts this short, G{100000} allows exactly what G{40}
// allows, so every mask of the big grammar is a non-empty subset of the small one's.
TEST(Matcher, HugeNullableRepetitionIsBoundedAndOnlyNarrows) {
  const std::string item = "(\"ab\" | [^\\n\"ab{zN]? | [^&\"Vn])";
  auto big = CompileGbnf("root ::= " + item + "{100000} .?");
  auto small = CompileGbnf("root ::= " + item + "{40} .?");
  ASSERT_TRUE(big.ok()) << big.status().ToString();
  ASSERT_TRUE(small.ok()) << small.status().ToString();
  auto v = ByteVocab();
  Matcher m(*big, v), ref(*small, v);
  std::mt19937_64 rng(7);
  TokenMask mask, ref_mask;
  for (int step = 0; step < 16; ++step) {
    m.FillMask(&mask);
    ref.FillMask(&ref_mask);
    std::vector<int32_t> allowed;
    for (int32_t i = 0; i < mask.size(); ++i) {
      if (!mask.Test(i)) continue;
      ASSERT_TRUE(ref_mask.Test(i)) << "step " << step << " token " << i;
      if (!v->IsEos(i)) allowed.push_back(i);
    }
    ASSERT_FALSE(allowed.empty()) << "step " << step;
    const int32_t t = allowed[rng() % allowed.size()];
    ASSERT_TRUE(m.Accept(t));
    ASSERT_TRUE(ref.Accept(t));
  }
  EXPECT_GT(m.truncated(), 0);
  EXPECT_EQ(ref.truncated(), 0);
}

// An expansion that passes thousands of nullable items in a row must not recurse once per item:
// run on a thread with a 256 KiB stack (a recursive expansion needs megabytes here).
TEST(Matcher, LongNullableChainNeedsLittleStack) {
  auto g = CompileGbnf("root ::= ([a]?){50000} \"b\"");
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  auto v = ByteVocab();
  bool ok = false;
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 256 << 10), 0);
  struct Ctx {
    const Grammar* g;
    std::shared_ptr<const Vocabulary> v;
    bool* ok;
  } ctx{&*g, v, &ok};
  pthread_t t;
  ASSERT_EQ(pthread_create(
                &t, &attr,
                [](void* p) -> void* {
                  auto* c = static_cast<Ctx*>(p);
                  Matcher m(*c->g, c->v);
                  TokenMask mask;
                  m.FillMask(&mask);
                  // (The set is cut at kMaxStacks, so "b", reachable only past every copy, is
                  // not offered: a narrowing.)
                  *c->ok = mask.Test('a') && m.Accept('a') && m.truncated() > 0;
                  return nullptr;
                },
                &ctx),
            0);
  pthread_join(t, nullptr);
  pthread_attr_destroy(&attr);
  EXPECT_TRUE(ok);
}

TEST(Vocabulary, SpecialAndEmptyTokensNeverAllowed) {
  auto g = CompileGbnf("root ::= [a-z]*");
  ASSERT_TRUE(g.ok());
  auto v = Vocabulary::Create({"", "a", "b", "a"}, {0}, {2});
  Matcher m(*g, v);
  TokenMask mask;
  m.FillMask(&mask);
  EXPECT_EQ(MaskString(mask), "0 1 3 ");  // EOS (complete), a, the duplicate a; b is special
}

}  // namespace
}  // namespace chorus::grammar

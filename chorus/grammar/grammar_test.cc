// GBNF parsing, JSON-schema compilation (each keyword: what it admits and rejects), errors, and
// the grammar cache. Acceptance is checked with the Earley reference (matcher.h).
#include <gtest/gtest.h>

#include <random>
// std::regex is the oracle here. GCC 12's <regex> trips -Wmaybe-uninitialized inside its own
// automaton at -O1 (the sanitizer builds); the warning is about libstdc++, not this file.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <regex>

#include "chorus/grammar/json_schema.h"
#include "chorus/grammar/matcher.h"

namespace chorus::grammar {
namespace {

using json = nlohmann::json;

bool Accepts(const Grammar& g, std::string_view s) { return ReferenceRecognize(g, s) == 1; }

Grammar Gbnf(std::string_view text) {
  auto g = CompileGbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().ToString();
  return g.ok() ? *g : Grammar();
}

Grammar Schema(const json& s) {
  auto g = CompileJsonSchema(s);
  EXPECT_TRUE(g.ok()) << g.status().ToString() << " for " << s.dump();
  return g.ok() ? *g : Grammar();
}

std::string SchemaError(const json& s) {
  auto g = CompileJsonSchema(s);
  return g.ok() ? "" : g.status().message();
}

std::string GbnfError(std::string_view text) {
  auto g = CompileGbnf(text);
  return g.ok() ? "" : g.status().message();
}

TEST(Gbnf, LiteralsClassesRepetitionsGroupsComments) {
  Grammar g = Gbnf(R"(# a comment
root ::= greeting " " name{1,2} ("!" | "?")?   # trailing comment
greeting ::= "hi" | "h\x65llo" | "\u00e9t\u00E9"
name ::= [A-Z] [a-z-]* [^0-9\n]
)");
  EXPECT_TRUE(Accepts(g, "hi Bob"));
  EXPECT_TRUE(Accepts(g, "hello Ann!"));
  EXPECT_TRUE(Accepts(g, "\xC3\xA9t\xC3\xA9 Al-x?"));
  EXPECT_TRUE(Accepts(g, "hi AbAb"));  // name{1,2}
  EXPECT_FALSE(Accepts(g, "hi AbAbAb"));
  EXPECT_FALSE(Accepts(g, "hi B1"));
  EXPECT_FALSE(Accepts(g, "hi bob"));
  EXPECT_FALSE(Accepts(g, "hey Bob"));
}

TEST(Gbnf, RepetitionBoundsAndAnyChar) {
  Grammar g = Gbnf("root ::= \"a\"{2} \"b\"{1,} \"c\"{0,2} .+");
  EXPECT_TRUE(Accepts(g, "aab\xE2\x82\xAC"));
  EXPECT_TRUE(Accepts(g, "aabbbccz"));
  EXPECT_FALSE(Accepts(g, "abz"));
  EXPECT_FALSE(Accepts(g, "aab"));
  EXPECT_TRUE(Accepts(g, "aabcccc"));  // two c then . matches the rest
}

TEST(Gbnf, MultiLineRulesAndNestedGroups) {
  Grammar g = Gbnf("root ::=\n  (\n    \"x\"\n    | \"y\" )\n  | \"z\"\nother ::= \"q\"\n");
  EXPECT_TRUE(Accepts(g, "x"));
  EXPECT_TRUE(Accepts(g, "y"));
  EXPECT_TRUE(Accepts(g, "z"));
  EXPECT_FALSE(Accepts(g, "q"));
}

TEST(Gbnf, ErrorsNameLineAndColumn) {
  EXPECT_EQ(GbnfError("root ::= foo\n"), "GBNF line 1, column 10: rule 'foo' is not defined");
  EXPECT_EQ(GbnfError("a ::= \"x\"\n"), "GBNF: the grammar has no 'root' rule");
  EXPECT_EQ(GbnfError("root ::= \"x\"\nb = \"y\"\n"),
            "GBNF line 2, column 3: expected '::=' after rule name 'b'");
  EXPECT_EQ(GbnfError("root ::= \"abc\n"),
            "GBNF line 1, column 14: newline inside a literal or class");
  EXPECT_EQ(GbnfError("root ::= [z-a]"), "GBNF line 1, column 14: character range is reversed");
  EXPECT_EQ(GbnfError("root ::= \"a\"{3,1}"),
            "GBNF line 1, column 18: repetition {m,n} with n < m");
  EXPECT_EQ(GbnfError("root ::= \"\\q\""), "GBNF line 1, column 12: unknown escape '\\q'");
  EXPECT_EQ(GbnfError("root ::= (\"a\""), "GBNF line 1, column 14: expected ')'");
  EXPECT_EQ(GbnfError("root ::= \"a\"\nroot ::= \"b\""),
            "GBNF line 2, column 1: rule 'root' is defined twice");
  EXPECT_NE(GbnfError("root ::= root \"a\" | \"b\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(GbnfError("root ::= x* root\nx ::= \"\"").find("left-recursive"), std::string::npos);
  EXPECT_NE(GbnfError("root ::= " + std::string(300, '(')).find("nested too deeply"),
            std::string::npos);
}

TEST(JsonSchema, ObjectsPropertiesRequiredOrder) {
  Grammar g = Schema(
      {{"type", "object"},
       {"properties",
        {{"a", {{"type", "integer"}}}, {"b", {{"type", "string"}}}, {"c", {{"type", "boolean"}}}}},
       {"required", {"b"}}});
  EXPECT_TRUE(Accepts(g, R"({"b":"x"})"));
  EXPECT_TRUE(Accepts(g, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(Accepts(g, "{\n  \"a\": -12,\n  \"b\": \"\"\n}"));
  EXPECT_TRUE(Accepts(g, R"({"b":"x","c":false})"));
  EXPECT_FALSE(Accepts(g, R"({"a":1})"));               // b required
  EXPECT_FALSE(Accepts(g, R"({"b":"x","d":1})"));       // no extra properties by default
  EXPECT_FALSE(Accepts(g, R"({"b":"x",})"));            // no trailing comma
  EXPECT_FALSE(Accepts(g, R"({"b":"x"  ,"c":true})"));  // bounded whitespace: one space at most
  EXPECT_FALSE(Accepts(g, R"({"a":1.5,"b":"x"})"));
}

TEST(JsonSchema, OrderedSchemaKeepsThePropertyOrder) {
  const auto schema = nlohmann::ordered_json::parse(R"({"type": "object",
      "properties": {"zeta": {"type": "integer"}, "alpha": {"type": "object",
        "properties": {"y": {"type": "null"}, "x": {"type": "boolean"}}, "required": ["y", "x"]}},
      "required": ["zeta", "alpha"]})");
  auto g = CompileOrderedJsonSchema(schema);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_TRUE(Accepts(*g, R"({"zeta":1,"alpha":{"y":null,"x":true}})"));
  EXPECT_FALSE(Accepts(*g, R"({"alpha":{"y":null,"x":true},"zeta":1})"));
  EXPECT_FALSE(Accepts(*g, R"({"zeta":1,"alpha":{"x":true,"y":null}})"));
  // The plain json overload sorts.
  Grammar sorted = Schema(json::parse(schema.dump()));
  EXPECT_TRUE(Accepts(sorted, R"({"alpha":{"x":true,"y":null},"zeta":1})"));
  // Order is part of the cache key.
  auto again = CachedOrderedJsonSchema(schema);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(Accepts(*again, R"({"zeta":1,"alpha":{"y":null,"x":true}})"));
}

TEST(JsonSchema, AdditionalProperties) {
  Grammar g = Schema({{"type", "object"},
                      {"properties", {{"id", {{"type", "integer"}}}}},
                      {"additionalProperties", {{"type", "string"}}}});
  EXPECT_TRUE(Accepts(g, R"({"id":1,"x":"y","z":"w"})"));
  EXPECT_TRUE(Accepts(g, R"({"x":"y"})"));
  EXPECT_TRUE(Accepts(g, R"({"idx":"y"})"));
  EXPECT_FALSE(Accepts(g, R"({"id":1,"id":"y"})"));  // an extra key never repeats a declared one
  EXPECT_FALSE(Accepts(g, R"({"x":1})"));
  Grammar any = Schema({{"type", "object"}});
  EXPECT_TRUE(Accepts(any, R"({"k":[1,{"a":null}],"j":"s"})"));
  EXPECT_FALSE(Accepts(any, "[]"));
}

TEST(JsonSchema, ArraysItemsPrefixItemsBounds) {
  Grammar g = Schema(
      {{"type", "array"}, {"items", {{"type", "integer"}}}, {"minItems", 2}, {"maxItems", 3}});
  EXPECT_FALSE(Accepts(g, "[1]"));
  EXPECT_TRUE(Accepts(g, "[1,2]"));
  EXPECT_TRUE(Accepts(g, "[1, 2, 3]"));
  EXPECT_FALSE(Accepts(g, "[1,2,3,4]"));
  EXPECT_FALSE(Accepts(g, "[1,\"a\"]"));
  Grammar t = Schema({{"type", "array"},
                      {"prefixItems", {{{"type", "string"}}, {{"type", "null"}}}},
                      {"items", false}});
  EXPECT_TRUE(Accepts(t, "[]"));
  EXPECT_TRUE(Accepts(t, "[\"a\"]"));
  EXPECT_TRUE(Accepts(t, "[\"a\",null]"));
  EXPECT_FALSE(Accepts(t, "[null]"));
  EXPECT_FALSE(Accepts(t, "[\"a\",null,null]"));
  Grammar p = Schema({{"type", "array"},
                      {"prefixItems", {{{"const", 1}}}},
                      {"items", {{"type", "boolean"}}},
                      {"minItems", 2}});
  EXPECT_FALSE(Accepts(p, "[1]"));
  EXPECT_TRUE(Accepts(p, "[1,true]"));
  EXPECT_TRUE(Accepts(p, "[1,true,false,true]"));
  EXPECT_FALSE(Accepts(p, "[true,true]"));
  Grammar e = Schema({{"type", "array"}, {"maxItems", 0}});
  EXPECT_TRUE(Accepts(e, "[]"));
  EXPECT_FALSE(Accepts(e, "[1]"));
}

TEST(JsonSchema, StringsLengthsAndEscapes) {
  Grammar g = Schema({{"type", "string"}, {"minLength", 2}, {"maxLength", 3}});
  EXPECT_FALSE(Accepts(g, "\"a\""));
  EXPECT_TRUE(Accepts(g, "\"ab\""));
  EXPECT_TRUE(Accepts(g, "\"\xC3\xA9\\n\\u00e9\""));  // é, \n, \u00e9: three characters
  EXPECT_FALSE(Accepts(g, "\"abcd\""));
  EXPECT_FALSE(Accepts(g, "\"a\"b\""));
  EXPECT_FALSE(Accepts(g, "\"a\nb\""));      // raw control characters are not JSON
  EXPECT_FALSE(Accepts(g, "\"\\ud800x\""));  // no surrogate escapes (length would differ)
}

TEST(JsonSchema, EnumConstTypeUnionsNull) {
  Grammar g = Schema({{"enum", {"red", 2, nullptr, json::object({{"a", 1}}), json::array({1})}}});
  EXPECT_TRUE(Accepts(g, "\"red\""));
  EXPECT_TRUE(Accepts(g, "2"));
  EXPECT_TRUE(Accepts(g, "null"));
  EXPECT_TRUE(Accepts(g, "{\"a\":1}"));
  EXPECT_TRUE(Accepts(g, "[1]"));
  EXPECT_FALSE(Accepts(g, "\"blue\""));
  Grammar c = Schema({{"const", "x\"y"}});
  EXPECT_TRUE(Accepts(c, R"("x\"y")"));
  Grammar u = Schema({{"type", {"string", "null"}}, {"maxLength", 1}});
  EXPECT_TRUE(Accepts(u, "null"));
  EXPECT_TRUE(Accepts(u, "\"a\""));
  EXPECT_FALSE(Accepts(u, "\"ab\""));
  EXPECT_FALSE(Accepts(u, "1"));
  Grammar n = Schema({{"type", "number"}});
  for (const char* ok : {"0", "-1", "3.25", "1e5", "-0.5E-3"}) EXPECT_TRUE(Accepts(n, ok)) << ok;
  for (const char* bad : {"01", "1.", ".5", "+1", "1e", "NaN"})
    EXPECT_FALSE(Accepts(n, bad)) << bad;
}

TEST(JsonSchema, IntegerRangesExact) {
  for (auto [lo, hi] : std::vector<std::pair<int, int>>{
           {-123, 4567}, {0, 9}, {10, 99}, {5, 5}, {-50, -7}, {100, 1000}, {37, 412}}) {
    Grammar g = Schema({{"type", "integer"}, {"minimum", lo}, {"maximum", hi}});
    for (int v = -1200; v <= 5200; v += (v > -200 && v < 1200) ? 1 : 7) {
      ASSERT_EQ(Accepts(g, std::to_string(v)), v >= lo && v <= hi)
          << v << " in [" << lo << "," << hi << "]";
    }
    EXPECT_FALSE(Accepts(g, "-0"));
    EXPECT_FALSE(Accepts(g, "007"));
  }
  Grammar half = Schema({{"type", "integer"}, {"minimum", 3}});
  EXPECT_TRUE(Accepts(half, "3"));
  EXPECT_TRUE(Accepts(half, "123456789"));
  EXPECT_FALSE(Accepts(half, "2"));
  EXPECT_FALSE(Accepts(half, "-5"));
}

TEST(JsonSchema, PatternsAndFormats) {
  Grammar p = Schema({{"type", "string"}, {"pattern", "^[A-Z]{2}-\\d{3}(x|yz)?$"}});
  EXPECT_TRUE(Accepts(p, "\"AB-123\""));
  EXPECT_TRUE(Accepts(p, "\"AB-123yz\""));
  EXPECT_FALSE(Accepts(p, "\"AB-12\""));
  EXPECT_FALSE(Accepts(p, "\"xAB-123\""));
  Grammar q = Schema({{"type", "string"}, {"pattern", "a\\.b"}});  // unanchored: a search
  EXPECT_TRUE(Accepts(q, "\"xxa.byy\""));
  EXPECT_FALSE(Accepts(q, "\"axb\""));
  Grammar quote = Schema({{"type", "string"}, {"pattern", "^\"[^x]$"}});
  EXPECT_TRUE(Accepts(quote, "\"\\\"a\""));
  EXPECT_FALSE(Accepts(quote, "\"\\\"\\\"\""));  // a class never produces a quote
  Grammar d = Schema({{"type", "string"}, {"format", "date"}});
  EXPECT_TRUE(Accepts(d, "\"2024-02-28\""));
  EXPECT_TRUE(Accepts(d, "\"1999-12-31\""));
  EXPECT_FALSE(Accepts(d, "\"2024-02-30\""));
  EXPECT_FALSE(Accepts(d, "\"2024-04-31\""));
  EXPECT_FALSE(Accepts(d, "\"2024-13-01\""));
  Grammar dt = Schema({{"type", "string"}, {"format", "date-time"}});
  EXPECT_TRUE(Accepts(dt, "\"2024-01-02T03:04:05Z\""));
  EXPECT_TRUE(Accepts(dt, "\"2024-01-02T23:59:59.123+05:30\""));
  EXPECT_FALSE(Accepts(dt, "\"2024-01-02T24:00:00Z\""));
  Grammar t = Schema({{"type", "string"}, {"format", "time"}});
  EXPECT_TRUE(Accepts(t, "\"12:00:00Z\""));
  Grammar u = Schema({{"type", "string"}, {"format", "uuid"}});
  EXPECT_TRUE(Accepts(u, "\"123e4567-e89b-12d3-a456-426614174000\""));
  EXPECT_FALSE(Accepts(u, "\"123e4567e89b-12d3-a456-426614174000\""));
  Grammar e = Schema({{"type", "string"}, {"format", "email"}});
  EXPECT_TRUE(Accepts(e, "\"a.b+c@example.co.uk\""));
  EXPECT_FALSE(Accepts(e, "\"a@b\""));
}

TEST(JsonSchema, AnyOfOneOfRefRecursion) {
  json tree = {{"$defs",
                {{"node",
                  {{"type", "object"},
                   {"properties",
                    {{"v", {{"type", "integer"}}},
                     {"kids", {{"type", "array"}, {"items", {{"$ref", "#/$defs/node"}}}}}}},
                   {"required", {"v"}}}}}},
               {"$ref", "#/$defs/node"}};
  Grammar g = Schema(tree);
  EXPECT_TRUE(Accepts(g, R"({"v":1})"));
  // Properties come in the schema object's key order, which nlohmann::json sorts.
  EXPECT_TRUE(Accepts(g, R"({"kids":[{"kids":[{"v":3}],"v":2},{"v":4}],"v":1})"));
  EXPECT_FALSE(Accepts(g, R"({"v":1,"kids":[]})"));
  EXPECT_FALSE(Accepts(g, R"({"kids":[{"kids":[]}],"v":1})"));
  Grammar a = Schema(
      {{"anyOf",
        {{{"type", "integer"}},
         {{"type", "object"}, {"properties", {{"x", {{"type", "null"}}}}}, {"required", {"x"}}}}}});
  EXPECT_TRUE(Accepts(a, "7"));
  EXPECT_TRUE(Accepts(a, R"({"x":null})"));
  EXPECT_FALSE(Accepts(a, "\"7\""));
  Grammar o = Schema({{"oneOf", {{{"const", "a"}}, {{"const", "b"}}}}});
  EXPECT_TRUE(Accepts(o, "\"b\""));
  Grammar root_ref = Schema({{"type", "array"}, {"items", {{"$ref", "#"}}}, {"maxItems", 2}});
  EXPECT_TRUE(Accepts(root_ref, "[[],[[]]]"));
  Grammar defs = Schema({{"definitions", {{"s", {{"type", "string"}}}}},
                         {"$ref", "#/definitions/s"},
                         {"title", "t"},
                         {"description", "d"}});
  EXPECT_TRUE(Accepts(defs, "\"q\""));
}

TEST(JsonSchema, ErrorsNameTheKeyword) {
  EXPECT_EQ(SchemaError({{"type", "object"}, {"patternProperties", json::object()}}),
            "unsupported JSON schema keyword 'patternProperties' at #");
  EXPECT_EQ(
      SchemaError({{"type", "object"},
                   {"properties", {{"a", {{"type", "string"}, {"contentEncoding", "base64"}}}}}}),
      "unsupported JSON schema keyword 'contentEncoding' at #/properties/a");
  EXPECT_EQ(SchemaError({{"type", "integer"}, {"exclusiveMinimum", 1}}),
            "unsupported JSON schema keyword 'exclusiveMinimum' at #");
  EXPECT_EQ(SchemaError({{"type", "number"}, {"minimum", 1}}),
            "'minimum'/'maximum' are only supported on integers at #");
  EXPECT_EQ(
      SchemaError({{"type", "string"}, {"format", "ipv4"}}),
      "unsupported format 'ipv4' (supported: date, time, date-time, uuid, email) at #/format");
  EXPECT_EQ(SchemaError({{"type", "strin"}}), "unknown type \"strin\" at #/type");
  EXPECT_EQ(SchemaError({{"$ref", "#/$defs/missing"}}),
            "$ref '#/$defs/missing' points nowhere at #");
  EXPECT_EQ(SchemaError({{"$ref", "http://x/y"}}),
            "only local $ref (\"#...\") is supported, got 'http://x/y' at #");
  EXPECT_EQ(SchemaError({{"type", "string"}, {"pattern", "(a"}}),
            "pattern: missing ')' (position 2) at #/pattern");
  EXPECT_EQ(SchemaError({{"type", "string"}, {"pattern", "(?=a)"}}),
            "pattern: lookaround and named groups are not supported (position 1) at #/pattern");
  EXPECT_EQ(SchemaError({{"type", "string"}, {"pattern", "(a)\\1"}}),
            "pattern: backreferences are not supported (position 4) at #/pattern");
  EXPECT_EQ(SchemaError({{"type", "object"}, {"properties", {{"a", true}}}, {"required", {"b"}}}),
            "required property 'b' is not in 'properties' at #/required");
  EXPECT_EQ(SchemaError(json(false)), "schema 'false' can match nothing at #");
  EXPECT_EQ(SchemaError(json(3)), "a schema must be an object or a boolean at #");
  EXPECT_EQ(SchemaError({{"$ref", "#"}}).find("left-recursive") != std::string::npos, true);
  EXPECT_EQ(SchemaError({{"type", "array"}, {"minItems", 3}, {"maxItems", 2}}),
            "minItems above the number of items allowed at #");
}

// vLLM's guided_regex: raw text matching the whole regex. Oracle: std::regex (ECMAScript)
// regex_match over every string of up to 4 characters from a small alphabet, and random longer
// ones (ASCII, so bytes are characters; no \r, which ECMAScript's '.' also excludes).
TEST(Regex, RawTextMatchesWholeAsStdRegexMatches) {
  const std::vector<std::string> patterns = {
      "[a-c]+",        "ab|b1", "(?:ab)*1?", "a{2,3}b?", "\\d-[a-z]|1{2}",
      "[^a1]{1,3}",    ".b.",   "\\w+ \\w",  "\\s*a\\S", "(a|b)(1|-)+",
      "a\\.b|\\(x\\)", "^ab$",  "[-a]+",     "x?y?"};
  const std::string alphabet = "ab1- .\tx(\ny";
  std::mt19937 rng(5);
  for (const std::string& p : patterns) {
    auto g = CompileRegex(p, "");
    ASSERT_TRUE(g.ok()) << p << ": " << g.status().ToString();
    const std::regex oracle(p, std::regex::ECMAScript);
    std::vector<std::string> texts = {""};
    for (size_t k = 0; k < texts.size() && texts.size() < 20000; ++k) {
      if (texts[k].size() >= 3) continue;
      for (char c : alphabet) texts.push_back(texts[k] + c);
    }
    for (int i = 0; i < 300; ++i) {
      std::string t;
      for (int n = static_cast<int>(rng() % 9); n > 0; --n) t += alphabet[rng() % alphabet.size()];
      texts.push_back(t);
    }
    int matched = 0;
    for (const std::string& t : texts) {
      const bool want = std::regex_match(t, oracle);
      matched += want ? 1 : 0;
      EXPECT_EQ(Accepts(*g, t), want) << "/" << p << "/ on '" << t << "'";
    }
    EXPECT_GT(matched, 0) << p;  // both outcomes occur for every pattern
    EXPECT_LT(matched, static_cast<int>(texts.size())) << p;
  }
  // Unicode literals and classes are raw UTF-8; a class may produce quotes and backslashes.
  auto u = CompileRegex("caf\u00e9|[\"\\\\]", "");
  ASSERT_TRUE(u.ok()) << u.status().ToString();
  EXPECT_TRUE(Accepts(*u, "caf\xC3\xA9"));
  EXPECT_TRUE(Accepts(*u, "\""));
  EXPECT_TRUE(Accepts(*u, "\\"));
  EXPECT_FALSE(Accepts(*u, "cafe"));
}

TEST(Regex, ErrorsNameTheProblemAndPosition) {
  auto error = [](const std::string& p) { return CompileRegex(p, "").status().message(); };
  EXPECT_EQ(error("(a"), "regex: missing ')' (position 2)");
  EXPECT_EQ(error("a)"), "regex: unexpected ')' (position 1)");
  EXPECT_EQ(error("(?=a)"), "regex: lookaround and named groups are not supported (position 1)");
  EXPECT_EQ(error("(a)\\1"), "regex: backreferences are not supported (position 4)");
  EXPECT_EQ(error("a*?"), "regex: lazy and possessive quantifiers are not supported (position 2)");
  EXPECT_EQ(error(""), "regex: empty");
  EXPECT_EQ(CompileRegex("[", "guided_regex").status().message(),
            "regex: missing ']' (position 1) at guided_regex");
}

TEST(GrammarCache, CachesByKeyAndEvictsLeastRecent) {
  GrammarCache cache(2);
  int compiles = 0;
  auto compile = [&](const char* text) {
    return [&compiles, text] {
      ++compiles;
      return CompileGbnf(text);
    };
  };
  ASSERT_TRUE(cache.GetOrCompile("a", compile("root ::= \"a\"")).ok());
  ASSERT_TRUE(cache.GetOrCompile("a", compile("root ::= \"a\"")).ok());
  EXPECT_EQ(compiles, 1);
  ASSERT_TRUE(cache.GetOrCompile("b", compile("root ::= \"b\"")).ok());
  ASSERT_TRUE(cache.GetOrCompile("a", compile("root ::= \"a\"")).ok());  // a most recent
  ASSERT_TRUE(cache.GetOrCompile("c", compile("root ::= \"c\"")).ok());  // evicts b
  EXPECT_EQ(compiles, 3);
  ASSERT_TRUE(cache.GetOrCompile("a", compile("root ::= \"a\"")).ok());
  EXPECT_EQ(compiles, 3);
  ASSERT_TRUE(cache.GetOrCompile("b", compile("root ::= \"b\"")).ok());
  EXPECT_EQ(compiles, 4);
  EXPECT_FALSE(cache.GetOrCompile("bad2", compile("root ::= x")).ok());
  EXPECT_EQ(cache.size(), 2u);
}

TEST(GrammarAst, EmbedCombinesGrammars) {
  // A tool-call-shaped wrapper around two schemas (their shared rule names do not clash).
  auto a = JsonSchemaToAst(
      {{"type", "object"}, {"properties", {{"x", {{"type", "integer"}}}}}, {"required", {"x"}}});
  auto b = JsonSchemaToAst({{"type", "array"}, {"items", {{"type", "string"}, {"maxLength", 2}}}});
  ASSERT_TRUE(a.ok() && b.ok());
  GrammarAst g;
  const int ra = g.Embed(*a, "a_");
  const int rb = g.Embed(*b, "b_");
  g.root = g.Define("root",
                    Expr::Seq({Expr::Literal("<call>"), Expr::Alt({Expr::Ref(ra), Expr::Ref(rb)}),
                               Expr::Literal("</call>")}));
  auto lowered = Grammar::FromAst(g);
  ASSERT_TRUE(lowered.ok()) << lowered.status().ToString();
  EXPECT_TRUE(Accepts(*lowered, R"(<call>{"x": 3}</call>)"));
  EXPECT_TRUE(Accepts(*lowered, R"(<call>["ab", "c"]</call>)"));
  EXPECT_FALSE(Accepts(*lowered, R"(<call>["abc"]</call>)"));
  EXPECT_FALSE(Accepts(*lowered, R"(<call>{"y": 3}</call>)"));
}

TEST(JsonSchema, DeepNestingCompilesInLinearSize) {
  // 60 levels of arrays of objects of arrays: every level's item and property is a rule, so the
  // grammar grows linearly (copies would double per level).
  json s = {{"type", "integer"}};
  for (int i = 0; i < 30; ++i) {
    s = {{"type", "array"}, {"items", s}, {"minItems", 1}, {"maxItems", 3}};
    s = {{"type", "object"},
         {"properties", {{"a", s}, {"b", {{"type", "null"}}}}},
         {"required", {"a"}}};
  }
  auto g = CompileJsonSchema(s);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_LT(g->n_rules(), 5000);
  std::string text = "7";
  for (int i = 0; i < 30; ++i) text = "{\"a\":[" + text + "]}";
  EXPECT_TRUE(Accepts(*g, text));
}

TEST(JsonSchema, AnyJsonObject) {
  Grammar g = AnyJsonObjectGrammar();
  EXPECT_TRUE(Accepts(g, "{}"));
  EXPECT_TRUE(Accepts(g, R"({"a": [1, 2.5, "x", true, null, {"b": {}}]})"));
  EXPECT_FALSE(Accepts(g, "1"));
  EXPECT_FALSE(Accepts(g, R"({"a" 1})"));
}

}  // namespace
}  // namespace chorus::grammar

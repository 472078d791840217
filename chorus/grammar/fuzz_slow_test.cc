// test-labels: slow
// Runs the grammar fuzz entries (the bodies of fuzz/fuzz_gbnf.cc and fuzz/fuzz_json_schema.cc) on
// random mutations of valid GBNF grammars and of the schemas of
// tests/data/structured_output_schemas.json, with any compiler: byte edits and, for schemas,
// structure-aware edits (values replaced by odd ones, keywords swapped). Any crash, hang,
// sanitizer report or CHORUS_CHECK failure is a bug.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "chorus/grammar/fuzz_entry.h"

namespace chorus::grammar {
namespace {

using json = nlohmann::json;

std::string MutateBytes(std::string s, std::mt19937_64& rng) {
  static const char kAlphabet[] = "()[]{}|*+?^-\\\"':=,0123456789azAZ \n#.";
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    if (s.empty()) s.push_back('a');
    const size_t pos = rng() % s.size();
    switch (rng() % 5) {
      case 0:
        s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:
        s.erase(pos, 1 + rng() % 8);
        break;
      case 2:
        s.insert(pos, 1, kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
        break;
      case 3:
        s.resize(pos);
        break;
      default: {
        const size_t len = std::min<size_t>(1 + rng() % 32, s.size() - pos);
        s.insert(rng() % s.size(), s.substr(pos, len));
      }
    }
  }
  return s;
}

json OddValue(std::mt19937_64& rng) {
  switch (rng() % 12) {
    case 0:
      return nullptr;
    case 1:
      return -1;
    case 2:
      return 100000;
    case 3:
      return 2.5;
    case 4:
      return "x";
    case 5:
      return json::array();
    case 6:
      return json::object();
    case 7:
      return true;
    case 8:
      return json{{"$ref", "#"}};
    case 9:
      return json{{"type", "integer"}, {"minimum", 9}, {"maximum", 3}};
    case 10:
      return json{{"pattern", "(((a|b)*c{2,3})|[^x-z])+$"}};
    default:
      return json{{"anyOf", json::array({json{{"type", "null"}}, json{{"$ref", "#/$defs/none"}}})}};
  }
}

void MutateJson(json* j, std::mt19937_64& rng, int depth = 0) {
  if (j->is_object() && !j->empty()) {
    auto it = j->begin();
    std::advance(it, static_cast<long>(rng() % j->size()));
    if (rng() % 3 == 0 || depth > 6) {
      it.value() = OddValue(rng);
    } else {
      MutateJson(&it.value(), rng, depth + 1);
    }
  } else if (j->is_array() && !j->empty()) {
    MutateJson(&(*j)[rng() % j->size()], rng, depth + 1);
  } else {
    *j = OddValue(rng);
  }
}

TEST(GrammarFuzz, GbnfMutations) {
  const std::vector<std::string> seeds = {
      "root ::= \"{\" ws pair (\",\" ws pair)* \"}\"\npair ::= [a-z]+ \":\" ws value\n"
      "value ::= [0-9]{1,3} | \"true\" | root\nws ::= [ \\t\\n]?\n",
      "root ::= (\"ab\" | [^\\n\"]){2,5} .? # comment\n",
      "root ::=\n  x+\n  | \"\\u00e9\" y*\nx ::= [a-c] | \"\"\ny ::= (\"q\" x)?\n",
  };
  std::mt19937_64 rng(22);
  int compiled = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string s = seeds[static_cast<size_t>(i) % seeds.size()];
    if (i >= static_cast<int>(seeds.size())) s = MutateBytes(s, rng);
    compiled += FuzzGbnfInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
  }
  EXPECT_GT(compiled, 500);  // mutations still reach the matcher
}

TEST(GrammarFuzz, JsonSchemaMutations) {
  std::ifstream in(std::string(CHORUS_SOURCE_DIR) + "/tests/data/structured_output_schemas.json");
  const json schemas = json::parse(in);
  std::mt19937_64 rng(23);
  int compiled = 0;
  for (int i = 0; i < 20000; ++i) {
    json s = schemas[static_cast<size_t>(i) % schemas.size()]["schema"];
    std::string text;
    if (i % 3 == 0) {
      text = MutateBytes(s.dump(), rng);
    } else {
      MutateJson(&s, rng);
      text = s.dump();
    }
    compiled += FuzzJsonSchemaInput(reinterpret_cast<const uint8_t*>(text.data()), text.size());
  }
  EXPECT_GT(compiled, 1000);
}

}  // namespace
}  // namespace chorus::grammar

// test-labels: slow
// Runs the tokenizer.json fuzz entry (the body of fuzz/fuzz_tokenizer_json.cc) on a bounded
// number of random mutations of small valid files, with any compiler: byte-level edits (which
// mostly exercise the JSON parser) and structure-aware edits of the parsed document (which reach
// the tokenizer builder with wrong types, out-of-range ids, odd regexes and broken merges).
// Any crash, hang, sanitizer report or CHORUS_CHECK failure is a bug.
#include <nlohmann/json.hpp>
#include <random>

#include "chorus/tokenizer/fuzz_entry.h"
#include "tests/testutil/testutil.h"

namespace chorus::tokenizer {
namespace {

using Json = nlohmann::json;

std::string MutateBytes(std::string s, std::mt19937_64& rng) {
  const int edits = 1 + static_cast<int>(rng() % 4);
  for (int e = 0; e < edits; ++e) {
    if (s.empty()) s.push_back('{');
    const size_t pos = rng() % s.size();
    switch (rng() % 6) {
      case 0:
        s[pos] = static_cast<char>(s[pos] ^ (1 << (rng() % 8)));
        break;
      case 1:
        s.erase(pos, 1 + rng() % 16);
        break;
      case 2:
        s.insert(pos, 1, "{}[]\":,0-9e\\u"[rng() % 14]);
        break;
      case 3:
        s.resize(pos);
        break;
      case 4: {  // duplicate a range
        const size_t len = std::min<size_t>(1 + rng() % 64, s.size() - pos);
        s.insert(rng() % s.size(), s.substr(pos, len));
        break;
      }
      default:
        if (s[pos] >= '0' && s[pos] <= '9')
          s[pos] = static_cast<char>('0' + rng() % 10);
        else
          s[pos] = static_cast<char>(rng() % 256);
    }
  }
  return s;
}

Json RandomValue(std::mt19937_64& rng, const Json& sibling) {
  switch (rng() % 12) {
    case 0:
      return nullptr;
    case 1:
      return static_cast<bool>(rng() % 2);
    case 2:
      return -1;
    case 3:
      return int64_t{1} << (rng() % 63);
    case 4:
      return 1e300;
    case 5:
      return "";
    case 6:
      return "\u2581";
    case 7:
      return Json::array();
    case 8:
      return Json::object();
    case 9:
      return std::string("(") + "[\\p{L}" + "*+?"[rng() % 3];
    case 10:
      return sibling;  // duplicate a neighbour (same type, maybe wrong place)
    default:
      return static_cast<int64_t>(rng() % 600);
  }
}

// Picks a random node (walking down from the root) and replaces, deletes or duplicates it.
void MutateTree(Json& root, std::mt19937_64& rng) {
  Json* node = &root;
  Json* parent = nullptr;
  std::string key;
  size_t index = 0;
  const int depth = static_cast<int>(rng() % 6);
  for (int d = 0; d < depth; ++d) {
    if (node->is_object() && !node->empty()) {
      auto it = node->begin();
      std::advance(it, rng() % node->size());
      parent = node;
      key = it.key();
      node = &it.value();
    } else if (node->is_array() && !node->empty()) {
      parent = node;
      index = rng() % node->size();
      key.clear();
      node = &(*node)[index];
    } else {
      break;
    }
  }
  if (parent != nullptr && rng() % 5 == 0) {
    if (parent->is_object()) {
      parent->erase(key);
    } else {
      parent->erase(index);
    }
    return;
  }
  *node = RandomValue(rng, *node);
}

bool RunInput(const std::string& s) {
  return FuzzTokenizerJsonInput(reinterpret_cast<const uint8_t*>(s.data()), s.size());
}

TEST(TokenizerJsonFuzz, RandomMutationsNeverCrash) {
  std::mt19937_64 rng(20240611);
  const std::vector<std::string> seeds = TokenizerJsonFuzzSeeds();
  for (const auto& s : seeds) ASSERT_TRUE(RunInput(s));
  constexpr int kIterations = 20000;
  int parsed = 0;
  for (int i = 0; i < kIterations; ++i) {
    const std::string& seed = seeds[rng() % seeds.size()];
    std::string input;
    if (i % 2 == 0) {
      input = MutateBytes(seed, rng);
    } else {
      Json j = Json::parse(seed);
      const int edits = 1 + static_cast<int>(rng() % 3);
      for (int e = 0; e < edits; ++e) MutateTree(j, rng);
      input = j.dump();
    }
    parsed += RunInput(input);
  }
  // Structure-aware edits often keep the file valid (e.g. a changed score or an extra merge);
  // make sure the fuzzer really reaches the encoder.
  EXPECT_GT(parsed, kIterations / 20);
  std::printf("%d of %d mutants parsed\n", parsed, kIterations);
}

}  // namespace
}  // namespace chorus::tokenizer

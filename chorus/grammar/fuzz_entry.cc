#include "chorus/grammar/fuzz_entry.h"

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "chorus/base/check.h"
#include "chorus/grammar/json_schema.h"
#include "chorus/grammar/matcher.h"

namespace chorus::grammar {
namespace {

// Every byte as a token, a few multi-byte tokens, and an EOS (id 256).
std::shared_ptr<const Vocabulary> FuzzVocab() {
  static const auto v = [] {
    std::vector<std::string> b;
    for (int i = 0; i < 256; ++i) b.push_back(std::string(1, static_cast<char>(i)));
    b.push_back("");
    for (const char* s : {"{\"", "\":", "\", \"", "true", "null", "\xC3\xA9", "ab", "\n  "})
      b.push_back(s);
    return Vocabulary::Create(std::move(b), {256});
  }();
  return v;
}

void CheckStatus(const Status& s) {
  CHORUS_CHECK(s.code() == StatusCode::kInvalidArgument ||
               s.code() == StatusCode::kResourceExhausted)
      << s.ToString();
}

void Exercise(const Grammar& g, uint64_t seed) {
  auto vocab = FuzzVocab();
  Matcher m(g, vocab);
  TokenMask mask;
  for (int step = 0; step < 24 && !m.Done(); ++step) {
    // A grammar that has met the matcher's work bounds twice is a hostile one (a huge set of
    // stacks): each further mask repeats the bounded work (~12 ms in a release build,
    // docs/structured_outputs.md "Matcher"), which under the fuzzer's instrumentation would
    // only slow the search down. Two steps keep the narrowed state's invariants checked.
    if (m.truncated() >= 2) break;
    m.FillMask(&mask);
    CHORUS_CHECK_EQ(mask.Test(256), m.CanEnd());
    std::vector<int32_t> allowed;
    for (int32_t i = 0; i < vocab->size(); ++i) {
      if (mask.Test(i)) allowed.push_back(i);
    }
    // A token outside the mask is refused and leaves the state alone.
    for (int32_t i = 0; i < vocab->size(); i += 7) {
      if (!mask.Test(i)) CHORUS_CHECK(!m.Accept(i)) << "token " << i << " outside the mask";
    }
    if (allowed.empty()) break;
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    const int32_t t = allowed[(seed >> 33) % allowed.size()];
    CHORUS_CHECK(m.Accept(t)) << "token " << t << " in the mask refused";
  }
}

uint64_t Hash(const uint8_t* data, size_t size) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ull;
  return h;
}

}  // namespace

bool FuzzGbnfInput(const uint8_t* data, size_t size) {
  if (size > 4096) return false;  // bounded work per input
  auto g = CompileGbnf(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!g.ok()) {
    CheckStatus(g.status());
    return false;
  }
  Exercise(*g, Hash(data, size));
  return true;
}

bool FuzzJsonSchemaInput(const uint8_t* data, size_t size) {
  if (size > 4096) return false;
  const auto j = nlohmann::json::parse(data, data + size, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return false;
  auto g = CompileJsonSchema(j);
  if (!g.ok()) {
    CheckStatus(g.status());
    return false;
  }
  Exercise(*g, Hash(data, size));
  return true;
}

}  // namespace chorus::grammar

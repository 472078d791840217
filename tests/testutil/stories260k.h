// stories260K (../shared/models/stories260K, read in place), the model and tokenizer the
// engine's integration tests run. Header-only, so only the tests that include it link the model
// and tokenizer libraries. Call after CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin").
#pragma once

#include <memory>
#include <string>

#include "chorus/base/check.h"
#include "chorus/model/loader.h"
#include "chorus/tokenizer/tokenizer.h"
#include "tests/testutil/testutil.h"

namespace chorus::testing {

struct Stories260K {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tok;
};

inline Stories260K LoadStories260K() {
  const std::string dir = SharedModelsDir() + "/stories260K/";
  auto m = model::LoadModel(dir + "stories260K.bin");
  CHORUS_CHECK(m.ok()) << m.status().ToString();
  auto t = tokenizer::LoadTokenizer(dir + "tok512.bin");
  CHORUS_CHECK(t.ok()) << t.status().ToString();
  return {*m, std::shared_ptr<const tokenizer::Tokenizer>(std::move(*t))};
}

}  // namespace chorus::testing

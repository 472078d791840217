// Helpers shared by tests.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "chorus/base/status.h"

namespace chorus::testing {

// "<repo>/../shared/models" — real assets read in place, never copied into the repository.
std::string SharedModelsDir();
// True when the folder (or a file under it, e.g. "stories260K/stories260K.bin") exists.
bool HaveSharedModel(const std::string& relative);
// True when CHORUS_REQUIRE_MODELS=1 (CI): a missing asset is then a failure, not a skip.
bool ModelsRequired();
// A fresh empty temporary directory, removed at process exit.
std::string TempDir();

}  // namespace chorus::testing

// Skips the test (or fails it when CHORUS_REQUIRE_MODELS=1) unless ../shared/models/<rel> exists.
#define CHORUS_REQUIRE_SHARED_MODEL(rel)                                                       \
  do {                                                                                         \
    if (!::chorus::testing::HaveSharedModel(rel)) {                                            \
      if (::chorus::testing::ModelsRequired()) {                                               \
        FAIL() << "shared model asset missing (CHORUS_REQUIRE_MODELS=1): "                     \
               << ::chorus::testing::SharedModelsDir() << "/" << (rel);                        \
      }                                                                                        \
      GTEST_SKIP() << "shared model asset not found: " << ::chorus::testing::SharedModelsDir() \
                   << "/" << (rel) << " (tests read ../shared/models in place)";               \
    }                                                                                          \
  } while (0)

#define CHORUS_ASSERT_OK(expr)                             \
  do {                                                     \
    auto chorus_s_ = ::chorus::internal::AsStatus((expr)); \
    ASSERT_TRUE(chorus_s_.ok()) << chorus_s_.ToString();   \
  } while (0)
#define CHORUS_EXPECT_OK(expr)                             \
  do {                                                     \
    auto chorus_s_ = ::chorus::internal::AsStatus((expr)); \
    EXPECT_TRUE(chorus_s_.ok()) << chorus_s_.ToString();   \
  } while (0)

// The punica workload's row → adapter assignment (DESIGN §10): group counts and sizes.
#include "chorus/engine/bench.h"

#include <gtest/gtest.h>

#include <map>

namespace chorus::engine {
namespace {

std::vector<int64_t> GroupSizes(const std::vector<int>& rows) {
  std::map<int, int64_t> n;
  for (size_t i = 0; i < rows.size(); ++i) {
    ++n[rows[i]];
    if (i > 0) {
      EXPECT_GE(rows[i], rows[i - 1]) << "groups must be contiguous";
    }
  }
  std::vector<int64_t> out;
  int expect = 0;
  for (const auto& [g, c] : n) {
    EXPECT_EQ(g, expect++) << "adapter indices are 0..groups-1";
    out.push_back(c);
  }
  return out;
}

TEST(PunicaAssignmentTest, Batch32) {
  EXPECT_EQ(GroupSizes(PunicaAssignment("identical", 32)), (std::vector<int64_t>{32}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("distinct", 32)), std::vector<int64_t>(32, 1));
  // ⌈√32⌉ = 6 groups of 5 or 6 rows.
  const auto u = GroupSizes(PunicaAssignment("uniform", 32));
  ASSERT_EQ(u.size(), 6u);
  for (int64_t s : u) EXPECT_TRUE(s == 5 || s == 6) << s;
  // Sizes ×1.5: 1, 1.5, 2.25, 3.4, 5.1, 7.6 → 1, 2, 2, 3, 5, 8, then the remaining 11.
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 32)),
            (std::vector<int64_t>{1, 2, 2, 3, 5, 8, 11}));
}

TEST(PunicaAssignmentTest, SmallBatches) {
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 8)), (std::vector<int64_t>{1, 2, 2, 3}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("uniform", 8)).size(), 3u);
  EXPECT_EQ(GroupSizes(PunicaAssignment("skewed", 1)), (std::vector<int64_t>{1}));
  EXPECT_EQ(GroupSizes(PunicaAssignment("uniform", 1)), (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace chorus::engine

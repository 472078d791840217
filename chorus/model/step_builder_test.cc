#include "chorus/model/step_builder.h"

#include <gtest/gtest.h>

#include <vector>

namespace chorus::model {
namespace {

std::vector<int32_t> Vec(std::span<const int32_t> s) { return {s.begin(), s.end()}; }

TEST(StepBuilderTest, SequencesBecomeContiguousRowsWithTheirTablesAndLogitRows) {
  StepBuilder b(8, 3);
  const std::vector<int32_t> table_a = {4, 5}, table_b = {7}, table_c = {9};
  const std::vector<int32_t> prompt = {1, 10, 11, 12};
  const std::vector<int32_t> decode = {42};
  EXPECT_EQ(b.AddSequence(prompt, 0, table_a.data(), /*want_logits=*/true), 0);   // prefill
  EXPECT_EQ(b.AddSequence(decode, 17, table_b.data(), /*want_logits=*/true), 1);  // decode row
  EXPECT_EQ(b.AddSequence(std::span<const int32_t>(prompt).subspan(2), 2, table_c.data(),
                          /*want_logits=*/false),  // a chunk
            2);
  EXPECT_EQ(b.rows(), 7);
  EXPECT_EQ(b.seqs(), 3);
  const StepInput in = b.Input();
  EXPECT_EQ(Vec(in.tokens), (std::vector<int32_t>{1, 10, 11, 12, 42, 11, 12}));
  EXPECT_EQ(Vec(in.positions), (std::vector<int32_t>{0, 1, 2, 3, 17, 2, 3}));
  EXPECT_EQ(Vec(in.seq), (std::vector<int32_t>{0, 0, 0, 0, 1, 2, 2}));
  ASSERT_EQ(in.block_tables.size(), 3u);
  EXPECT_EQ(in.block_tables[0], table_a.data());
  EXPECT_EQ(in.block_tables[1], table_b.data());
  EXPECT_EQ(in.block_tables[2], table_c.data());
  EXPECT_EQ(Vec(in.logit_rows), (std::vector<int32_t>{3, 4}));  // last row of each that asks
  EXPECT_EQ(in.hook, nullptr);

  b.Clear();
  EXPECT_EQ(b.rows(), 0);
  EXPECT_EQ(b.seqs(), 0);
  EXPECT_EQ(b.AddSequence(decode, 5, table_a.data(), true), 0);
  EXPECT_EQ(Vec(b.Input().positions), (std::vector<int32_t>{5}));
}

}  // namespace
}  // namespace chorus::model

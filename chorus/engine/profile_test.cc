// chorus profile's measurement (engine/profile.h) on the embedded tiny shape: both clocks give a
// fitted file that says how it was timed, every step has a positive time, and the CPU clock is
// refused with more than one compute thread (the step would run on other threads too).
#include "chorus/engine/profile.h"

#include <gtest/gtest.h>

#include "chorus/model/synthetic.h"

namespace chorus::engine {
namespace {

TEST(ProfileTest, BothClocksProfileAndTheFileSaysWhich) {
  auto m = model::MakeSyntheticModel({.shape = "tiny"});
  ASSERT_TRUE(m.ok()) << m.status().message();
  std::shared_ptr<const model::Model> mdl = std::move(*m);
  for (bool cpu : {false, true}) {
    ProfileOptions o;
    o.threads = 1;
    o.samples = 24;
    o.repeats = 1;
    o.max_prefill = 32;
    o.max_decode = 4;
    o.max_context = 64;
    o.cpu_clock = cpu;
    auto r = RunProfile(mdl, o, [](const std::string&) {});
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_EQ(r->file.clock, cpu ? "thread-cpu" : "wall");
    EXPECT_EQ(r->train.size() + r->heldout.size(), 24u);
    for (const StepSample& s : r->train) EXPECT_GT(s.seconds, 0);
    auto back = CostModelFile::Parse(r->file.ToJson());
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(back->clock, r->file.clock);
  }
  ProfileOptions two;
  two.threads = 2;
  two.samples = 16;
  two.cpu_clock = true;
  auto r = RunProfile(mdl, two, [](const std::string&) {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--threads 1"), std::string::npos);
}

}  // namespace
}  // namespace chorus::engine

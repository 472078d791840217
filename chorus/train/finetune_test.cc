// The fine-tuning loop end to end on the real stories260K: the loss falls, the output is a PEFT
// adapter that the LoRA loader accepts, the same seed gives the same bytes with any thread
// count, a resumed run ends exactly where the uninterrupted one does, bad options are refused.
#include "chorus/train/finetune.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/mapped_file.h"
#include "chorus/model/loader.h"
#include "tests/testutil/testutil.h"

namespace chorus::train {
namespace {

struct Assets {
  std::shared_ptr<const model::Model> model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::string data;
};

Assets Load() {
  const std::string dir = testing::SharedModelsDir() + "/stories260K/";
  Assets a;
  a.model = *model::LoadModel(dir + "stories260K.bin");
  auto tok = tokenizer::LoadTokenizer(dir + "tok512.bin");
  a.tok = std::move(tok).value();
  // A small JSONL set: prompt/completion pairs in the stories' style.
  a.data = testing::TempDir() + "/train.jsonl";
  std::ofstream out(a.data);
  const char* names[] = {"Lily", "Tom", "Sue", "Ben", "Max", "Amy", "Sam", "Tim"};
  for (int i = 0; i < 24; ++i) {
    out << R"({"prompt": "Once upon a time, there was a girl named )" << names[i % 8]
        << R"(.", "completion": " She went to the beach with her kite."})"
        << "\n";
  }
  return a;
}

FinetuneOptions Options(const Assets& a, const std::string& out) {
  FinetuneOptions o;
  o.data_path = a.data;
  o.output_dir = out;
  o.lora.rank = 4;
  o.lora.alpha = 8;
  o.lora.targets = {model::Linear::kQ, model::Linear::kV, model::Linear::kDown};
  o.lr = 5e-3;
  o.steps = 6;
  o.batch = 2;
  o.grad_accum = 2;
  o.warmup = 1;
  o.data.seq_len = 64;
  o.save_every = 3;
  return o;
}

std::string Bytes(const std::string& path) { return *ReadFileToString(path); }

#define NEED_STORIES() CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin")

TEST(FinetuneTest, LossFallsAndTheAdapterLoads) {
  NEED_STORIES();
  Assets a = Load();
  const std::string out = testing::TempDir() + "/run";
  FinetuneOptions o = Options(a, out);
  o.steps = 12;
  std::vector<double> losses;
  ThreadPool pool(2);
  auto r = RunFinetune(a.model, *a.tok, o, &pool,
                       [&](const StepReport& s) { losses.push_back(s.loss); });
  CHORUS_ASSERT_OK(r.status());
  ASSERT_EQ(losses.size(), 12u);
  EXPECT_LT(losses.back(), 0.7 * losses.front());
  auto w = adapters::ReadPeftLora(out, a.model->config());
  CHORUS_ASSERT_OK(w.status());
  EXPECT_EQ(w->at(0, model::Linear::kQ).rank(), 4);
  EXPECT_FALSE(w->at(0, model::Linear::kK).present());
  CHORUS_EXPECT_OK(adapters::LoadLoraAdapter(out, a.model->config()).status());
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-12/optimizer.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(out + "/checkpoint-9/adapter_model.safetensors"));
  EXPECT_FALSE(std::filesystem::exists(out + "/checkpoint-6"));  // the latest two are kept
  // loss.csv: a header and one row per step.
  const std::string csv = Bytes(out + "/loss.csv");
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 13);
}

TEST(FinetuneTest, SameSeedSameAdapterWhateverTheThreads) {
  NEED_STORIES();
  Assets a = Load();
  const std::string o1 = testing::TempDir() + "/t1", o3 = testing::TempDir() + "/t3",
                    o4 = testing::TempDir() + "/t4";
  ThreadPool p1(1), p3(3);
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, Options(a, o1), &p1).status());
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, Options(a, o3), &p3).status());
  EXPECT_EQ(Bytes(o1 + "/adapter_model.safetensors"), Bytes(o3 + "/adapter_model.safetensors"));
  FinetuneOptions other = Options(a, o4);
  other.lora.seed = 2;
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, other, &p1).status());
  EXPECT_NE(Bytes(o1 + "/adapter_model.safetensors"), Bytes(o4 + "/adapter_model.safetensors"));
}

// Gradient accumulation is exactly a larger batch: the step's loss is the mean over all of its
// loss tokens, every kernel is batch-invariant and the weight gradients continue one chain over
// the micro-batches' rows in order, so the adapters are bitwise equal.
TEST(FinetuneTest, AccumulationEqualsALargerBatch) {
  NEED_STORIES();
  Assets a = Load();
  const std::string big = testing::TempDir() + "/big", acc = testing::TempDir() + "/acc";
  ThreadPool pool(2);
  FinetuneOptions o1 = Options(a, big);
  o1.batch = 4;
  o1.grad_accum = 1;
  FinetuneOptions o2 = Options(a, acc);
  o2.batch = 1;
  o2.grad_accum = 4;
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, o1, &pool).status());
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, o2, &pool).status());
  EXPECT_EQ(Bytes(big + "/adapter_model.safetensors"), Bytes(acc + "/adapter_model.safetensors"));
}

TEST(FinetuneTest, ResumeEndsWhereTheUninterruptedRunEnds) {
  NEED_STORIES();
  Assets a = Load();
  const std::string full = testing::TempDir() + "/full", part = testing::TempDir() + "/part";
  ThreadPool pool(2);
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, Options(a, full), &pool).status());
  // "Interrupted" after the checkpoint of step 3: a run of 3 steps with the same plan would
  // change the schedule, so stop the full run's twin by deleting its later state instead.
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, Options(a, part), &pool).status());
  std::filesystem::remove_all(part + "/checkpoint-6");
  std::filesystem::remove(part + "/adapter_model.safetensors");
  FinetuneOptions o = Options(a, part);
  o.resume = true;
  int64_t first_step = 0;
  CHORUS_ASSERT_OK(RunFinetune(a.model, *a.tok, o, &pool, [&](const StepReport& s) {
                     if (first_step == 0) first_step = s.step;
                   }).status());
  EXPECT_EQ(first_step, 4);
  EXPECT_EQ(Bytes(full + "/adapter_model.safetensors"), Bytes(part + "/adapter_model.safetensors"));
  EXPECT_EQ(Bytes(full + "/checkpoint-6/optimizer.safetensors"),
            Bytes(part + "/checkpoint-6/optimizer.safetensors"));
  // A resume with other options is refused, naming the checkpoint.
  o.lora.rank = 8;
  auto bad = RunFinetune(a.model, *a.tok, o, &pool);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("cannot resume from"), std::string::npos);
}

TEST(FinetuneTest, BadOptionsAreRefused) {
  NEED_STORIES();
  Assets a = Load();
  ThreadPool pool(1);
  auto expect_error = [&](FinetuneOptions o, const std::string& what) {
    auto r = RunFinetune(a.model, *a.tok, o, &pool);
    ASSERT_FALSE(r.ok()) << what;
    EXPECT_NE(r.status().message().find(what), std::string::npos) << r.status().message();
  };
  const std::string out = testing::TempDir() + "/bad";
  FinetuneOptions o = Options(a, out);
  o.lr = 0;
  expect_error(o, "--lr");
  o = Options(a, out);
  o.lora.rank = 0;
  expect_error(o, "rank");
  o = Options(a, out);
  o.data.seq_len = 100000;
  expect_error(o, "longer than the model's context");
  o = Options(a, out);
  o.data_path = "/nonexistent.jsonl";
  expect_error(o, "/nonexistent.jsonl");
}

}  // namespace
}  // namespace chorus::train

// test-labels: unit concurrency
// Fine-tuning jobs: Submit answers validating_files at once and the files are validated
// afterwards, off the caller's thread; validation failures name the line and never queue; jobs
// run in order,
// report steps and checkpoints, call on_success before they read "succeeded"; a queued job
// cancels at once, a running one before its next step, and neither leaves a final adapter.
#include "chorus/train/jobs.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "chorus/base/mapped_file.h"
#include "chorus/model/loader.h"
#include "tests/testutil/testutil.h"

namespace chorus::train {
namespace {

class JobsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
    const std::string dir = testing::SharedModelsDir() + "/stories260K/";
    model_ = *model::LoadModel(dir + "stories260K.bin");
    auto tok = tokenizer::LoadTokenizer(dir + "tok512.bin");
    tok_ = std::shared_ptr<const tokenizer::Tokenizer>(std::move(tok).value());
    data_ = testing::TempDir() + "/jobs.jsonl";
    std::ofstream out(data_);
    for (int i = 0; i < 8; ++i) {
      out << R"({"prompt": "Once upon a time", "completion": " there was a cat."})"
          << "\n";
    }
  }
  FinetuneOptions Options(const std::string& name, int64_t steps) {
    FinetuneOptions o;
    o.data_path = data_;
    o.output_dir = testing::TempDir() + "/" + name;
    o.lora.rank = 2;
    o.steps = steps;
    o.batch = 1;
    o.data.seq_len = 32;
    o.save_every = 2;
    return o;
  }
  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  std::string data_;
};

TEST_F(JobsTest, BadDataFailsValidationNamingTheLine) {
  JobQueue q(model_, tok_, 1);
  const std::string bad = testing::TempDir() + "/bad.jsonl";
  std::ofstream(bad) << R"({"prompt": "a", "completion": "b"})"
                     << "\n{oops\n";
  FinetuneOptions o = Options("bad", 2);
  o.data_path = bad;
  JobSnapshot submitted;
  EXPECT_EQ(*q.Submit("ftjob-bad", o, "", &submitted), JobState::kValidatingFiles);
  // As recorded, whatever the validator did since: what the create request answers.
  EXPECT_EQ(submitted.state, JobState::kValidatingFiles);
  EXPECT_EQ(submitted.id, "ftjob-bad");
  EXPECT_TRUE(submitted.error.empty());
  q.Wait("ftjob-bad");
  const JobSnapshot s = *q.Snapshot("ftjob-bad");
  EXPECT_EQ(s.state, JobState::kFailed);
  EXPECT_NE(s.error.find("line 2: invalid JSON"), std::string::npos) << s.error;
  EXPECT_EQ(s.events.back().level, "error");
  EXPECT_FALSE(q.Submit("ftjob-bad", Options("bad2", 1)).ok());  // duplicate id
}

TEST_F(JobsTest, RunsInOrderReportsAndCancels) {
  JobQueue q(model_, tok_, 2);
  std::atomic<int> successes{0};
  std::atomic<bool> was_running{false};
  q.set_on_success([&](const JobSnapshot& s) {
    ++successes;
    was_running = q.Snapshot(s.id)->state == JobState::kRunning;
    return OkStatus();
  });
  ASSERT_EQ(*q.Submit("a", Options("a", 4)), JobState::kValidatingFiles);
  ASSERT_EQ(*q.Submit("b", Options("b", 400)), JobState::kValidatingFiles);
  ASSERT_EQ(*q.Submit("c", Options("c", 2)), JobState::kValidatingFiles);
  CHORUS_ASSERT_OK(q.Cancel("c"));  // validating or queued behind a and b: final at once
  EXPECT_EQ(q.Snapshot("c")->state, JobState::kCancelled);
  q.Wait("a");
  const JobSnapshot a = *q.Snapshot("a");
  EXPECT_EQ(a.state, JobState::kSucceeded);
  EXPECT_EQ(a.step, 4);
  ASSERT_EQ(a.checkpoints.size(), 2u);
  EXPECT_EQ(a.checkpoints[1].step, 4);
  EXPECT_TRUE(std::filesystem::exists(a.output_dir + "/adapter_model.safetensors"));
  EXPECT_EQ(successes.load(), 1);
  EXPECT_TRUE(was_running.load());
  // b runs now; cancel it mid-run.
  while (q.Snapshot("b")->step < 1 && !JobStateFinal(q.Snapshot("b")->state)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHORUS_ASSERT_OK(q.Cancel("b"));
  q.Wait("b");
  const JobSnapshot b = *q.Snapshot("b");
  EXPECT_EQ(b.state, JobState::kCancelled);
  EXPECT_LT(b.step, 400);
  EXPECT_FALSE(std::filesystem::exists(b.output_dir + "/adapter_model.safetensors"));
  EXPECT_EQ(successes.load(), 1);
  EXPECT_FALSE(q.Cancel("nope").ok());
  EXPECT_EQ(q.Ids(), (std::vector<std::string>{"a", "b", "c"}));
}

// Jobs survive a restart: a running job interrupted by the shutdown (not a cancellation) and a
// queued one are queued again by the next JobQueue on the same state directory; the running one
// resumes from its latest checkpoint; finished and failed jobs are listed as they were.
TEST_F(JobsTest, JobsSurviveARestart) {
  const std::string state = testing::TempDir() + "/jobs-state";
  {
    auto q = JobQueue::Open(model_, tok_, 1, state);
    CHORUS_ASSERT_OK(q.status());
    ASSERT_EQ(*(*q)->Submit("done", Options("done", 2)), JobState::kValidatingFiles);
    (*q)->Wait("done");
    FinetuneOptions bad = Options("bad", 2);
    bad.data_path = "/nonexistent.jsonl";
    ASSERT_EQ(*(*q)->Submit("bad", bad), JobState::kValidatingFiles);
    (*q)->Wait("bad");
    ASSERT_EQ((*q)->Snapshot("bad")->state, JobState::kFailed);
    ASSERT_EQ(*(*q)->Submit("long", Options("long", 40)), JobState::kValidatingFiles);
    ASSERT_EQ(*(*q)->Submit("next", Options("next", 2)), JobState::kValidatingFiles);
    while ((*q)->Snapshot("long")->checkpoints.empty() &&
           !JobStateFinal((*q)->Snapshot("long")->state)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }  // "the server stops"
  auto q = JobQueue::Open(model_, tok_, 1, state);
  CHORUS_ASSERT_OK(q.status());
  EXPECT_EQ((*q)->Ids(), (std::vector<std::string>{"done", "bad", "long", "next"}));
  EXPECT_EQ((*q)->Snapshot("done")->state, JobState::kSucceeded);
  EXPECT_EQ((*q)->Snapshot("bad")->state, JobState::kFailed);
  EXPECT_NE((*q)->Snapshot("bad")->error.find("/nonexistent.jsonl"), std::string::npos);
  (*q)->Wait("long");
  (*q)->Wait("next");
  const JobSnapshot l = *(*q)->Snapshot("long");
  EXPECT_EQ(l.state, JobState::kSucceeded) << l.error;
  EXPECT_EQ(l.step, 40);
  bool resumed = false;
  for (const JobEvent& e : l.events) resumed = resumed || e.message == "Fine-tuning job resumed";
  EXPECT_TRUE(resumed);
  EXPECT_TRUE(std::filesystem::exists(l.output_dir + "/adapter_model.safetensors"));
  EXPECT_EQ((*q)->Snapshot("next")->state, JobState::kSucceeded);
  // A corrupt state file is an error naming it.
  const std::string bad_state = testing::TempDir() + "/jobs-bad";
  std::filesystem::create_directories(bad_state);
  std::ofstream(bad_state + "/jobs.json") << "{";
  auto broken = JobQueue::Open(model_, tok_, 1, bad_state);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.status().message().find("jobs.json"), std::string::npos);
}

// A corrupt jobs.json is refused with kDataLoss naming the problem (left as it is), or with
// recover_corrupt_state moved aside (kept byte for byte) and the queue starts with no jobs.
// One process per state directory.
TEST_F(JobsTest, CorruptStateIsRefusedOrQuarantined) {
  namespace fs = std::filesystem;
  const std::string state = testing::TempDir() + "/jobs-corrupt";
  {
    auto q = JobQueue::Open(model_, tok_, 1, state);
    CHORUS_ASSERT_OK(q.status());
    ASSERT_EQ(*(*q)->Submit("done", Options("done", 2)), JobState::kValidatingFiles);
    (*q)->Wait("done");
    EXPECT_EQ(JobQueue::Open(model_, tok_, 1, state).status().code(),
              StatusCode::kFailedPrecondition);
  }
  const std::string path = state + "/jobs.json";
  const std::string good = *ReadFileToString(path);
  nlohmann::json no_options = nlohmann::json::parse(good);
  no_options[0].erase("options");
  nlohmann::json bad_state = nlohmann::json::parse(good);
  bad_state[0]["state"] = "exploded";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {good.substr(0, good.size() / 2), "not valid JSON"},
      {"{}", "not a job list"},
      {no_options.dump(), "corrupt job done"},
      {bad_state.dump(), "unknown job state 'exploded'"}};
  for (const auto& [text, problem] : cases) {
    CHORUS_ASSERT_OK(WriteFileAtomically(path, text));
    auto refused = JobQueue::Open(model_, tok_, 1, state);
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << text.substr(0, 80);
    EXPECT_NE(refused.status().message().find(problem), std::string::npos)
        << refused.status().message();
    EXPECT_NE(refused.status().message().find(path), std::string::npos);
    EXPECT_EQ(*ReadFileToString(path), text) << "refused: left as it was";

    auto recovered = JobQueue::Open(model_, tok_, 1, state, {}, /*recover_corrupt_state=*/true);
    CHORUS_ASSERT_OK(recovered.status());
    EXPECT_TRUE((*recovered)->Ids().empty());
    int quarantined = 0;
    for (const auto& e : fs::directory_iterator(state)) {
      if (e.path().filename().string().rfind("jobs.json.corrupt-", 0) == 0) {
        ++quarantined;
        EXPECT_EQ(*ReadFileToString(e.path().string()), text);
        fs::remove(e.path());
      }
    }
    EXPECT_EQ(quarantined, 1);
  }
}

// A job records its owner (a tenant) in jobs.json — absent for an ownerless job, so older state
// files load unchanged; a bad one is kDataLoss — and keeps it when it is resumed after a
// restart, so on_success (where the server registers the adapter) sees the right owner.
TEST_F(JobsTest, OwnerIsPersistedAndKeptByAResumedJob) {
  const std::string state = testing::TempDir() + "/jobs-owned";
  {
    auto q = JobQueue::Open(model_, tok_, 1, state);
    CHORUS_ASSERT_OK(q.status());
    for (const char* bad : {"a b", "x/y", "t\xc3\xa9"}) {
      auto r = (*q)->Submit("bad-owner", Options("bad-owner", 2), bad);
      EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
      EXPECT_NE(r.status().message().find("owner"), std::string::npos);
    }
    EXPECT_FALSE((*q)->Snapshot("bad-owner").has_value());
    ASSERT_EQ(*(*q)->Submit("mine", Options("own-mine", 40), "acme"), JobState::kValidatingFiles);
    ASSERT_EQ(*(*q)->Submit("shared", Options("own-shared", 2)), JobState::kValidatingFiles);
    EXPECT_EQ((*q)->Snapshot("mine")->owner, "acme");
    EXPECT_EQ((*q)->Snapshot("shared")->owner, "");
    while ((*q)->Snapshot("mine")->checkpoints.empty() &&
           !JobStateFinal((*q)->Snapshot("mine")->state)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ASSERT_FALSE(JobStateFinal((*q)->Snapshot("mine")->state)) << "must be stopped mid-run";
  }  // "the server stops": both jobs resume at the next start
  const std::string path = state + "/jobs.json";
  const nlohmann::json saved = nlohmann::json::parse(*ReadFileToString(path));
  ASSERT_EQ(saved.size(), 2u);
  EXPECT_EQ(saved[0]["owner"], "acme");
  EXPECT_FALSE(saved[1].contains("owner")) << "ownerless: the field is absent";
  {
    std::mutex mu;
    std::map<std::string, std::string> registered;  // job → owner seen by on_success
    auto q = JobQueue::Open(model_, tok_, 1, state, {}, false, [&](const JobSnapshot& s) {
      std::lock_guard<std::mutex> l(mu);
      registered[s.id] = s.owner;
      return OkStatus();
    });
    CHORUS_ASSERT_OK(q.status());
    (*q)->Wait("mine");
    (*q)->Wait("shared");
    EXPECT_EQ((*q)->Snapshot("mine")->state, JobState::kSucceeded) << (*q)->Snapshot("mine")->error;
    EXPECT_EQ((*q)->Snapshot("mine")->owner, "acme");
    EXPECT_EQ((*q)->Snapshot("shared")->owner, "");
    std::lock_guard<std::mutex> l(mu);
    EXPECT_EQ(registered, (std::map<std::string, std::string>{{"mine", "acme"}, {"shared", ""}}));
  }
  // A bad owner is corruption naming the job and the field.
  const nlohmann::json good = nlohmann::json::parse(*ReadFileToString(path));
  for (const nlohmann::json& bad_owner :
       {nlohmann::json(""), nlohmann::json(3), nlohmann::json("a/b"), nlohmann::json(nullptr)}) {
    nlohmann::json j = good;
    j[1]["owner"] = bad_owner;
    CHORUS_ASSERT_OK(WriteFileAtomically(path, j.dump()));
    auto refused = JobQueue::Open(model_, tok_, 1, state);
    ASSERT_EQ(refused.status().code(), StatusCode::kDataLoss) << bad_owner.dump();
    EXPECT_NE(refused.status().message().find("corrupt job shared: 'owner'"), std::string::npos)
        << refused.status().message();
  }
}

// Submit never reads the data (OpenAI's create answers before validation): with a FIFO as the
// training file the validator blocks in open() until the test writes to it, yet Submit returns
// kValidatingFiles at once, snapshots and cancels are answered meanwhile, the jobs behind it wait
// in validating_files (validation is one job at a time, in order), and when the FIFO is released
// the job fails naming the file while the next one is validated, queued and run.
TEST_F(JobsTest, SubmitAnswersBeforeValidationAndValidatesInOrder) {
  const std::string fifo = testing::TempDir() + "/blocking.jsonl";
  std::filesystem::remove(fifo);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  JobQueue q(model_, tok_, 1);
  FinetuneOptions blocked = Options("blocked", 2);
  blocked.data_path = fifo;
  ASSERT_EQ(*q.Submit("blocked", blocked), JobState::kValidatingFiles);
  ASSERT_EQ(*q.Submit("next", Options("next", 2)), JobState::kValidatingFiles);
  ASSERT_EQ(*q.Submit("dropped", Options("dropped", 2)), JobState::kValidatingFiles);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(q.Snapshot("blocked")->state, JobState::kValidatingFiles);
  EXPECT_EQ(q.Snapshot("next")->state, JobState::kValidatingFiles) << "validated in order";
  CHORUS_ASSERT_OK(q.Cancel("dropped"));  // not validated yet: final at once
  EXPECT_EQ(q.Snapshot("dropped")->state, JobState::kCancelled);
  // Release the validator: the writer's open completes the reader's, which then finds a FIFO.
  const int fd = ::open(fifo.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ::close(fd);
  q.Wait("blocked");
  const JobSnapshot b = *q.Snapshot("blocked");
  EXPECT_EQ(b.state, JobState::kFailed);
  EXPECT_NE(b.error.find(fifo), std::string::npos) << b.error;
  EXPECT_NE(b.error.find("not a regular file"), std::string::npos) << b.error;
  q.Wait("next");
  const JobSnapshot n = *q.Snapshot("next");
  EXPECT_EQ(n.state, JobState::kSucceeded) << n.error;
  std::vector<std::string> seen;
  for (const JobEvent& e : n.events) seen.push_back(e.message.substr(0, 16));
  const std::vector<std::string> want = {"Validating train", "Files validated ", "Fine-tuning job ",
                                         "Step 1/2: traini"};
  ASSERT_GE(seen.size(), want.size());
  EXPECT_EQ(std::vector<std::string>(seen.begin(), seen.begin() + 4), want);
  EXPECT_EQ(q.Snapshot("dropped")->state, JobState::kCancelled);
  EXPECT_FALSE(std::filesystem::exists(testing::TempDir() + "/dropped/adapter_model.safetensors"));
  std::filesystem::remove(fifo);
}

// A job the process stopped while its files were being validated (jobs.json says
// validating_files) is validated again by the next Open: good data is queued and run, bad data
// fails naming the line — never resumed as if it had been queued.
TEST_F(JobsTest, JobStillValidatingAtAStopIsValidatedAgain) {
  const std::string state = testing::TempDir() + "/jobs-validating";
  std::filesystem::remove_all(state);
  {
    auto q = JobQueue::Open(model_, tok_, 1, state);
    CHORUS_ASSERT_OK(q.status());
    ASSERT_EQ(*(*q)->Submit("good", Options("revalidate-good", 2)), JobState::kValidatingFiles);
    (*q)->Wait("good");
  }
  const std::string path = state + "/jobs.json";
  nlohmann::json j = nlohmann::json::parse(*ReadFileToString(path));
  ASSERT_EQ(j.size(), 1u);
  // Rewind "good" to the moment Submit returned, and add a second job with a bad line.
  j[0]["state"] = "validating_files";
  j[0]["step"] = 0;
  j[0]["finished_at"] = 0;
  j[0]["checkpoints"] = nlohmann::json::array();
  j[0]["events"] = nlohmann::json::array({j[0]["events"][0]});
  std::filesystem::remove_all(testing::TempDir() + "/revalidate-good");
  const std::string bad = testing::TempDir() + "/revalidate-bad.jsonl";
  std::ofstream(bad) << R"({"prompt": "a", "completion": "b"})"
                     << "\n"
                     << R"({"prompt": "a"})"
                     << "\n";
  nlohmann::json b = j[0];
  b["id"] = "bad";
  b["options"]["data_path"] = bad;
  b["options"]["output_dir"] = testing::TempDir() + "/revalidate-bad";
  b["output_dir"] = b["options"]["output_dir"];
  j.push_back(b);
  CHORUS_ASSERT_OK(WriteFileAtomically(path, j.dump()));
  auto q = JobQueue::Open(model_, tok_, 1, state);
  CHORUS_ASSERT_OK(q.status());
  (*q)->Wait("good");
  (*q)->Wait("bad");
  const JobSnapshot g = *(*q)->Snapshot("good");
  EXPECT_EQ(g.state, JobState::kSucceeded) << g.error;
  EXPECT_EQ(g.step, 2);
  bool again = false, resumed = false;
  for (const JobEvent& e : g.events) {
    again = again || e.message == "Server restarted; validating files again";
    resumed = resumed || e.message == "Fine-tuning job resumed";
  }
  EXPECT_TRUE(again);
  EXPECT_FALSE(resumed) << "it never ran: started, not resumed";
  const JobSnapshot f = *(*q)->Snapshot("bad");
  EXPECT_EQ(f.state, JobState::kFailed);
  EXPECT_NE(f.error.find(bad + ": line 2"), std::string::npos) << f.error;
  EXPECT_FALSE(std::filesystem::exists(f.output_dir + "/adapter_model.safetensors"));
  // The outcome is persisted like any other change.
  const nlohmann::json after = nlohmann::json::parse(*ReadFileToString(path));
  EXPECT_EQ(after[0]["state"], "succeeded");
  EXPECT_EQ(after[1]["state"], "failed");
}

}  // namespace
}  // namespace chorus::train

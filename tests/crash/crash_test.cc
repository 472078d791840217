// Crash consistency (docs/adapters.md and docs/finetuning.md, "Durability"): a child process
// mutates a persistent store in a loop and is killed with SIGKILL — after a random delay, or at
// a chosen step of a file write through the CHORUS_CRASH_POINT hook (durable_file.h) — then the
// store is reopened and must hold exactly the state before or after the operation that was
// interrupted (the test replays the same deterministic operation sequence, and the child
// reports through a pipe which operations began and which returned), with no torn file and no
// temp file left behind. Stores: the adapter registry (register / replace / unregister with
// real PEFT and GGUF adapter files), the fine-tuning file store (add / delete), and fine-tuning
// checkpoints (a run killed at any step resumes and ends bitwise where the uninterrupted run
// ends), and the fine-tuning job queue (a job killed while queued or running is listed again
// and resumes to the same bytes).
//
// CHORUS_CRASH_ITERATIONS sets the registry's kill count (default 200); the file store runs half
// as many, the fine-tuning run a tenth and the job queue a twentieth (at least 5 each).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/adapters/lora/lora_files.h"
#include "chorus/adapters/registry.h"
#include "chorus/base/durable_file.h"
#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/formats/safetensors.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "chorus/train/file_store.h"
#include "chorus/train/finetune.h"
#include "chorus/train/jobs.h"
#include "tests/testutil/testutil.h"

namespace chorus {
namespace {

namespace fs = std::filesystem;

int Iterations() {
  const char* env = std::getenv("CHORUS_CRASH_ITERATIONS");
  const int n = env != nullptr ? std::atoi(env) : 200;
  return n > 0 ? n : 200;
}

// The steps of a file write a child can be stopped at (WriteFileAtomically's crash points).
const char* const kWritePoints[] = {"atomic_write.partial", "atomic_write.before_rename",
                                    "atomic_write.after_rename"};

// How one child was stopped.
struct KillPlan {
  std::string crash_point;  // "" = SIGKILL from the parent after delay_us
  int delay_us = 0;
};

KillPlan PlanKill(int iteration, std::mt19937& rng, int max_delay_us,
                  const std::vector<std::string>& points, int max_hit) {
  KillPlan k;
  // Every third child stops at a deterministic write step; the others at a random moment.
  if (iteration % 3 == 2) {
    k.crash_point = points[static_cast<size_t>(iteration / 3) % points.size()] + "@" +
                    std::to_string(std::uniform_int_distribution<int>(1, max_hit)(rng));
  } else {
    k.delay_us = std::uniform_int_distribution<int>(0, max_delay_us)(rng);
  }
  return k;
}

// The child's side of the progress pipe: "B k" before operation k, "D k" after it returned.
void Report(int fd, char what, int k) {
  const std::string line = std::string(1, what) + " " + std::to_string(k) + "\n";
  (void)!::write(fd, line.data(), line.size());
}

// Forks `body` (which must end with _exit), stops it as `plan` says, and returns the operations
// it reported: the last one begun (-1: none) and the last one that returned (-1: none).
struct ChildRun {
  int last_begun = -1, last_done = -1;
  bool killed = false;
};
template <typename Body>
ChildRun RunChild(const KillPlan& plan, Body body) {
  int fds[2];
  CHORUS_CHECK(::pipe(fds) == 0);
  const pid_t pid = ::fork();
  CHORUS_CHECK(pid >= 0);
  if (pid == 0) {
    ::close(fds[0]);
    if (!plan.crash_point.empty()) ::setenv("CHORUS_CRASH_POINT", plan.crash_point.c_str(), 1);
    body(fds[1]);
    ::_exit(0);
  }
  ::close(fds[1]);
  if (plan.crash_point.empty()) {
    ::usleep(static_cast<useconds_t>(plan.delay_us));
    ::kill(pid, SIGKILL);
  }
  int status = 0;
  CHORUS_CHECK(::waitpid(pid, &status, 0) == pid);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;)
    out.append(buf, static_cast<size_t>(n));
  ::close(fds[0]);
  ChildRun r;
  r.killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
  if (!r.killed) {
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the child failed (status " << status << ")";
  }
  std::istringstream in(out);
  std::string line;
  while (std::getline(in, line)) {
    if (line.size() < 3) continue;
    const int k = std::atoi(line.c_str() + 2);
    (line[0] == 'B' ? r.last_begun : r.last_done) = k;
  }
  return r;
}

// Every file directly in `dir` whose name matches a temp or quarantine pattern.
std::vector<std::string> Leftovers(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (IsAtomicWriteTempName(n) || n.starts_with(".tmp-") || n.find(".corrupt-") != n.npos)
      out.push_back(n);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The adapter registry.

struct Entry {
  std::string path;
  uint64_t version = 0;
  bool operator==(const Entry&) const = default;
};
struct RegistryModel {
  std::map<std::string, Entry> entries;
  uint64_t next_version = 1;
  bool operator==(const RegistryModel&) const = default;
};
struct RegistryOp {
  enum Kind { kAdd, kReplace, kRemove } kind;
  std::string name, path;
};

// The next operation, valid in state `m` (so the child never sees an error): a new name, a
// replacement with another adapter, or a removal.
RegistryOp NextRegistryOp(std::mt19937& rng, const RegistryModel& m,
                          const std::vector<std::string>& paths) {
  static const char* const kNames[] = {"n0", "n1", "n2", "n3", "org/n4", "n5"};
  std::vector<std::string> present, absent;
  for (const char* n : kNames) (m.entries.count(n) ? present : absent).push_back(n);
  const int pick = std::uniform_int_distribution<int>(0, 9)(rng);
  auto any = [&](const std::vector<std::string>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)];
  };
  const std::string path = any(paths);
  if (present.empty() || (pick < 4 && !absent.empty()))
    return {RegistryOp::kAdd, any(absent), path};
  if (pick < 8) return {RegistryOp::kReplace, any(present), path};
  return {RegistryOp::kRemove, any(present), ""};
}

void Apply(const RegistryOp& op, RegistryModel* m) {
  if (op.kind == RegistryOp::kRemove) {
    m->entries.erase(op.name);
  } else {
    m->entries[op.name] = Entry{op.path, m->next_version++};
  }
}

class CrashTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SetMinLogLevel(LogLevel::kError);
    tmp_ = fs::canonical(testing::TempDir()).string();
  }
  std::string tmp_;
};

TEST_F(CrashTest, RegistryIsOldOrNewAfterSigkill) {
  auto cfg = model::SyntheticConfig("tiny");
  CHORUS_ASSERT_OK(cfg.status());
  const std::string root = tmp_ + "/adapters", state_dir = tmp_ + "/state";
  const std::string state = state_dir + "/registry.json";
  fs::create_directories(root);
  fs::create_directories(state_dir);
  // Real adapter files: PEFT directories of several ranks and a GGUF LoRA.
  std::vector<std::string> paths;
  for (int i = 0; i < 4; ++i) {
    adapters::RandomLoraSpec s;
    s.rank = 2 + 2 * i;
    s.seed = 100 + static_cast<uint64_t>(i);
    paths.push_back(root + "/peft" + std::to_string(i));
    CHORUS_ASSERT_OK(
        adapters::WritePeftLora(paths.back(), adapters::MakeRandomLora(*cfg, s), *cfg));
  }
  {
    adapters::RandomLoraSpec s;
    s.rank = 4;
    s.targets = {model::Linear::kQ, model::Linear::kV};
    paths.push_back(root + "/lora.gguf");
    CHORUS_ASSERT_OK(
        adapters::WriteGgufLora(paths.back(), adapters::MakeRandomLora(*cfg, s), *cfg));
  }
  adapters::RegistryOptions ro;
  ro.adapter_roots = {root};
  ro.base = *cfg;
  ro.base_model_name = "tiny";

  const int iterations = Iterations();
  constexpr int kOpsPerChild = 40;
  std::mt19937 rng(20261125);
  RegistryModel model;
  int by_delay = 0, by_point = 0, mid_op = 0, temp_files_seen = 0, finished = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < iterations; ++it) {
    // The operations this child will run, planned from the current state.
    std::vector<RegistryOp> ops;
    std::vector<RegistryModel> after;  // after[k]: the state once ops[0..k] returned
    RegistryModel m = model;
    for (int k = 0; k < kOpsPerChild; ++k) {
      ops.push_back(NextRegistryOp(rng, m, paths));
      Apply(ops.back(), &m);
      after.push_back(m);
    }
    std::vector<std::string> points(std::begin(kWritePoints), std::end(kWritePoints));
    const KillPlan plan = PlanKill(it, rng, 60000, points, kOpsPerChild / 2);
    const ChildRun run = RunChild(plan, [&](int fd) {
      auto reg = adapters::AdapterRegistry::Open(state, ro);
      if (!reg.ok()) ::_exit(2);
      for (int k = 0; k < kOpsPerChild; ++k) {
        const RegistryOp& op = ops[static_cast<size_t>(k)];
        Report(fd, 'B', k);
        const Status s = op.kind == RegistryOp::kRemove
                             ? (*reg)->Unregister(op.name)
                             : internal::AsStatus((*reg)->Register(
                                   op.name, op.path, op.kind == RegistryOp::kReplace));
        if (!s.ok()) ::_exit(3);
        Report(fd, 'D', k);
      }
    });
    if (!run.killed) ++finished;
    (plan.crash_point.empty() ? by_delay : by_point) += run.killed ? 1 : 0;
    if (run.last_begun > run.last_done) ++mid_op;
    // Which states are allowed: every returned operation persisted; the interrupted one either.
    std::vector<RegistryModel> allowed;
    allowed.push_back(run.last_done >= 0 ? after[static_cast<size_t>(run.last_done)] : model);
    if (run.last_begun > run.last_done)
      allowed.push_back(after[static_cast<size_t>(run.last_begun)]);

    temp_files_seen += static_cast<int>(Leftovers(state_dir).size());
    auto reg = adapters::AdapterRegistry::Open(state, ro);
    ASSERT_TRUE(reg.ok()) << "iteration " << it << " (" << plan.crash_point
                          << "): " << reg.status().ToString();
    RegistryModel got;
    got.next_version = (*reg)->next_version();
    for (const adapters::AdapterInfo& a : (*reg)->List()) {
      got.entries[a.name] = Entry{a.path, a.version};
      EXPECT_TRUE(a.available) << a.name << ": " << a.problem;
    }
    const bool old_state = got == allowed[0];
    const bool new_state = allowed.size() > 1 && got == allowed[1];
    ASSERT_TRUE(old_state || new_state)
        << "iteration " << it << ": the registry after the kill (" << plan.crash_point
        << (plan.crash_point.empty() ? "delay " + std::to_string(plan.delay_us) + " us" : "")
        << ", op " << run.last_begun << " begun, " << run.last_done
        << " returned) is neither the state before nor after the interrupted operation";
    model = got;
    // The reopened registry removed the temp files; nothing else is there.
    EXPECT_TRUE(Leftovers(state_dir).empty()) << "iteration " << it;
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(state_dir)) files.insert(e.path().filename());
    EXPECT_EQ(files, (std::set<std::string>{"registry.json", "registry.json.lock"}));
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "registry crash test: %d/%d restarts consistent in %.1f s (%d killed after a random delay, "
      "%d at a write step, %d ran to the end; %d interrupted mid-operation; %d temp files left "
      "by killed writers, all removed)\n",
      iterations, iterations, secs, by_delay, by_point, finished, mid_op, temp_files_seen);
  EXPECT_GT(mid_op, iterations / 4) << "too few kills landed inside an operation";
  EXPECT_GT(model.next_version, 1u);
}

// ---------------------------------------------------------------------------------------------
// The fine-tuning file store.

struct StoredModel {
  std::vector<std::pair<std::string, std::string>> files;  // (filename, content), oldest first
  bool operator==(const StoredModel&) const = default;
};

TEST_F(CrashTest, FileStoreIsOldOrNewAfterSigkill) {
  const std::string dir = tmp_ + "/files";
  const int iterations = std::max(1, Iterations() / 2);
  constexpr int kOpsPerChild = 30;
  std::mt19937 rng(7);
  StoredModel model;
  int counter = 0, mid_op = 0;
  // Two of three files are owned by a tenant (so their `<id>.owner` files go through the kills
  // too); the owner follows from the name "f<N>.jsonl".
  auto owner_of = [](const std::string& name) {
    const int n = std::stoi(name.substr(1));
    return n % 3 == 0 ? std::string() : "tenant-" + std::to_string(n % 3);
  };
  for (int it = 0; it < iterations; ++it) {
    // Operation k: add a new file (index = -1) or delete the file at `index`.
    std::vector<std::pair<int, std::string>> ops;
    std::vector<StoredModel> after;
    StoredModel m = model;
    for (int k = 0; k < kOpsPerChild; ++k) {
      const bool add = m.files.size() < 2 || std::uniform_int_distribution<int>(0, 2)(rng) != 0;
      if (add) {
        const std::string name = "f" + std::to_string(counter++) + ".jsonl";
        std::string content;
        const int lines = std::uniform_int_distribution<int>(1, 400)(rng);
        for (int l = 0; l < lines; ++l)
          content += "{\"text\": \"" + name + " line " + std::to_string(l) + "\"}\n";
        ops.emplace_back(-1, content);
        m.files.emplace_back(name, content);
      } else {
        const int at =
            std::uniform_int_distribution<int>(0, static_cast<int>(m.files.size()) - 1)(rng);
        ops.emplace_back(at, "");
        m.files.erase(m.files.begin() + at);
      }
      after.push_back(m);
    }
    std::vector<std::string> points(std::begin(kWritePoints), std::end(kWritePoints));
    const KillPlan plan = PlanKill(it, rng, 30000, points, kOpsPerChild);
    const StoredModel before = model;
    const ChildRun run = RunChild(plan, [&](int fd) {
      auto s = train::FileStore::Open(dir);
      if (!s.ok()) ::_exit(2);
      for (int k = 0; k < kOpsPerChild; ++k) {
        Report(fd, 'B', k);
        const auto& [at, content] = ops[static_cast<size_t>(k)];
        Status st;
        if (at < 0) {
          const std::string name =
              after[static_cast<size_t>(k)].files.back().first;  // the one this op adds
          st = internal::AsStatus((*s)->Add(name, "fine-tune", content, owner_of(name)));
        } else {
          st = (*s)->Delete((*s)->List()[static_cast<size_t>(at)].id);
        }
        if (!st.ok()) ::_exit(3);
        Report(fd, 'D', k);
      }
    });
    std::vector<StoredModel> allowed;
    allowed.push_back(run.last_done >= 0 ? after[static_cast<size_t>(run.last_done)] : before);
    if (run.last_begun > run.last_done) {
      ++mid_op;
      allowed.push_back(after[static_cast<size_t>(run.last_begun)]);
    }
    auto s = train::FileStore::Open(dir);
    ASSERT_TRUE(s.ok()) << "iteration " << it << ": " << s.status().ToString();
    StoredModel got;
    std::set<std::string> expected_files = {"files.json", ".lock"};
    for (const train::StoredFile& f : (*s)->List()) {
      auto content = ReadFileToString(f.path);
      ASSERT_TRUE(content.ok()) << content.status().ToString();
      EXPECT_EQ(static_cast<int64_t>(content->size()), f.bytes);
      got.files.emplace_back(f.filename, *content);
      expected_files.insert(fs::path(f.path).filename());
      EXPECT_EQ(f.owner, owner_of(f.filename)) << "iteration " << it;
      if (!f.owner.empty()) {
        expected_files.insert(f.id + ".owner");
        auto owner = ReadFileToString(dir + "/" + f.id + ".owner");
        EXPECT_TRUE(owner.ok() && *owner == f.owner) << "iteration " << it << ": " << f.id;
      }
    }
    ASSERT_TRUE(got == allowed[0] || (allowed.size() > 1 && got == allowed[1]))
        << "iteration " << it << " (" << plan.crash_point << "): the file store holds "
        << got.files.size() << " files, neither the state before nor after operation "
        << run.last_begun;
    model = got;
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(dir)) files.insert(e.path().filename());
    if (!fs::exists(dir + "/files.json")) expected_files.erase("files.json");
    EXPECT_EQ(files, expected_files) << "iteration " << it << ": orphaned or temp files";
  }
  std::printf("file store crash test: %d/%d restarts consistent (%d interrupted mid-operation)\n",
              iterations, iterations, mid_op);
}

// ---------------------------------------------------------------------------------------------
// Fine-tuning checkpoints.

TEST_F(CrashTest, FinetuneResumesFromACompleteCheckpointAfterSigkill) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  const std::string mdir = testing::SharedModelsDir() + "/stories260K/";
  auto model = model::LoadModel(mdir + "stories260K.bin");
  CHORUS_ASSERT_OK(model.status());
  auto tok = tokenizer::LoadTokenizer(mdir + "tok512.bin");
  CHORUS_ASSERT_OK(tok.status());
  const std::string data = tmp_ + "/train.jsonl";
  {
    std::ofstream out(data);
    for (int i = 0; i < 16; ++i) {
      out << R"({"prompt": "Once upon a time there was a cat number )" << i
          << R"(.", "completion": " It liked to play in the sun."})"
          << "\n";
    }
  }
  auto options = [&](const std::string& out) {
    train::FinetuneOptions o;
    o.data_path = data;
    o.output_dir = out;
    o.lora.rank = 4;
    o.lora.alpha = 8;
    o.lora.targets = {model::Linear::kQ, model::Linear::kV};
    o.lr = 5e-3;
    o.steps = 12;
    o.batch = 2;
    o.warmup = 1;
    o.data.seq_len = 48;
    o.save_every = 1;
    return o;
  };
  // The uninterrupted run: the reference bytes.
  const std::string ref = tmp_ + "/reference";
  {
    ThreadPool pool(1);
    CHORUS_ASSERT_OK(train::RunFinetune(*model, **tok, options(ref), &pool).status());
  }
  const std::string ref_weights = *ReadFileToString(ref + "/adapter_model.safetensors");
  const auto t_ref0 = std::chrono::steady_clock::now();
  {
    ThreadPool pool(1);
    CHORUS_ASSERT_OK(train::RunFinetune(*model, **tok, options(tmp_ + "/timing"), &pool).status());
  }
  const int run_us = static_cast<int>(std::chrono::duration_cast<std::chrono::microseconds>(
                                          std::chrono::steady_clock::now() - t_ref0)
                                          .count());

  const int iterations = std::max(5, Iterations() / 10);
  std::mt19937 rng(99);
  const std::vector<std::string> points = {"atomic_write.partial", "atomic_write.before_rename",
                                           "checkpoint.after_adapter", "checkpoint.before_rename",
                                           "checkpoint.after_rename"};
  for (int it = 0; it < iterations; ++it) {
    const std::string out = tmp_ + "/run" + std::to_string(it);
    // Killed up to three times in a row, then resumed to the end.
    for (int kill = 0; kill < 3; ++kill) {
      const KillPlan plan = PlanKill(it * 3 + kill, rng, run_us, points, 8);
      train::FinetuneOptions o = options(out);
      o.resume = true;
      RunChild(plan, [&](int) {
        ThreadPool pool(1);
        if (!train::RunFinetune(*model, **tok, o, &pool).ok()) ::_exit(3);
      });
      // Every visible checkpoint is complete and loadable.
      if (!fs::exists(out)) continue;
      for (const auto& e : fs::directory_iterator(out)) {
        const std::string n = e.path().filename();
        if (!n.starts_with("checkpoint-")) continue;
        for (const char* f : {"adapter_config.json", "adapter_model.safetensors",
                              "optimizer.safetensors", "trainer_state.json"}) {
          EXPECT_TRUE(fs::exists(e.path() / f)) << "torn checkpoint " << e.path() << ": no " << f;
        }
        CHORUS_EXPECT_OK(adapters::ReadPeftLora(e.path().string(), (*model)->config()).status());
        CHORUS_EXPECT_OK(
            formats::SafetensorsFile::Open((e.path() / "optimizer.safetensors").string()).status());
      }
    }
    train::FinetuneOptions o = options(out);
    o.resume = true;
    {
      ThreadPool pool(1);
      auto r = train::RunFinetune(*model, **tok, o, &pool);
      ASSERT_TRUE(r.ok()) << "iteration " << it << ": --resume failed: " << r.status().ToString();
    }
    EXPECT_EQ(*ReadFileToString(out + "/adapter_model.safetensors"), ref_weights)
        << "iteration " << it << ": the resumed run does not end where the uninterrupted one does";
    EXPECT_TRUE(Leftovers(out).empty()) << "iteration " << it << ": temp files left";
    // loss.csv: one whole row per step.
    auto csv = ReadFileToString(out + "/loss.csv");
    CHORUS_ASSERT_OK(csv.status());
    std::istringstream in(*csv);
    std::string line;
    std::getline(in, line);
    int64_t step = 0;
    while (std::getline(in, line)) EXPECT_EQ(std::atoll(line.c_str()), ++step) << line;
    EXPECT_EQ(step, 12);
  }
  std::printf("finetune crash test: %d/%d runs killed three times resumed to the reference bytes\n",
              iterations, iterations);
}

// ---------------------------------------------------------------------------------------------
// The fine-tuning job queue: a child submits a job and runs it; killed at any moment, the queue
// reopened on the same state directory lists the job iff its submission may have happened (and
// surely once Submit returned), resumes it, and the job ends on the uninterrupted run's bytes.

TEST_F(CrashTest, JobQueueResumesJobsAfterSigkill) {
  CHORUS_REQUIRE_SHARED_MODEL("stories260K/stories260K.bin");
  const std::string mdir = testing::SharedModelsDir() + "/stories260K/";
  auto model = model::LoadModel(mdir + "stories260K.bin");
  CHORUS_ASSERT_OK(model.status());
  auto tok_or = tokenizer::LoadTokenizer(mdir + "tok512.bin");
  CHORUS_ASSERT_OK(tok_or.status());
  const std::shared_ptr<const tokenizer::Tokenizer> tok(std::move(tok_or).value());
  const std::string data = tmp_ + "/jobs.jsonl";
  {
    std::ofstream out(data);
    for (int i = 0; i < 8; ++i) {
      out << R"({"prompt": "Once upon a time", "completion": " there was a dog )" << i << R"(."})"
          << "\n";
    }
  }
  auto options = [&](const std::string& out) {
    train::FinetuneOptions o;
    o.data_path = data;
    o.output_dir = out;
    o.lora.rank = 2;
    o.steps = 8;
    o.batch = 1;
    o.data.seq_len = 32;
    o.save_every = 1;
    return o;
  };
  std::string ref_weights;
  int run_us = 0;
  {
    ThreadPool pool(1);
    const auto t0 = std::chrono::steady_clock::now();
    CHORUS_ASSERT_OK(train::RunFinetune(*model, *tok, options(tmp_ + "/jobref"), &pool).status());
    run_us = static_cast<int>(
        std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - t0)
            .count());
    ref_weights = *ReadFileToString(tmp_ + "/jobref/adapter_model.safetensors");
  }
  const int iterations = std::max(5, Iterations() / 20);
  std::mt19937 rng(5);
  const std::vector<std::string> points = {"atomic_write.partial", "atomic_write.before_rename",
                                           "atomic_write.after_rename", "checkpoint.before_rename"};
  int listed_after_kill = 0;
  for (int it = 0; it < iterations; ++it) {
    const std::string state = tmp_ + "/jobstate" + std::to_string(it);
    const std::string out = tmp_ + "/jobout" + std::to_string(it);
    const KillPlan plan = PlanKill(it, rng, run_us * 3 / 2, points, 6);
    const ChildRun run = RunChild(plan, [&](int fd) {
      auto q = train::JobQueue::Open(*model, tok, 1, state);
      if (!q.ok()) ::_exit(2);
      Report(fd, 'B', 0);
      if (!(*q)->Submit("job", options(out)).ok()) ::_exit(3);
      Report(fd, 'D', 0);
      (*q)->Wait("job");
      ::_exit((*q)->Snapshot("job")->state == train::JobState::kSucceeded ? 0 : 4);
    });
    auto q = train::JobQueue::Open(*model, tok, 1, state);
    ASSERT_TRUE(q.ok()) << "iteration " << it << ": " << q.status().ToString();
    const bool listed = (*q)->Snapshot("job").has_value();
    if (run.last_done >= 0) {
      EXPECT_TRUE(listed) << "iteration " << it << ": a submitted job is lost";
    }
    if (run.last_begun < 0) {
      EXPECT_FALSE(listed) << "iteration " << it << ": a job that was never submitted";
    }
    if (listed) {
      ++listed_after_kill;
    } else {
      CHORUS_ASSERT_OK((*q)->Submit("job", options(out)).status());
    }
    (*q)->Wait("job");
    const auto snap = (*q)->Snapshot("job");
    ASSERT_EQ(snap->state, train::JobState::kSucceeded)
        << "iteration " << it << ": " << snap->error;
    EXPECT_EQ(*ReadFileToString(out + "/adapter_model.safetensors"), ref_weights)
        << "iteration " << it;
    q->reset();
    EXPECT_TRUE(Leftovers(state).empty()) << "iteration " << it;
    EXPECT_TRUE(Leftovers(out).empty()) << "iteration " << it;
  }
  std::printf(
      "job queue crash test: %d/%d restarts consistent (%d jobs found persisted after the "
      "kill and resumed)\n",
      iterations, iterations, listed_after_kill);
}

}  // namespace
}  // namespace chorus

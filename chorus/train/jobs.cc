#include "chorus/train/jobs.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>

namespace chorus::train {
namespace {

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* JobStateName(JobState s) {
  switch (s) {
    case JobState::kValidatingFiles:
      return "validating_files";
    case JobState::kQueued:
      return "queued";
    case JobState::kRunning:
      return "running";
    case JobState::kSucceeded:
      return "succeeded";
    case JobState::kFailed:
      return "failed";
    default:
      return "cancelled";
  }
}

bool JobStateFinal(JobState s) {
  return s == JobState::kSucceeded || s == JobState::kFailed || s == JobState::kCancelled;
}

JobQueue::JobQueue(std::shared_ptr<const model::Model> model,
                   std::shared_ptr<const tokenizer::Tokenizer> tok, int threads)
    : model_(std::move(model)), tok_(std::move(tok)), pool_(threads) {
  worker_ = std::thread([this] { Worker(); });
}

JobQueue::~JobQueue() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto& [id, j] : jobs_) j->cancel.store(true);
  }
  cv_.notify_all();
  worker_.join();
}

void JobQueue::set_on_success(std::function<void(const JobSnapshot&)> fn) {
  std::lock_guard<std::mutex> l(mu_);
  on_success_ = std::move(fn);
}

void JobQueue::AddEvent(Job& j, const std::string& level, const std::string& message) {
  j.snap.events.push_back({Now(), level, message});
}

Result<JobState> JobQueue::Submit(const std::string& id, FinetuneOptions opts) {
  Job* job = nullptr;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (jobs_.count(id)) return InvalidArgumentError("job " + id + " already exists");
    auto j = std::make_unique<Job>();
    j->snap.id = id;
    j->snap.created_at = Now();
    j->snap.output_dir = opts.output_dir;
    j->snap.state = JobState::kValidatingFiles;
    AddEvent(*j, "info", "Validating training file: " + opts.data_path);
    job = j.get();
    jobs_.emplace(id, std::move(j));
    order_.push_back(id);
  }
  // Validation outside the lock: reading and tokenizing the files may take a moment.
  Status st = OkStatus();
  int64_t n_train = 0;
  if (auto s = LoadSamples(opts.data_path, *tok_, opts.data); !s.ok()) {
    st = s.status();
  } else {
    n_train = static_cast<int64_t>(s->size());
    if (!opts.eval_path.empty()) {
      if (auto e = LoadSamples(opts.eval_path, *tok_, opts.data); !e.ok()) st = e.status();
    }
  }
  std::lock_guard<std::mutex> l(mu_);
  if (!st.ok()) {
    job->snap.state = JobState::kFailed;
    job->snap.error = st.message();
    job->snap.finished_at = Now();
    AddEvent(*job, "error", "Validation failed: " + st.message());
    cv_.notify_all();
    return JobState::kFailed;
  }
  if (job->cancel.load()) {
    job->snap.state = JobState::kCancelled;
    job->snap.finished_at = Now();
    cv_.notify_all();
    return JobState::kCancelled;
  }
  opts.cancel = &job->cancel;
  job->opts = std::move(opts);
  job->snap.state = JobState::kQueued;
  AddEvent(*job, "info",
           "Files validated (" + std::to_string(n_train) + " training samples); job queued");
  queue_.push_back(id);
  cv_.notify_all();
  return JobState::kQueued;
}

std::optional<JobSnapshot> JobQueue::Snapshot(const std::string& id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return std::nullopt;
  return it->second->snap;
}

std::vector<std::string> JobQueue::Ids() const {
  std::lock_guard<std::mutex> l(mu_);
  return order_;
}

Status JobQueue::Cancel(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFoundError("no fine-tuning job " + id);
  Job& j = *it->second;
  if (JobStateFinal(j.snap.state)) return OkStatus();
  j.cancel.store(true);
  if (j.snap.state == JobState::kQueued) {  // never started: final at once
    std::erase(queue_, id);
    j.snap.state = JobState::kCancelled;
    j.snap.finished_at = Now();
    AddEvent(j, "info", "Job cancelled");
    cv_.notify_all();
  }
  return OkStatus();
}

void JobQueue::Wait(const std::string& id) {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] {
    auto it = jobs_.find(id);
    return it == jobs_.end() || JobStateFinal(it->second->snap.state);
  });
}

void JobQueue::Worker() {
  for (;;) {
    Job* job = nullptr;
    FinetuneOptions opts;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) {
        for (const std::string& id : queue_) {
          Job& j = *jobs_[id];
          j.snap.state = JobState::kCancelled;
          j.snap.finished_at = Now();
        }
        queue_.clear();
        cv_.notify_all();
        return;
      }
      job = jobs_[queue_.front()].get();
      queue_.pop_front();
      job->snap.state = JobState::kRunning;
      AddEvent(*job, "info", "Fine-tuning job started");
      opts = job->opts;
    }
    cv_.notify_all();
    auto progress = [&](const StepReport& r) {
      std::lock_guard<std::mutex> l(mu_);
      job->snap.step = r.step;
      job->snap.total_steps = r.total_steps;
      job->snap.trained_tokens = r.tokens;
      char msg[160];
      std::snprintf(msg, sizeof msg, "Step %lld/%lld: training loss=%.4f",
                    static_cast<long long>(r.step), static_cast<long long>(r.total_steps), r.loss);
      AddEvent(*job, "info", msg);
      if (r.checkpoint) {
        job->snap.checkpoints.push_back(
            {r.step,
             (std::filesystem::path(opts.output_dir) / ("checkpoint-" + std::to_string(r.step)))
                 .string(),
             r.loss, r.eval_loss});
      }
    };
    auto res = RunFinetune(model_, *tok_, opts, &pool_, progress);
    std::function<void(const JobSnapshot&)> on_success;
    JobSnapshot snap;
    {
      std::lock_guard<std::mutex> l(mu_);
      on_success = on_success_;
      snap = job->snap;
    }
    if (res.ok() && on_success) on_success(snap);
    std::lock_guard<std::mutex> l(mu_);
    job->snap.finished_at = Now();
    if (res.ok()) {
      job->snap.state = JobState::kSucceeded;
      AddEvent(*job, "info", "The job has successfully completed");
    } else if (res.status().code() == StatusCode::kCancelled) {
      job->snap.state = JobState::kCancelled;
      AddEvent(*job, "info", "Job cancelled");
    } else {
      job->snap.state = JobState::kFailed;
      job->snap.error = res.status().message();
      AddEvent(*job, "error", "Job failed: " + res.status().message());
    }
    cv_.notify_all();
  }
}

}  // namespace chorus::train

#include "chorus/train/jobs.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/train/file_store.h"

namespace chorus::train {
namespace {

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

using json = nlohmann::json;

json OptionsJson(const FinetuneOptions& o) {
  json targets = json::array();
  for (model::Linear l : o.lora.targets) targets.push_back(static_cast<int>(l));
  return {{"data_path", o.data_path},
          {"eval_path", o.eval_path},
          {"output_dir", o.output_dir},
          {"rank", o.lora.rank},
          {"alpha", o.lora.alpha},
          {"targets", targets},
          {"seed", o.lora.seed},
          {"lr", o.lr},
          {"epochs", o.epochs},
          {"steps", o.steps},
          {"batch", o.batch},
          {"grad_accum", o.grad_accum},
          {"warmup", o.warmup},
          {"schedule", ScheduleName(o.schedule)},
          {"clip", o.clip},
          {"beta1", o.adamw.beta1},
          {"beta2", o.adamw.beta2},
          {"eps", o.adamw.eps},
          {"weight_decay", o.adamw.weight_decay},
          {"save_every", o.save_every},
          {"seq_len", o.data.seq_len},
          {"max_file_bytes", o.data.max_file_bytes},
          {"chat_template", o.data.chat_template},
          {"base_model_name", o.base_model_name}};
}

Result<FinetuneOptions> OptionsFromJson(const json& j) {
  try {
    FinetuneOptions o;
    o.data_path = j.at("data_path");
    o.eval_path = j.at("eval_path");
    o.output_dir = j.at("output_dir");
    o.lora.rank = j.at("rank");
    o.lora.alpha = j.at("alpha");
    o.lora.targets.clear();
    for (const json& t : j.at("targets")) {
      const int v = t.get<int>();
      if (v < 0 || v >= model::kNumLinears) return InvalidArgumentError("bad target");
      o.lora.targets.push_back(static_cast<model::Linear>(v));
    }
    o.lora.seed = j.at("seed");
    o.lr = j.at("lr");
    o.epochs = j.at("epochs");
    o.steps = j.at("steps");
    o.batch = j.at("batch");
    o.grad_accum = j.at("grad_accum");
    o.warmup = j.at("warmup");
    CHORUS_ASSIGN_OR_RETURN(o.schedule, ParseSchedule(j.at("schedule").get<std::string>()));
    o.clip = j.at("clip");
    o.adamw.beta1 = j.at("beta1");
    o.adamw.beta2 = j.at("beta2");
    o.adamw.eps = j.at("eps");
    o.adamw.weight_decay = j.at("weight_decay");
    o.save_every = j.at("save_every");
    o.data.seq_len = j.at("seq_len");
    o.data.max_file_bytes = j.at("max_file_bytes");
    o.data.chat_template = j.at("chat_template");
    o.base_model_name = j.at("base_model_name");
    return o;
  } catch (const json::exception& e) {
    return InvalidArgumentError(std::string("bad job options: ") + e.what());
  }
}

Result<JobState> ParseJobState(const std::string& s) {
  for (JobState st : {JobState::kValidatingFiles, JobState::kQueued, JobState::kRunning,
                      JobState::kSucceeded, JobState::kFailed, JobState::kCancelled}) {
    if (s == JobStateName(st)) return st;
  }
  return InvalidArgumentError("unknown job state '" + s + "'");
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
  validator_ = std::thread([this] { Validator(); });
}

Result<std::unique_ptr<JobQueue>> JobQueue::Open(
    std::shared_ptr<const model::Model> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
    int threads, std::string state_dir, StepHooks hooks, bool recover_corrupt_state,
    std::function<Status(const JobSnapshot&)> on_success) {
  std::vector<std::unique_ptr<Job>> loaded;
  FileLock lock;
  if (!state_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(state_dir, ec);
    if (ec) return InternalError("cannot create " + state_dir + ": " + ec.message());
    CHORUS_ASSIGN_OR_RETURN(lock, FileLock::Acquire(state_dir + "/jobs.lock",
                                                    "the fine-tuning job state " + state_dir));
    // Temp files of a writer killed before its rename: never read.
    RemoveAtomicWriteTempFiles(state_dir, "jobs.json");
    const std::string path = (std::filesystem::path(state_dir) / "jobs.json").string();
    // Every problem is kDataLoss naming the file, the job and the field.
    auto read = [&]() -> Status {
      if (!std::filesystem::exists(path, ec)) return OkStatus();
      auto text = ReadFileToString(path);
      if (!text.ok()) {
        if (text.status().code() == StatusCode::kNotFound) return text.status();
        return DataLossError(path + ": unreadable job state: " + text.status().message());
      }
      const json j = json::parse(*text, nullptr, false);
      if (j.is_discarded()) return DataLossError(path + ": corrupt job state: not valid JSON");
      if (!j.is_array()) return DataLossError(path + ": corrupt job state: not a job list");
      std::set<std::string> ids;
      for (const json& e : j) {
        auto job = std::make_unique<Job>();
        const std::string which = e.is_object() && e.contains("id") && e["id"].is_string()
                                      ? e["id"].get<std::string>()
                                      : "?";
        try {
          job->snap.id = e.at("id");
          if (e.contains("owner")) {  // absent: no owner (also every file written before owners)
            const json& o = e["owner"];
            if (!o.is_string() || !IsValidOwnerName(o.get<std::string>())) {
              return DataLossError(path + ": corrupt job " + which +
                                   ": 'owner' is not a tenant name (1-64 characters of "
                                   "[A-Za-z0-9._-])");
            }
            job->snap.owner = o.get<std::string>();
          }
          auto st = ParseJobState(e.at("state"));
          if (!st.ok())
            return DataLossError(path + ": corrupt job " + which + ": " + st.status().message());
          job->snap.state = *st;
          job->snap.error = e.at("error");
          job->snap.step = e.at("step");
          job->snap.total_steps = e.at("total_steps");
          job->snap.trained_tokens = e.at("trained_tokens");
          job->snap.created_at = e.at("created_at");
          job->snap.finished_at = e.at("finished_at");
          job->snap.output_dir = e.at("output_dir");
          for (const json& ev : e.at("events")) {
            job->snap.events.push_back({ev.at("created_at"), ev.at("level"), ev.at("message")});
          }
          for (const json& c : e.at("checkpoints")) {
            JobCheckpoint cp{c.at("step"), c.at("path"), c.at("train_loss"), std::nullopt};
            if (c.contains("eval_loss")) cp.eval_loss = c["eval_loss"].get<double>();
            job->snap.checkpoints.push_back(cp);
          }
          auto opts = OptionsFromJson(e.at("options"));
          if (!opts.ok()) {
            return DataLossError(path + ": corrupt job " + which + ": " + opts.status().message());
          }
          job->opts = std::move(*opts);
        } catch (const json::exception& ex) {
          return DataLossError(path + ": corrupt job " + which + ": " + ex.what());
        }
        if (!ids.insert(job->snap.id).second) {
          return DataLossError(path + ": corrupt job state: job " + which + " listed twice");
        }
        loaded.push_back(std::move(job));
      }
      return OkStatus();
    };
    Status st = read();
    if (!st.ok() && st.code() == StatusCode::kDataLoss && recover_corrupt_state) {
      CHORUS_ASSIGN_OR_RETURN(const std::string moved, QuarantineFile(path));
      CHORUS_LOG(ERROR) << "fine-tuning job state " << path << " is corrupt and was moved aside to "
                        << moved << "; starting with no jobs (" << st.message() << ")";
      loaded.clear();
    } else {
      CHORUS_RETURN_IF_ERROR(st);
    }
  }
  auto q = std::make_unique<JobQueue>(std::move(model), std::move(tok), threads);
  std::lock_guard<std::mutex> l(q->mu_);
  q->state_dir_ = std::move(state_dir);
  q->lock_ = std::move(lock);

  q->hooks_ = std::move(hooks);
  q->on_success_ = std::move(on_success);
  for (auto& job : loaded) {
    const std::string id = job->snap.id;
    if (job->snap.state == JobState::kValidatingFiles) {
      // Stopped before its files were validated (it never ran): validated again, in the order
      // the jobs were submitted, ahead of anything submitted from now on.
      job->snap.events.push_back({Now(), "info", "Server restarted; validating files again"});
      q->validate_.push_back(id);
    } else if (!JobStateFinal(job->snap.state)) {
      // Interrupted by a stop: queued again, resuming from its latest checkpoint.
      job->snap.state = JobState::kQueued;
      job->opts.resume = true;
      job->snap.events.push_back({Now(), "info", "Server restarted; job queued to resume"});
      q->queue_.push_back(id);
    }
    job->opts.cancel = &job->cancel;
    q->order_.push_back(id);
    q->jobs_.emplace(id, std::move(job));
  }
  q->Persist();
  q->cv_.notify_all();
  return q;
}

void JobQueue::Persist() const {
  if (state_dir_.empty()) return;
  json list = json::array();
  for (const std::string& id : order_) {
    const Job& j = *jobs_.at(id);
    json events = json::array(), checkpoints = json::array();
    for (const JobEvent& e : j.snap.events) {
      events.push_back({{"created_at", e.created_at}, {"level", e.level}, {"message", e.message}});
    }
    for (const JobCheckpoint& c : j.snap.checkpoints) {
      json cj = {{"step", c.step}, {"path", c.path}, {"train_loss", c.train_loss}};
      if (c.eval_loss) cj["eval_loss"] = *c.eval_loss;
      checkpoints.push_back(cj);
    }
    json e = {{"id", j.snap.id},
              {"state", JobStateName(j.snap.state)},
              {"error", j.snap.error},
              {"step", j.snap.step},
              {"total_steps", j.snap.total_steps},
              {"trained_tokens", j.snap.trained_tokens},
              {"created_at", j.snap.created_at},
              {"finished_at", j.snap.finished_at},
              {"output_dir", j.snap.output_dir},
              {"events", events},
              {"checkpoints", checkpoints},
              {"options", OptionsJson(j.opts)}};
    if (!j.snap.owner.empty()) e["owner"] = j.snap.owner;  // absent: no owner
    list.push_back(std::move(e));
  }
  // A failed write loses only this update; the next change writes the whole list again.
  // Error messages may quote training data that is not UTF-8: replaced, never thrown.
  (void)WriteFileAtomically((std::filesystem::path(state_dir_) / "jobs.json").string(),
                            list.dump(1, ' ', false, nlohmann::json::error_handler_t::replace));
}

JobQueue::~JobQueue() { Stop(); }

void JobQueue::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
    for (auto& [id, j] : jobs_) j->cancel.store(true);
  }
  cv_.notify_all();
  if (worker_.joinable()) worker_.join();
  if (validator_.joinable()) validator_.join();
}

void JobQueue::set_step_hooks(StepHooks hooks) {
  std::lock_guard<std::mutex> l(mu_);
  hooks_ = std::move(hooks);
}

void JobQueue::set_on_success(std::function<Status(const JobSnapshot&)> fn) {
  std::lock_guard<std::mutex> l(mu_);
  on_success_ = std::move(fn);
}

void JobQueue::AddEvent(Job& j, const std::string& level, const std::string& message) {
  j.snap.events.push_back({Now(), level, message});
}

Result<JobState> JobQueue::Submit(const std::string& id, FinetuneOptions opts,
                                  const std::string& owner, JobSnapshot* submitted) {
  if (!owner.empty() && !IsValidOwnerName(owner)) {
    return InvalidArgumentError("owner must be a tenant name (1-64 characters of [A-Za-z0-9._-])");
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    if (jobs_.count(id)) return InvalidArgumentError("job " + id + " already exists");
    auto j = std::make_unique<Job>();
    j->snap.id = id;
    j->snap.owner = owner;
    j->snap.created_at = Now();
    j->snap.output_dir = opts.output_dir;
    j->snap.state = JobState::kValidatingFiles;
    j->opts = std::move(opts);
    j->opts.cancel = &j->cancel;
    AddEvent(*j, "info", "Validating training file: " + j->opts.data_path);
    if (submitted) *submitted = j->snap;
    jobs_.emplace(id, std::move(j));
    order_.push_back(id);
    validate_.push_back(id);
    // Persisted before Submit returns: a job the caller was told about survives a kill (and is
    // validated again at the next Open).
    Persist();
  }
  cv_.notify_all();
  return JobState::kValidatingFiles;
}

void JobQueue::Validator() {
  for (;;) {
    std::string id;
    FinetuneOptions opts;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !validate_.empty(); });
      if (stop_) return;  // jobs still to validate stay validating_files (persisted)
      id = validate_.front();
      validate_.pop_front();
      opts = jobs_.at(id)->opts;
    }
    // Outside the lock: reading and tokenizing a large file takes a while, and nothing else
    // (snapshots, cancels, the running job's progress) may wait for it.
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
    if (stop_) return;  // stopped meanwhile: validated again at the next Open
    Job& job = *jobs_.at(id);
    if (job.snap.state != JobState::kValidatingFiles) continue;  // cancelled meanwhile
    if (!st.ok()) {
      job.snap.state = JobState::kFailed;
      job.snap.error = st.message();
      job.snap.finished_at = Now();
      AddEvent(job, "error", "Validation failed: " + st.message());
    } else {
      job.snap.state = JobState::kQueued;
      AddEvent(job, "info",
               "Files validated (" + std::to_string(n_train) + " training samples); job queued");
      queue_.push_back(id);
    }
    Persist();
    cv_.notify_all();
  }
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
  j.user_cancelled = true;
  j.cancel.store(true);
  if (j.snap.state == JobState::kQueued || j.snap.state == JobState::kValidatingFiles) {
    // Never started: final at once (the validator drops the result of a job it was reading).
    std::erase(queue_, id);
    std::erase(validate_, id);
    j.snap.state = JobState::kCancelled;
    j.snap.finished_at = Now();
    AddEvent(j, "info", "Job cancelled");
    Persist();
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
    StepHooks hooks;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;  // queued jobs stay queued (persisted) for the next start
      job = jobs_[queue_.front()].get();
      queue_.pop_front();
      job->snap.state = JobState::kRunning;
      AddEvent(*job, "info",
               job->opts.resume ? "Fine-tuning job resumed" : "Fine-tuning job started");
      opts = job->opts;
      hooks = hooks_;
      Persist();
    }
    cv_.notify_all();
    if (hooks.before_step) {
      opts.before_step = [&hooks, job] { return hooks.before_step(&job->cancel); };
    }
    opts.after_step = hooks.after_step;
    if (hooks.on_job_start) hooks.on_job_start();
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
      Persist();
    };
    auto res = RunFinetune(model_, *tok_, opts, &pool_, progress);
    if (hooks.on_job_end) hooks.on_job_end();
    std::function<Status(const JobSnapshot&)> on_success;
    JobSnapshot snap;
    {
      std::lock_guard<std::mutex> l(mu_);
      on_success = on_success_;
      snap = job->snap;
    }
    if (res.ok() && on_success) {
      if (Status s = on_success(snap); !s.ok()) res = s;
    }
    std::lock_guard<std::mutex> l(mu_);
    if (!res.ok() && res.status().code() == StatusCode::kCancelled && stop_ &&
        !job->user_cancelled) {
      // Stopped by the shutdown, not cancelled: resumes at the next start.
      job->snap.state = JobState::kQueued;
      AddEvent(*job, "info", "Interrupted by shutdown at step " + std::to_string(job->snap.step));
      Persist();
      cv_.notify_all();
      return;
    }
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
    Persist();
    cv_.notify_all();
  }
}

}  // namespace chorus::train

// Fine-tuning jobs: the state machine of OpenAI's fine-tuning jobs (validating_files → queued →
// running → succeeded | failed | cancelled), their event logs and checkpoints, run one at a time
// on a worker thread — the library half of the /v1/fine_tuning/jobs API (docs/finetuning.md,
// "Jobs"; the HTTP routes over it are in server/finetune_routes.h).
//
// Submit() records the job as validating_files and returns at once (OpenAI's contract: the
// create request answers before the files are read); a validator thread then reads and
// tokenizes its data files in submission order (every problem names the line, as data.h), so a
// job with bad data becomes failed without ever being queued, and a good one queued. The worker
// runs queued jobs in that order through RunFinetune. Cancel() stops a queued job at once and a
// running one before its next optimizer step; a cancelled or failed job never writes its final
// adapter (output_dir/adapter_model.safetensors appears only on success), so nothing partial can be
// registered.
//
// Persistence: with a state directory, every change is written to <state_dir>/jobs.json
// (atomically); a JobQueue opened on it again lists every job, and jobs that were queued or
// running when the process stopped are queued again and resume from their latest checkpoint
// (finetune.h's --resume), so jobs survive a restart; jobs still validating_files are validated
// again. Stopping the process (the destructor or
// Stop) is not a cancellation.
//
// Ownership (docs/api.md, "Tenants"): a job records the tenant that created it
// (JobSnapshot::owner, persisted in jobs.json; absent = none, as in state files written before
// owners). A resumed job keeps it, so on_success sees the owner also after a restart. The queue
// does not filter: the routes decide who sees what (server/finetune_routes.h).
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "chorus/base/durable_file.h"
#include "chorus/train/finetune.h"

namespace chorus::train {

enum class JobState { kValidatingFiles, kQueued, kRunning, kSucceeded, kFailed, kCancelled };
const char* JobStateName(JobState s);  // "validating_files", "queued", ... (OpenAI's names)
bool JobStateFinal(JobState s);

struct JobEvent {
  int64_t created_at = 0;  // unix seconds
  std::string level;       // "info", "warn", "error"
  std::string message;
};

struct JobCheckpoint {
  int64_t step = 0;
  std::string path;
  double train_loss = 0;
  std::optional<double> eval_loss;
};

struct JobSnapshot {
  std::string id;
  std::string owner;  // the tenant that created the job; empty = none (a server without tenants)
  JobState state = JobState::kValidatingFiles;
  std::string error;  // failed: why (names the line for bad data)
  int64_t step = 0, total_steps = 0, trained_tokens = 0;
  int64_t created_at = 0, finished_at = 0;
  std::string output_dir;
  std::vector<JobEvent> events;
  std::vector<JobCheckpoint> checkpoints;
};

class JobQueue {
 public:
  // How a running job shares the machine (e.g. engine::TrainingGate; empty: it runs on its own
  // pool, unscheduled). on_job_start / on_job_end bracket RunFinetune on the worker thread;
  // before_step / after_step become FinetuneOptions' (before_step gets the job's cancel flag).
  struct StepHooks {
    std::function<void()> on_job_start, on_job_end;
    std::function<ThreadPool*(const std::atomic<bool>* cancel)> before_step;
    std::function<void()> after_step;
  };
  // `model` / `tok` are the base the jobs train on; `threads` compute threads per job.
  // `state_dir` empty: nothing persisted. A corrupt jobs.json (not JSON, a bad or missing
  // field) is kDataLoss naming the job and the field, the file left as it is; with
  // `recover_corrupt_state` it is moved aside to `jobs.json.corrupt-<UTC time>` (logged at ERROR
  // with the problem) and the queue starts with no jobs. One process per state directory
  // (`jobs.lock`, kFailedPrecondition for a second); temp files of a killed writer are removed.
  // `hooks` and `on_success` (set_on_success) are in force before any resumed job starts, so a
  // resumed job that finishes at once is still registered.
  static Result<std::unique_ptr<JobQueue>> Open(
      std::shared_ptr<const model::Model> model, std::shared_ptr<const tokenizer::Tokenizer> tok,
      int threads, std::string state_dir = "", StepHooks hooks = {},
      bool recover_corrupt_state = false,
      std::function<Status(const JobSnapshot&)> on_success = {});
  JobQueue(std::shared_ptr<const model::Model> model,
           std::shared_ptr<const tokenizer::Tokenizer> tok, int threads);
  ~JobQueue();  // cancels every job and joins the worker

  // Records the job under `id` (must be new), owned by `owner` ("" = none), as
  // kValidatingFiles (persisted before it returns) and hands its data files to the validator;
  // returns kValidatingFiles without reading them. The job then becomes kQueued, or kFailed
  // (Snapshot(id)->error names the file and line). kInvalidArgument for a duplicate id or an
  // owner that is not a tenant name. `submitted` (if given) receives the job as recorded, before
  // the validator can have moved it on.
  Result<JobState> Submit(const std::string& id, FinetuneOptions opts,
                          const std::string& owner = "", JobSnapshot* submitted = nullptr);
  std::optional<JobSnapshot> Snapshot(const std::string& id) const;
  std::vector<std::string> Ids() const;  // submission order
  // kNotFound for an unknown id; a job already final is left as it is; a validating or queued
  // job is cancelled at once, a running one before its next optimizer step.
  Status Cancel(const std::string& id);
  // Blocks until the job is final (or unknown).
  void Wait(const std::string& id);
  // Called on the worker thread when a job succeeds, before its state is published (e.g. to
  // register the adapter so that it is servable the moment the job reads "succeeded"); an error
  // fails the job with that message.
  void set_on_success(std::function<Status(const JobSnapshot&)> fn);

  // Given to Open instead when jobs resumed from the state directory must use them too.
  void set_step_hooks(StepHooks hooks);
  // Stops the worker as the destructor does (a running job is interrupted, not cancelled: it
  // resumes at the next Open on the state directory). Idempotent.
  void Stop();

 private:
  struct Job {
    JobSnapshot snap;
    FinetuneOptions opts;
    std::atomic<bool> cancel{false};
    bool user_cancelled = false;
  };
  void Worker();
  void Validator();      // validates validate_'s jobs one at a time, then queues or fails them
  void Persist() const;  // mu_ held
  void AddEvent(Job& j, const std::string& level, const std::string& message);  // mu_ held

  std::shared_ptr<const model::Model> model_;
  std::shared_ptr<const tokenizer::Tokenizer> tok_;
  ThreadPool pool_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::unique_ptr<Job>> jobs_;
  std::vector<std::string> order_;
  std::deque<std::string> validate_;  // validating_files, in submission order
  std::deque<std::string> queue_;     // queued, in the order they were validated
  std::function<Status(const JobSnapshot&)> on_success_;
  StepHooks hooks_;
  bool stop_ = false;
  std::string state_dir_;
  FileLock lock_;  // held on state_dir_ for the queue's lifetime
  std::thread worker_;
  std::thread validator_;
};

}  // namespace chorus::train

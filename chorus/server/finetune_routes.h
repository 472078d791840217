// OpenAI's fine-tuning API over train::FileStore and train::JobQueue (docs/api.md, "Files and
// fine-tuning"; docs/finetuning.md, "Training while serving"):
//
//   POST   /v1/files                            multipart/form-data: file, purpose=fine-tune
//   GET    /v1/files, /v1/files/{id}, /v1/files/{id}/content
//   DELETE /v1/files/{id}
//   POST   /v1/fine_tuning/jobs                 {model, training_file, validation_file,
//                                               hyperparameters, suffix, seed}
//   GET    /v1/fine_tuning/jobs[?after&limit], /v1/fine_tuning/jobs/{id},
//          /v1/fine_tuning/jobs/{id}/events[?after&limit], .../{id}/checkpoints[?after&limit]
//   POST   /v1/fine_tuning/jobs/{id}/cancel
//
// Objects have OpenAI's shapes ("file", "fine_tuning.job", "fine_tuning.job.event",
// "fine_tuning.job.checkpoint", lists with has_more). A job that succeeds registers its adapter
// in the adapter registry as `ft:<base>:<suffix>:<job id>` before it reads "succeeded" (so it is
// in /v1/models and servable at once; a failed or cancelled job registers nothing). Everything
// lives under one state directory (files/, jobs/<id>/ outputs, jobs.json, ft_jobs.json), so files
// and jobs survive a restart and interrupted jobs resume from their latest checkpoint.
//
// Tenants (docs/api.md, "Tenants"): every method takes the caller's tenant (`tenant`, its name;
// empty on a server without tenants). A file or job records the tenant that created it
// (train::StoredFile::owner, train::JobSnapshot::owner); one created without tenants has no
// owner. The rule is the adapters' (server.cc, Visible): a caller sees the records it owns and
// the ownerless ones; another tenant's id is 404 with the message of an unknown id, lists leave
// it out (pagination counts only what the caller sees), and a job naming another tenant's file
// gets the error of an unknown file. Deleting or cancelling needs ownership: an ownerless record
// is 403 for a tenant (it is visible, so nothing leaks). A job's adapter is registered with the
// job's owner, so it is that tenant's like one it loaded itself (also for a job resumed after a
// restart: the owner is persisted with the job).
//
// Thread-safety: all methods are thread-safe.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "chorus/adapters/registry.h"
#include "chorus/base/status.h"
#include "chorus/model/model.h"
#include "chorus/tokenizer/tokenizer.h"
#include "chorus/train/file_store.h"
#include "chorus/train/jobs.h"

namespace chorus::server {

struct FinetuneApiOptions {
  std::string dir;              // the state directory (created if needed)
  std::string base_model_name;  // the served model name: the only `model` a job may train
  int64_t max_file_bytes = int64_t{256} << 20;  // larger uploads: 413
  int64_t max_seq_len = 0;                      // the base's context (longest seq_len)
  // A corrupt files.json / jobs.json is moved aside and the store starts empty instead of
  // refusing to open (docs/finetuning.md, "Durability"; `chorus serve --recover-corrupt-state`).
  bool recover_corrupt_state = false;
};

struct FinetuneReply {
  int status = 200;
  std::string body;
  std::string content_type = "application/json";
};

class FinetuneApi {
 public:
  // Opens the state directory (files and jobs of an earlier run; interrupted jobs are queued
  // again and resume). `hooks` schedule the jobs' iterations (train::JobQueue::StepHooks).
  // `registry` receives the finished adapters; its adapter roots must include adapter_root().
  static Result<std::unique_ptr<FinetuneApi>> Open(
      FinetuneApiOptions opts, std::shared_ptr<const model::Model> model,
      std::shared_ptr<const tokenizer::Tokenizer> tok,
      std::shared_ptr<adapters::AdapterRegistry> registry, train::JobQueue::StepHooks hooks);
  ~FinetuneApi();
  // Where job outputs are written (an adapter root of the registry).
  static std::string AdapterRoot(const std::string& dir);

  // `tenant`: the caller's tenant ("" without tenants; see the file comment).
  FinetuneReply UploadFile(const std::string& filename, const std::string& purpose,
                           const std::string& content, bool has_file,
                           const std::string& tenant = "");
  FinetuneReply ListFiles(const std::string& purpose, const std::string& after,
                          const std::string& limit, const std::string& tenant = "") const;
  FinetuneReply GetFile(const std::string& id, const std::string& tenant = "") const;
  FinetuneReply FileContent(const std::string& id, const std::string& tenant = "") const;
  FinetuneReply DeleteFile(const std::string& id, const std::string& tenant = "");
  FinetuneReply CreateJob(const std::string& body, const std::string& tenant = "");
  FinetuneReply ListJobs(const std::string& after, const std::string& limit,
                         const std::string& tenant = "") const;
  FinetuneReply GetJob(const std::string& id, const std::string& tenant = "") const;
  FinetuneReply ListEvents(const std::string& id, const std::string& after,
                           const std::string& limit, const std::string& tenant = "") const;
  FinetuneReply ListCheckpoints(const std::string& id, const std::string& after,
                                const std::string& limit, const std::string& tenant = "") const;
  FinetuneReply CancelJob(const std::string& id, const std::string& tenant = "");
  // Stops the job worker (a running job is interrupted and resumes at the next start). Must be
  // called before the engine whose gate the hooks use stops. Idempotent.
  void Stop();

  // What the server keeps per job beside train::JobQueue's state (persisted in ft_jobs.json).
  struct JobMeta {
    std::string model, training_file, validation_file, suffix, fine_tuned_model;
    int64_t n_epochs = 0, batch_size = 0, seed = 0;
    double learning_rate_multiplier = 1;
    std::string extras;  // Chorus hyperparameters as JSON (lora_rank, ...)
  };

 private:
  FinetuneApi() = default;
  std::string JobJson(const std::string& id) const;  // mu_ held
  // The job as `snap` shows it (e.g. as Submit recorded it, not as it is by now); mu_ held.
  std::string JobJson(const std::string& id, const std::optional<train::JobSnapshot>& snap) const;
  // The job as `tenant` may see it: nullopt when unknown, without metadata, or another tenant's.
  std::optional<train::JobSnapshot> VisibleJob(const std::string& id,
                                               const std::string& tenant) const;  // mu_ held
  // The file as `tenant` may see it (nullopt: unknown or another tenant's).
  std::optional<train::StoredFile> VisibleFile(const std::string& id,
                                               const std::string& tenant) const;
  Status SaveMeta() const;  // mu_ held
  Status RegisterResult(const train::JobSnapshot& snap);

  FinetuneApiOptions opts_;
  std::shared_ptr<adapters::AdapterRegistry> registry_;
  std::unique_ptr<train::FileStore> files_;
  std::unique_ptr<train::JobQueue> jobs_;
  mutable std::mutex mu_;
  std::map<std::string, JobMeta> meta_;
  uint64_t counter_ = 0;
};

}  // namespace chorus::server

#include "chorus/server/finetune_routes.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "chorus/base/mapped_file.h"
#include "chorus/server/api_error.h"

namespace chorus::server {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The learning rate a multiplier of 1 means: `chorus finetune`'s default --lr.
constexpr double kBaseLearningRate = 2e-4;
// "auto" values (OpenAI picks them from the data; these are fixed and documented).
constexpr int64_t kAutoEpochs = 3;
constexpr int64_t kAutoBatch = 4;
constexpr int64_t kDefaultSeqLen = 256;
constexpr int64_t kDefaultCheckpointEvery = 20;
// How long POST .../cancel waits for a running job to stop before answering.
constexpr auto kCancelWait = std::chrono::seconds(3);

FinetuneReply Error(const ApiError& e) { return {e.http_status, e.ToJson(), "application/json"}; }
// Never throws: invalid UTF-8 (which no stored field should hold) is replaced by U+FFFD.
FinetuneReply Ok(const json& j) {
  return {200, j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json"};
}

int64_t Now() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

json FileJson(const train::StoredFile& f) {
  return {{"id", f.id},
          {"object", "file"},
          {"bytes", f.bytes},
          {"created_at", f.created_at},
          {"filename", f.filename},
          {"purpose", f.purpose},
          {"status", "processed"},
          {"status_details", nullptr},
          {"expires_at", nullptr}};
}

// `limit` query parameter: empty = `def`; else an integer in [1, max].
Result<int64_t> ParseLimit(const std::string& s, int64_t def, int64_t max) {
  if (s.empty()) return def;
  char* end = nullptr;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (end == s.c_str() || *end != '\0' || v < 1 || v > max) {
    return InvalidArgumentError("limit must be an integer in [1, " + std::to_string(max) + "]");
  }
  return static_cast<int64_t>(v);
}

// A page of `items` (already in list order, each with an "id"): those after the item `after`
// (all when empty), at most `limit`. kInvalidArgument for an unknown `after`.
Result<json> Page(const std::vector<json>& items, const std::string& after, int64_t limit) {
  size_t start = 0;
  if (!after.empty()) {
    auto it =
        std::find_if(items.begin(), items.end(), [&](const json& j) { return j["id"] == after; });
    if (it == items.end()) return InvalidArgumentError("after: no item with id '" + after + "'");
    start = static_cast<size_t>(it - items.begin()) + 1;
  }
  json data = json::array();
  for (size_t i = start; i < items.size() && static_cast<int64_t>(data.size()) < limit; ++i) {
    data.push_back(items[i]);
  }
  const bool more = start + data.size() < items.size();
  json out = {{"object", "list"}, {"data", data}, {"has_more", more}};
  out["first_id"] = data.empty() ? json(nullptr) : data.front()["id"];
  out["last_id"] = data.empty() ? json(nullptr) : data.back()["id"];
  return out;
}

// An integer hyperparameter: "auto" (→ `auto_value`, when given) or an integer in [lo, hi].
Result<int64_t> IntParam(const json& v, const std::string& name, int64_t lo, int64_t hi,
                         std::optional<int64_t> auto_value) {
  if (auto_value && v.is_string() && v.get<std::string>() == "auto") return *auto_value;
  if (v.is_number_integer() ||
      (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>())) {
    const double d = v.get<double>();
    if (d >= static_cast<double>(lo) && d <= static_cast<double>(hi))
      return static_cast<int64_t>(d);
  }
  return InvalidArgumentError("hyperparameters." + name + " must be " +
                              (auto_value ? std::string("\"auto\" or ") : std::string()) +
                              "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                              "], got " + v.dump().substr(0, 40));
}

Result<double> NumParam(const json& v, const std::string& name, double lo, double hi,
                        std::optional<double> auto_value) {
  if (auto_value && v.is_string() && v.get<std::string>() == "auto") return *auto_value;
  if (v.is_number()) {
    const double d = v.get<double>();
    if (d > lo && d <= hi) return d;
  }
  char range[64];
  std::snprintf(range, sizeof range, "(%g, %g]", lo, hi);
  return InvalidArgumentError("hyperparameters." + name + " must be " +
                              (auto_value ? std::string("\"auto\" or ") : std::string()) +
                              "a number in " + range + ", got " + v.dump().substr(0, 40));
}

Result<std::vector<model::Linear>> ParseTargets(const json& v) {
  std::vector<std::string> names;
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    size_t pos = 0;
    while (pos <= s.size()) {
      const size_t comma = std::min(s.find(',', pos), s.size());
      if (comma > pos) names.push_back(s.substr(pos, comma - pos));
      pos = comma + 1;
    }
  } else if (v.is_array()) {
    for (const json& e : v) {
      if (!e.is_string()) return InvalidArgumentError("hyperparameters.lora_targets: not a string");
      names.push_back(e.get<std::string>());
    }
  } else {
    return InvalidArgumentError(
        "hyperparameters.lora_targets must be a list of q,k,v,o,gate,up,down");
  }
  std::vector<model::Linear> out;
  for (const std::string& n : names) {
    bool found = false;
    for (int i = 0; i < model::kNumLinears; ++i) {
      const std::string full = model::LinearName(static_cast<model::Linear>(i));
      if (n == full || n + "_proj" == full) {
        const auto l = static_cast<model::Linear>(i);
        if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
        found = true;
      }
    }
    if (!found) {
      return InvalidArgumentError("hyperparameters.lora_targets: unknown module '" +
                                  n.substr(0, 32) + "' (q,k,v,o,gate,up,down)");
    }
  }
  if (out.empty()) return InvalidArgumentError("hyperparameters.lora_targets is empty");
  return out;
}

// Whether a caller of tenant `tenant` ("" = no tenants) sees a record owned by `owner`: its own
// and the ownerless ones — the rule of adapters (server.cc, Visible).
bool Visible(const std::string& owner, const std::string& tenant) {
  return owner.empty() || owner == tenant;
}

// The 403 for a tenant deleting or cancelling an ownerless record (one it sees but does not own).
FinetuneReply NotOwned(const std::string& what) {
  return Error(ErrorFromStatus(PermissionDeniedError(
      what + " was created without tenants and is shared; a tenant cannot delete or cancel it")));
}

std::string Hex(uint64_t v, int digits) {
  std::string s(static_cast<size_t>(digits), '0');
  for (int i = digits - 1; i >= 0 && v != 0; --i, v >>= 4)
    s[static_cast<size_t>(i)] = "0123456789abcdef"[v & 15];
  return s;
}

}  // namespace

std::string FinetuneApi::AdapterRoot(const std::string& dir) {
  return (fs::path(dir) / "jobs").string();
}

Result<std::unique_ptr<FinetuneApi>> FinetuneApi::Open(
    FinetuneApiOptions opts, std::shared_ptr<const model::Model> model,
    std::shared_ptr<const tokenizer::Tokenizer> tok,
    std::shared_ptr<adapters::AdapterRegistry> registry, train::JobQueue::StepHooks hooks) {
  std::error_code ec;
  fs::create_directories(AdapterRoot(opts.dir), ec);
  if (ec) return InternalError("cannot create " + AdapterRoot(opts.dir) + ": " + ec.message());
  std::unique_ptr<FinetuneApi> api(new FinetuneApi());
  api->opts_ = std::move(opts);
  api->registry_ = std::move(registry);
  CHORUS_ASSIGN_OR_RETURN(
      api->files_,
      train::FileStore::Open((fs::path(api->opts_.dir) / "files").string(),
                             api->opts_.max_file_bytes, api->opts_.recover_corrupt_state));
  const std::string meta_path = (fs::path(api->opts_.dir) / "ft_jobs.json").string();
  if (fs::exists(meta_path)) {
    CHORUS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(meta_path));
    const json j = json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("jobs") || !j["jobs"].is_object()) {
      return InvalidArgumentError(meta_path + ": not a fine-tuning job index");
    }
    try {
      api->counter_ = j.value("counter", uint64_t{0});
      for (const auto& [id, m] : j["jobs"].items()) {
        JobMeta jm;
        jm.model = m.at("model");
        jm.training_file = m.at("training_file");
        jm.validation_file = m.at("validation_file");
        jm.suffix = m.at("suffix");
        jm.fine_tuned_model = m.at("fine_tuned_model");
        jm.n_epochs = m.at("n_epochs");
        jm.batch_size = m.at("batch_size");
        jm.seed = m.at("seed");
        jm.learning_rate_multiplier = m.at("learning_rate_multiplier");
        jm.extras = m.at("extras");
        api->meta_[id] = std::move(jm);
      }
    } catch (const json::exception& e) {
      return InvalidArgumentError(meta_path + ": bad entry: " + e.what());
    }
  }
  // on_success is given to Open, so a job resumed from the state directory registers its
  // adapter (for its owner) however soon it finishes. RegisterResult uses meta_ and registry_,
  // both set by now, never jobs_.
  FinetuneApi* raw = api.get();
  CHORUS_ASSIGN_OR_RETURN(
      api->jobs_, train::JobQueue::Open(
                      std::move(model), std::move(tok), /*threads=*/1, api->opts_.dir,
                      std::move(hooks), api->opts_.recover_corrupt_state,
                      [raw](const train::JobSnapshot& snap) { return raw->RegisterResult(snap); }));
  return api;
}

FinetuneApi::~FinetuneApi() { Stop(); }

void FinetuneApi::Stop() {
  if (jobs_) jobs_->Stop();
}

Status FinetuneApi::RegisterResult(const train::JobSnapshot& snap) {
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = meta_.find(snap.id);
    if (it == meta_.end()) return InternalError("no metadata for job " + snap.id);
    name = it->second.fine_tuned_model;
  }
  // The name holds the job id, so replacing can only replace this job's own earlier
  // registration (a restart between registering and recording "succeeded").
  // Owned by the job's tenant (persisted with the job, so also after a restart), exactly like an
  // adapter that tenant loaded through the API.
  auto info = registry_->Register(name, snap.output_dir, /*replace=*/true, snap.owner);
  if (!info.ok()) return info.status().WithContext("registering " + name);
  return OkStatus();
}

Status FinetuneApi::SaveMeta() const {
  json jobs = json::object();
  for (const auto& [id, m] : meta_) {
    jobs[id] = {{"model", m.model},
                {"training_file", m.training_file},
                {"validation_file", m.validation_file},
                {"suffix", m.suffix},
                {"fine_tuned_model", m.fine_tuned_model},
                {"n_epochs", m.n_epochs},
                {"batch_size", m.batch_size},
                {"seed", m.seed},
                {"learning_rate_multiplier", m.learning_rate_multiplier},
                {"extras", m.extras}};
  }
  json j = {{"counter", counter_}, {"jobs", jobs}};
  return WriteFileAtomically((fs::path(opts_.dir) / "ft_jobs.json").string(), j.dump(1));
}

FinetuneReply FinetuneApi::UploadFile(const std::string& filename, const std::string& purpose,
                                      const std::string& content, bool has_file,
                                      const std::string& tenant) {
  if (!has_file) {
    return Error(BadRequest("a multipart/form-data field `file` is required", "file"));
  }
  if (purpose.empty()) return Error(BadRequest("purpose is required (\"fine-tune\")", "purpose"));
  if (purpose != "fine-tune") {
    return Error(
        BadRequest("purpose must be \"fine-tune\" (the only purpose this server stores), "
                   "got '" +
                       purpose.substr(0, 32) + "'",
                   "purpose"));
  }
  std::string name = fs::path(filename).filename().string();
  if (name.empty()) name = "upload.jsonl";
  auto f = files_->Add(name, purpose, content, tenant);
  if (!f.ok()) {
    ApiError e = ErrorFromStatus(f.status(), "file");
    if (f.status().code() == StatusCode::kResourceExhausted) {
      e.http_status = 413;
      e.type = "invalid_request_error";
      e.code = "file_too_large";
      e.retry_after_s = 0;
    }
    return Error(e);
  }
  return Ok(FileJson(*f));
}

std::optional<train::StoredFile> FinetuneApi::VisibleFile(const std::string& id,
                                                          const std::string& tenant) const {
  auto f = files_->Get(id);
  if (!f || !Visible(f->owner, tenant)) return std::nullopt;
  return f;
}

FinetuneReply FinetuneApi::ListFiles(const std::string& purpose, const std::string& after,
                                     const std::string& limit, const std::string& tenant) const {
  auto lim = ParseLimit(limit, 10000, 10000);
  if (!lim.ok()) return Error(BadRequest(lim.status().message(), "limit"));
  std::vector<train::StoredFile> all = files_->List();
  std::vector<json> items;
  for (auto it = all.rbegin(); it != all.rend(); ++it) {  // newest first (OpenAI's order)
    // Only what the caller sees, before paging: `after` and has_more count those alone.
    if (!Visible(it->owner, tenant)) continue;
    if (purpose.empty() || it->purpose == purpose) items.push_back(FileJson(*it));
  }
  auto page = Page(items, after, *lim);
  if (!page.ok()) return Error(BadRequest(page.status().message(), "after"));
  return Ok(*page);
}

FinetuneReply FinetuneApi::GetFile(const std::string& id, const std::string& tenant) const {
  auto f = VisibleFile(id, tenant);
  if (!f) return Error(NotFound("No such File object: " + id.substr(0, 64)));
  return Ok(FileJson(*f));
}

FinetuneReply FinetuneApi::FileContent(const std::string& id, const std::string& tenant) const {
  auto f = VisibleFile(id, tenant);
  if (!f) return Error(NotFound("No such File object: " + id.substr(0, 64)));
  auto text = ReadFileToString(f->path);
  if (!text.ok()) return Error(ErrorFromStatus(text.status()));
  return {200, std::move(*text), "application/octet-stream"};
}

FinetuneReply FinetuneApi::DeleteFile(const std::string& id, const std::string& tenant) {
  auto f = VisibleFile(id, tenant);
  if (!f) return Error(NotFound("No such File object: " + id.substr(0, 64)));
  if (f->owner != tenant) return NotOwned("file " + id);
  {
    // A queued or running job reads its files again when it starts or resumes.
    std::lock_guard<std::mutex> l(mu_);
    for (const auto& [job_id, m] : meta_) {
      if (m.training_file != id && m.validation_file != id) continue;
      auto snap = jobs_->Snapshot(job_id);
      if (snap && !train::JobStateFinal(snap->state)) {
        ApiError e = BadRequest("file " + id + " is used by fine-tuning job " + job_id + " (" +
                                    train::JobStateName(snap->state) + "); cancel it first",
                                "file_id", "file_in_use");
        e.http_status = 409;
        return Error(e);
      }
    }
  }
  if (Status s = files_->Delete(id); !s.ok()) return Error(ErrorFromStatus(s));
  return Ok({{"id", id}, {"object", "file"}, {"deleted", true}});
}

FinetuneReply FinetuneApi::CreateJob(const std::string& body, const std::string& tenant) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return Error(BadRequest("request body must be a JSON object"));
  }
  auto str = [&](const char* key) -> std::optional<std::string> {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return std::string();
    if (!it->is_string()) return std::nullopt;
    return it->get<std::string>();
  };
  const auto model = str("model");
  if (!model || model->empty()) return Error(BadRequest("model must be a string", "model"));
  if (*model != opts_.base_model_name) {
    ApiError e = BadRequest("model `" + model->substr(0, 64) +
                                "` cannot be fine-tuned here: the base model is `" +
                                opts_.base_model_name + "`",
                            "model", "model_not_found");
    return Error(e);
  }
  const auto training_file = str("training_file");
  if (!training_file || training_file->empty()) {
    return Error(BadRequest("training_file must be a file id", "training_file"));
  }
  // Another tenant's file is answered as an unknown one.
  auto train_file = VisibleFile(*training_file, tenant);
  if (!train_file) {
    return Error(BadRequest("invalid training_file: " + training_file->substr(0, 64) +
                                " does not exist (upload it with POST /v1/files)",
                            "training_file", "invalid_training_file"));
  }
  if (train_file->purpose != "fine-tune") {
    return Error(BadRequest("invalid training_file: " + *training_file + " has purpose '" +
                                train_file->purpose + "', not fine-tune",
                            "training_file", "invalid_training_file"));
  }
  const auto validation_file = str("validation_file");
  if (!validation_file) {
    return Error(BadRequest("validation_file must be a file id or null", "validation_file"));
  }
  std::optional<train::StoredFile> valid_file;
  if (!validation_file->empty()) {
    valid_file = VisibleFile(*validation_file, tenant);
    if (!valid_file) {
      return Error(BadRequest(
          "invalid validation_file: " + validation_file->substr(0, 64) + " does not exist",
          "validation_file", "invalid_validation_file"));
    }
  }
  const auto suffix = str("suffix");
  if (!suffix || suffix->size() > 64 || !std::all_of(suffix->begin(), suffix->end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      })) {
    return Error(BadRequest("suffix must be at most 64 characters of [A-Za-z0-9._-]", "suffix"));
  }
  int64_t seed = static_cast<int64_t>(std::random_device{}() & 0x7fffffff);
  if (auto it = j.find("seed"); it != j.end() && !it->is_null()) {
    if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 2147483647) {
      return Error(BadRequest("seed must be an integer in [0, 2147483647]", "seed"));
    }
    seed = it->get<int64_t>();
  }
  // Hyperparameters: top-level (the older API) or method.supervised.hyperparameters.
  json hp = json::object();
  if (auto it = j.find("hyperparameters"); it != j.end() && !it->is_null()) {
    if (!it->is_object())
      return Error(BadRequest("hyperparameters must be an object", "hyperparameters"));
    hp = *it;
  }
  if (auto it = j.find("method"); it != j.end() && !it->is_null()) {
    if (!it->is_object() || it->value("type", "supervised") != "supervised") {
      return Error(
          BadRequest("method.type must be \"supervised\" (the only method Chorus runs)", "method"));
    }
    if (auto s = it->find("supervised"); s != it->end() && s->is_object()) {
      if (auto h = s->find("hyperparameters"); h != s->end() && h->is_object()) {
        for (const auto& [k, v] : h->items()) hp[k] = v;
      }
    }
  }
  train::FinetuneOptions o;
  JobMeta meta;
  meta.n_epochs = kAutoEpochs;
  meta.batch_size = kAutoBatch;
  json extras = json::object();
  o.data.seq_len = std::min<int64_t>(kDefaultSeqLen, opts_.max_seq_len);
  o.save_every = kDefaultCheckpointEvery;
  auto bad = [](const Status& s) {
    return Error(BadRequest(s.message(), "hyperparameters", "invalid_hyperparameters"));
  };
  for (const auto& [k, v] : hp.items()) {
    Result<int64_t> iv = int64_t{0};
    if (k == "n_epochs") {
      if (!(iv = IntParam(v, k, 1, 50, kAutoEpochs)).ok()) return bad(iv.status());
      meta.n_epochs = *iv;
    } else if (k == "batch_size") {
      if (!(iv = IntParam(v, k, 1, 256, kAutoBatch)).ok()) return bad(iv.status());
      meta.batch_size = *iv;
    } else if (k == "learning_rate_multiplier") {
      auto d = NumParam(v, k, 0, 100, 1.0);
      if (!d.ok()) return bad(d.status());
      meta.learning_rate_multiplier = *d;
    } else if (k == "lora_rank") {
      if (!(iv = IntParam(v, k, 1, 256, std::nullopt)).ok()) return bad(iv.status());
      o.lora.rank = *iv;
    } else if (k == "lora_alpha") {
      auto d = NumParam(v, k, 0, 10000, std::nullopt);
      if (!d.ok()) return bad(d.status());
      o.lora.alpha = static_cast<float>(*d);
    } else if (k == "lora_targets") {
      auto t = ParseTargets(v);
      if (!t.ok()) return bad(t.status());
      o.lora.targets = *t;
    } else if (k == "n_steps") {
      if (!(iv = IntParam(v, k, 1, 1000000, std::nullopt)).ok()) return bad(iv.status());
      o.steps = *iv;
    } else if (k == "seq_len") {
      if (!(iv = IntParam(v, k, 2, opts_.max_seq_len, std::nullopt)).ok()) return bad(iv.status());
      o.data.seq_len = *iv;
    } else if (k == "warmup_steps") {
      if (!(iv = IntParam(v, k, 0, 1000000, std::nullopt)).ok()) return bad(iv.status());
      o.warmup = *iv;
    } else if (k == "grad_accum") {
      if (!(iv = IntParam(v, k, 1, 4096, std::nullopt)).ok()) return bad(iv.status());
      o.grad_accum = *iv;
    } else if (k == "checkpoint_every") {
      if (!(iv = IntParam(v, k, 0, 1000000, std::nullopt)).ok()) return bad(iv.status());
      o.save_every = *iv;
    } else {
      return Error(BadRequest("hyperparameters." + k.substr(0, 40) +
                                  " is not a known hyperparameter (n_epochs, batch_size, "
                                  "learning_rate_multiplier, lora_rank, lora_alpha, lora_targets, "
                                  "n_steps, seq_len, warmup_steps, grad_accum, checkpoint_every)",
                              "hyperparameters", "invalid_hyperparameters"));
    }
    if (k != "n_epochs" && k != "batch_size" && k != "learning_rate_multiplier") extras[k] = v;
  }
  o.lr = kBaseLearningRate * meta.learning_rate_multiplier;
  if (o.lr > 1) {
    return bad(
        InvalidArgumentError("hyperparameters.learning_rate_multiplier gives a learning rate "
                             "above 1"));
  }
  o.epochs = meta.n_epochs;
  o.batch = meta.batch_size;
  o.lora.seed = static_cast<uint64_t>(seed);
  o.data_path = train_file->path;
  if (valid_file) o.eval_path = valid_file->path;
  o.data.max_file_bytes = opts_.max_file_bytes;
  o.base_model_name = opts_.base_model_name;

  std::string id;
  {
    std::lock_guard<std::mutex> l(mu_);
    id = "ftjob-" + Hex(static_cast<uint64_t>(Now()), 10) + Hex(++counter_, 14);
    meta.model = *model;
    meta.training_file = *training_file;
    meta.validation_file = *validation_file;
    meta.suffix = *suffix;
    meta.seed = seed;
    meta.extras = extras.dump();
    meta.fine_tuned_model = "ft:" + opts_.base_model_name + ":" + *suffix + ":" + id;
    if (!adapters::IsValidAdapterName(meta.fine_tuned_model)) {
      --counter_;
      return Error(BadRequest("the fine-tuned model name " + meta.fine_tuned_model.substr(0, 64) +
                                  "... would not be a valid model name (1-128 characters of "
                                  "[A-Za-z0-9._:/-]); serve the base under a shorter "
                                  "--served-model-name or shorten the suffix",
                              "suffix"));
    }
    o.output_dir = (fs::path(AdapterRoot(opts_.dir)) / id).string();
    meta_[id] = meta;
    if (Status s = SaveMeta(); !s.ok()) {
      meta_.erase(id);
      return Error(ErrorFromStatus(s));
    }
  }
  // Answers at once with "validating_files" (as OpenAI does): the queue's validator reads the
  // files afterwards, off this HTTP thread, and a bad line fails the job naming file and line.
  // The answer shows the job as Submit recorded it: by now the validator may already have
  // moved it on (a small bad file can be failed before this line), and the contract is that
  // create answers validating_files.
  train::JobSnapshot submitted;
  auto st = jobs_->Submit(id, std::move(o), tenant, &submitted);
  if (!st.ok()) return Error(ErrorFromStatus(st.status()));
  std::lock_guard<std::mutex> l(mu_);
  return {200, JobJson(id, submitted), "application/json"};
}

std::string FinetuneApi::JobJson(const std::string& id) const {
  return JobJson(id, jobs_->Snapshot(id));
}

std::string FinetuneApi::JobJson(const std::string& id,
                                 const std::optional<train::JobSnapshot>& snap) const {
  const JobMeta& m = meta_.at(id);
  const bool final = snap && train::JobStateFinal(snap->state);
  const bool ok = snap && snap->state == train::JobState::kSucceeded;
  json hp = {{"n_epochs", m.n_epochs},
             {"batch_size", m.batch_size},
             {"learning_rate_multiplier", m.learning_rate_multiplier}};
  json j = {
      {"object", "fine_tuning.job"},
      {"id", id},
      {"model", m.model},
      {"created_at", snap ? snap->created_at : 0},
      {"finished_at", final ? json(snap->finished_at) : json(nullptr)},
      {"fine_tuned_model", ok ? json(m.fine_tuned_model) : json(nullptr)},
      {"organization_id", "org-chorus"},
      {"result_files", json::array()},
      {"status", snap ? train::JobStateName(snap->state) : "failed"},
      {"validation_file", m.validation_file.empty() ? json(nullptr) : json(m.validation_file)},
      {"training_file", m.training_file},
      {"hyperparameters", hp},
      {"method", {{"type", "supervised"}, {"supervised", {{"hyperparameters", hp}}}}},
      {"trained_tokens", ok ? json(snap->trained_tokens) : json(nullptr)},
      {"error", nullptr},
      {"seed", m.seed},
      {"estimated_finish", nullptr},
      {"integrations", json::array()},
      {"user_provided_suffix", m.suffix.empty() ? json(nullptr) : json(m.suffix)}};
  json chorus = {{"hyperparameters", json::parse(m.extras, nullptr, false)}};
  if (snap) {
    chorus["step"] = snap->step;
    chorus["total_steps"] = snap->total_steps;
    chorus["trained_tokens"] = snap->trained_tokens;  // so far (OpenAI's field: at the end)
  }
  j["chorus"] = chorus;
  if (snap && snap->state == train::JobState::kFailed) {
    // Name files by their ids, not by where this server keeps them.
    std::string msg = snap->error;
    std::string code = "job_failed";
    json param = nullptr;
    for (const auto& [file_id, which] : {std::pair{m.training_file, "training_file"},
                                         std::pair{m.validation_file, "validation_file"}}) {
      if (file_id.empty()) continue;
      auto f = files_->Get(file_id);
      const std::string path =
          f ? f->path : (fs::path(opts_.dir) / "files" / (file_id + ".jsonl")).string();
      if (size_t at = msg.find(path); at != std::string::npos) {
        msg.replace(at, path.size(), file_id);
        code = std::string("invalid_") + which;
        param = which;
      }
    }
    j["error"] = {{"code", code}, {"message", msg}, {"param", param}};
  }
  // An error message may quote the training data, which need not be UTF-8: never throw.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::optional<train::JobSnapshot> FinetuneApi::VisibleJob(const std::string& id,
                                                          const std::string& tenant) const {
  auto snap = jobs_->Snapshot(id);
  if (!snap || !meta_.count(id) || !Visible(snap->owner, tenant)) return std::nullopt;
  return snap;
}

FinetuneReply FinetuneApi::ListJobs(const std::string& after, const std::string& limit,
                                    const std::string& tenant) const {
  auto lim = ParseLimit(limit, 20, 1000);
  if (!lim.ok()) return Error(BadRequest(lim.status().message(), "limit"));
  std::vector<std::string> ids = jobs_->Ids();
  std::vector<json> items;
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = ids.rbegin(); it != ids.rend(); ++it) {  // newest first
    // Only the caller's (and ownerless) jobs, before paging.
    if (VisibleJob(*it, tenant)) items.push_back(json::parse(JobJson(*it)));
  }
  auto page = Page(items, after, *lim);
  if (!page.ok()) return Error(BadRequest(page.status().message(), "after"));
  page->erase("first_id");
  page->erase("last_id");
  return Ok(*page);
}

FinetuneReply FinetuneApi::GetJob(const std::string& id, const std::string& tenant) const {
  std::lock_guard<std::mutex> l(mu_);
  if (!VisibleJob(id, tenant)) {
    return Error(NotFound("No such fine-tuning job: " + id.substr(0, 64)));
  }
  return {200, JobJson(id), "application/json"};
}

FinetuneReply FinetuneApi::ListEvents(const std::string& id, const std::string& after,
                                      const std::string& limit, const std::string& tenant) const {
  auto lim = ParseLimit(limit, 20, 10000);
  if (!lim.ok()) return Error(BadRequest(lim.status().message(), "limit"));
  std::optional<train::JobSnapshot> snap;
  {
    std::lock_guard<std::mutex> l(mu_);
    snap = VisibleJob(id, tenant);
  }
  if (!snap) return Error(NotFound("No such fine-tuning job: " + id.substr(0, 64)));
  std::vector<json> items;
  const std::string stem = "ftevent-" + id.substr(std::min<size_t>(6, id.size())) + "-";
  for (size_t i = snap->events.size(); i-- > 0;) {  // newest first
    const train::JobEvent& e = snap->events[i];
    items.push_back({{"object", "fine_tuning.job.event"},
                     {"id", stem + std::to_string(i)},
                     {"created_at", e.created_at},
                     {"level", e.level},
                     {"message", e.message},
                     {"data", json::object()},
                     {"type", "message"}});
  }
  auto page = Page(items, after, *lim);
  if (!page.ok()) return Error(BadRequest(page.status().message(), "after"));
  page->erase("first_id");
  page->erase("last_id");
  return Ok(*page);
}

FinetuneReply FinetuneApi::ListCheckpoints(const std::string& id, const std::string& after,
                                           const std::string& limit,
                                           const std::string& tenant) const {
  auto lim = ParseLimit(limit, 10, 10000);
  if (!lim.ok()) return Error(BadRequest(lim.status().message(), "limit"));
  std::optional<train::JobSnapshot> snap;
  std::string name;
  {
    std::lock_guard<std::mutex> l(mu_);
    snap = VisibleJob(id, tenant);
    if (!snap) {
      return Error(NotFound("No such fine-tuning job: " + id.substr(0, 64)));
    }
    name = meta_.at(id).fine_tuned_model;
  }
  std::vector<json> items;
  const std::string stem = "ftckpt-" + id.substr(std::min<size_t>(6, id.size())) + "-";
  for (size_t i = snap->checkpoints.size(); i-- > 0;) {  // newest first
    const train::JobCheckpoint& c = snap->checkpoints[i];
    json metrics = {{"step", c.step}, {"train_loss", c.train_loss}};
    if (c.eval_loss) metrics["valid_loss"] = *c.eval_loss;
    items.push_back({{"object", "fine_tuning.job.checkpoint"},
                     {"id", stem + std::to_string(c.step)},
                     {"created_at", snap->created_at},
                     {"fine_tuned_model_checkpoint", name + ":ckpt-step-" + std::to_string(c.step)},
                     {"fine_tuning_job_id", id},
                     {"metrics", metrics},
                     {"step_number", c.step}});
  }
  auto page = Page(items, after, *lim);
  if (!page.ok()) return Error(BadRequest(page.status().message(), "after"));
  return Ok(*page);
}

FinetuneReply FinetuneApi::CancelJob(const std::string& id, const std::string& tenant) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto snap = VisibleJob(id, tenant);
    if (!snap) return Error(NotFound("No such fine-tuning job: " + id.substr(0, 64)));
    if (snap->owner != tenant) return NotOwned("fine-tuning job " + id);
  }
  if (Status s = jobs_->Cancel(id); !s.ok()) return Error(ErrorFromStatus(s));
  // A running job stops before its next step; answer with the final state when it comes soon.
  const auto deadline = std::chrono::steady_clock::now() + kCancelWait;
  while (std::chrono::steady_clock::now() < deadline) {
    auto snap = jobs_->Snapshot(id);
    if (!snap || train::JobStateFinal(snap->state)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> l(mu_);
  return {200, JobJson(id), "application/json"};
}

}  // namespace chorus::server

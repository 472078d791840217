#include "chorus/train/finetune.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <sstream>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/durable_file.h"
#include "chorus/base/logging.h"
#include "chorus/base/mapped_file.h"
#include "chorus/base/rng.h"
#include "chorus/formats/safetensors.h"

namespace chorus::train {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr int kKeepCheckpoints = 2;

Status Validate(const FinetuneOptions& o) {
  auto bad = [](const std::string& m) { return InvalidArgumentError(m); };
  if (o.data_path.empty()) return bad("--data is required");
  if (o.output_dir.empty()) return bad("--output is required");
  if (!(o.lr > 0 && o.lr <= 1)) return bad("--lr must be in (0, 1]");
  if (o.epochs < 1 && o.steps < 1) return bad("--epochs or --steps must be at least 1");
  if (o.batch < 1 || o.batch > 4096) return bad("--batch must be in [1, 4096]");
  if (o.grad_accum < 1 || o.grad_accum > 4096) return bad("--grad-accum must be in [1, 4096]");
  if (o.warmup < 0) return bad("--warmup must be ≥ 0");
  if (o.data.seq_len < 2) return bad("--seq-len must be at least 2");
  if (o.save_every < 0) return bad("--save-every must be ≥ 0");
  if (o.adamw.weight_decay < 0 || o.adamw.weight_decay >= 1) {
    return bad("--weight-decay must be in [0, 1)");
  }
  return OkStatus();
}

// The options that must match for a resume to continue the same run.
json RunSignature(const FinetuneOptions& o, int64_t n_samples) {
  json targets = json::array();
  for (model::Linear l : o.lora.targets) targets.push_back(model::LinearName(l));
  return {{"rank", o.lora.rank},
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
          {"weight_decay", o.adamw.weight_decay},
          {"seq_len", o.data.seq_len},
          {"samples", n_samples}};
}

// The optimizer steps of the run: each a list of packed sequences of one epoch.
struct Plan {
  std::vector<std::vector<PackedSeq>> steps;
  std::vector<double> epoch_at;  // fractional epoch after each step
  int64_t sequences_per_epoch = 0;
};

Plan MakePlan(const std::vector<Sample>& samples, const FinetuneOptions& o) {
  Plan plan;
  const int64_t per_step = o.batch * o.grad_accum;
  for (int64_t e = 0;; ++e) {
    if (o.steps == 0 && e >= o.epochs) break;
    std::vector<int64_t> order(samples.size());
    std::iota(order.begin(), order.end(), 0);
    Rng rng(o.lora.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(e) + 1);
    for (size_t i = order.size(); i > 1; --i) {
      std::swap(order[i - 1], order[rng.NextU64() % i]);
    }
    const std::vector<PackedSeq> seqs = Pack(samples, order, o.data.seq_len);
    if (e == 0) plan.sequences_per_epoch = static_cast<int64_t>(seqs.size());
    for (size_t i = 0; i < seqs.size(); i += static_cast<size_t>(per_step)) {
      const size_t end = std::min(seqs.size(), i + static_cast<size_t>(per_step));
      plan.steps.emplace_back(seqs.begin() + static_cast<int64_t>(i),
                              seqs.begin() + static_cast<int64_t>(end));
      plan.epoch_at.push_back(static_cast<double>(e) +
                              static_cast<double>(end) / static_cast<double>(seqs.size()));
      if (o.steps > 0 && static_cast<int64_t>(plan.steps.size()) == o.steps) return plan;
    }
  }
  return plan;
}

Tensor F32Tensor(const std::vector<float>& v) {
  return Tensor::FromF32(v, DType::kF32, {static_cast<int64_t>(v.size())});
}

// Removes what a run killed mid-write left in the output directory: temporary checkpoint
// directories (`.tmp-…`, never read) and WriteFileAtomically temp files. Called with the
// directory's lock held, before anything is written, so repeated kills never accumulate files.
void RemoveInterruptedWrites(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (e.path().filename().string().starts_with(".tmp-")) stale.push_back(e.path());
  }
  for (const fs::path& p : stale) {
    fs::remove_all(p, ec);
    CHORUS_LOG(INFO) << "finetune: removed " << p.string() << " (an interrupted checkpoint write)";
  }
  RemoveAtomicWriteTempFiles(dir.string());
  if (!stale.empty()) (void)SyncDirectory(dir.string());
}

// A checkpoint is made visible atomically: every file is written (each fsynced) into
// `.tmp-checkpoint-<step>`, which is then renamed to `checkpoint-<step>` and the output
// directory fsynced; a reader (--resume) never sees a partial one. A directory being replaced or
// pruned is first renamed to a `.tmp-` name, so a kill midway never leaves a torn
// `checkpoint-*` either; `.tmp-` leftovers are removed at the next start.
Status SaveCheckpoint(const FinetuneOptions& o, const model::ModelConfig& c,
                      const LoraParams& params, int64_t step, const json& signature) {
  const fs::path dir(o.output_dir);
  const fs::path tmp = dir / (".tmp-checkpoint-" + std::to_string(step));
  const fs::path final_dir = dir / ("checkpoint-" + std::to_string(step));
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return InternalError("cannot create " + tmp.string() + ": " + ec.message());
  adapters::PeftWriteOptions pw;
  pw.base_model_name = o.base_model_name;
  CHORUS_RETURN_IF_ERROR(adapters::WritePeftLora(tmp.string(), params.ToLoraWeights(c), c, pw));
  CrashPoint("checkpoint.after_adapter");
  std::vector<std::pair<std::string, Tensor>> state;
  const std::vector<const Param*> ps = params.params();
  const std::vector<std::string> names = params.param_names();
  for (size_t i = 0; i < ps.size(); ++i) {
    state.emplace_back(names[i] + ".value", F32Tensor(ps[i]->value));
    state.emplace_back(names[i] + ".m", F32Tensor(ps[i]->m));
    state.emplace_back(names[i] + ".v", F32Tensor(ps[i]->v));
  }
  CHORUS_RETURN_IF_ERROR(
      formats::WriteSafetensors((tmp / "optimizer.safetensors").string(), state));
  const json st = {{"step", step}, {"run", signature}};
  CHORUS_RETURN_IF_ERROR(WriteFileAtomically((tmp / "trainer_state.json").string(), st.dump(2)));
  CrashPoint("checkpoint.before_rename");
  if (fs::exists(final_dir, ec)) {
    // Replaced (a run restarted without --resume): moved out of the way first.
    const fs::path old = dir / (".tmp-old-checkpoint-" + std::to_string(step));
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    if (ec) return InternalError("cannot rename " + final_dir.string() + ": " + ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  if (ec) return InternalError("cannot rename " + tmp.string() + ": " + ec.message());
  CHORUS_RETURN_IF_ERROR(SyncDirectory(dir.string()));
  CrashPoint("checkpoint.after_rename");
  // Keep the latest kKeepCheckpoints (and drop a replaced one).
  fs::remove_all(dir / (".tmp-old-checkpoint-" + std::to_string(step)), ec);
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n.starts_with("checkpoint-")) steps.push_back(std::atoll(n.c_str() + 11));
  }
  std::sort(steps.rbegin(), steps.rend());
  for (size_t i = kKeepCheckpoints; i < steps.size(); ++i) {
    const std::string n = "checkpoint-" + std::to_string(steps[i]);
    const fs::path doomed = dir / (".tmp-pruned-" + n);
    fs::rename(dir / n, doomed, ec);
    if (!ec) fs::remove_all(doomed, ec);
  }
  return OkStatus();
}

// The latest complete checkpoint's step (0 when none).
int64_t LatestCheckpoint(const std::string& dir) {
  std::error_code ec;
  int64_t best = 0;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (!n.starts_with("checkpoint-")) continue;
    if (!fs::exists(e.path() / "trainer_state.json")) continue;
    best = std::max<int64_t>(best, std::atoll(n.c_str() + 11));
  }
  return best;
}

Status LoadCheckpoint(const std::string& dir, int64_t step, const json& signature,
                      LoraParams* params) {
  const fs::path ck = fs::path(dir) / ("checkpoint-" + std::to_string(step));
  CHORUS_ASSIGN_OR_RETURN(std::string st_text,
                          ReadFileToString((ck / "trainer_state.json").string()));
  const json st = json::parse(st_text, nullptr, false);
  if (st.is_discarded() || !st.contains("run")) {
    return InvalidArgumentError((ck / "trainer_state.json").string() + ": not a trainer state");
  }
  if (st["run"] != signature) {
    return InvalidArgumentError("cannot resume from " + ck.string() +
                                ": it was made with other options or data (" + st["run"].dump() +
                                ", this run: " + signature.dump() + ")");
  }
  CHORUS_ASSIGN_OR_RETURN(auto file,
                          formats::SafetensorsFile::Open((ck / "optimizer.safetensors").string()));
  const std::vector<Param*> ps = params->params();
  const std::vector<std::string> names = params->param_names();
  for (size_t i = 0; i < ps.size(); ++i) {
    for (const char* part : {".value", ".m", ".v"}) {
      CHORUS_ASSIGN_OR_RETURN(Tensor t, file->GetTensor(names[i] + part));
      if (t.dtype() != DType::kF32 || t.shape().size() != 1 ||
          t.shape()[0] != static_cast<int64_t>(ps[i]->value.size())) {
        return InvalidArgumentError(ck.string() + ": tensor " + names[i] + part +
                                    " has the wrong shape or dtype");
      }
      std::vector<float>& dst = part[1] == 'v' && part[2] == 'a' ? ps[i]->value
                                : part[1] == 'm'                 ? ps[i]->m
                                                                 : ps[i]->v;
      const float* src = static_cast<const float*>(t.data());
      std::copy(src, src + dst.size(), dst.begin());
    }
  }
  return OkStatus();
}

}  // namespace

Result<double> EvalLoss(TrainModel& tm, const LoraParams& params,
                        const std::vector<Sample>& samples, int64_t seq_len, int64_t batch,
                        ThreadPool* pool) {
  std::vector<int64_t> order(samples.size());
  std::iota(order.begin(), order.end(), 0);
  const std::vector<PackedSeq> seqs = Pack(samples, order, seq_len);
  double sum = 0;
  int64_t tokens = 0;
  for (size_t i = 0; i < seqs.size(); i += static_cast<size_t>(batch)) {
    Batch b;
    for (size_t j = i; j < std::min(seqs.size(), i + static_cast<size_t>(batch)); ++j) {
      AppendSequence(samples, seqs[j], &b);
    }
    CHORUS_ASSIGN_OR_RETURN(LossSum ls, tm.Loss(b, params, pool));
    sum += ls.sum;
    tokens += ls.tokens;
  }
  if (tokens == 0) return InvalidArgumentError("evaluation data has no token to score");
  return sum / static_cast<double>(tokens);
}

Result<FinetuneResult> RunFinetune(std::shared_ptr<const model::Model> model,
                                   const tokenizer::Tokenizer& tok, const FinetuneOptions& opts,
                                   ThreadPool* pool,
                                   const std::function<void(const StepReport&)>& progress) {
  CHORUS_RETURN_IF_ERROR(Validate(opts));
  const model::ModelConfig& c = model->config();
  if (opts.data.seq_len > c.max_seq_len) {
    return InvalidArgumentError("--seq-len " + std::to_string(opts.data.seq_len) +
                                " is longer than the model's context of " +
                                std::to_string(c.max_seq_len));
  }
  if (tok.vocab_size() > c.vocab_size) {
    return InvalidArgumentError("the tokenizer's vocabulary (" + std::to_string(tok.vocab_size()) +
                                ") is larger than the model's (" + std::to_string(c.vocab_size) +
                                ")");
  }
  CHORUS_ASSIGN_OR_RETURN(std::vector<Sample> samples, LoadSamples(opts.data_path, tok, opts.data));
  std::vector<Sample> eval_samples;
  if (!opts.eval_path.empty()) {
    CHORUS_ASSIGN_OR_RETURN(eval_samples, LoadSamples(opts.eval_path, tok, opts.data));
  }
  CHORUS_ASSIGN_OR_RETURN(LoraParams params, LoraParams::Init(c, opts.lora));
  const Plan plan = MakePlan(samples, opts);
  const int64_t total = static_cast<int64_t>(plan.steps.size());
  const json signature = RunSignature(opts, static_cast<int64_t>(samples.size()));
  if (opts.on_validated) {
    opts.on_validated(static_cast<int64_t>(samples.size()),
                      static_cast<int64_t>(eval_samples.size()), total);
  }

  std::error_code ec;
  fs::create_directories(opts.output_dir, ec);
  if (ec) return InternalError("cannot create " + opts.output_dir + ": " + ec.message());
  // One run per output directory; then what a killed run left is removed.
  CHORUS_ASSIGN_OR_RETURN(const FileLock lock,
                          FileLock::Acquire((fs::path(opts.output_dir) / ".lock").string(),
                                            "the fine-tuning output directory " + opts.output_dir));
  RemoveInterruptedWrites(opts.output_dir);
  int64_t start = 0;
  const std::string csv_path = (fs::path(opts.output_dir) / "loss.csv").string();
  std::string csv_keep = "step,epoch,lr,loss,grad_norm,tokens_per_s,elapsed_s,eval_loss\n";
  if (opts.resume) {
    start = LatestCheckpoint(opts.output_dir);
    if (start > 0) {
      CHORUS_RETURN_IF_ERROR(LoadCheckpoint(opts.output_dir, start, signature, &params));
      // Keep the curve up to the checkpoint: whole rows only (a killed run may have left half
      // a row after the checkpoint's).
      if (auto old = ReadFileToString(csv_path); old.ok()) {
        std::istringstream in(*old);
        std::string line;
        std::getline(in, line);
        while (std::getline(in, line) && !in.eof()) {
          if (std::count(line.begin(), line.end(), ',') == 7 && std::atoll(line.c_str()) <= start)
            csv_keep += line + "\n";
        }
      }
    }
  }
  CHORUS_RETURN_IF_ERROR(WriteFileAtomically(csv_path, csv_keep));
  std::FILE* csv = std::fopen(csv_path.c_str(), "a");
  if (csv == nullptr) return InternalError("cannot open " + csv_path);
  struct Closer {
    std::FILE* f;
    ~Closer() { std::fclose(f); }
  } closer{csv};

  TrainModel tm(model, opts.batch * opts.data.seq_len);
  const std::vector<Param*> ps = params.params();
  FinetuneResult result;
  result.samples = static_cast<int64_t>(samples.size());
  result.sequences_per_epoch = plan.sequences_per_epoch;
  result.trainable_params = params.n_trainable();
  const auto t0 = std::chrono::steady_clock::now();
  int64_t tokens_done = 0;
  for (int64_t s = start; s < total; ++s) {
    if (opts.cancel != nullptr && opts.cancel->load(std::memory_order_relaxed)) {
      return CancelledError("cancelled before step " + std::to_string(s + 1));
    }
    ThreadPool* step_pool = pool;
    if (opts.before_step) {
      step_pool = opts.before_step();
      if (step_pool == nullptr)
        return CancelledError("stopped before step " + std::to_string(s + 1));
    }
    struct StepEnd {
      const std::function<void()>& fn;
      ~StepEnd() {
        if (fn) fn();
      }
    } step_end{opts.after_step};
    const std::vector<PackedSeq>& seqs = plan.steps[static_cast<size_t>(s)];
    // The step's micro-batches and its loss-token count (the loss is the step's mean).
    std::vector<Batch> micro;
    int64_t loss_tokens = 0;
    for (size_t i = 0; i < seqs.size(); i += static_cast<size_t>(opts.batch)) {
      Batch b;
      for (size_t j = i; j < std::min(seqs.size(), i + static_cast<size_t>(opts.batch)); ++j) {
        AppendSequence(samples, seqs[j], &b);
      }
      loss_tokens += b.loss_tokens();
      micro.push_back(std::move(b));
    }
    params.ZeroGrad();
    double loss_sum = 0;
    const float scale = loss_tokens > 0 ? 1.0f / static_cast<float>(loss_tokens) : 0.0f;
    for (const Batch& b : micro) {
      CHORUS_ASSIGN_OR_RETURN(LossSum ls, tm.ForwardBackward(b, &params, scale, step_pool));
      loss_sum += ls.sum;
      tokens_done += b.size();
    }
    const double norm = ClipGradNorm(ps, opts.clip);
    const double lr = LearningRate(s, total, opts.warmup, opts.lr, opts.schedule);
    AdamWStep(ps, opts.adamw, lr, s + 1);

    StepReport r;
    r.step = s + 1;
    r.total_steps = total;
    r.epoch = plan.epoch_at[static_cast<size_t>(s)];
    r.loss = loss_tokens > 0 ? loss_sum / static_cast<double>(loss_tokens) : 0.0;
    r.lr = lr;
    r.grad_norm = norm;
    r.tokens = tokens_done;
    r.elapsed_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.tokens_per_s = r.elapsed_s > 0 ? static_cast<double>(tokens_done) / r.elapsed_s : 0.0;
    r.eta_s = r.elapsed_s / static_cast<double>(s + 1 - start) * static_cast<double>(total - s - 1);
    const bool last = s + 1 == total;
    r.checkpoint = last || (opts.save_every > 0 && (s + 1) % opts.save_every == 0);
    if (r.checkpoint && !eval_samples.empty()) {
      CHORUS_ASSIGN_OR_RETURN(
          double el, EvalLoss(tm, params, eval_samples, opts.data.seq_len, opts.batch, step_pool));
      r.eval_loss = el;
      result.eval_loss = el;
    }
    // The row before the checkpoint: a resumed run keeps the rows up to its checkpoint, so
    // the curve never misses the checkpoint's step.
    std::fprintf(csv, "%lld,%.4f,%.6g,%.6f,%.6f,%.1f,%.2f,%s\n", static_cast<long long>(s + 1),
                 r.epoch, lr, r.loss, norm, r.tokens_per_s, r.elapsed_s,
                 r.eval_loss ? std::to_string(*r.eval_loss).c_str() : "");
    std::fflush(csv);
    if (r.checkpoint) {
      CHORUS_RETURN_IF_ERROR(SaveCheckpoint(opts, c, params, s + 1, signature));
    }
    result.final_loss = r.loss;
    result.tokens_per_s = r.tokens_per_s;
    if (progress) progress(r);
  }
  result.steps = total;
  result.activation_bytes = tm.activation_bytes();
  // The final adapter at the top of the output directory.
  adapters::PeftWriteOptions pw;
  pw.base_model_name = opts.base_model_name;
  CHORUS_RETURN_IF_ERROR(adapters::WritePeftLora(opts.output_dir, params.ToLoraWeights(c), c, pw));
  return result;
}

}  // namespace chorus::train

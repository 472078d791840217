// `chorus finetune`: trains a LoRA adapter over a frozen base model (any format Chorus loads,
// quantized bases included) and writes it as a PEFT directory (docs/finetuning.md).
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <sstream>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/train/finetune.h"

namespace chorus::apps {
namespace {

Result<std::vector<model::Linear>> ParseTargets(const std::string& s) {
  std::vector<model::Linear> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (item.empty()) continue;
    if (item.ends_with("_proj")) item.resize(item.size() - 5);
    bool found = false;
    for (int i = 0; i < model::kNumLinears; ++i) {
      std::string name = model::LinearName(static_cast<model::Linear>(i));
      name.resize(name.size() - 5);  // "q_proj" -> "q"
      if (name == item) {
        if (std::find(out.begin(), out.end(), static_cast<model::Linear>(i)) == out.end()) {
          out.push_back(static_cast<model::Linear>(i));
        }
        found = true;
      }
    }
    if (!found) {
      return InvalidArgumentError("flag --targets: unknown module '" + item +
                                  "' (q, k, v, o, gate, up, down)");
    }
  }
  if (out.empty()) return InvalidArgumentError("flag --targets: no module given");
  return out;
}

std::string Clock(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long long t = std::llround(s);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

int FinetuneCommand(int argc, char** argv) {
  Flags f(
      "finetune",
      "Trains a LoRA adapter on --data over the frozen base --model (f32/f16/bf16/q8_0/q4_0\n"
      "weights; the adapter and optimizer state are f32) and writes it to --output as a PEFT\n"
      "directory (adapter_config.json + adapter_model.safetensors) that `chorus serve --lora`\n"
      "and PEFT load. Data: JSONL with {\"prompt\",\"completion\"}, {\"messages\":[...]} or\n"
      "{\"text\"} per line (*.jsonl / *.json), or plain text with documents separated by blank\n"
      "lines (any other name). Writes loss.csv and checkpoint-<step>/ directories;\n"
      "--resume continues from the latest checkpoint (docs/finetuning.md).");
  f.String("model", "", "base model: GGUF file, Hugging Face directory or llama2.c .bin");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.String("data", "", "training data (required)");
  f.String("eval", "", "held-out data (same formats): mean loss at each checkpoint");
  f.String("output", "", "output directory (required)");
  f.String("targets", "q,k,v,o", "LoRA target linears: any of q,k,v,o,gate,up,down");
  f.Int("rank", 8, "LoRA rank r");
  f.Float("alpha", 0, "lora_alpha (scale = alpha / r); 0 = 2·r");
  f.Float("lr", 2e-4, "peak learning rate (AdamW)");
  f.Int("epochs", 1, "passes over the data (ignored when --steps is set)");
  f.Int("steps", 0, "optimizer steps (0 = --epochs passes)");
  f.Int("batch", 4, "packed sequences per micro-batch");
  f.Int("grad-accum", 1, "micro-batches per optimizer step");
  f.Int("seq-len", 256, "tokens per packed sequence (longer samples are an error)");
  f.Int("warmup", 0, "linear warm-up steps");
  f.String("schedule", "cosine", "learning-rate decay after warm-up: cosine, linear, constant");
  f.Float("clip", 1.0, "max global gradient norm (0 = no clipping)");
  f.Float("weight-decay", 0.0, "AdamW decoupled weight decay");
  f.Int("seed", 1, "seed of the LoRA init and the data order (same seed = same adapter)");
  f.Int("save-every", 0, "write a checkpoint every N steps (0 = only at the end)");
  f.Bool("resume", "continue from the latest checkpoint in --output");
  f.Int("max-data-bytes", int64_t{256} << 20, "refuse data files larger than this");
  f.String("chat-template", "", "chat template (FILE or STRING) for {\"messages\"} data");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  f.String("isa", "best", "kernel level cap: best, amx, avx512, avx2, scalar");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  if (Status s = ApplyIsaFlag(f); !s.ok()) return Fail("finetune", s);
  if (f.GetString("model").empty()) {
    return Fail("finetune", InvalidArgumentError("flag --model is required"));
  }
  train::FinetuneOptions o;
  o.data_path = f.GetString("data");
  o.eval_path = f.GetString("eval");
  o.output_dir = f.GetString("output");
  auto targets = ParseTargets(f.GetString("targets"));
  if (!targets.ok()) return Fail("finetune", targets.status());
  o.lora.targets = *targets;
  o.lora.rank = f.GetInt("rank");
  o.lora.alpha = static_cast<float>(f.GetFloat("alpha"));
  if (o.lora.alpha == 0.0f) o.lora.alpha = 2.0f * static_cast<float>(o.lora.rank);
  o.lora.seed = static_cast<uint64_t>(f.GetInt("seed"));
  o.lr = f.GetFloat("lr");
  o.epochs = f.GetInt("epochs");
  o.steps = f.GetInt("steps");
  o.batch = f.GetInt("batch");
  o.grad_accum = f.GetInt("grad-accum");
  o.data.seq_len = f.GetInt("seq-len");
  o.data.max_file_bytes = f.GetInt("max-data-bytes");
  o.warmup = f.GetInt("warmup");
  auto sched = train::ParseSchedule(f.GetString("schedule"));
  if (!sched.ok()) return Fail("finetune", sched.status().WithContext("flag --schedule"));
  o.schedule = *sched;
  o.clip = f.GetFloat("clip");
  o.adamw.weight_decay = f.GetFloat("weight-decay");
  o.save_every = f.GetInt("save-every");
  o.resume = f.GetBool("resume");
  if (!f.GetString("chat-template").empty()) {
    auto t = ReadChatTemplateFlag(f.GetString("chat-template"));
    if (!t.ok()) return Fail("finetune", t.status().WithContext("flag --chat-template"));
    o.data.chat_template = t->source;
  }

  auto loaded = LoadModelAndTokenizer(f.GetString("model"), f.GetString("tokenizer"));
  if (!loaded.ok()) return Fail("finetune", loaded.status());
  o.base_model_name = f.GetString("model");
  ThreadPool pool(ThreadsFlag(f));
  std::fprintf(stderr, "chorus finetune: %s, LoRA rank %lld alpha %g on %s, %d threads, %s\n",
               loaded->model->config().Summary().c_str(), static_cast<long long>(o.lora.rank),
               o.lora.alpha, f.GetString("targets").c_str(), pool.size(), IsaLine().c_str());
  const bool tty = isatty(fileno(stderr)) != 0;
  auto res = train::RunFinetune(
      loaded->model, *loaded->tokenizer, o, &pool, [&](const train::StepReport& r) {
        char eval[48] = "";
        if (r.eval_loss) {
          std::snprintf(eval, sizeof eval, " | eval %.4f (ppl %.3f)", *r.eval_loss,
                        std::exp(*r.eval_loss));
        }
        std::fprintf(stderr,
                     "%sstep %lld/%lld | epoch %.2f | loss %.4f | lr %.3g | grad %.3f | "
                     "%.0f tok/s | %s elapsed | ETA %s%s%s",
                     tty ? "\r\033[K" : "", static_cast<long long>(r.step),
                     static_cast<long long>(r.total_steps), r.epoch, r.loss, r.lr, r.grad_norm,
                     r.tokens_per_s, Clock(r.elapsed_s).c_str(), Clock(r.eta_s).c_str(), eval,
                     r.checkpoint ? " | saved" : "");
        if (!tty || r.checkpoint || r.step == r.total_steps) std::fputc('\n', stderr);
      });
  if (!res.ok()) return Fail("finetune", res.status());
  std::printf("steps %lld, samples %lld, sequences/epoch %lld, trainable %lld params\n",
              static_cast<long long>(res->steps), static_cast<long long>(res->samples),
              static_cast<long long>(res->sequences_per_epoch),
              static_cast<long long>(res->trainable_params));
  std::printf("final loss %.4f%s, %.1f tokens/s, activations %.1f MiB\n", res->final_loss,
              res->eval_loss ? (", eval loss " + std::to_string(*res->eval_loss) + " (ppl " +
                                std::to_string(std::exp(*res->eval_loss)) + ")")
                                   .c_str()
                             : "",
              res->tokens_per_s, static_cast<double>(res->activation_bytes) / (1 << 20));
  std::printf(
      "adapter: %s (PEFT); loss curve: %s/loss.csv (plot: tools/plot.py loss %s/loss.csv)\n",
      o.output_dir.c_str(), o.output_dir.c_str(), o.output_dir.c_str());
  return 0;
}

}  // namespace chorus::apps

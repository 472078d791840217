#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "apps/chorus/tp_cli.h"
#include "chorus/engine/engine.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/forward.h"
#include "chorus/server/template_routes.h"

namespace chorus::apps {

int GenerateCommand(int argc, char** argv) {
  Flags f("generate",
          "Generates text from --prompt and streams it to stdout; prints prefill and decode\n"
          "tokens/s to stderr at the end. --prompt \"\" starts from BOS alone.");
  f.String(
      "model", "",
      "model: GGUF file, Hugging Face directory or llama2.c .bin (default: embedded tiny model)");
  f.String("tokenizer", "", "tokenizer file or directory; overrides the model's own");
  f.String("prompt", "", "prompt text");
  f.Int("max-tokens", 128, "tokens to generate");
  f.Float("temperature", 0.8, "sampling temperature; 0 = greedy");
  f.Float("top-p", 0.95, "nucleus sampling threshold (1 = off)");
  f.Int("top-k", 40, "keep the k most likely tokens (0 = off)");
  f.Float("min-p", 0.05, "drop tokens below min-p x the top probability (0 = off)");
  f.Float("repetition-penalty", 1.0, "HF-style repetition penalty (1 = off)");
  f.Float("presence-penalty", 0.0, "OpenAI presence penalty");
  f.Float("frequency-penalty", 0.0, "OpenAI frequency penalty");
  f.Int("seed", -1, "sampling seed (-1 = random); the same seed gives the same tokens");
  f.Repeated("stop", "stop string");
  f.Bool("ignore-eos", "keep generating past the end-of-sequence token");
  f.Bool("no-bos", "do not prepend BOS");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  f.Int("max-batch-tokens", 512, "prefill chunk size (tokens per step)");
  f.String("kv-dtype", "bf16",
           "KV cache elements: bf16 (values rounded to nearest even when written), or f32");
  f.Bool("quiet", "do not print the statistics line");
  f.Bool("chat", "send --prompt as a user message through the model's chat template");
  f.String("system", "", "with --chat: a system message before the prompt");
  f.String("chat-template", "",
           "chat template (a Jinja FILE or the template STRING itself) replacing the model's "
           "own; implies --chat");
  f.Bool("show-prompt", "print the prompt text (after the chat template) to stderr");
  f.Int("tp", 1,
        "tensor-parallel ranks: run as `mpirun -np N chorus generate --tp N ...` "
        "(docs/scaleout.md); rank 0 prints");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;

  auto tp = StartTensorParallel(static_cast<int>(f.GetInt("tp")));
  if (!tp.ok()) return Fail("generate", tp.status());
  auto loaded = LoadModelAndTokenizer(f.GetString("model"), f.GetString("tokenizer"));
  if (Status s = AgreeAcrossRanks(tp->comm.get(), loaded.status()); !s.ok())
    return Fail("generate", s);
  if (Status s = ShardForTensorParallel(&*tp, &loaded->model); !s.ok()) return Fail("generate", s);
  if (tp->worker()) {  // ranks > 0 compute their shard of every step rank 0 plans
    Status s = model::RunTpWorker(tp->comm.get(), loaded->model);
    return s.ok() ? 0 : Fail("generate", s);
  }
  const auto& tok = *loaded->tokenizer;
  const auto& cfg = loaded->model->config();

  auto chat_template = ReadChatTemplateFlag(f.GetString("chat-template"));
  if (!chat_template.ok()) return Fail("generate", chat_template.status());
  std::vector<int32_t> prompt;
  if (f.GetBool("chat") || !chat_template->source.empty()) {
    // The same template choice and rendering as `chorus serve`'s /v1/chat/completions.
    auto choice = server::ChooseChatTemplate(tok, chat_template->source, chat_template->label);
    if (!choice.ok()) return Fail("generate", choice.status());
    if (choice->is_fallback)
      std::fprintf(stderr, "chorus generate: chat template: %s\n", choice->note.c_str());
    nlohmann::json body = {{"messages", nlohmann::json::array()}};
    if (!f.GetString("system").empty()) {
      body["messages"].push_back({{"role", "system"}, {"content", f.GetString("system")}});
    }
    body["messages"].push_back({{"role", "user"}, {"content", f.GetString("prompt")}});
    server::ApiContext ctx;
    ctx.tok = &tok;
    ctx.chat_template = &choice->tmpl;
    std::string text;
    if (auto e = server::RenderChatPrompt(body.dump(), ctx, &text)) {
      return Fail("generate", InvalidArgumentError(e->message));
    }
    if (f.GetBool("show-prompt")) std::fprintf(stderr, "%s\n", text.c_str());
    prompt = server::EncodeChatPrompt(tok, text);
  } else {
    tokenizer::EncodeOptions eo;
    eo.add_bos = !f.GetBool("no-bos") && tok.add_bos();
    if (f.GetBool("show-prompt")) std::fprintf(stderr, "%s\n", f.GetString("prompt").c_str());
    prompt = tok.Encode(f.GetString("prompt"), eo);
  }
  if (prompt.empty()) {
    if (tok.bos_id() < 0)
      return Fail("generate",
                  InvalidArgumentError("empty prompt and the tokenizer has no BOS token"));
    prompt.push_back(tok.bos_id());
  }

  engine::GenerationRequest req;
  req.prompt = prompt;
  req.max_tokens = f.GetInt("max-tokens");
  if (req.max_tokens < 1)
    return Fail("generate", InvalidArgumentError("flag --max-tokens must be at least 1"));
  // Like llama.cpp's -n, a request longer than the context is cut to what fits, with a note.
  const int64_t room = cfg.max_seq_len - static_cast<int64_t>(prompt.size());
  if (room < 1) {
    return Fail("generate", InvalidArgumentError("the prompt has " + std::to_string(prompt.size()) +
                                                 " tokens; the model's context is " +
                                                 std::to_string(cfg.max_seq_len)));
  }
  if (req.max_tokens > room) {
    std::fprintf(stderr,
                 "chorus generate: note: --max-tokens %lld does not fit the context (%lld tokens, "
                 "prompt %zu); generating at most %lld\n",
                 static_cast<long long>(req.max_tokens), static_cast<long long>(cfg.max_seq_len),
                 prompt.size(), static_cast<long long>(room));
    req.max_tokens = room;
  }
  req.stop = f.GetRepeated("stop");
  req.ignore_eos = f.GetBool("ignore-eos");
  req.id = "cli";
  auto& sp = req.sampling;
  sp.temperature = static_cast<float>(f.GetFloat("temperature"));
  sp.top_p = static_cast<float>(f.GetFloat("top-p"));
  sp.top_k = static_cast<int32_t>(f.GetInt("top-k"));
  sp.min_p = static_cast<float>(f.GetFloat("min-p"));
  sp.repetition_penalty = static_cast<float>(f.GetFloat("repetition-penalty"));
  sp.presence_penalty = static_cast<float>(f.GetFloat("presence-penalty"));
  sp.frequency_penalty = static_cast<float>(f.GetFloat("frequency-penalty"));
  int64_t seed = f.GetInt("seed");
  sp.seed = seed >= 0 ? static_cast<uint64_t>(seed) : std::random_device{}();

  engine::EngineOptions eopts;
  eopts.threads = ThreadsFlag(f);
  eopts.max_batch_tokens = f.GetInt("max-batch-tokens");
  eopts.max_running = 1;
  eopts.max_queue = 1;
  if (tp->leader) {
    eopts.tp_leader = tp->leader.get();
    eopts.prefix_cache = false;  // one request: nothing to share (and not supported under TP)
  }
  if (auto kv_dtype = memory::ParseKvDtype(f.GetString("kv-dtype")); kv_dtype.ok()) {
    eopts.kv_dtype = *kv_dtype;
  } else {
    return Fail("generate", kv_dtype.status().WithContext("flag --kv-dtype"));
  }
  const memory::KvLayout layout = model::KvLayoutFor(cfg, 16, eopts.kv_dtype);
  const int64_t tokens = static_cast<int64_t>(prompt.size()) + req.max_tokens;
  eopts.pool_bytes = std::max<int64_t>(
      int64_t{1} << 20,
      (layout.Groups().PagesFor(tokens, eopts.max_batch_tokens, 16) + 1) * layout.PageBytes());
  auto eng = engine::Engine::Create(loaded->model, loaded->tokenizer, eopts);
  if (!eng.ok()) return Fail("generate", eng.status());
  const auto t0 = std::chrono::steady_clock::now();
  auto handle = (*eng)->Submit(std::move(req));
  if (!handle.ok()) return Fail("generate", handle.status());
  std::chrono::steady_clock::time_point t_first;
  int64_t n_gen = 0;
  engine::FinishReason finish = engine::FinishReason::kNone;
  while (finish == engine::FinishReason::kNone) {
    auto ev = (*handle)->Next(std::chrono::milliseconds(1000));
    if (!ev) continue;
    if (ev->token >= 0 && ++n_gen == 1) t_first = std::chrono::steady_clock::now();
    std::fwrite(ev->text.data(), 1, ev->text.size(), stdout);
    std::fflush(stdout);
    finish = ev->finish;
  }
  const auto t_end = std::chrono::steady_clock::now();
  std::fputc('\n', stdout);
  if (!f.GetBool("quiet")) {
    const double prefill_s = std::chrono::duration<double>(t_first - t0).count();
    const double decode_s = std::chrono::duration<double>(t_end - t_first).count();
    std::fprintf(stderr,
                 "chorus generate: prompt %zu tokens, prefill %.1f tok/s (%.3f s); generated %lld "
                 "tokens, decode %.1f tok/s; "
                 "finish=%s\n",
                 prompt.size(), n_gen ? prompt.size() / prefill_s : 0.0, prefill_s,
                 static_cast<long long>(n_gen), n_gen > 1 ? (n_gen - 1) / decode_s : 0.0,
                 engine::FinishReasonName(finish));
  }
  return finish == engine::FinishReason::kError ? 1 : 0;
}

}  // namespace chorus::apps

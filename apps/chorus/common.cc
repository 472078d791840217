#include "apps/chorus/common.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <thread>

#include "apps/chorus/default_model.h"
#include "chorus/kernels/delta.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/model/loader.h"
#include "chorus/tokenizer/chat_template.h"

namespace chorus::apps {

int Fail(const std::string& cmd, const Status& s) {
  std::fprintf(stderr, "chorus %s: %s\n", cmd.c_str(), s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument && s.message().find("flag") != std::string::npos
             ? 2
             : 1;
}

int ParseOrExit(Flags& flags, int argc, char** argv) {
  Status s = flags.Parse(argc, argv);
  if (s.code() == StatusCode::kCancelled) return 0;
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.message().c_str());
    return 2;
  }
  return -1;
}

Result<LoadedModel> LoadModelAndTokenizer(const std::string& model_path,
                                          const std::string& tokenizer_path) {
  std::string path = model_path;
  if (path.empty()) {
    CHORUS_ASSIGN_OR_RETURN(path, EnsureDefaultModel());
  }
  // Errors name the flag whose value failed (a supervisor's log then says what to fix).
  LoadedModel out;
  auto mdl = model::LoadModel(path);
  if (!mdl.ok()) {
    return mdl.status().WithContext(model_path.empty() ? "the embedded default model"
                                                       : "flag --model");
  }
  out.model = std::move(*mdl);
  auto tok = model::LoadTokenizerFor(*out.model, tokenizer_path);
  if (!tok.ok()) return tok.status().WithContext("flag --tokenizer");
  out.tokenizer = std::move(*tok);
  return out;
}

Status ApplyIsaFlag(const Flags& f) {
  std::string isa = f.GetString("isa");
  if (const char* env = std::getenv("CHORUS_ISA"); isa == "best" && env != nullptr && *env)
    isa = env;
  if (isa == "best") return OkStatus();
  const std::optional<kernels::IsaLevel> cap = kernels::ParseIsaLevel(isa);
  if (!cap) {
    return InvalidArgumentError(
        "--isa (or CHORUS_ISA) must be best, amx, avx512, avx2 or scalar, got '" +
        isa.substr(0, 32) + "'");
  }
  kernels::SetMaxIsa(*cap);
  if (kernels::ActiveIsa() != *cap) {
    std::string why =
        "--isa " + isa + ": this CPU supports at most " + kernels::IsaName(kernels::ActiveIsa());
    if (*cap == kernels::IsaLevel::kAmx) why += " (" + kernels::AmxUnavailableReason() + ")";
    return InvalidArgumentError(why);
  }
  return OkStatus();
}

Status ApplyDeltaActivationsFlag(const Flags& f) {
  const std::string name = f.GetString("delta-activations");
  std::optional<kernels::DeltaActivations> parsed;
  if (!kernels::ParseDeltaActivations(name, &parsed)) {
    return InvalidArgumentError("--delta-activations must be auto, int16 or f32, got '" +
                                name.substr(0, 32) + "'");
  }
  kernels::SetDeltaActivations(parsed);
  return OkStatus();
}

std::string IsaLine() {
  return "kernels: isa " + kernels::IsaName(kernels::ActiveIsa()) +
         " (cpu: " + kernels::CpuFeaturesString() + "); delta term activations " +
         kernels::DeltaActivationsName(kernels::DefaultDeltaActivations());
}

int ThreadsFlag(const Flags& f) {
  int64_t t = f.GetInt("threads");
  if (t <= 0) t = static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(t);
}

Result<ChatTemplateFlag> ReadChatTemplateFlag(const std::string& value) {
  ChatTemplateFlag out;
  if (value.empty()) return out;
  std::error_code ec;
  if (std::filesystem::is_regular_file(value, ec)) {
    if (std::filesystem::file_size(value, ec) > (size_t{1} << 20)) {
      return InvalidArgumentError("flag --chat-template " + value + ": larger than 1 MiB");
    }
    std::ifstream in(value, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    if (!in) return InvalidArgumentError("flag --chat-template " + value + ": cannot be read");
    out.source = ss.str();
    out.label = value;
  } else if (value.find("{{") != std::string::npos || value.find("{%") != std::string::npos) {
    out.source = value;
    out.label = "(inline)";
  } else {
    return InvalidArgumentError("flag --chat-template " + value +
                                ": no such file, and not a template (no {{ or {% in it)");
  }
  auto t = tokenizer::ChatTemplate::Parse(out.source);
  if (!t.ok()) {
    return InvalidArgumentError("flag --chat-template " + out.label +
                                " does not compile: " + t.status().message());
  }
  return out;
}

}  // namespace chorus::apps

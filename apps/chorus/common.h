// Helpers shared by the subcommands.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "apps/chorus/flags.h"
#include "chorus/base/status.h"
#include "chorus/model/model.h"
#include "chorus/tokenizer/tokenizer.h"

namespace chorus::apps {

// Prints "chorus <cmd>: <message>" to stderr and returns the exit code (1; 2 for usage errors).
int Fail(const std::string& cmd, const Status& s);

// Parses flags; returns -1 to continue, else the exit code (0 after --help).
int ParseOrExit(Flags& flags, int argc, char** argv);

struct LoadedModel {
  std::shared_ptr<const model::Model> model;
  std::shared_ptr<const tokenizer::Tokenizer> tokenizer;
};
// --model PATH (or the embedded default when empty) and --tokenizer PATH.
Result<LoadedModel> LoadModelAndTokenizer(const std::string& model_path,
                                          const std::string& tokenizer_path);

// Applies --threads: 0 means all cores.
int ThreadsFlag(const Flags& f);

// The --chat-template value (vLLM's and llama.cpp's FILE|STRING): a file's contents when it
// names one, else the text itself when it contains a Jinja tag ("{{" or "{%"); checked to
// compile. `label` names it in messages (the path, or "(inline)"). Empty value → empty result.
struct ChatTemplateFlag {
  std::string source;
  std::string label;
};
Result<ChatTemplateFlag> ReadChatTemplateFlag(const std::string& value);

// Applies --isa (best, amx, avx512, avx2, scalar; "best" defers to the environment variable
// CHORUS_ISA when it is set): caps the kernel level (kernels/dispatch.h). An unknown name, or a
// level this CPU (or, for amx, the OS tile permission) does not allow, is an error naming why.
Status ApplyIsaFlag(const Flags& f);
// --delta-activations auto|int16|f32 (kernels/delta.h): how the delta term multiplies; the
// flag is registered with the help kDeltaActivationsHelp.
Status ApplyDeltaActivationsFlag(const Flags& f);
inline constexpr const char* kDeltaActivationsHelp =
    "how the delta term of full fine-tunes multiplies (docs/deltas.md): int16 (x rounded to 15 "
    "bits per row, integer dot products on the codes: ~2x faster), f32 (exact to the dense "
    "reconstruction's rounding), or auto = int16 where the CPU has its kernel (AVX-512 "
    "VNNI/VBMI2)";
// "kernels: isa amx (cpu: ...)" — the level in use, for the start-up lines of serve and bench.
std::string IsaLine();

}  // namespace chorus::apps

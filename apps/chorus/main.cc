// chorus — serve one base LLM with many fine-tuned variants on CPU. See README.md.
#include <cstdio>
#include <cstring>
#include <string>

#include "apps/chorus/commands.h"

namespace {

constexpr const char* kUsage =
    "usage: chorus <command> [flags]\n"
    "\n"
    "commands:\n"
    "  serve      OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, ...)\n"
    "  generate   generate text from a prompt, streaming it to stdout\n"
    "  inspect    print a model file's architecture, tensors, dtypes and tokenizer\n"
    "  convert    write a model (or a synthetic one at a real shape) as GGUF or HF\n"
    "  bench      engine benchmark: bandwidth, prefill, decode at several batch sizes\n"
    "  profile    measure step latency and fit the cost model of the slo policy\n"
    "  eval       perplexity of a model or variant; KL and same-top-token vs a reference\n"
    "  compress   a full fine-tune as a compressed delta (deltazip, bitdelta, rtn)\n"
    "  router     one OpenAI endpoint over several `chorus serve` replicas\n"
    "  simulate   compare routing policies on a simulated cluster (cost-model driven)\n"
    "  finetune   train a LoRA adapter on JSONL / text data; writes a PEFT directory\n"
    "\n"
    "`chorus <command> --help` shows each command's flags.\n";

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0 ||
      std::strcmp(argv[1], "help") == 0) {
    std::fputs(kUsage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  const std::string cmd = argv[1];
  if (cmd == "--version") {
    std::puts("chorus 0.1.0");
    return 0;
  }
  using namespace chorus::apps;
  if (cmd == "serve") return ServeCommand(argc - 2, argv + 2);
  if (cmd == "generate") return GenerateCommand(argc - 2, argv + 2);
  if (cmd == "inspect") return InspectCommand(argc - 2, argv + 2);
  if (cmd == "convert") return ConvertCommand(argc - 2, argv + 2);
  if (cmd == "bench") return BenchCommand(argc - 2, argv + 2);
  if (cmd == "profile") return ProfileCommand(argc - 2, argv + 2);
  if (cmd == "eval") return EvalCommand(argc - 2, argv + 2);
  if (cmd == "compress") return CompressCommand(argc - 2, argv + 2);
  if (cmd == "router") return RouterCommand(argc - 2, argv + 2);
  if (cmd == "finetune") return FinetuneCommand(argc - 2, argv + 2);
  if (cmd == "simulate") return SimulateCommand(argc - 2, argv + 2);
  std::fprintf(stderr, "chorus: unknown command '%s'\n\n%s", cmd.substr(0, 64).c_str(), kUsage);
  return 2;
}

// Disk → host load of one LoRA adapter (what the host tier's loader thread runs on a cold
// request): LoadLoraAdapter = read the files (mmap), validate against the base, convert to the
// compute layout (finite check, Bᵀ, q/k pair order, bf16 rounding). TinyLlama-1.1B shape, q,k,v,o
// targets, written once into a temp directory as PEFT (f32 / bf16 tensors) and GGUF (f32); the
// files stay in the page cache, so this measures the CPU work of a load, not the disk — unless
// cold = 1: then the files are dropped from the page cache (POSIX_FADV_DONTNEED, untimed) before
// every load, which then reads the disk as a first use after a restart does.
// Arguments: rank, file dtype (0 = f32, 1 = bf16, 2 = GGUF f32), compute storage (0 f32, 1 bf16),
// cold (0 / 1).
//
//   ./lora_load_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//
// Counter: file bytes/s.
#include <benchmark/benchmark.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>

#include "chorus/adapters/lora/lora_files.h"
#include "chorus/base/logging.h"
#include "chorus/model/synthetic.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;

const model::ModelConfig& Base() {
  static const model::ModelConfig c = *model::SyntheticConfig("tinyllama-1.1b");
  return c;
}

// The adapter directory / file for (rank, kind), written on first use.
const std::string& AdapterPath(int64_t rank, int kind) {
  static std::map<std::pair<int64_t, int>, std::string> paths;
  static const std::string dir = [] {
    std::string d =
        (fs::temp_directory_path() / ("chorus-lora-load-bench-" + std::to_string(::getpid())))
            .string();
    fs::create_directories(d);
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(
          fs::temp_directory_path() / ("chorus-lora-load-bench-" + std::to_string(::getpid())), ec);
    });
    return d;
  }();
  auto& p = paths[{rank, kind}];
  if (p.empty()) {
    RandomLoraSpec spec;
    spec.rank = rank;
    spec.alpha = 2.0f * static_cast<float>(rank);
    spec.targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV, model::Linear::kO};
    const LoraWeights w = MakeRandomLora(Base(), spec);
    const std::string base = dir + "/r" + std::to_string(rank) + "-k" + std::to_string(kind);
    if (kind == 2) {
      p = base + ".gguf";
      CHORUS_CHECK(WriteGgufLora(p, w, Base(), {.dtype = DType::kF32}).ok());
    } else {
      p = base;
      PeftWriteOptions wo;
      wo.dtype = kind == 1 ? DType::kBF16 : DType::kF32;
      CHORUS_CHECK(WritePeftLora(p, w, Base(), wo).ok());
    }
  }
  return p;
}

int64_t PathBytes(const std::string& p) {
  int64_t n = 0;
  if (fs::is_directory(p)) {
    for (const auto& e : fs::directory_iterator(p)) n += static_cast<int64_t>(e.file_size());
  } else {
    n = static_cast<int64_t>(fs::file_size(p));
  }
  return n;
}

// Drops every file under `p` from the page cache (clean pages only: they were written earlier).
void DropFromPageCache(const std::string& p) {
  auto drop = [](const fs::path& f) {
    const int fd = ::open(f.c_str(), O_RDONLY | O_CLOEXEC);
    CHORUS_CHECK(fd >= 0) << "cannot open " << f;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (fs::is_directory(p)) {
    for (const auto& e : fs::directory_iterator(p)) drop(e.path());
  } else {
    drop(p);
  }
}

void BM_LoadLora(benchmark::State& state) {
  const int64_t rank = state.range(0);
  const int kind = static_cast<int>(state.range(1));
  const std::string& path = AdapterPath(rank, kind);
  LoraLoadOptions lo;
  lo.limits.storage = state.range(2) != 0 ? LoraStorage::kBF16 : LoraStorage::kF32;
  const bool cold = state.range(3) != 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      DropFromPageCache(path);
      state.ResumeTiming();
    }
    auto a = LoadLoraAdapter(path, Base(), lo, "bench");
    CHORUS_CHECK(a.ok()) << a.status().ToString();
    benchmark::DoNotOptimize(a->get());
  }
  state.SetBytesProcessed(state.iterations() * PathBytes(path));
  state.SetLabel(std::string(kind == 2   ? "gguf-f32"
                             : kind == 1 ? "peft-bf16"
                                         : "peft-f32") +
                 " -> " + (state.range(2) ? "bf16" : "f32") + (cold ? ", from disk" : ""));
}
BENCHMARK(BM_LoadLora)
    ->ArgNames({"rank", "file", "bf16", "cold"})
    ->Args({64, 1, 1, 0})
    ->Args({64, 0, 1, 0})
    ->Args({64, 2, 1, 0})
    ->Args({64, 1, 0, 0})
    ->Args({8, 1, 1, 0})
    ->Args({64, 1, 1, 1})
    ->Args({16, 1, 1, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace chorus::adapters

BENCHMARK_MAIN();

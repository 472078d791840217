#include <cstdio>
#include <fstream>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "apps/chorus/default_model.h"
#include "chorus/engine/profile.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/model/synthetic.h"

namespace chorus::apps {

int ProfileCommand(int argc, char** argv) {
  Flags f("profile",
          "Measures engine step latency on this machine over random step shapes (prefill tokens,\n"
          "decode rows and their depth, LoRA adapters of ranks 8-64) through the real forward\n"
          "pass, fits the linear cost model (CaraServe) and an extended one on 3/4 of the steps,\n"
          "reports R2 and the median error of each on the other 1/4, and writes both as JSON for\n"
          "`chorus serve --policy slo --cost-model FILE` (docs/scheduling.md).");
  f.String("model", "", "model file (default: the embedded default model)");
  f.String("tokenizer", "",
           "tokenizer of --model when it carries none (llama2.c checkpoints: e.g. tok512.bin); "
           "only loaded, the profile uses random token ids");
  f.String("shape", "",
           "profile a synthetic model at this real shape instead (e.g. tinyllama-1.1b; weights "
           "--dtype)");
  f.String("dtype", "q4_0", "weight dtype of --shape");
  f.String("out", "",
           "cost model JSON to write (default: next to the model, <model>.cost-model.json; with "
           "--shape: cost-model-<shape>.json)");
  f.String("csv", "", "also write every timed step (features, seconds) to this CSV");
  f.Int("threads", 0, "compute threads (0 = all cores; profile with what the server will use)");
  f.Int("samples", 160, "step shapes timed");
  f.Int("repeats", 3, "timings per shape (their median, or with --timing min the fastest)");
  f.String("timing", "median",
           "a shape's time from its repeats: median, or min (the fastest: other work on the "
           "machine only ever adds to a step, so the fastest repeat is the step's own cost)");
  f.Bool("quick", "40 shapes, shallower grid (a rough model in a few seconds)");
  f.String("clock", "wall",
           "how steps are timed: wall, or cpu (the thread's CPU time: steadier on a shared host; "
           "needs --threads 1)");
  f.String("isa", "best", "highest kernel level: best, amx, avx512, avx2 or scalar");
  f.String("kv-dtype", "bf16", "KV cache elements: bf16 or f32 (as the server will run)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  if (Status si = ApplyIsaFlag(f); !si.ok()) return Fail("profile", si);

  engine::ProfileOptions po;
  po.threads = ThreadsFlag(f);
  po.samples = f.GetInt("samples");
  po.repeats = static_cast<int>(std::clamp<int64_t>(f.GetInt("repeats"), 1, 100));
  if (f.GetString("clock") != "wall" && f.GetString("clock") != "cpu")
    return Fail("profile", InvalidArgumentError("flag --clock must be wall or cpu"));
  po.cpu_clock = f.GetString("clock") == "cpu";
  if (auto kv_dtype = memory::ParseKvDtype(f.GetString("kv-dtype")); kv_dtype.ok()) {
    po.kv_dtype = *kv_dtype;
  } else {
    return Fail("profile", kv_dtype.status().WithContext("flag --kv-dtype"));
  }
  if (f.GetString("timing") != "median" && f.GetString("timing") != "min")
    return Fail("profile", InvalidArgumentError("flag --timing must be median or min"));
  po.min_time = f.GetString("timing") == "min";
  if (f.GetBool("quick")) {
    po.samples = 40;
    po.max_prefill = 128;
    po.max_decode = 16;
    po.max_context = 512;
  }
  std::shared_ptr<const model::Model> mdl;
  std::string out = f.GetString("out"), name;
  if (const std::string shape = f.GetString("shape"); !shape.empty()) {
    auto dt = ParseDType(f.GetString("dtype"));
    if (!dt.ok()) return Fail("profile", dt.status().WithContext("flag --dtype"));
    auto m = model::MakeSyntheticModel({.shape = shape, .dtype = *dt, .seed = 1});
    if (!m.ok()) return Fail("profile", m.status().WithContext("flag --shape"));
    mdl = std::move(*m);
    name = "synthetic " + shape + " " + f.GetString("dtype");
    if (out.empty()) out = "cost-model-" + shape + ".json";
  } else {
    std::string path = f.GetString("model");
    auto loaded = LoadModelAndTokenizer(path, f.GetString("tokenizer"));
    if (!loaded.ok()) return Fail("profile", loaded.status());
    mdl = loaded->model;
    if (path.empty()) {
      auto p = EnsureDefaultModel();
      if (!p.ok()) return Fail("profile", p.status());
      path = *p;
    }
    name = path;
    if (out.empty()) out = path + ".cost-model.json";
  }
  std::fprintf(stderr, "chorus profile: %s\n", IsaLine().c_str());
  auto rep = engine::RunProfile(mdl, po, [](const std::string& s) {
    std::fprintf(stderr, "chorus profile: %s\n", s.c_str());
  });
  if (!rep.ok()) return Fail("profile", rep.status());
  rep->file.model_name = name;
  std::printf("%s", rep->ToTable().c_str());
  std::printf("loadavg: %s, threads %d, clock %s, %s\n", rep->file.loadavg.c_str(),
              rep->file.threads, rep->file.clock.c_str(), rep->file.timing.c_str());
  std::ofstream os(out, std::ios::trunc);
  os << rep->file.ToJson();
  os.close();
  if (!os) return Fail("profile", InvalidArgumentError("cannot write " + out));
  std::printf("wrote %s\n", out.c_str());
  if (const std::string csv = f.GetString("csv"); !csv.empty()) {
    std::ofstream cs(csv, std::ios::trunc);
    cs << rep->ToCsv();
    if (!cs) return Fail("profile", InvalidArgumentError("cannot write " + csv));
  }
  return 0;
}

}  // namespace chorus::apps

// Heterogeneous batching measured (docs/finetuning.md, "Heterogeneous batching: measured, not
// kept"; FineInfer §3.3): does one pass over each layer's base weights for the rows of a
// training micro-batch and the rows of an inference step together cost less than the two
// passes apart?
//
// For a synthetic model at a real shape (model/synthetic.h: every layer's seven linears are
// distinct matrices, so a pass over the model streams its weights from DRAM, as a step does),
// each repeat times, over all layers, the base matmuls (kernels::MatMul, one call per linear) of
//   (a) the training forward alone: `--train-rows` rows (one packed sequence of 256 by default),
//   (b) an inference step alone: b rows (decode batches `--infer-rows`, e.g. 1,8,32, and a
//       prefill chunk if listed),
//   (c) both in one call per linear, the rows concatenated: the shared pass,
// in a rotating order; the saving of the shared pass is (a) + (b) − (c), taken per repeat and
// reported as the median. With `--train-iteration` it also times a whole training iteration
// (train::TrainModel::ForwardBackward on the same model: LoRA rank 16 on q,k,v,o, the setting of
// docs/benchmarks.md "Fine-tuning"), the cost the saving is a fraction of.
//
//   ./hetero_bench --shape tinyllama-1.1b --dtypes q4_0,bf16 --infer-rows 1,8,32,128
//                  --repeats 5 --train-iteration --out /tmp/hetero.csv   (one line)
//   ./hetero_bench --shape stories260k --dtypes f32 --infer-rows 1,8,32 --repeats 20
//
// The machine is shared: run it under the measurement lock and quote the paired medians.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "chorus/base/thread_pool.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/kernels/matmul.h"
#include "chorus/model/synthetic.h"
#include "chorus/train/lora_model.h"

namespace chorus {
namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string shape = "tinyllama-1.1b";
  std::vector<std::string> dtypes = {"q4_0"};
  std::vector<int64_t> infer_rows = {1, 8, 32};
  int64_t train_rows = 256;
  int threads = 2;
  int repeats = 5;
  bool train_iteration = false;
  std::string out;
};

[[noreturn]] void Usage(const std::string& error) {
  std::fprintf(stderr,
               "hetero_bench: %s\nusage: hetero_bench [--shape S] [--dtypes q4_0,bf16,f32] "
               "[--infer-rows 1,8,32] [--train-rows 256] [--threads 2] [--repeats 5] "
               "[--train-iteration] [--out FILE.csv]\n",
               error.c_str());
  std::exit(2);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

int64_t PositiveInt(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x < 1 || x > 1 << 20)
    Usage(flag + " wants a positive integer, got '" + v + "'");
  return x;
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) Usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--shape") {
      o.shape = value();
    } else if (a == "--dtypes") {
      o.dtypes = Split(value());
    } else if (a == "--infer-rows") {
      o.infer_rows.clear();
      for (const auto& s : Split(value())) o.infer_rows.push_back(PositiveInt(a, s));
    } else if (a == "--train-rows") {
      o.train_rows = PositiveInt(a, value());
    } else if (a == "--threads") {
      o.threads = static_cast<int>(PositiveInt(a, value()));
    } else if (a == "--repeats") {
      o.repeats = static_cast<int>(PositiveInt(a, value()));
    } else if (a == "--train-iteration") {
      o.train_iteration = true;
    } else if (a == "--out") {
      o.out = value();
    } else {
      Usage("unknown flag '" + a + "'");
    }
  }
  if (o.dtypes.empty() || o.infer_rows.empty()) Usage("--dtypes and --infer-rows need values");
  return o;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// CPU time of the whole process (every pool thread): unlike wall time it does not count the
// time the threads are descheduled, so it is the steadier figure on a shared host.
double CpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Time {
  double wall = 0, cpu = 0;  // seconds
};

// The base matmuls of one forward pass of `m` rows over every layer: one MatMul per linear, in
// the forward's order, inputs read from `x` (m rows of up to max_in floats) and outputs written
// to `y`.
Time Pass(const model::Model& model, const std::vector<float>& x, std::vector<float>* y, int64_t m,
          ThreadPool* pool) {
  const auto t0 = Clock::now();
  const double c0 = CpuSeconds();
  for (const model::LayerWeights& lw : model.weights().layers) {
    for (const kernels::PackedWeight& w : lw.linear) {
      kernels::MatMul(w, x.data(), w.k(), m, y->data(), w.n(), /*accumulate=*/false, pool);
    }
  }
  return {std::chrono::duration<double>(Clock::now() - t0).count(), CpuSeconds() - c0};
}

// A packed sequence of `rows` random tokens with next-token targets.
train::Batch RandomBatch(const model::ModelConfig& c, int64_t rows) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size) - 1);
  train::Batch b;
  for (int64_t i = 0; i < rows; ++i) {
    b.tokens.push_back(tok(rng));
    b.positions.push_back(static_cast<int32_t>(i));
    b.seg_start.push_back(0);
  }
  for (int64_t i = 0; i < rows; ++i)
    b.targets.push_back(i + 1 < rows ? b.tokens[static_cast<size_t>(i + 1)] : -1);
  return b;
}

int Main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  auto config = model::SyntheticConfig(o.shape);
  if (!config.ok()) Usage(config.status().ToString());
  ThreadPool pool(o.threads);
  FILE* csv = nullptr;
  if (!o.out.empty()) {
    csv = std::fopen(o.out.c_str(), "w");
    if (csv == nullptr) Usage("cannot write " + o.out + ": " + std::strerror(errno));
    std::fprintf(csv,
                 "shape,dtype,threads,layers,train_rows,infer_rows,repeat,train_ms,infer_ms,"
                 "shared_ms,train_cpu_ms,infer_cpu_ms,shared_cpu_ms,train_iteration_ms\n");
  }
  std::printf(
      "# %s, %d threads, ISA %s, %d repeats (medians; saving = train + infer - shared "
      "per repeat)\n",
      o.shape.c_str(), o.threads, kernels::IsaName(kernels::ActiveIsa()).c_str(), o.repeats);
  for (const std::string& dt_name : o.dtypes) {
    auto dt = ParseDType(dt_name);
    if (!dt.ok()) Usage(dt.status().ToString());
    const auto b0 = Clock::now();
    auto built = model::MakeSyntheticModel({.shape = o.shape, .dtype = *dt});
    if (!built.ok()) Usage(built.status().ToString());
    const model::Model& m = **built;
    const model::ModelConfig& c = m.config();
    int64_t max_in = 0, max_out = 0, layer_bytes = 0;
    for (const kernels::PackedWeight& w : m.weights().layers[0].linear) {
      max_in = std::max(max_in, w.k());
      max_out = std::max(max_out, w.n());
      layer_bytes += w.source().view().NumBytes();
    }
    const int64_t max_infer = *std::max_element(o.infer_rows.begin(), o.infer_rows.end());
    const int64_t max_rows = o.train_rows + max_infer;
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(max_rows * max_in));
    for (float& v : x) v = dist(rng);
    std::vector<float> y(static_cast<size_t>(max_rows * max_out));
    std::printf(
        "# %s: built in %.1f s; %lld layers, %.1f MiB of linear weights per layer, "
        "%.1f MiB in all\n",
        dt_name.c_str(), std::chrono::duration<double>(Clock::now() - b0).count(),
        static_cast<long long>(c.n_layers), static_cast<double>(layer_bytes) / (1 << 20),
        static_cast<double>(layer_bytes * c.n_layers) / (1 << 20));

    // A whole training iteration at the same shape, for the fraction the saving is of it.
    std::unique_ptr<train::TrainModel> tm;
    std::unique_ptr<train::LoraParams> lora;
    train::Batch batch;
    if (o.train_iteration) {
      tm = std::make_unique<train::TrainModel>(*built, o.train_rows);
      auto p = train::LoraParams::Init(c, {.rank = 16, .alpha = 32});
      if (!p.ok()) Usage(p.status().ToString());
      lora = std::make_unique<train::LoraParams>(std::move(p).value());
      batch = RandomBatch(c, o.train_rows);
    }
    auto Iteration = [&]() -> double {
      if (!tm) return 0;
      lora->ZeroGrad();
      const auto t0 = Clock::now();
      auto r = tm->ForwardBackward(batch, lora.get(), 1.0f, &pool);
      CHORUS_CHECK(r.ok()) << r.status().ToString();
      return std::chrono::duration<double>(Clock::now() - t0).count();
    };

    // Warm-up: every pass shape once (scratch buffers grow to their largest size).
    Pass(m, x, &y, max_rows, &pool);
    for (int64_t b : o.infer_rows) Pass(m, x, &y, b, &pool);
    Pass(m, x, &y, o.train_rows, &pool);
    Iteration();

    const size_t nb = o.infer_rows.size();
    std::vector<double> iter_s;
    // Per inference size: (a), (b), (c) and the paired saving, wall and CPU time.
    struct Series {
      std::vector<double> train, infer, shared, saving, train_cpu, infer_cpu, shared_cpu,
          saving_cpu;
    };
    std::vector<Series> ser(nb);
    for (int r = 0; r < o.repeats; ++r) {
      const double it = Iteration();
      iter_s.push_back(it);
      // One training pass per inference size, each paired with the (b) and (c) taken next to
      // it; the order of the three rotates from repeat to repeat.
      for (size_t i = 0; i < nb; ++i) {
        const int64_t b = o.infer_rows[i];
        Time t[3];
        for (int j = 0; j < 3; ++j) {
          const int which = (j + r) % 3;
          const int64_t rows = which == 0 ? o.train_rows : which == 1 ? b : o.train_rows + b;
          t[which] = Pass(m, x, &y, rows, &pool);
        }
        Series& S = ser[i];
        S.train.push_back(t[0].wall);
        S.infer.push_back(t[1].wall);
        S.shared.push_back(t[2].wall);
        S.saving.push_back(t[0].wall + t[1].wall - t[2].wall);
        S.train_cpu.push_back(t[0].cpu);
        S.infer_cpu.push_back(t[1].cpu);
        S.shared_cpu.push_back(t[2].cpu);
        S.saving_cpu.push_back(t[0].cpu + t[1].cpu - t[2].cpu);
        if (csv != nullptr) {
          std::fprintf(csv, "%s,%s,%d,%lld,%lld,%lld,%d,%.4f,%.4f,%.4f,%.4f,%.4f,%.4f,%.2f\n",
                       o.shape.c_str(), dt_name.c_str(), o.threads,
                       static_cast<long long>(c.n_layers), static_cast<long long>(o.train_rows),
                       static_cast<long long>(b), r, t[0].wall * 1e3, t[1].wall * 1e3,
                       t[2].wall * 1e3, t[0].cpu * 1e3, t[1].cpu * 1e3, t[2].cpu * 1e3, it * 1e3);
          std::fflush(csv);
        }
      }
    }
    const double layers = static_cast<double>(c.n_layers);
    const double iter_ms = tm ? Median(iter_s) * 1e3 : 0;
    std::printf("# %s: base matmuls of the training forward = %lld rows", dt_name.c_str(),
                static_cast<long long>(o.train_rows));
    if (tm) std::printf("; whole training iteration (forward + backward) %.1f ms", iter_ms);
    std::printf(
        "\n# wall ms (CPU ms of both threads); saving = median over repeats of a + b - c\n");
    std::printf("%-6s %5s %20s %20s %20s %20s %13s %9s %9s\n", "dtype", "rows", "(a) train",
                "(b) infer", "(c) shared", "saving", "saving/layer", "of (b)", "of iter");
    for (size_t i = 0; i < nb; ++i) {
      const Series& S = ser[i];
      auto cell = [](double wall_s, double cpu_s) {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.2f (%.2f)", wall_s * 1e3, cpu_s * 1e3);
        return std::string(buf);
      };
      const double sv = Median(S.saving) * 1e3, inf = Median(S.infer) * 1e3;
      char iter_frac[32] = "-";
      if (tm) std::snprintf(iter_frac, sizeof iter_frac, "%.3f%%", 100 * sv / iter_ms);
      std::printf("%-6s %5lld %20s %20s %20s %20s %13.3f %8.1f%% %9s\n", dt_name.c_str(),
                  static_cast<long long>(o.infer_rows[i]),
                  cell(Median(S.train), Median(S.train_cpu)).c_str(),
                  cell(Median(S.infer), Median(S.infer_cpu)).c_str(),
                  cell(Median(S.shared), Median(S.shared_cpu)).c_str(),
                  cell(Median(S.saving), Median(S.saving_cpu)).c_str(), sv / layers, 100 * sv / inf,
                  iter_frac);
    }
    std::fflush(stdout);
  }
  if (csv != nullptr) std::fclose(csv);
  return 0;
}

}  // namespace
}  // namespace chorus

int main(int argc, char** argv) { return chorus::Main(argc, argv); }

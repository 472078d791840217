#include "chorus/compress/compress.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <random>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/base/mapped_file.h"
#include "chorus/compress/quantize.h"
#include "chorus/eval/eval.h"

namespace chorus::compress {
namespace {

using delta::MatrixLayout;
using delta::UnpackedMatrix;
using model::Linear;

std::string Shape(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) r += ", ";
    r += std::to_string(s[i]);
  }
  return r + "]";
}

bool IsLinearName(const model::ModelConfig& c, const std::string& name) {
  for (int64_t l = 0; l < c.n_layers; ++l)
    for (int w = 0; w < model::kNumLinears; ++w)
      if (model::HfLayerTensorName(l, static_cast<Linear>(w)) == name) return true;
  return false;
}

using model::LinearIn;
using model::LinearOut;

void Parallel(ThreadPool* pool, int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (pool == nullptr || pool->size() <= 1 || n < 64) {
    fn(0, n);
    return;
  }
  pool->Run([&](int i, int k) {
    int64_t b, e;
    ThreadPool::Slice(n, i, k, 1, &b, &e);
    if (b < e) fn(b, e);
  });
}

// Mean KL(reference ‖ model + hook) over every position of `seqs`.
Result<double> MeanKl(eval::LogitsRunner& runner, const model::LinearHook* hook,
                      const std::vector<std::vector<int32_t>>& seqs,
                      const std::vector<size_t>& which,
                      const std::vector<std::vector<float>>& ref_logits, ThreadPool* pool) {
  const int64_t vocab = runner.model().config().vocab_size;
  std::vector<float> logits;
  double kl = 0;
  int64_t n = 0;
  for (size_t s : which) {
    CHORUS_RETURN_IF_ERROR(runner.Run(seqs[s], 0, hook, pool, &logits));
    const int64_t len = static_cast<int64_t>(seqs[s].size());
    for (int64_t p = 0; p < len; ++p) {
      kl += eval::KlDivergence(
          std::span<const float>(ref_logits[s].data() + p * vocab, static_cast<size_t>(vocab)),
          std::span<const float>(logits.data() + p * vocab, static_cast<size_t>(vocab)));
      ++n;
    }
  }
  return n ? kl / static_cast<double>(n) : 0.0;
}

}  // namespace

Status ValidateCompressOptions(const CompressOptions& o) {
  if (o.bits != 1 && o.bits != 2 && o.bits != 3 && o.bits != 4 && o.bits != 8)
    return InvalidArgumentError("--bits must be 1, 2, 3, 4 or 8");
  if (o.method == delta::Method::kBitDelta && (o.bits != 1 || o.group_size != 0))
    return InvalidArgumentError("bitdelta stores 1 bit per weight and one scale per matrix");
  if (o.method != delta::Method::kBitDelta && o.bits == 1)
    return InvalidArgumentError("1 bit per weight is --method bitdelta");
  if (o.group_size < 0) return InvalidArgumentError("--group-size must be ≥ 0");
  if (o.sparse24 && o.group_size > 0 && o.group_size % 4 != 0)
    return InvalidArgumentError("with 2:4 sparsity --group-size must be a multiple of 4");
  if (!(o.damp >= 0) || o.damp > 10) return InvalidArgumentError("--damp must be in [0, 10]");
  if (o.calib_seq_len < 2) return InvalidArgumentError("calibration sequences need ≥ 2 tokens");
  if (o.distill_steps < 0 || o.distill_batch < 1)
    return InvalidArgumentError("bad distillation settings");
  return OkStatus();
}

Status CheckSameArchitecture(const model::Model& base, const model::Model& finetuned) {
  return CheckSameArchitecture(model::ModelFile::Of(base), model::ModelFile::Of(finetuned));
}

Status CheckSameArchitecture(const model::ModelFile& b, const model::ModelFile& f) {
  const auto& cb = b.config;
  const auto& cf = f.config;
  if (cb.n_embd != cf.n_embd || cb.n_layers != cf.n_layers || cb.n_heads != cf.n_heads ||
      cb.n_kv_heads != cf.n_kv_heads || cb.n_ff != cf.n_ff || cb.vocab_size != cf.vocab_size ||
      cb.arch != cf.arch || cb.tie_embeddings != cf.tie_embeddings) {
    return InvalidArgumentError("the fine-tune " + f.source + " (" + cf.Summary() +
                                ") has another architecture than the base " + b.source + " (" +
                                cb.Summary() + ")");
  }
  std::map<std::string, const Tensor*> fm;
  for (const auto& [n, t] : f.tensors) fm[n] = &t;
  for (const auto& [n, t] : b.tensors) {
    auto it = fm.find(n);
    if (it == fm.end())
      return InvalidArgumentError("tensor " + n + " of the base is missing from the fine-tune " +
                                  f.source);
    if (it->second->shape() != t.shape()) {
      return InvalidArgumentError("tensor " + n + " is " + Shape(it->second->shape()) +
                                  " in the fine-tune " + f.source + " but " + Shape(t.shape()) +
                                  " in the base " + b.source);
    }
  }
  if (fm.size() != b.tensors.size()) {
    for (const auto& [n, t] : f.tensors) {
      bool found = false;
      for (const auto& p : b.tensors) found |= p.first == n;
      if (!found)
        return InvalidArgumentError("tensor " + n + " of the fine-tune is not in the base");
    }
  }
  if (cb.rope_layout != cf.rope_layout) {
    return InvalidArgumentError(
        "the base and the fine-tune order q/k rows differently (one is a "
        "llama2.c or GGUF file, the other a Hugging Face export); convert one");
  }
  return OkStatus();
}

std::vector<std::vector<int32_t>> CalibrationSequences(std::span<const int32_t> tokens,
                                                       int64_t seq_len, int32_t bos) {
  std::vector<std::vector<int32_t>> out;
  size_t i = (!tokens.empty() && tokens[0] == bos) ? 1 : 0;
  const size_t body = static_cast<size_t>(bos >= 0 ? seq_len - 1 : seq_len);
  while (i + body <= tokens.size()) {
    std::vector<int32_t> s;
    if (bos >= 0) s.push_back(bos);
    s.insert(s.end(), tokens.begin() + static_cast<std::ptrdiff_t>(i),
             tokens.begin() + static_cast<std::ptrdiff_t>(i + body));
    out.push_back(std::move(s));
    i += body;
  }
  return out;
}

DenseDeltaHook::DenseDeltaHook(const model::ModelConfig& c)
    : config_(c), d_(static_cast<size_t>(c.n_layers * model::kNumLinears)), packed_(d_.size()) {}

void DenseDeltaHook::Set(int64_t layer, Linear which, std::vector<float> d) {
  const size_t k = static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which));
  if (d.empty()) {
    d_[k].reset();
    packed_[k] = kernels::PackedWeight();
    return;
  }
  const int64_t out = LinearOut(config_, which), in = LinearIn(config_, which);
  CHORUS_CHECK_EQ(static_cast<int64_t>(d.size()), out * in);
  auto owned = std::make_shared<std::vector<float>>(std::move(d));
  const Tensor view(TensorView{DType::kF32, {out, in}, owned->data()}, owned);
  auto packed = kernels::PackedWeight::Pack(view);
  CHORUS_CHECK(packed.ok()) << packed.status().message();  // f32 [out, in] is always packable
  packed_[k] = *std::move(packed);
  d_[k] = std::move(owned);
}
const std::vector<float>& DenseDeltaHook::Get(int64_t layer, Linear which) const {
  static const std::vector<float> kNone;
  const auto& d = d_[static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which))];
  return d != nullptr ? *d : kNone;
}
void DenseDeltaHook::Capture(int64_t layer, Linear which, std::vector<double>* h, int64_t* n) {
  cap_layer_ = layer;
  cap_which_ = which;
  cap_h_ = h;
  cap_n_ = n;
}
void DenseDeltaHook::StopCapture() {
  cap_layer_ = -1;
  cap_h_ = nullptr;
  cap_n_ = nullptr;
}

void DenseDeltaHook::Apply(int64_t layer, Linear which, const float* x, int64_t x_stride, float* y,
                           int64_t y_stride, int64_t n_rows, ThreadPool* pool) const {
  const int64_t in = LinearIn(config_, which);
  if (cap_h_ != nullptr && layer == cap_layer_ && which == cap_which_) {
    // xᵀx of the step's rows as one product: X' = xᵀ [in, n_rows] multiplied by itself
    // transposed (f32 over the step's ≤ max_rows rows), then added into H in double.
    xt_.resize(static_cast<size_t>(in * n_rows));
    for (int64_t r = 0; r < n_rows; ++r)
      for (int64_t i = 0; i < in; ++i)
        xt_[static_cast<size_t>(i * n_rows + r)] = x[r * x_stride + i];
    const Tensor xt(TensorView{DType::kF32, {in, n_rows}, xt_.data()}, nullptr);
    auto packed = kernels::PackedWeight::Pack(xt);
    CHORUS_CHECK(packed.ok()) << packed.status().message();
    xtx_.resize(static_cast<size_t>(in * in));
    kernels::MatMul(*packed, xt_.data(), n_rows, in, xtx_.data(), in, /*accumulate=*/false, pool);
    std::vector<double>& h = *cap_h_;
    Parallel(pool, in, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        double* hi = h.data() + i * in;
        const float* si = xtx_.data() + i * in;
        for (int64_t j = 0; j < in; ++j) hi[j] += 2.0 * static_cast<double>(si[j]);
      }
    });
    *cap_n_ += n_rows;
  }
  const size_t k = static_cast<size_t>(layer * model::kNumLinears + static_cast<int>(which));
  if (d_[k] == nullptr) return;
  kernels::MatMul(packed_[k], x, x_stride, n_rows, y, y_stride, /*accumulate=*/true, pool);
}

namespace {

// Pages out the fine-tune's tensor once read (compress reads each tensor of it once; left
// mapped, the file would stay resident beside the base's prepared copy). Anonymous memory (a
// fine-tune built in memory) is left alone by the kernel without swap.
void ReleasePages(const Tensor& t) {
  ReleaseResidentPages(t.data(), static_cast<size_t>(t.view().NumBytes()));
}

// `base_model` / `ft_model`: Models of `base` / `ft` the caller already holds (null: built
// when a pass runs them — the base for calibration, the fine-tune for bitdelta's reference
// logits, built and dropped before the base is).
Result<delta::Delta> Compress(const model::ModelFile& base,
                              std::shared_ptr<const model::Model> base_model,
                              const model::ModelFile& ft,
                              std::shared_ptr<const model::Model> ft_model,
                              std::span<const int32_t> calib_tokens, int32_t bos,
                              const CompressOptions& opts, ThreadPool* pool,
                              CompressReport* report) {
  CHORUS_RETURN_IF_ERROR(ValidateCompressOptions(opts));
  CHORUS_RETURN_IF_ERROR(CheckSameArchitecture(base, ft));
  const auto& c = base.config;
  auto say = [&](const std::string& s) {
    if (opts.progress) opts.progress(s);
  };
  CompressReport rep;
  delta::Delta out;
  out.method = opts.method;
  out.bits = opts.bits;
  out.sparse24 = opts.sparse24;
  out.group_size = opts.group_size;
  out.base_hash =
      base_model != nullptr ? delta::BaseWeightsHash(*base_model) : delta::BaseWeightsHash(base);
  out.base_source = base.source;
  // A base tensor once read: paged out unless the kernels compute from its pages.
  auto release_base = [&](const Tensor& t) {
    if (base_model != nullptr)
      base_model->ReleaseSourcePages(t);
    else
      ReleasePages(t);
  };
  auto need_base_model = [&]() -> Status {
    if (base_model == nullptr) {
      CHORUS_ASSIGN_OR_RETURN(
          base_model, model::Model::Build(base.config, base.tensors, base.format, base.source));
    }
    return OkStatus();
  };
  out.finetuned_source = ft.source;

  std::map<std::string, const Tensor*> ftm, bm;
  for (const auto& [n, t] : ft.tensors) ftm[n] = &t;
  for (const auto& [n, t] : base.tensors) bm[n] = &t;
  for (const auto& [n, t] : ft.tensors) rep.finetuned_bf16_bytes += t.view().NumElements() * 2;

  // Extras: every non-linear tensor that changed.
  model::Model::NamedTensors changed;
  for (const auto& [name, bt] : base.tensors) {
    if (IsLinearName(c, name)) continue;
    std::vector<float> b = bt.ToF32(), f = ftm.at(name)->ToF32();
    ReleasePages(*ftm.at(name));
    release_base(bt);
    std::vector<float> d(b.size());
    bool any = false;
    for (size_t i = 0; i < b.size(); ++i) {
      d[i] = f[i] - b[i];
      any |= d[i] != 0;
    }
    if (!any) continue;
    delta::ExtraDelta e;
    e.name = name;
    e.shape = bt.shape();
    if (bt.shape().size() == 2 && !opts.extras_exact) {
      e.kind = delta::ExtraDelta::Kind::kInt8Rows;
      const int64_t rows = e.shape[0], cols = e.shape[1];
      e.q.resize(d.size());
      e.row_scales.resize(static_cast<size_t>(rows));
      for (int64_t r = 0; r < rows; ++r) {
        float mx = 0;
        for (int64_t j = 0; j < cols; ++j)
          mx = std::max(mx, std::fabs(d[static_cast<size_t>(r * cols + j)]));
        const float s = mx > 0 ? mx / 127.0f : 1.0f;
        e.row_scales[static_cast<size_t>(r)] = s;
        for (int64_t j = 0; j < cols; ++j) {
          e.q[static_cast<size_t>(r * cols + j)] =
              static_cast<int8_t>(std::lround(d[static_cast<size_t>(r * cols + j)] / s));
        }
      }
    } else {
      e.kind = delta::ExtraDelta::Kind::kExactF32;
      e.values = d;
    }
    const std::vector<float> dec = e.Decode();
    for (size_t i = 0; i < b.size(); ++i) b[i] += dec[i];
    changed.emplace_back(name, Tensor::FromF32(b, DType::kF32, bt.shape()));
    out.extras.push_back(std::move(e));
  }
  // Calibration runs over B + the extra deltas (the embeddings and norms the fine-tune moved),
  // with the linears' deltas added by a hook; B's prepared matrices are shared, not repacked.
  auto calibration_base = [&]() -> Result<std::shared_ptr<const model::Model>> {
    CHORUS_RETURN_IF_ERROR(need_base_model());
    if (changed.empty()) return base_model;
    return model::Model::WithTensors(*base_model, changed, base.source + " + extras");
  };

  auto linear_delta = [&](int64_t l, Linear w, MatrixLayout* layout) {
    const std::string name = model::HfLayerTensorName(l, w);
    const Tensor* bt = bm.at(name);
    const Tensor* ftt = ftm.at(name);
    std::vector<float> b = bt->ToF32(), f = ftt->ToF32();
    for (size_t i = 0; i < b.size(); ++i) b[i] = f[i] - b[i];
    ReleasePages(*ftt);
    release_base(*bt);
    layout->rows = bt->shape()[0];
    layout->cols = bt->shape()[1];
    layout->bits = opts.bits;
    layout->sparse24 = opts.sparse24;
    layout->group_size = opts.group_size;
    rep.finetuned_matrix_bf16_bytes += layout->rows * layout->cols * 2;
    return b;
  };
  // Each matrix is packed as soon as it is final: unpacked codes take a byte per weight.
  std::vector<delta::PackedMatrix> packed(static_cast<size_t>(c.n_layers * model::kNumLinears));
  auto put = [&](int64_t l, Linear w, const UnpackedMatrix& m) {
    packed[static_cast<size_t>(l * model::kNumLinears + static_cast<int>(w))] = delta::Pack(m);
  };
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed_s = [&] {
    return static_cast<int64_t>(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  auto layer_progress = [&](int64_t l) {
    const int width = 20;
    const int done = static_cast<int>((l + 1) * width / c.n_layers);
    say("layer " + std::to_string(l + 1) + "/" + std::to_string(c.n_layers) + " [" +
        std::string(static_cast<size_t>(done), '#') +
        std::string(static_cast<size_t>(width - done), '.') + "] " + std::to_string(elapsed_s()) +
        " s");
  };

  std::vector<std::vector<int32_t>> seqs;
  const bool needs_calib = opts.method == delta::Method::kDeltaZip ||
                           (opts.method == delta::Method::kBitDelta && opts.distill_steps > 0);
  if (needs_calib) {
    seqs = CalibrationSequences(calib_tokens, std::min(opts.calib_seq_len, c.max_seq_len), bos);
    if (seqs.empty()) {
      return InvalidArgumentError(std::string(delta::MethodName(opts.method)) +
                                  " needs calibration text (--calib) of at least one sequence of " +
                                  std::to_string(opts.calib_seq_len) + " tokens");
    }
  }

  for (int64_t l = 0; l < c.n_layers && opts.method == delta::Method::kRtn; ++l) {
    for (int w = 0; w < model::kNumLinears; ++w) {
      MatrixLayout layout;
      auto d = linear_delta(l, static_cast<Linear>(w), &layout);
      CHORUS_RETURN_IF_ERROR(
          delta::ValidateLayout(layout, model::HfLayerTensorName(l, static_cast<Linear>(w))));
      put(l, static_cast<Linear>(w), RtnCompress(d, layout));
    }
    layer_progress(l);
  }
  if (opts.method == delta::Method::kDeltaZip) {
    const int64_t len = static_cast<int64_t>(seqs[0].size());
    CHORUS_ASSIGN_OR_RETURN(auto calib_base, calibration_base());
    eval::LogitsRunner runner(calib_base, len, len);
    DenseDeltaHook hook(c);
    const std::vector<std::vector<Linear>> groups = {{Linear::kQ, Linear::kK, Linear::kV},
                                                     {Linear::kO},
                                                     {Linear::kGate, Linear::kUp},
                                                     {Linear::kDown}};
    // Layer by layer: `stream[s]` is the residual stream of sequence s entering layer l through
    // B + the deltas of layers < l as compressed, so each group's capture runs layer l alone
    // (5 passes of one layer per layer, where whole passes up to layer l cost O(layers²)).
    std::vector<std::vector<float>> stream(seqs.size());
    std::vector<float> scratch(static_cast<size_t>(len * c.n_embd));
    for (size_t s = 0; s < seqs.size(); ++s) {
      stream[s].resize(static_cast<size_t>(static_cast<int64_t>(seqs[s].size()) * c.n_embd));
      CHORUS_RETURN_IF_ERROR(
          runner.RunLayers(seqs[s], 0, 0, nullptr, stream[s].data(), &hook, pool));
    }
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (const auto& g : groups) {
        const int64_t in = LinearIn(c, g[0]);
        std::vector<double> h(static_cast<size_t>(in * in), 0.0);
        int64_t n = 0;
        hook.Capture(l, g[0], &h, &n);
        for (size_t s = 0; s < seqs.size(); ++s) {
          CHORUS_RETURN_IF_ERROR(
              runner.RunLayers(seqs[s], l, l + 1, stream[s].data(), scratch.data(), &hook, pool));
        }
        hook.StopCapture();
        for (double& v : h) v /= static_cast<double>(std::max<int64_t>(n, 1));
        for (Linear w : g) {
          MatrixLayout layout;
          auto d = linear_delta(l, w, &layout);
          const std::string name = model::HfLayerTensorName(l, w);
          CHORUS_RETURN_IF_ERROR(delta::ValidateLayout(layout, name));
          auto m = ObsCompress(d, h, layout, opts.damp, pool, opts.refine_sweeps);
          if (!m.ok()) return Status(m.status().code(), name + ": " + m.status().message());
          hook.Set(l, w, m->Decode());
          put(l, w, *m);
        }
      }
      // The stream leaving layer l with all of its deltas, the next layer's input; layer l's
      // deltas are then in the stream and no longer needed by the hook.
      for (size_t s = 0; s < seqs.size(); ++s) {
        CHORUS_RETURN_IF_ERROR(
            runner.RunLayers(seqs[s], l, l + 1, stream[s].data(), scratch.data(), &hook, pool));
        std::copy(scratch.begin(), scratch.begin() + static_cast<std::ptrdiff_t>(stream[s].size()),
                  stream[s].begin());
      }
      for (int w = 0; w < model::kNumLinears; ++w) hook.Set(l, static_cast<Linear>(w), {});
      layer_progress(l);
    }
  }

  if (opts.method == delta::Method::kBitDelta) {
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int w = 0; w < model::kNumLinears; ++w) {
        MatrixLayout layout;
        auto d = linear_delta(l, static_cast<Linear>(w), &layout);
        CHORUS_RETURN_IF_ERROR(
            delta::ValidateLayout(layout, model::HfLayerTensorName(l, static_cast<Linear>(w))));
        put(l, static_cast<Linear>(w), SignCompress(d, layout));
      }
      layer_progress(l);
    }
  }
  if (opts.method == delta::Method::kBitDelta && opts.distill_steps > 0) {
    // Scale distillation against the fine-tune's logits, computed first: the fine-tune's
    // prepared weights are resident only for that pass, and (unless the caller holds it) the
    // base's only after it.
    const int64_t len = static_cast<int64_t>(seqs[0].size());
    std::vector<std::vector<float>> ref(seqs.size());
    {
      if (ft_model == nullptr) {
        CHORUS_ASSIGN_OR_RETURN(ft_model,
                                model::Model::Build(ft.config, ft.tensors, ft.format, ft.source));
      }
      eval::LogitsRunner ft_runner(ft_model, len, len);
      for (size_t s = 0; s < seqs.size(); ++s)
        CHORUS_RETURN_IF_ERROR(ft_runner.Run(seqs[s], 0, nullptr, pool, &ref[s]));
      ft_model.reset();
    }
    // B + Δ̃ runs as `chorus serve` runs it: the signs as a delta applied by DeltaHook (the
    // table-lookup kernel where the CPU has it; docs/deltas.md "BitDelta by table lookup"), an
    // eighth of a byte per weight where dense f32 signs took four, and a fraction of their
    // matmuls' time. The kernel reads each matrix's scale at every apply, so the scales are
    // set in place between evaluations.
    auto signs = std::make_shared<delta::Delta>();
    signs->method = out.method;
    signs->bits = out.bits;
    signs->sparse24 = out.sparse24;
    signs->group_size = out.group_size;
    signs->base_hash = out.base_hash;
    const int64_t n_params = c.n_layers * model::kNumLinears;
    std::vector<double> theta(static_cast<size_t>(n_params)), m1(theta.size(), 0),
        m2(theta.size(), 0);
    std::vector<float> sign_x_mean(theta.size());
    for (int64_t k = 0; k < n_params; ++k) {
      delta::MatrixDelta md;
      md.name = model::HfLayerTensorName(k / model::kNumLinears,
                                         static_cast<Linear>(k % model::kNumLinears));
      md.packed = std::move(packed[static_cast<size_t>(k)]);
      sign_x_mean[static_cast<size_t>(k)] = md.packed.scales[0];
      theta[static_cast<size_t>(k)] = std::log(md.packed.scales[0]);
      signs->matrices.push_back(std::move(md));
    }
    {
      CHORUS_ASSIGN_OR_RETURN(auto weights, delta::DeltaWeights::Build(signs, c, "distillation"));
      delta::DeltaHook hook(len);
      const std::vector<const delta::DeltaView*> rows(static_cast<size_t>(len), weights.get());
      CHORUS_RETURN_IF_ERROR(hook.SetRows(rows));
      CHORUS_ASSIGN_OR_RETURN(auto calib_base, calibration_base());
      eval::LogitsRunner runner(calib_base, len, len);
      std::vector<size_t> all(seqs.size());
      for (size_t s = 0; s < all.size(); ++s) all[s] = s;
      auto set_theta = [&](const std::vector<double>& th) {
        for (int64_t k = 0; k < n_params; ++k)
          signs->matrices[static_cast<size_t>(k)].packed.scales[0] =
              static_cast<float>(std::exp(th[static_cast<size_t>(k)]));
      };
      set_theta(theta);
      CHORUS_ASSIGN_OR_RETURN(rep.base_kl_calib, MeanKl(runner, &hook, seqs, all, ref, pool));
      say("distill: calibration KL at sign x mean " + std::to_string(rep.base_kl_calib) + " " +
          std::to_string(elapsed_s()) + " s");
      std::mt19937_64 rng(opts.seed);
      const double c_pert = 0.05, b1 = 0.9, b2 = 0.999;
      std::vector<double> delta_dir(theta.size()), tp(theta.size()), tm(theta.size());
      for (int step = 0; step < opts.distill_steps; ++step) {
        std::vector<size_t> batch;
        for (int64_t b = 0;
             b < std::min<int64_t>(opts.distill_batch, static_cast<int64_t>(seqs.size())); ++b)
          batch.push_back(static_cast<size_t>(rng() % seqs.size()));
        for (size_t k = 0; k < theta.size(); ++k) {
          delta_dir[k] = (rng() & 1) ? 1.0 : -1.0;
          tp[k] = theta[k] + c_pert * delta_dir[k];
          tm[k] = theta[k] - c_pert * delta_dir[k];
        }
        set_theta(tp);
        CHORUS_ASSIGN_OR_RETURN(double lp, MeanKl(runner, &hook, seqs, batch, ref, pool));
        set_theta(tm);
        CHORUS_ASSIGN_OR_RETURN(double lm, MeanKl(runner, &hook, seqs, batch, ref, pool));
        const double gscale = (lp - lm) / (2 * c_pert);
        for (size_t k = 0; k < theta.size(); ++k) {
          const double g = gscale * delta_dir[k];
          m1[k] = b1 * m1[k] + (1 - b1) * g;
          m2[k] = b2 * m2[k] + (1 - b2) * g * g;
          const double mh = m1[k] / (1 - std::pow(b1, step + 1));
          const double vh = m2[k] / (1 - std::pow(b2, step + 1));
          theta[k] -= opts.distill_lr * mh / (std::sqrt(vh) + 1e-12);
        }
        if ((step + 1) % 25 == 0 || step + 1 == opts.distill_steps)
          say("distill step " + std::to_string(step + 1) + "/" +
              std::to_string(opts.distill_steps) + " batch kl " + std::to_string((lp + lm) / 2) +
              " " + std::to_string(elapsed_s()) + " s");
      }
      set_theta(theta);
      CHORUS_ASSIGN_OR_RETURN(rep.final_kl_calib, MeanKl(runner, &hook, seqs, all, ref, pool));
      say("distill: calibration KL after " + std::to_string(opts.distill_steps) + " steps " +
          std::to_string(rep.final_kl_calib));
    }
    const bool improved = rep.final_kl_calib <= rep.base_kl_calib;
    if (!improved) {
      say("distill: no improvement on the whole calibration set; keeping sign x mean scales");
      rep.final_kl_calib = rep.base_kl_calib;
    }
    for (int64_t k = 0; k < n_params; ++k) {
      delta::PackedMatrix& p = signs->matrices[static_cast<size_t>(k)].packed;
      p.scales[0] = improved ? static_cast<float>(std::exp(theta[static_cast<size_t>(k)]))
                             : sign_x_mean[static_cast<size_t>(k)];
      packed[static_cast<size_t>(k)] = std::move(p);
    }
  }

  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int w = 0; w < model::kNumLinears; ++w) {
      delta::MatrixDelta md;
      md.name = model::HfLayerTensorName(l, static_cast<Linear>(w));
      md.packed = std::move(packed[static_cast<size_t>(l * model::kNumLinears + w)]);
      out.matrices.push_back(std::move(md));
    }
  }
  if (report) *report = rep;
  return out;
}

}  // namespace

Result<delta::Delta> CompressDelta(const model::ModelFile& base, const model::ModelFile& finetuned,
                                   std::span<const int32_t> calib_tokens, int32_t bos,
                                   const CompressOptions& opts, ThreadPool* pool,
                                   CompressReport* report) {
  return Compress(base, nullptr, finetuned, nullptr, calib_tokens, bos, opts, pool, report);
}

Result<delta::Delta> CompressDelta(std::shared_ptr<const model::Model> base,
                                   std::shared_ptr<const model::Model> finetuned,
                                   std::span<const int32_t> calib_tokens, int32_t bos,
                                   const CompressOptions& opts, ThreadPool* pool,
                                   CompressReport* report) {
  const model::ModelFile base_file = model::ModelFile::Of(*base);
  const model::ModelFile ft_file = model::ModelFile::Of(*finetuned);
  return Compress(base_file, std::move(base), ft_file, std::move(finetuned), calib_tokens, bos,
                  opts, pool, report);
}

namespace {
// MakeSyntheticFineTune; `release_pages`: give each source matrix's resident pages back once read
// (a file read, not loaded: nothing else reads them).
Result<model::ModelFile> NoisyCopy(const model::ModelFile& base, double rel_lo, double rel_hi,
                                   uint64_t seed, bool release_pages) {
  if (!(rel_lo >= 0) || !(rel_hi >= rel_lo) || rel_hi > 1)
    return InvalidArgumentError("relative delta norms must satisfy 0 <= lo <= hi <= 1");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> pick(rel_lo, rel_hi);
  std::normal_distribution<float> g(0, 1);
  model::ModelFile ft{base.config, {}, base.format, base.source + " + synthetic fine-tune"};
  for (const auto& [name, t] : base.tensors) {
    if (!IsLinearName(base.config, name)) {
      ft.tensors.emplace_back(name, t);
      continue;
    }
    std::vector<float> v = t.ToF32();
    if (release_pages) ReleaseResidentPages(t.data(), static_cast<size_t>(t.view().NumBytes()));
    double norm2 = 0;
    for (float x : v) norm2 += static_cast<double>(x) * x;
    // Noise of per-element sd σ has norm ≈ σ·√n: σ = rel·‖W‖/√n.
    const float sd =
        static_cast<float>(pick(rng) * std::sqrt(norm2 / static_cast<double>(v.size())));
    for (float& x : v) x += sd * g(rng);
    ft.tensors.emplace_back(name, Tensor::FromF32(v, t.dtype(), t.shape()));
  }
  return ft;
}
}  // namespace

Result<model::ModelFile> MakeSyntheticFineTune(const model::ModelFile& base, double rel_lo,
                                               double rel_hi, uint64_t seed) {
  return NoisyCopy(base, rel_lo, rel_hi, seed, base.format != model::ModelFormat::kSynthetic);
}

Result<std::shared_ptr<const model::Model>> MakeSyntheticFineTune(const model::Model& base,
                                                                  double rel_lo, double rel_hi,
                                                                  uint64_t seed) {
  // A loaded model may run from its mapping (q4_0, K-quants): its pages stay.
  CHORUS_ASSIGN_OR_RETURN(model::ModelFile ft,
                          NoisyCopy(model::ModelFile::Of(base), rel_lo, rel_hi, seed, false));
  return model::Model::Build(std::move(ft.config), std::move(ft.tensors), ft.format, ft.source);
}

}  // namespace chorus::compress

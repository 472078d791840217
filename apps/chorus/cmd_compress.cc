// `chorus compress`: a full fine-tune as a compressed delta against its base (docs/deltas.md).
#include <cstdio>
#include <fstream>
#include <sstream>

#include "apps/chorus/commands.h"
#include "apps/chorus/common.h"
#include "chorus/compress/compress.h"
#include "chorus/model/loader.h"

namespace chorus::apps {

int CompressCommand(int argc, char** argv) {
  Flags f(
      "compress",
      "Compresses a full fine-tune (--finetuned) into a delta against its base (--base):\n"
      "deltazip (OBS-calibrated 2:4 + quantization, DeltaZip), bitdelta (sign + one distilled\n"
      "scale per matrix) or rtn (round to nearest). Writes a safetensors delta (docs/deltas.md)\n"
      "and prints its size against the fine-tune's bf16 matrices.");
  f.String("base", "", "base model (GGUF, Hugging Face directory, llama2.c .bin) (required)");
  f.String("finetuned", "", "the full fine-tune of the base, same architecture (required)");
  f.String("output", "", "output: a .safetensors file, or a directory (required)");
  f.String("method", "deltazip", "deltazip, bitdelta or rtn");
  f.Int("bits", 0, "bits per kept weight: 2, 3, 4 or 8 (default 4; bitdelta: 1)");
  f.String("sparsity", "", "2:4 or none (default 2:4; bitdelta: none)");
  f.Int("group-size", -1, "columns per scale (default 64; bitdelta: one scale per matrix)");
  f.String("calib", "", "calibration text file (deltazip, bitdelta)");
  f.Int("calib-tokens", 4096, "calibration tokens taken from the start of --calib (0 = all)");
  f.Int("calib-seq-len", 128, "calibration sequence length in tokens");
  f.Float("damp", 0.01, "deltazip: Hessian damping, a fraction of its mean diagonal");
  f.Int("refine-sweeps", 4, "deltazip: local-search sweeps after OBS (0 = plain OBS)");
  f.Int("distill-steps", 200, "bitdelta: Adam steps of scale distillation (0 = sign x mean)");
  f.String("extras", "int8",
           "non-linear tensors the fine-tune changed (embeddings, head): int8 or exact; norms are "
           "always exact");
  f.String("tokenizer", "", "tokenizer for --calib; overrides the base model's own");
  f.Int("zstd-level", 9, "zstd level over the packed codes");
  f.Int("seed", 1, "seed of the distillation's perturbations and minibatches");
  f.Int("threads", 0, "compute threads (0 = all cores)");
  if (int rc = ParseOrExit(f, argc, argv); rc >= 0) return rc;
  for (const char* req : {"base", "finetuned", "output"}) {
    if (f.GetString(req).empty())
      return Fail("compress", InvalidArgumentError(std::string("flag --") + req + " is required"));
  }
  compress::CompressOptions o;
  auto method = delta::ParseMethod(f.GetString("method"));
  if (!method.ok()) return Fail("compress", method.status().WithContext("flag --method"));
  o.method = *method;
  const bool bd = o.method == delta::Method::kBitDelta;
  o.bits = f.GetInt("bits") != 0 ? static_cast<int>(f.GetInt("bits")) : (bd ? 1 : 4);
  const std::string sp =
      f.GetString("sparsity").empty() ? (bd ? "none" : "2:4") : f.GetString("sparsity");
  if (sp != "2:4" && sp != "none")
    return Fail("compress", InvalidArgumentError("flag --sparsity must be 2:4 or none"));
  o.sparse24 = sp == "2:4";
  o.group_size = f.GetInt("group-size") >= 0 ? f.GetInt("group-size") : (bd ? 0 : 64);
  o.damp = f.GetFloat("damp");
  o.calib_seq_len = f.GetInt("calib-seq-len");
  o.refine_sweeps = static_cast<int>(f.GetInt("refine-sweeps"));
  o.distill_steps = static_cast<int>(f.GetInt("distill-steps"));
  o.seed = static_cast<uint64_t>(f.GetInt("seed"));
  const std::string extras = f.GetString("extras");
  if (extras != "int8" && extras != "exact")
    return Fail("compress", InvalidArgumentError("flag --extras must be int8 or exact"));
  o.extras_exact = extras == "exact";
  o.progress = [](const std::string& s) {
    std::fprintf(stderr, "chorus compress: %s\n", s.c_str());
  };
  if (Status s = compress::ValidateCompressOptions(o); !s.ok())
    return Fail("compress", InvalidArgumentError("flag " + s.message()));

  const bool needs_calib = o.method == delta::Method::kDeltaZip ||
                           (o.method == delta::Method::kBitDelta && o.distill_steps > 0);
  if (needs_calib && f.GetString("calib").empty())
    return Fail("compress",
                InvalidArgumentError(std::string("flag --calib is required by --method ") +
                                     delta::MethodName(o.method)));
  // Both read, not loaded: compress reads their matrices once and prepares a model for the
  // kernels only for the passes that run it (docs/deltas.md "How it runs").
  auto base = model::ReadModelFile(f.GetString("base"));
  if (!base.ok()) return Fail("compress", base.status().WithContext("flag --base"));
  std::shared_ptr<const tokenizer::Tokenizer> tok;
  if (needs_calib) {
    auto t = model::LoadTokenizerFor(*base, f.GetString("tokenizer"));
    if (!t.ok()) return Fail("compress", t.status().WithContext("flag --tokenizer"));
    tok = std::shared_ptr<const tokenizer::Tokenizer>(std::move(*t));
  }
  auto ft = model::ReadModelFile(f.GetString("finetuned"));
  if (!ft.ok()) return Fail("compress", ft.status().WithContext("flag --finetuned"));

  std::vector<int32_t> calib;
  int32_t bos = -1;
  if (needs_calib) {
    std::ifstream in(f.GetString("calib"), std::ios::binary);
    if (!in)
      return Fail("compress", NotFoundError("flag --calib: cannot open " + f.GetString("calib")));
    std::stringstream ss;
    ss << in.rdbuf();
    tokenizer::EncodeOptions eo;
    eo.add_bos = tok->add_bos();
    calib = tok->Encode(ss.str(), eo);
    const int64_t n = f.GetInt("calib-tokens");
    if (n > 0 && static_cast<int64_t>(calib.size()) > n) calib.resize(static_cast<size_t>(n));
    bos = tok->bos_id();
  }
  ThreadPool pool(ThreadsFlag(f));
  std::fprintf(stderr,
               "chorus compress: %s, %d-bit, sparsity %s, group %lld, %zu calibration tokens\n",
               delta::MethodName(o.method), o.bits, sp.c_str(),
               static_cast<long long>(o.group_size), calib.size());
  compress::CompressReport rep;
  auto d = compress::CompressDelta(*base, *ft, calib, bos, o, &pool, &rep);
  if (!d.ok()) return Fail("compress", d.status());
  delta::WriteStats ws;
  if (Status s = delta::WriteDelta(f.GetString("output"), *d,
                                   static_cast<int>(f.GetInt("zstd-level")), &ws);
      !s.ok()) {
    return Fail("compress", s.WithContext("flag --output"));
  }
  const int64_t matrices_stored = d->MatrixBytes() - ws.codes_raw_bytes + ws.codes_stored_bytes;
  std::printf("wrote %s: %lld bytes (%lld matrices, %lld with zstd codes; %lld extra tensors)\n",
              f.GetString("output").c_str(), static_cast<long long>(ws.file_bytes),
              static_cast<long long>(d->matrices.size()), static_cast<long long>(ws.matrices_zstd),
              static_cast<long long>(d->extras.size()));
  std::printf(
      "matrices: %lld bytes vs %lld bytes of the fine-tune's bf16 matrices: %.2fx smaller\n",
      static_cast<long long>(matrices_stored),
      static_cast<long long>(rep.finetuned_matrix_bf16_bytes),
      static_cast<double>(rep.finetuned_matrix_bf16_bytes) / static_cast<double>(matrices_stored));
  std::printf(
      "whole file: %lld bytes vs %lld bytes of the whole fine-tune in bf16: %.2fx smaller\n",
      static_cast<long long>(ws.file_bytes), static_cast<long long>(rep.finetuned_bf16_bytes),
      static_cast<double>(rep.finetuned_bf16_bytes) / static_cast<double>(ws.file_bytes));
  if (bd && o.distill_steps > 0)
    std::printf("distillation: calibration KL %.6f -> %.6f\n", rep.base_kl_calib,
                rep.final_kl_calib);
  return 0;
}

}  // namespace chorus::apps

// Engine-level benchmark (`chorus bench`): in one invocation it measures the
// machine's memory read bandwidth, then for each weight dtype prefill tokens/s of prompts of each
// length in `prefill_lengths`, decode tokens/s at batch 1 and aggregate decode tokens/s at larger
// batches with depths[0] tokens of KV, and decode at batch 1 at each further depth, all through
// the same Forward the server uses. Decode at batch 1 is reported as a fraction of the bandwidth
// roofline ((weight bytes + KV bytes) read per token ÷ read bandwidth), each run against the mean
// of probe passes right before and right after it (median over runs), so host drift within the
// invocation moves both alike.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "chorus/adapters/delta/delta_synthetic.h"
#include "chorus/adapters/lora/lora_adapter.h"
#include "chorus/base/status.h"
#include "chorus/base/thread_pool.h"
#include "chorus/kernels/attention.h"
#include "chorus/kernels/dispatch.h"
#include "chorus/model/quant_scheme.h"
#include "chorus/tensor/dtype.h"

namespace chorus::engine {

struct EngineBenchOptions {
  std::string shape = "tinyllama-1.1b";  // synthetic shape (model/synthetic.h)
  // A model file (GGUF, HF directory) to measure instead of synthetic weights: `shape` and
  // `dtypes` are then ignored by the default workload, whose rows name the file.
  std::string model_path;
  // Weight dtypes, or K-quant mixes such as q4_k_m (model/quant_scheme.h).
  std::vector<model::QuantScheme> dtypes = {DType::kQ4_0, DType::kQ8_0, DType::kBF16};
  int threads = 2;
  // Prompt lengths of the prefill figures.
  std::vector<int64_t> prefill_lengths = {512, 2048, 4096};
  // Rows per prefill step: a longer prompt is prefilled in consecutive chunks of this many
  // tokens over its own cached KV, as `chorus serve` does with its default --max-batch-tokens
  // (512) and llama.cpp with its default n_ubatch (512). 0: the whole prompt in one step.
  int64_t prefill_chunk = 512;
  std::vector<int64_t> batches = {1, 8, 32};
  int64_t decode_steps = 32;  // timed decode steps per batch size
  // Tokens already in each sequence's KV when decode is timed: `batches` run at depths[0]; every
  // further depth adds a batch-1 decode figure (long-context decode).
  std::vector<int64_t> depths = {128, 4000};
  int repeats = 3;  // each figure is the median of this many runs
  int64_t bandwidth_bytes = int64_t{1} << 30;
  // Mixed-adapter decode: when > 0, every decode batch is run a second time with each
  // row using a different LoRA adapter (row i → adapter i mod n_adapters; ranks round-robin
  // over `lora_ranks`; targets q, k, v, o), reported as metric "decode-lora" next to the
  // base-only "decode" of the same invocation.
  int64_t n_adapters = 0;
  std::vector<int64_t> lora_ranks = {8, 16, 32, 64};
  // Mixed-variant decode (docs/variants.md): when > 0, every decode batch is also run with its
  // rows split into contiguous equal groups over the base model, n_deltas compressed deltas
  // (random codes in `delta_layout` on every linear: the cost depends on layout and shape, not
  // values) and the n_adapters LoRA adapters, reported as metric "decode-mixed" next to the
  // base-only "decode" of the same repeats. (With deltas, LoRA rows follow this grouping too.)
  int64_t n_deltas = 0;
  delta::RandomDeltaSpec delta_layout;
  // Workload: "default" = the figures above; "punica" = the reference Punica
  // popularity workload instead: for each decode batch B (dtype = dtypes[0]), decode tokens/s
  // with every row on the base model ("base"), and with LoRA adapters (q,k,v,o, ranks
  // round-robin over lora_ranks) assigned by popularity: "identical" (one adapter), "skewed"
  // (group sizes growing ×1.5: 1, 2, 2, 3, 5, 8, 11 for B = 32), "uniform" (⌈√B⌉ equal groups),
  // "distinct" (B adapters). Rows of one adapter are contiguous, as the engine orders them.
  // The kinds are interleaved within each repeat so drift on a shared machine hits all alike.
  std::string workload = "default";
  adapters::LoraStorage lora_storage =
      adapters::LoraStorage::kBF16;  // as `chorus serve` stores them
  // Kernel levels to measure (default workload): empty = the active one. With several, every
  // prefill and decode figure is measured at each level, the levels alternating inside every
  // repeat on the same model (a same-run A/B of the kernels); rows carry their level. Requires:
  // every level is supported (ActiveIsa() reaches it once uncapped).
  std::vector<kernels::IsaLevel> isas;
  // Element type of the KV cache every figure runs with (`--kv-dtype`, as `chorus serve`); the
  // roofline counts the KV bytes of this dtype.
  kernels::KvDtype kv_dtype = kernels::KvDtype::kF32;
};

struct EngineBenchRow {
  std::string dtype;
  std::string metric;        // "prefill", "decode", "decode-lora"; punica: "base", "identical", ...
  int64_t batch = 1;         // rows per step (decode) or the prompt length (prefill)
  int64_t depth = 0;         // decode: KV tokens of each sequence when the timed steps start
  double tokens_per_s = 0;   // median
  std::vector<double> runs;  // every run, tokens/s
  double roofline_fraction = 0;  // decode batch 1: median of the runs' fractions
  double weight_bytes_per_token = 0;
  // Decode: K and V bytes attention reads per token at the timed steps' mean context (every
  // layer, in the cache's dtype); the roofline counts them beside the weights.
  double kv_bytes_per_token = 0;
  int64_t adapters = 0;  // distinct adapters in the batch (punica workload)
  // Decode batch 1: each run's roofline bandwidth is the mean of the probe passes run right
  // before and right after it (GB/s); roofline_fraction is the median over runs of that run's
  // tokens/s ÷ (its bandwidth ÷ (weight + KV bytes per token)). roofline_bandwidth_gbs is the
  // median of the runs' bandwidths.
  double roofline_bandwidth_gbs = 0;
  std::vector<double> roofline_bandwidth_runs = {};
  // Prefill: int8 operations per token the base matmuls perform (2 · the weights of every layer's
  // linears; the output head runs for the last row only), and, like the bandwidth roofline of
  // batch-1 decode, each run against the int8 VNNI limit probed right before and right after it
  // (MeasureVnniPeak): vnni_fraction is the median over runs of run tokens/s · ops_per_token ÷
  // its limit, vnni_gops the median of the runs' limits (both 0 without AVX-512 VNNI).
  double ops_per_token = 0;
  double vnni_fraction = 0;
  double vnni_gops = 0;
  std::string isa = {};  // the kernel level of this row (EngineBenchOptions::isas)
};

// Adapter-row assignment of the punica workload: for `kind` ("identical", "skewed", "uniform",
// "distinct") and batch `b`, the adapter index of each row (contiguous groups). Exposed for tests.
std::vector<int> PunicaAssignment(const std::string& kind, int64_t b);

struct EngineBenchReport {
  std::string shape;
  int threads = 0;
  std::string isa;
  std::string kv_dtype = "f32";  // the KV cache's element type (EngineBenchOptions::kv_dtype)
  int64_t prefill_chunk = 0;     // rows per prefill step (EngineBenchOptions); 0: whole prompt
  double bandwidth_gbs = 0;      // median read bandwidth (GB/s = 1e9 B/s)
  std::vector<double> bandwidth_runs;
  // The int8 dot-product limit of the vector units (VnniPeakProbe, all `threads`): median GOP/s
  // (1e9 int8 multiply-adds counted as 2 operations each); 0 without AVX-512 VNNI.
  double vnni_gops = 0;
  std::vector<double> vnni_runs;
  std::vector<EngineBenchRow> rows;
  std::string ToCsv() const;
  std::string ToJson() const;
  std::string ToTable() const;
};

// Multi-threaded streaming read of one buffer of `bytes` bytes, allocated and touched once, so
// passes can be interleaved with the runs they are the roofline of.
class ReadBandwidthProbe {
 public:
  ReadBandwidthProbe(ThreadPool* pool, int64_t bytes);
  ~ReadBandwidthProbe();
  ReadBandwidthProbe(const ReadBandwidthProbe&) = delete;
  ReadBandwidthProbe& operator=(const ReadBandwidthProbe&) = delete;
  double Once();  // one pass, GB/s (1e9 B/s)

 private:
  ThreadPool* pool_;
  int64_t bytes_;
  uint8_t* buf_ = nullptr;
  std::vector<uint64_t> sink_;
};

// The int8 limit the VNNI kernels are measured against: every pool thread runs a register-only
// loop of vpdpbusd on zmm registers (12 independent accumulators, more than the instruction's
// latency × throughput on Zen 4 and Sapphire Rapids) for a fixed count. GOP/s counts 2
// operations per int8 multiply-add (128 per instruction). 0 when the CPU lacks AVX-512 VNNI.
double MeasureVnniPeak(ThreadPool* pool);

// The median of `v` (the mean of the middle two for an even count; 0 when empty): every
// benchmark here reports medians of its repeats.
double Median(std::vector<double> v);

// Median of `repeats` probe passes (after one warm-up pass), in GB/s.
double MeasureReadBandwidth(int threads, int64_t bytes, int repeats, std::vector<double>* runs);

Result<EngineBenchReport> RunEngineBench(const EngineBenchOptions& opts,
                                         const std::function<void(const std::string&)>& progress);

}  // namespace chorus::engine

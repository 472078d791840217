#include "chorus/engine/tp_bench.h"

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <sstream>

#include "chorus/base/rng.h"
#include "chorus/base/thread_pool.h"
#include "chorus/engine/bench.h"
#include "chorus/memory/kv_cache.h"
#include "chorus/memory/page_pool.h"
#include "chorus/model/forward.h"
#include "chorus/model/step_builder.h"

namespace chorus::engine {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

int64_t TpBenchOptions::max_rows() const {
  const int64_t max_b = batches.empty() ? 1 : *std::max_element(batches.begin(), batches.end());
  return std::max(context, max_b);
}

Result<std::unique_ptr<TpBenchAdapters>> TpBenchAdapters::Make(const TpBenchOptions& opts,
                                                               const model::ModelConfig& full,
                                                               const model::ModelConfig& shard,
                                                               dist::Communicator* comm) {
  if (opts.lora_ranks.empty()) return InvalidArgumentError("tp bench: no LoRA ranks");
  auto out = std::make_unique<TpBenchAdapters>();
  std::vector<std::shared_ptr<const adapters::LoraAdapter>> table;
  for (int64_t a = 0; a < opts.adapters; ++a) {
    adapters::RandomLoraSpec ls;
    ls.rank = opts.lora_ranks[static_cast<size_t>(a) % opts.lora_ranks.size()];
    ls.alpha = 2.0f * static_cast<float>(ls.rank);
    ls.seed = 900 + static_cast<uint64_t>(a);
    ls.targets = {model::Linear::kQ, model::Linear::kK, model::Linear::kV, model::Linear::kO};
    CHORUS_ASSIGN_OR_RETURN(
        auto part, adapters::LoraAdapter::BuildShard(
                       adapters::MakeRandomLora(full, ls), full, comm->rank(), comm->size(),
                       "tp-bench" + std::to_string(a), {.storage = opts.lora_storage}));
    out->memory_bytes_ += part->memory_bytes();
    table.push_back(std::move(part));
  }
  out->hook_ =
      std::make_unique<adapters::LoraSlotHook>(shard, opts.max_rows(), comm, std::move(table));
  return out;
}

Result<TpBenchReport> RunTpBench(const TpBenchOptions& opts, const model::ModelConfig& full,
                                 std::shared_ptr<const model::Model> shard,
                                 dist::Communicator* comm, model::TpLeader* leader,
                                 const std::function<void(const std::string&)>& progress) {
  if (opts.batches.empty() || opts.context < 1 || opts.decode_steps < 1 || opts.repeats < 1)
    return InvalidArgumentError("tp bench: batches, context, decode steps and repeats must be set");
  if (opts.adapters < 0) return InvalidArgumentError("tp bench: adapters must be ≥ 0");
  CHORUS_CHECK_EQ(comm->rank(), 0);
  const model::ModelConfig& c = shard->config();
  if (opts.context + opts.decode_steps > c.max_seq_len) {
    return InvalidArgumentError(
        "--context " + std::to_string(opts.context) + " + " + std::to_string(opts.decode_steps) +
        " decode steps exceed the model's context of " + std::to_string(c.max_seq_len));
  }
  const int64_t max_b = *std::max_element(opts.batches.begin(), opts.batches.end());
  const int64_t max_rows = opts.max_rows();
  std::unique_ptr<TpBenchAdapters> loras;
  if (opts.adapters > 0) {
    CHORUS_ASSIGN_OR_RETURN(loras, TpBenchAdapters::Make(opts, full, c, comm));
  }
  const memory::KvLayout layout = model::KvLayoutFor(c, 16, opts.kv_dtype);
  const int64_t n_pages =
      layout.Groups().PagesFor(opts.context + opts.decode_steps, max_rows, 16) * max_b + 1;
  memory::PagePool pages(n_pages, layout.PageBytes());
  memory::KvCache kv(layout, &pages);
  ThreadPool pool(opts.threads);
  if (leader != nullptr) {
    leader->Start({.max_rows = max_rows,
                   .max_seqs = max_b,
                   .max_logit_rows = max_b,
                   .n_pages = n_pages,
                   .block_size = 16,
                   .kv_dtype = static_cast<int32_t>(opts.kv_dtype),
                   .threads = opts.threads});
  }
  model::Forward fwd(shard, max_rows, max_b, comm);
  model::StepBuilder builder(max_rows, max_b);
  std::vector<float> logits(static_cast<size_t>(max_b * c.vocab_size));
  std::vector<int32_t> slots;
  auto run = [&](const model::StepInput& in, std::span<const int32_t> row_slots) -> Status {
    const model::LinearHook* hook = nullptr;
    if (!row_slots.empty()) {
      CHORUS_ASSIGN_OR_RETURN(hook, loras->ForRows(row_slots));
    }
    model::StepInput with = in;
    with.hook = hook;
    if (leader != nullptr) leader->Step(with, kv, row_slots);
    fwd.Run(with, &kv, &pool, logits.data());
    return OkStatus();
  };
  Rng rng(7);
  TpBenchReport rep;
  rep.tp = comm->size();
  rep.threads = opts.threads;
  rep.adapters = opts.adapters;
  rep.adapter_bytes = loras ? loras->memory_bytes() : 0;
  std::vector<std::string> kinds = {"base"};
  if (loras) kinds.push_back("lora");
  for (int64_t b : opts.batches) {
    std::vector<TpBenchRow> rows(kinds.size());
    std::vector<std::vector<double>> step_ms(kinds.size());
    for (int r = 0; r < opts.repeats; ++r) {
      for (size_t k = 0; k < kinds.size(); ++k) {  // interleaved: both see the same host phases
        TpBenchRow& row = rows[k];
        row.batch = b;
        row.rows = kinds[k];
        std::vector<std::vector<int32_t>> tables(static_cast<size_t>(b));
        for (auto& t : tables)
          CHORUS_RETURN_IF_ERROR(kv.Reserve(&t, opts.context + opts.decode_steps));
        // Each sequence's context: one untimed prefill step of random tokens on the base.
        for (auto& t : tables) {
          std::vector<int32_t> toks(static_cast<size_t>(opts.context));
          for (int32_t& x : toks)
            x = static_cast<int32_t>(rng.NextU64() % static_cast<uint64_t>(c.vocab_size));
          builder.Clear();
          builder.AddSequence(toks, 0, t.data(), /*want_logits=*/false);
          CHORUS_RETURN_IF_ERROR(run(builder.Input(), {}));
        }
        slots.clear();
        if (kinds[k] == "lora") {
          for (int64_t s = 0; s < b; ++s) slots.push_back(static_cast<int32_t>(s % opts.adapters));
        }
        std::vector<int32_t> next(static_cast<size_t>(b), 1);
        const dist::CommStats before = comm->stats();
        const auto t0 = Clock::now();
        for (int64_t step = 0; step < opts.decode_steps; ++step) {
          builder.Clear();
          for (int64_t s = 0; s < b; ++s) {
            builder.AddSequence(std::span<const int32_t>(&next[static_cast<size_t>(s)], 1),
                                opts.context + step, tables[static_cast<size_t>(s)].data(), true);
          }
          CHORUS_RETURN_IF_ERROR(run(builder.Input(), slots));
          for (int64_t s = 0; s < b; ++s) {  // greedy, as the engine's sampler would at T = 0
            const float* lg = logits.data() + s * c.vocab_size;
            next[static_cast<size_t>(s)] =
                static_cast<int32_t>(std::max_element(lg, lg + c.vocab_size) - lg);
          }
        }
        const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        const dist::CommStats& after = comm->stats();
        const auto steps = static_cast<double>(opts.decode_steps);
        row.runs.push_back(static_cast<double>(b * opts.decode_steps) / secs);
        step_ms[k].push_back(secs * 1e3 / steps);
        row.comm_ms_runs.push_back((after.seconds() - before.seconds()) * 1e3 / steps);
        row.all_reduces_per_step =
            static_cast<double>(after.all_reduces - before.all_reduces) / steps;
        row.all_gathers_per_step =
            static_cast<double>(after.all_gathers - before.all_gathers) / steps;
        row.bytes_per_step = static_cast<double>(after.all_reduce_bytes - before.all_reduce_bytes +
                                                 after.all_gather_bytes - before.all_gather_bytes +
                                                 after.broadcast_bytes - before.broadcast_bytes) /
                             steps;
        for (auto& t : tables) kv.Release(&t);
        progress("tp " + std::to_string(rep.tp) + " batch " + std::to_string(b) + " " + kinds[k] +
                 " run " + std::to_string(r + 1) + "/" + std::to_string(opts.repeats) + ": " +
                 std::to_string(row.runs.back()) + " tok/s, comm " +
                 std::to_string(row.comm_ms_runs.back()) + " ms/step of " +
                 std::to_string(step_ms[k].back()) + " ms");
      }
    }
    for (size_t k = 0; k < kinds.size(); ++k) {
      rows[k].tokens_per_s = Median(rows[k].runs);
      rows[k].step_ms = Median(step_ms[k]);
      rows[k].comm_ms = Median(rows[k].comm_ms_runs);
      rep.rows.push_back(std::move(rows[k]));
    }
  }
  return rep;
}

std::string TpBenchReport::ToTable() const {
  std::ostringstream s;
  s << "model " << model << "  dtype " << dtype << "  tp " << tp << "  threads/rank " << threads;
  if (adapters > 0) {
    s << "  adapters " << adapters << " (" << std::fixed << std::setprecision(1)
      << static_cast<double>(adapter_bytes) / 1e6 << " MB on rank 0)";
  }
  s << "\n";
  s << std::left << std::setw(7) << "batch" << std::setw(6) << "rows" << std::right << std::setw(12)
    << "tok/s" << std::setw(11) << "step ms" << std::setw(11) << "comm ms" << std::setw(8)
    << "comm%" << std::setw(13) << "MB/step" << std::setw(14) << "colls/step"
    << "\n";
  s << std::fixed;
  for (const auto& r : rows) {
    s << std::left << std::setw(7) << r.batch << std::setw(6) << r.rows << std::right
      << std::setprecision(1) << std::setw(12) << r.tokens_per_s << std::setprecision(2)
      << std::setw(11) << r.step_ms << std::setw(11) << r.comm_ms << std::setprecision(1)
      << std::setw(8) << (r.step_ms > 0 ? 100.0 * r.comm_ms / r.step_ms : 0.0)
      << std::setprecision(2) << std::setw(13) << r.bytes_per_step / 1e6 << std::setprecision(0)
      << std::setw(14) << r.all_reduces_per_step + r.all_gathers_per_step << "\n";
  }
  return s.str();
}

std::string TpBenchReport::ToCsv() const {
  std::ostringstream s;
  s << "model,dtype,tp,threads,adapters,batch,rows,tokens_per_s,step_ms,comm_ms,"
       "all_reduces_per_step,all_gathers_per_step,bytes_per_step,runs,comm_ms_runs\n";
  s << std::fixed;
  for (const auto& r : rows) {
    s << model << "," << dtype << "," << tp << "," << threads << "," << adapters << "," << r.batch
      << "," << r.rows << "," << std::setprecision(2) << r.tokens_per_s << ","
      << std::setprecision(3) << r.step_ms << "," << r.comm_ms << "," << std::setprecision(0)
      << r.all_reduces_per_step << "," << r.all_gathers_per_step << "," << r.bytes_per_step << ",";
    for (size_t i = 0; i < r.runs.size(); ++i)
      s << (i ? ";" : "") << std::setprecision(2) << r.runs[i];
    s << ",";
    for (size_t i = 0; i < r.comm_ms_runs.size(); ++i)
      s << (i ? ";" : "") << std::setprecision(3) << r.comm_ms_runs[i];
    s << "\n";
  }
  return s.str();
}

std::string TpBenchReport::ToJson() const {
  std::ostringstream s;
  s << std::fixed << std::setprecision(3);
  s << "{\"model\":\"" << model << "\",\"dtype\":\"" << dtype << "\",\"tp\":" << tp
    << ",\"threads\":" << threads << ",\"adapters\":" << adapters
    << ",\"adapter_bytes\":" << adapter_bytes << ",\"rows\":[";
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto& r = rows[i];
    s << (i ? "," : "") << "{\"batch\":" << r.batch << ",\"rows\":\"" << r.rows
      << "\",\"tokens_per_s\":" << r.tokens_per_s << ",\"step_ms\":" << r.step_ms
      << ",\"comm_ms\":" << r.comm_ms << ",\"all_reduces_per_step\":" << r.all_reduces_per_step
      << ",\"all_gathers_per_step\":" << r.all_gathers_per_step
      << ",\"bytes_per_step\":" << r.bytes_per_step << ",\"runs\":[";
    for (size_t j = 0; j < r.runs.size(); ++j) s << (j ? "," : "") << r.runs[j];
    s << "],\"comm_ms_runs\":[";
    for (size_t j = 0; j < r.comm_ms_runs.size(); ++j) s << (j ? "," : "") << r.comm_ms_runs[j];
    s << "]}";
  }
  s << "]}\n";
  return s.str();
}

}  // namespace chorus::engine

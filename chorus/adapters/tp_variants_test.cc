// Adapters served under tensor parallelism (adapters/tp_variants.h): the definition's wire form,
// rank 0's slot binding (one definition per loaded copy, slots reused only once a copy is gone,
// a worker's failure binding nothing) and a worker loading its shard of a registered file —
// equal to the shard built in memory, refused when the file changed or the kind is unknown.
// (Deltas: adapters/delta/delta_tp_test.cc and tests/tp/tp_cli_test.sh.)
#include "chorus/adapters/tp_variants.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "chorus/adapters/registry.h"
#include "chorus/dist/thread_communicator.h"
#include "chorus/model/synthetic.h"
#include "chorus/model/tensor_parallel.h"

namespace chorus::adapters {
namespace {

namespace fs = std::filesystem;

VariantRef SomeRef() {
  VariantRef r;
  r.name = "sql/v2";
  r.kind = "lora";
  r.path = "/srv/adapters/sql \"quoted\"";
  r.id = {.content_hash = 0xfedcba9876543210ull, .version = 7};
  r.files = {{"/srv/adapters/sql/adapter_model.safetensors", 12345, 1700000000123456789},
             {"/srv/adapters/sql/adapter_config.json", 456, 1700000000000000001}};
  return r;
}

TEST(TpVariantDescriptionTest, RoundTripsEveryField) {
  const VariantRef r = SomeRef();
  auto back = ParseTpVariant(DescribeTpVariant(r));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->name, r.name);
  EXPECT_EQ(back->kind, r.kind);
  EXPECT_EQ(back->path, r.path);
  EXPECT_EQ(back->id, r.id);
  ASSERT_EQ(back->files.size(), 2u);
  EXPECT_EQ(back->files[0].path, r.files[0].path);
  EXPECT_EQ(back->files[0].size, r.files[0].size);
  EXPECT_EQ(back->files[0].mtime_ns, r.files[0].mtime_ns);
}

TEST(TpVariantDescriptionTest, MalformedIsRefused) {
  for (const char* bad :
       {"", "[]", "{\"name\": 1}", "{\"name\": \"a\", \"kind\": \"lora\", \"path\": \"p\"}",
        "{\"name\": \"a\", \"kind\": \"lora\", \"path\": \"p\", \"content_hash\": -1, "
        "\"version\": 1, \"files\": []}",
        "{\"name\": \"a\", \"kind\": \"lora\", \"path\": \"p\", \"content_hash\": 1, "
        "\"version\": 1, \"files\": [{\"path\": 3}]}"}) {
    auto r = ParseTpVariant(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << bad;
  }
}

std::shared_ptr<const LoraAdapter> SmallAdapter(const std::string& name, uint64_t seed) {
  auto m = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 2});
  EXPECT_TRUE(m.ok());
  RandomLoraSpec spec;
  spec.rank = 4;
  spec.seed = seed;
  auto a = LoraAdapter::Build(MakeRandomLora((*m)->config(), spec), (*m)->config(), name);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  return *a;
}

TEST(TpVariantSlotsTest, OneDefinitionPerCopyAndSlotsReusedOnlyWhenTheCopyIsGone) {
  std::vector<std::pair<int32_t, std::string>> sent;
  TpVariantSlots slots([&](int32_t slot, std::string_view d) {
    sent.emplace_back(slot, std::string(d));
    return OkStatus();
  });
  auto a = SmallAdapter("a", 1), b = SmallAdapter("b", 2);
  VariantRef ra = SomeRef(), rb = SomeRef();
  ra.name = "a";
  rb.name = "b";
  auto sa = slots.Bind(a, ra);
  auto sb = slots.Bind(b, rb);
  ASSERT_TRUE(sa.ok() && sb.ok());
  EXPECT_NE(*sa, *sb);
  EXPECT_EQ(*slots.Bind(a, ra), *sa);  // bound: no second definition
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(ParseTpVariant(sent[0].second)->name, "a");
  EXPECT_EQ(slots.SlotOf(a.get()), *sa);
  EXPECT_EQ(slots.SlotOf(b.get()), *sb);

  // While `a` lives its slot is never given to another copy.
  auto c = SmallAdapter("c", 3);
  VariantRef rc = SomeRef();
  rc.name = "c";
  auto sc = slots.Bind(c, rc);
  ASSERT_TRUE(sc.ok());
  EXPECT_NE(*sc, *sa);
  EXPECT_NE(*sc, *sb);

  // Once `b` is gone (no sequence, no cache holds it) its slot is reused, defined anew.
  const int32_t b_slot = *sb;
  b.reset();
  auto d = SmallAdapter("d", 4);
  VariantRef rd = SomeRef();
  rd.name = "d";
  auto sd = slots.Bind(d, rd);
  ASSERT_TRUE(sd.ok());
  EXPECT_EQ(*sd, b_slot);
  ASSERT_EQ(sent.size(), 4u);
  EXPECT_EQ(sent.back().first, b_slot);
  EXPECT_EQ(ParseTpVariant(sent.back().second)->name, "d");
  EXPECT_EQ(slots.definitions(), 4);
}

TEST(TpVariantSlotsTest, AWorkersFailureBindsNothing) {
  bool fail = true;
  int calls = 0;
  TpVariantSlots slots([&](int32_t, std::string_view) {
    ++calls;
    return fail ? UnavailableError("rank 1 could not load its shard") : OkStatus();
  });
  auto a = SmallAdapter("a", 1);
  VariantRef ra = SomeRef();
  ra.name = "a";
  auto s = slots.Bind(a, ra);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(s.status().message().find("adapter 'a'"), std::string::npos) << s.status().message();
  EXPECT_EQ(slots.bound(), 0);
  fail = false;
  auto again = slots.Bind(a, ra);  // defined again on the next use
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, 0);  // the failed slot was not lost
  EXPECT_EQ(calls, 2);
}

TEST(TpVariantSlotsTest, PrefetchHintsOncePerDefinitionAndNotForABoundCopy) {
  TpVariantSlots slots([](int32_t, std::string_view) { return OkStatus(); });
  VariantRef ra = SomeRef(), rb = SomeRef();
  ra.name = "a";
  rb.name = "b";
  EXPECT_TRUE(slots.ShouldPrefetch(ra));
  EXPECT_FALSE(slots.ShouldPrefetch(ra)) << "hinted already";
  EXPECT_TRUE(slots.ShouldPrefetch(rb));
  auto a = SmallAdapter("a", 1);
  ASSERT_TRUE(slots.Bind(a, ra).ok());
  EXPECT_FALSE(slots.ShouldPrefetch(ra)) << "a live copy is bound: the workers hold it";
  a.reset();
  EXPECT_TRUE(slots.ShouldPrefetch(ra)) << "its copy is gone: a later use defines it anew";
  for (int i = 0; i < static_cast<int>(TpVariantSlots::kMaxHinted) + 1; ++i) {
    VariantRef r = SomeRef();
    r.name = "many" + std::to_string(i);
    EXPECT_TRUE(slots.ShouldPrefetch(r));
  }
}

class TpVariantWorkerTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(testing::TempDir()) / ("tp_variants_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    auto m = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 2});
    ASSERT_TRUE(m.ok());
    full_ = (*m)->config();
    SyntheticLoraSetOptions so;
    so.count = 1;
    so.ranks = {8};
    so.targets = {model::Linear::kQ,    model::Linear::kK,  model::Linear::kV,   model::Linear::kO,
                  model::Linear::kGate, model::Linear::kUp, model::Linear::kDown};
    so.dtype = DType::kF32;
    auto n = WriteSyntheticLoraSet((dir_ / "set").string(), full_, so);
    ASSERT_TRUE(n.ok()) << n.status().ToString();
    RegistryOptions ro;
    ro.adapter_roots = {dir_.string()};
    ro.base = full_;
    auto reg = AdapterRegistry::Open((dir_ / "registry.json").string(), ro);
    ASSERT_TRUE(reg.ok()) << reg.status().ToString();
    registry_ = std::move(*reg);
    auto info = registry_->Register("sql", (dir_ / "set" / "lora-0").string());
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    ref_ = info->ref();
  }
  void TearDown() override { fs::remove_all(dir_); }

  fs::path dir_;
  model::ModelConfig full_;
  std::shared_ptr<AdapterRegistry> registry_;
  VariantRef ref_;
};

TEST_F(TpVariantWorkerTest, LoadsItsShardOfTheRegisteredFile) {
  LoraLoadOptions lo;
  lo.limits.storage = LoraStorage::kF32;
  auto comms = dist::MakeThreadCommunicators(2);  // rank 1's (no collective is called here)
  TpVariantWorker worker(full_, comms[1].get(), 16, lo, "");
  ASSERT_TRUE(worker.Define(3, DescribeTpVariant(ref_)).ok());
  // The same part built from the file in memory (BuildShard, lora_tp_test checks it against the
  // whole adapter).
  auto w = ReadLora(ref_.path, full_, lo);
  ASSERT_TRUE(w.ok());
  auto expect = LoraAdapter::BuildShard(*w, full_, 1, 2, "sql", lo.limits);
  ASSERT_TRUE(expect.ok());
  auto via_file = LoadLoraAdapterShard(ref_.path, full_, 1, 2, lo, "sql");
  ASSERT_TRUE(via_file.ok()) << via_file.status().ToString();
  EXPECT_EQ((*via_file)->memory_bytes(), (*expect)->memory_bytes());
  EXPECT_EQ((*via_file)->max_rank(), 8);

  const int32_t rows[] = {3, -1, 3};
  auto hook = worker.ForRows(rows);
  EXPECT_TRUE(hook.ok()) << hook.status().ToString();
  const int32_t undefined[] = {2};
  auto bad = worker.ForRows(undefined);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("slot 2"), std::string::npos) << bad.status().message();
}

TEST_F(TpVariantWorkerTest, RefusesChangedFilesAndUnknownKindsAndForgetsTheSlot) {
  auto comms = dist::MakeThreadCommunicators(2);
  TpVariantWorker worker(full_, comms[1].get(), 16, {}, "");
  ASSERT_TRUE(worker.Define(0, DescribeTpVariant(ref_)).ok());
  VariantRef odd = ref_;
  odd.kind = "mystery";
  Status d = worker.Define(0, DescribeTpVariant(odd));
  EXPECT_EQ(d.code(), StatusCode::kInvalidArgument) << d.ToString();
  const int32_t row[] = {0};
  EXPECT_FALSE(worker.ForRows(row).ok());  // a failed definition leaves the slot empty

  // The file changed since registration: its content no longer hashes to the registered id.
  {
    std::ofstream f(ref_.files[0].path, std::ios::app | std::ios::binary);
    f << "x";
  }
  Status s = worker.Define(1, DescribeTpVariant(ref_));
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition) << s.ToString();
  EXPECT_NE(s.message().find("changed since it was registered"), std::string::npos) << s.message();
  EXPECT_FALSE(worker.Define(2, "not json").ok());
}

// A prefetched shard is what Define then installs, without reading the file again (it was
// checked against the registered content when the prefetch read it); a failed prefetch is the
// error of that Define; a Define without a prefetch loads as before.
TEST_F(TpVariantWorkerTest, DefineTakesThePrefetchedShard) {
  auto comms = dist::MakeThreadCommunicators(2);
  TpVariantWorker worker(full_, comms[1].get(), 16, {}, "");
  const std::string desc = DescribeTpVariant(ref_);
  worker.Prefetch(desc);
  worker.Prefetch(desc);  // queued or loaded already: one load
  worker.WaitForPrefetches();
  // Removing the file now shows the Define does not read it.
  const fs::path moved = dir_ / "moved";
  fs::rename(dir_ / "set" / "lora-0", moved);
  ASSERT_TRUE(worker.Define(4, desc).ok());
  EXPECT_EQ(worker.prefetch_hits(), 1);
  const int32_t rows[] = {4, -1};
  EXPECT_TRUE(worker.ForRows(rows).ok());
  // Taken: a second Define reads the file, which is gone.
  EXPECT_FALSE(worker.Define(5, desc).ok());
  EXPECT_EQ(worker.prefetch_hits(), 1);
  fs::rename(moved, dir_ / "set" / "lora-0");

  VariantRef odd = ref_;
  odd.kind = "mystery";
  worker.Prefetch(DescribeTpVariant(odd));
  worker.Prefetch("not json");
  worker.WaitForPrefetches();
  Status d = worker.Define(6, DescribeTpVariant(odd));
  EXPECT_EQ(d.code(), StatusCode::kInvalidArgument) << d.ToString();
  EXPECT_NE(d.message().find("unknown kind"), std::string::npos) << d.message();
  EXPECT_FALSE(worker.Define(7, "not json").ok());
  EXPECT_EQ(worker.prefetch_hits(), 3);
}

TEST_F(TpVariantWorkerTest, PrefetchesBeyondTheLimitDropTheOldest) {
  auto comms = dist::MakeThreadCommunicators(2);
  TpVariantWorker worker(full_, comms[1].get(), 16, {}, "");
  // Distinct descriptions of the same file (another version each): each is its own load.
  std::vector<std::string> descs;
  for (size_t i = 0; i < TpVariantWorker::kMaxPrefetched + 2; ++i) {
    VariantRef r = ref_;
    r.id.version += 1 + i;
    descs.push_back(DescribeTpVariant(r));
    worker.Prefetch(descs.back());
    worker.WaitForPrefetches();  // loaded, in order: the oldest loaded ones are dropped first
  }
  ASSERT_TRUE(worker.Define(0, descs.front()).ok());  // dropped: loaded here
  EXPECT_EQ(worker.prefetch_hits(), 0);
  ASSERT_TRUE(worker.Define(1, descs.back()).ok());
  EXPECT_EQ(worker.prefetch_hits(), 1);
}

}  // namespace
}  // namespace chorus::adapters

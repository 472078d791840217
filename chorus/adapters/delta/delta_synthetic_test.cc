// Random deltas (delta_synthetic.h) are valid delta files and servable: every layout round-trips
// through the file format's full validation and builds kernel views for its model.
#include "chorus/adapters/delta/delta_synthetic.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>

#include "chorus/adapters/delta/delta_hook.h"
#include "chorus/base/mapped_file.h"
#include "chorus/memory/host_arena.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::delta {
namespace {

TEST(DeltaSyntheticTest, EveryLayoutIsAValidServableDelta) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  for (const RandomDeltaSpec spec :
       {RandomDeltaSpec{.bits = 4, .sparse24 = true, .group_size = 64},
        RandomDeltaSpec{.bits = 3, .sparse24 = true, .group_size = 32},
        RandomDeltaSpec{.bits = 2, .sparse24 = false, .group_size = 16},
        RandomDeltaSpec{.bits = 1, .sparse24 = false, .group_size = 0}}) {
    Delta d = MakeRandomDelta(c, spec);
    EXPECT_EQ(d.matrices.size(), static_cast<size_t>(c.n_layers * model::kNumLinears));
    d.base_hash = BaseWeightsHash(**base);
    auto bytes = SerializeDelta(d);
    ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
    auto back = ParseDelta("random", *std::move(bytes));
    ASSERT_TRUE(back.ok()) << spec.bits << ": " << back.status().ToString();
    auto w = DeltaWeights::Build(std::make_shared<const Delta>(*std::move(back)), c, "random");
    ASSERT_TRUE(w.ok()) << w.status().ToString();
    EXPECT_EQ(w->get()->at(0, model::Linear::kDown).cols, c.n_ff);
  }
}

// Every view of `b` holds the same bytes as `a`'s, and `b`'s sit in its cache-line aligned
// streamed buffer with its Delta's copies freed.
void ExpectSameBytesInTheStreamedBuffer(const DeltaWeights& a, const DeltaWeights& b,
                                        const model::ModelConfig& c) {
  EXPECT_TRUE(b.streamed_buffer());
  EXPECT_EQ(DeltaWeightsBytes(a), DeltaWeightsBytes(b));
  EXPECT_EQ(a.positions_bytes(), b.positions_bytes());
  for (const MatrixDelta& m : b.delta().matrices) {
    EXPECT_TRUE(m.packed.codes.empty() && m.packed.mask.empty() && m.packed.scales.empty())
        << m.name;
  }
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<model::Linear>(li);
      const kernels::DeltaMatrixView& x = a.at(l, which);
      const kernels::DeltaMatrixView& y = b.at(l, which);
      ASSERT_EQ(x.rows, y.rows);
      ASSERT_EQ(x.cols, y.cols);
      EXPECT_EQ(reinterpret_cast<uintptr_t>(y.codes) % 64, 0u);
      EXPECT_EQ(std::memcmp(x.codes, y.codes, static_cast<size_t>(x.rows * x.code_row_bytes())), 0);
      EXPECT_EQ(std::memcmp(x.scales, y.scales, static_cast<size_t>(x.n_scales() * 4)), 0);
      ASSERT_EQ(x.mask == nullptr, y.mask == nullptr);
      if (x.mask != nullptr) {
        EXPECT_EQ(std::memcmp(x.mask, y.mask, static_cast<size_t>(x.rows * x.mask_row_bytes())), 0);
      }
      ASSERT_EQ(x.positions == nullptr, y.positions == nullptr);
      if (x.positions != nullptr) {
        EXPECT_EQ(std::memcmp(x.positions, y.positions,
                              static_cast<size_t>(x.rows * x.position_row_words() * 8)),
                  0);
      }
    }
  }
}

// Serving's Build(Delta) moves the matrices into one huge-page buffer: the views must hold the
// same bytes as Build(shared_ptr)'s (which point into the Delta), the Delta's copies are freed,
// and the accounting is unchanged.
TEST(DeltaSyntheticTest, ServingBuildMovesTheMatricesIntoOneBufferWithTheSameBytes) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  for (const RandomDeltaSpec spec :
       {RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64},
        RandomDeltaSpec{.bits = 1, .sparse24 = false, .group_size = 0},
        RandomDeltaSpec{.bits = 4, .sparse24 = false, .group_size = 32}}) {
    const Delta d = MakeRandomDelta(c, spec);
    auto kept = DeltaWeights::Build(std::make_shared<const Delta>(d), c, "kept");
    auto moved = DeltaWeights::Build(Delta(d), c, "moved");
    ASSERT_TRUE(kept.ok() && moved.ok());
    EXPECT_FALSE((*kept)->streamed_buffer());
    ExpectSameBytesInTheStreamedBuffer(**kept, **moved, c);
  }
}

// Given the host tier's arena, serving's Build puts the buffer in it (same bytes, every view
// inside the arena) and gives the chunks back when the last holder drops the weights; an arena
// without a long enough free run leaves the buffer on fresh huge pages, with the same bytes.
TEST(DeltaSyntheticTest, ServingBuildUsesTheHostArenaWhenItHasRoom) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  const Delta d = MakeRandomDelta(c, {.bits = 2, .sparse24 = true, .group_size = 64});
  auto kept = DeltaWeights::Build(std::make_shared<const Delta>(d), c, "kept");
  ASSERT_TRUE(kept.ok());
  auto arena = std::make_shared<memory::HostArena>(size_t{64} << 20);
  {
    auto in_arena = DeltaWeights::Build(Delta(d), c, "in-arena", arena);
    ASSERT_TRUE(in_arena.ok()) << in_arena.status().ToString();
    EXPECT_TRUE((*in_arena)->streamed_in_arena());
    ExpectSameBytesInTheStreamedBuffer(**kept, **in_arena, c);
    EXPECT_GE(arena->bytes_in_use(), static_cast<size_t>(DeltaWeightsBytes(**in_arena)));
    for (int64_t l = 0; l < c.n_layers; ++l) {
      for (int li = 0; li < model::kNumLinears; ++li) {
        const kernels::DeltaMatrixView& v = (*in_arena)->at(l, static_cast<model::Linear>(li));
        EXPECT_TRUE(arena->Contains(v.codes) && arena->Contains(v.scales) &&
                    arena->Contains(v.mask) && arena->Contains(v.positions))
            << l << " " << li;
      }
    }
    // An arena with no run long enough for it (one chunk): fresh memory, the same bytes.
    auto full = std::make_shared<memory::HostArena>(memory::HostArena::kChunkBytes);
    auto outside = DeltaWeights::Build(Delta(d), c, "outside", full);
    ASSERT_TRUE(outside.ok());
    if (DeltaWeightsBytes(**outside) > static_cast<int64_t>(memory::HostArena::kChunkBytes)) {
      EXPECT_FALSE((*outside)->streamed_in_arena());
      EXPECT_EQ(full->bytes_in_use(), 0u);
    }
    ExpectSameBytesInTheStreamedBuffer(**kept, **outside, c);
  }
  EXPECT_EQ(arena->bytes_in_use(), 0u);
}

// Serving loads a delta file through ReadDeltaMapped, copying codes and patterns from the
// mapping straight into the buffer: the same bytes as the file read into memory first, for
// every layout, zstd-compressed codes included; and a damaged file fails as ReadDelta does.
TEST(DeltaSyntheticTest, LoadingFromTheMappedFileGivesTheBytesOfTheFileReadIntoMemory) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  const std::string dir = testing::TempDir() + "/delta_mapped";
  std::filesystem::create_directories(dir);
  int zstd_files = 0;
  for (const RandomDeltaSpec spec :
       {RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64},
        RandomDeltaSpec{.bits = 4, .sparse24 = true, .group_size = 32},
        RandomDeltaSpec{.bits = 1, .sparse24 = false, .group_size = 0},
        RandomDeltaSpec{.bits = 8, .sparse24 = false, .group_size = 64}}) {
    Delta d = MakeRandomDelta(c, spec);
    d.base_hash = BaseWeightsHash(**base);
    // Random codes do not compress; the 4-bit delta's zeroed ones are stored zstd-compressed.
    if (spec.bits == 4)
      for (MatrixDelta& m : d.matrices) std::fill(m.packed.codes.begin(), m.packed.codes.end(), 0);
    const std::string path = dir + "/d" + std::to_string(spec.bits) + ".safetensors";
    WriteStats stats;
    ASSERT_TRUE(WriteDelta(path, d, 9, &stats).ok());
    zstd_files += stats.matrices_zstd > 0;
    // The file is streamed from the delta's own buffers: the bytes SerializeDelta assembles.
    auto written = ReadFileToString(path, size_t{1} << 30);
    auto serialized = SerializeDelta(d, 9);
    ASSERT_TRUE(written.ok() && serialized.ok());
    EXPECT_EQ(*written, *serialized);
    EXPECT_EQ(stats.file_bytes, static_cast<int64_t>(written->size()));
    auto read = ReadDelta(path);
    ASSERT_TRUE(read.ok()) << read.status().ToString();
    auto in_memory = DeltaWeights::Build(std::make_shared<const Delta>(*std::move(read)), c, "a");
    auto mapped = LoadDeltaWeights(path, c, d.base_hash, "b");
    ASSERT_TRUE(in_memory.ok() && mapped.ok()) << mapped.status().ToString();
    ExpectSameBytesInTheStreamedBuffer(**in_memory, **mapped, c);
  }
  EXPECT_GT(zstd_files, 0) << "no layout exercised zstd-compressed codes";
  {
    // Extras (exact f32 and int8 rows) are streamed from the delta too; a wrong count is refused.
    Delta d = MakeRandomDelta(c, RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64});
    ExtraDelta norm;
    norm.name = "model.norm.weight";
    norm.kind = ExtraDelta::Kind::kExactF32;
    norm.shape = {c.n_embd};
    norm.values.assign(static_cast<size_t>(c.n_embd), 0.25f);
    ExtraDelta embed;
    embed.name = "model.embed_tokens.weight";
    embed.kind = ExtraDelta::Kind::kInt8Rows;
    embed.shape = {3, c.n_embd};
    embed.q.assign(static_cast<size_t>(3 * c.n_embd), int8_t{-7});
    embed.row_scales = {0.5f, 1.0f, 2.0f};
    d.extras = {norm, embed};
    const std::string path = dir + "/extras.safetensors";
    ASSERT_TRUE(WriteDelta(path, d).ok());
    auto written = ReadFileToString(path, size_t{1} << 30);
    auto serialized = SerializeDelta(d);
    ASSERT_TRUE(written.ok() && serialized.ok());
    EXPECT_EQ(*written, *serialized);
    d.extras[1].row_scales.pop_back();
    EXPECT_EQ(WriteDelta(dir + "/short.safetensors", d).code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(std::filesystem::exists(dir + "/short.safetensors"));
    d.extras.clear();
    d.matrices[2].packed.codes.pop_back();
    EXPECT_EQ(WriteDelta(dir + "/short.safetensors", d).code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(SerializeDelta(d).status().code(), StatusCode::kInvalidArgument);
    EXPECT_FALSE(std::filesystem::exists(dir + "/short.safetensors"));
  }

  // A 2:4 pattern byte above the largest pattern code, in the file.
  Delta d = MakeRandomDelta(c, RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64});
  d.base_hash = BaseWeightsHash(**base);
  d.matrices[3].packed.mask[5] = 250;
  const std::string bad = dir + "/bad.safetensors";
  ASSERT_TRUE(WriteDelta(bad, d).ok());
  auto want = ReadDelta(bad);
  auto got = LoadDeltaWeights(bad, c, d.base_hash, "bad");
  ASSERT_FALSE(want.ok());
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().ToString(), want.status().ToString());
  EXPECT_NE(got.status().message().find("above the largest pattern code"), std::string::npos)
      << got.status().ToString();
}

// Registration checks a delta file as serving loads it, without the copy: CheckDeltaFile accepts
// what LoadDeltaWeights accepts, reports the linears it changes, and refuses a damaged file, a
// delta for other base weights and one whose shapes are not the base's with LoadDeltaWeights'
// own message.
TEST(DeltaSyntheticTest, CheckingAFileRefusesWhatLoadingRefusesWithoutTheCopy) {
  auto base = model::MakeSyntheticModel({.shape = "tiny", .dtype = DType::kF32, .seed = 3});
  ASSERT_TRUE(base.ok());
  const model::ModelConfig& c = (*base)->config();
  const std::string hash = BaseWeightsHash(**base);
  const std::string dir = testing::TempDir() + "/delta_check";
  std::filesystem::create_directories(dir);

  Delta d = MakeRandomDelta(c, RandomDeltaSpec{.bits = 2, .sparse24 = true, .group_size = 64});
  d.base_hash = hash;
  d.base_source = "tiny-base";
  // Only q and down: the summary lists just those.
  std::erase_if(d.matrices, [](const MatrixDelta& m) {
    return m.name.find("q_proj") == std::string::npos &&
           m.name.find("down_proj") == std::string::npos;
  });
  const std::string good = dir + "/good.safetensors";
  ASSERT_TRUE(WriteDelta(good, d).ok());
  auto summary = CheckDeltaFile(good, c, hash, "good");
  ASSERT_TRUE(summary.ok()) << summary.status().ToString();
  EXPECT_EQ(summary->base_source, "tiny-base");
  EXPECT_EQ(summary->linears,
            (std::vector<model::Linear>{model::Linear::kQ, model::Linear::kDown}));
  ASSERT_TRUE(LoadDeltaWeights(good, c, hash, "good").ok());

  auto same_error = [&](const std::string& path, const std::string& base_hash) {
    auto load = LoadDeltaWeights(path, c, base_hash, "x");
    auto check = CheckDeltaFile(path, c, base_hash, "x");
    ASSERT_FALSE(load.ok());
    ASSERT_FALSE(check.ok());
    EXPECT_EQ(check.status().ToString(), load.status().ToString());
  };
  same_error(good, std::string(hash.size(), '0'));  // made for other base weights

  Delta damaged = d;
  damaged.matrices[1].packed.mask[7] = 250;  // a 2:4 pattern byte above the largest code
  const std::string bad = dir + "/bad.safetensors";
  ASSERT_TRUE(WriteDelta(bad, damaged).ok());
  same_error(bad, hash);

  auto other = model::SyntheticConfig("tiny");
  ASSERT_TRUE(other.ok());
  other->n_embd *= 2;  // the base's shapes, not the delta's
  auto load = LoadDeltaWeights(good, *other, hash, "x");
  auto check = CheckDeltaFile(good, *other, hash, "x");
  ASSERT_FALSE(load.ok());
  ASSERT_FALSE(check.ok());
  EXPECT_EQ(check.status().ToString(), load.status().ToString());
}

}  // namespace
}  // namespace chorus::delta

// test-labels: unit
// What loading does with the mapped file's pages of the matrices it repacks (SourcePages,
// model.h): kRelease reclaims them, so the weights are resident once; kKeep leaves them in the
// page cache, so that `--swap-full-models` reads a model swapped out and back in from memory
// rather than storage.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "chorus/base/mapped_file.h"
#include "chorus/model/convert.h"
#include "chorus/model/loader.h"
#include "chorus/model/synthetic.h"
#include "tests/testutil/testutil.h"

namespace chorus::model {
namespace {

// Fraction of the whole pages inside the model's q4_0 linear matrices (views into its mapped
// file) that are resident, by mincore.
double ResidentFractionOfLinears(const Model& m) {
  const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  size_t resident = 0, total = 0;
  for (const auto& [name, t] : m.tensors()) {
    if (t.dtype() != DType::kQ4_0) continue;
    const auto p = reinterpret_cast<uintptr_t>(t.data());
    const uintptr_t begin = (p + page - 1) & ~(page - 1);
    const uintptr_t end = (p + static_cast<uintptr_t>(t.view().NumBytes())) & ~(page - 1);
    if (end <= begin) continue;
    std::vector<unsigned char> vec((end - begin) / page);
    EXPECT_EQ(::mincore(reinterpret_cast<void*>(begin), end - begin, vec.data()), 0) << name;
    for (unsigned char v : vec) resident += v & 1;
    total += vec.size();
  }
  return total == 0 ? 0.0 : static_cast<double>(resident) / static_cast<double>(total);
}

// Reads every byte of the file through its own mapping, so its pages are in the page cache.
void TouchFile(const std::string& path) {
  auto f = MappedFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  volatile unsigned sum = 0;
  for (size_t i = 0; i < (*f)->size(); i += 512) sum = sum + (*f)->data()[i];
}

TEST(SourcePagesTest, KeepLeavesTheRepackedMatricesInThePageCache) {
  SyntheticSpec spec;
  spec.shape = "tiny";
  spec.dtype = DType::kQ4_0;
  auto synthetic = MakeSyntheticModel(spec);
  ASSERT_TRUE(synthetic.ok()) << synthetic.status().ToString();
  const std::string dir = testing::TempDir() + "/source_pages";
  std::filesystem::create_directories(dir);
  ConvertOptions co;
  co.output = dir + "/tiny-q4_0.gguf";
  ASSERT_TRUE(ConvertModel(**synthetic, co).ok());

  TouchFile(co.output);
  {
    auto released = LoadModel(co.output, SourcePages::kRelease);
    ASSERT_TRUE(released.ok()) << released.status().ToString();
    const double after_release = ResidentFractionOfLinears(**released);
    // Where MADV_PAGEOUT cannot reclaim file pages (old kernels, files on tmpfs) both modes
    // look alike, and the check below could not tell them apart.
    if (after_release > 0.5)
      GTEST_SKIP() << "MADV_PAGEOUT left " << after_release * 100
                   << " % of the released pages resident here";
  }
  TouchFile(co.output);
  auto kept = LoadModel(co.output, SourcePages::kKeep);
  ASSERT_TRUE(kept.ok()) << kept.status().ToString();
  EXPECT_GT(ResidentFractionOfLinears(**kept), 0.9);
}

}  // namespace
}  // namespace chorus::model

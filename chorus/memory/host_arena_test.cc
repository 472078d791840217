// test-labels: unit concurrency
#include "chorus/memory/host_arena.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace chorus::memory {
namespace {

constexpr size_t kChunk = HostArena::kChunkBytes;

TEST(HostArena, AllocatesAlignedRunsAndReusesFreedOnes) {
  HostArena arena(8 * kChunk);
  EXPECT_EQ(arena.bytes(), 8 * kChunk);
  void* a = arena.Allocate(1);               // 1 chunk
  void* b = arena.Allocate(2 * kChunk + 1);  // 3 chunks
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b) % 64, 0u);
  EXPECT_TRUE(arena.Contains(a) && arena.Contains(b));
  EXPECT_EQ(arena.bytes_in_use(), 4 * kChunk);
  std::memset(b, 0x5a, 2 * kChunk + 1);  // the whole run is usable
  arena.Free(a);
  EXPECT_EQ(arena.bytes_in_use(), 3 * kChunk);
  void* c = arena.Allocate(kChunk);  // first fit: the chunk `a` had
  EXPECT_EQ(c, a);
  arena.Free(b);
  arena.Free(c);
  EXPECT_EQ(arena.bytes_in_use(), 0u);
}

TEST(HostArena, FullOrFragmentedReturnsNullAndChangesNothing) {
  HostArena arena(4 * kChunk);
  void* x[4];
  for (auto& p : x) ASSERT_NE(p = arena.Allocate(kChunk), nullptr);
  EXPECT_EQ(arena.Allocate(1), nullptr);  // full
  arena.Free(x[0]);
  arena.Free(x[2]);
  // Two free chunks, but not adjacent: a 2-chunk request does not fit.
  EXPECT_EQ(arena.Allocate(2 * kChunk), nullptr);
  EXPECT_EQ(arena.bytes_in_use(), 2 * kChunk);
  arena.Free(x[1]);  // now chunks 0..2 are free
  void* y = arena.Allocate(3 * kChunk);
  EXPECT_EQ(y, x[0]);
  arena.Free(y);
  arena.Free(x[3]);
  int local = 0;
  EXPECT_FALSE(arena.Contains(&local));
}

TEST(HostArena, PrefaultKeepsTheContentsOfChunksInUse) {
  HostArena arena(64 * kChunk);
  auto* p = static_cast<uint8_t*>(arena.Allocate(5 * kChunk));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < 5 * kChunk; ++i) p[i] = static_cast<uint8_t>(i * 7 + 3);
  EXPECT_EQ(arena.prefaulted_bytes(), 0u);
  arena.StartPrefault();
  arena.StartPrefault();  // idempotent
  arena.WaitPrefault();
  EXPECT_EQ(arena.prefaulted_bytes(), arena.bytes());
  for (size_t i = 0; i < 5 * kChunk; ++i) {
    ASSERT_EQ(p[i], static_cast<uint8_t>(i * 7 + 3)) << "byte " << i;
  }
  arena.Free(p);
}

TEST(HostArena, ConcurrentAllocateFreeWhilePrefaulting) {
  HostArena arena(256 * kChunk);
  arena.StartPrefault();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&arena, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t n = static_cast<size_t>((i % 5) + 1) * kChunk - 100;
        auto* p = static_cast<uint8_t*>(arena.Allocate(n));
        if (p == nullptr) continue;  // momentarily full: callers fall back
        std::memset(p, t + 1, n);
        for (size_t k = 0; k < n; k += 4093) ASSERT_EQ(p[k], t + 1);
        arena.Free(p);
      }
    });
  }
  for (auto& th : threads) th.join();
  arena.WaitPrefault();
  EXPECT_EQ(arena.bytes_in_use(), 0u);
}

}  // namespace
}  // namespace chorus::memory

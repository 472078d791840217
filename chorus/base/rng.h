// Rng: a small, fast, seedable generator (xoshiro256**, seeded by splitmix64). Used by the
// sampler (one per request, so the same seed gives the same tokens) and by synthetic weights.
//
// Thread-safety: none; one Rng per user.
#pragma once

#include <cstdint>

namespace chorus {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0x9E3779B97F4A7C15ull) { Seed(seed); }
  void Seed(uint64_t seed) {
    for (auto& s : s_) {
      seed += 0x9E3779B97F4A7C15ull;
      uint64_t z = seed;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      s = z ^ (z >> 31);
    }
  }
  uint64_t NextU64() {
    uint64_t result = Rotl(s_[1] * 5, 7) * 9;
    uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = Rotl(s_[3], 45);
    return result;
  }
  // Uniform in [0, 1) with 24 bits of precision.
  float NextFloat() { return static_cast<float>(NextU64() >> 40) * (1.0f / 16777216.0f); }
  // Uniform in [0, 1) with 53 bits of precision.
  double NextDouble() { return static_cast<double>(NextU64() >> 11) * (1.0 / 9007199254740992.0); }
  // Standard normal (Box–Muller).
  float NextGaussian();

 private:
  static uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t s_[4];
};

}  // namespace chorus

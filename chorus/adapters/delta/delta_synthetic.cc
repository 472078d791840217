#include "chorus/adapters/delta/delta_synthetic.h"

#include <algorithm>

#include "chorus/base/check.h"

namespace chorus::delta {

Delta MakeRandomDelta(const model::ModelConfig& c, const RandomDeltaSpec& spec) {
  Delta d;
  d.method = spec.bits == 1 ? Method::kBitDelta : Method::kRtn;
  d.bits = spec.bits;
  d.sparse24 = spec.sparse24;
  d.group_size = spec.group_size;
  uint64_t s = spec.seed * 0x9E3779B97F4A7C15ull + 1;
  auto next = [&s] {  // xorshift64: fast enough for gigabytes of codes
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  };
  for (int64_t l = 0; l < c.n_layers; ++l) {
    for (int li = 0; li < model::kNumLinears; ++li) {
      const auto which = static_cast<model::Linear>(li);
      MatrixDelta m;
      m.name = model::HfLayerTensorName(l, which);
      MatrixLayout& lay = m.packed.layout;
      lay.rows = model::LinearOut(c, which);
      lay.cols = model::LinearIn(c, which);
      lay.bits = spec.bits;
      lay.sparse24 = spec.sparse24;
      lay.group_size = spec.group_size;
      CHORUS_CHECK(ValidateLayout(lay, m.name).ok()) << "random delta layout for " << m.name;
      m.packed.codes.resize(static_cast<size_t>(lay.rows * lay.code_row_bytes()));
      for (uint8_t& b : m.packed.codes) b = static_cast<uint8_t>(next());
      // Padding bits past the last code of a row stay zero, as the file format requires.
      const int64_t used_bits = lay.kept_per_row() * lay.bits;
      if (used_bits % 8 != 0)
        for (int64_t r = 0; r < lay.rows; ++r)
          m.packed.codes[static_cast<size_t>((r + 1) * lay.code_row_bytes() - 1)] &=
              static_cast<uint8_t>((1u << (used_bits % 8)) - 1);
      if (lay.sparse24) {
        m.packed.mask.resize(static_cast<size_t>(lay.rows * lay.mask_row_bytes()));
        const int64_t groups = lay.cols / 4;
        for (int64_t r = 0; r < lay.rows; ++r) {
          uint8_t* row = m.packed.mask.data() + r * lay.mask_row_bytes();
          for (int64_t b = 0; b < lay.mask_row_bytes(); ++b) {
            // A last byte with fewer than three groups holds zeros for the missing ones.
            const int64_t in_byte = std::min<int64_t>(3, groups - 3 * b);
            int v = 0;
            for (int64_t g = in_byte - 1; g >= 0; --g) v = v * 6 + static_cast<int>(next() % 6);
            row[b] = static_cast<uint8_t>(v);
          }
        }
      }
      m.packed.scales.assign(static_cast<size_t>(lay.n_scales()), spec.scale);
      d.matrices.push_back(std::move(m));
    }
  }
  return d;
}

}  // namespace chorus::delta

#include "chorus/adapters/delta/delta_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "chorus/tensor/dtype.h"

namespace chorus::delta {

int Pattern24(int a, int b) {
  for (int p = 0; p < 6; ++p) {
    if (kPairs24[static_cast<size_t>(p)].first == a && kPairs24[static_cast<size_t>(p)].second == b)
      return p;
  }
  return -1;
}

Status ValidateLayout(const MatrixLayout& l, const std::string& what) {
  if (l.bits != 1 && l.bits != 2 && l.bits != 3 && l.bits != 4 && l.bits != 8) {
    return InvalidArgumentError(what + ": bits " + std::to_string(l.bits) +
                                " is not one of 1, 2, 3, 4, 8");
  }
  constexpr int64_t kMaxDim = int64_t{1} << 24;
  if (l.rows < 1 || l.cols < 1 || l.rows > kMaxDim || l.cols > kMaxDim) {
    return InvalidArgumentError(what + ": shape [" + std::to_string(l.rows) + ", " +
                                std::to_string(l.cols) + "] is out of range");
  }
  if (l.sparse24 && l.cols % 4 != 0) {
    return InvalidArgumentError(what + ": 2:4 sparsity needs a multiple of 4 columns, it has " +
                                std::to_string(l.cols));
  }
  if (l.group_size < 0 || l.group_size > l.cols) {
    return InvalidArgumentError(what + ": group size " + std::to_string(l.group_size) +
                                " does not fit " + std::to_string(l.cols) + " columns");
  }
  return OkStatus();
}

int64_t UnpackedMatrix::KeptColumn(int64_t row, int64_t j) const {
  if (!layout.sparse24) return j;
  const int64_t g = j / 2;
  const int p = patterns[static_cast<size_t>(row * (layout.cols / 4) + g)];
  const auto& pair = kPairs24[static_cast<size_t>(p)];
  return g * 4 + ((j & 1) ? pair.second : pair.first);
}

std::vector<float> UnpackedMatrix::Decode() const {
  const MatrixLayout& l = layout;
  std::vector<float> out(static_cast<size_t>(l.rows * l.cols), 0.0f);
  const int64_t kept = l.kept_per_row();
  for (int64_t r = 0; r < l.rows; ++r) {
    for (int64_t j = 0; j < kept; ++j) {
      const int64_t c = KeptColumn(r, j);
      out[static_cast<size_t>(r * l.cols + c)] =
          Dequantize(codes[static_cast<size_t>(r * kept + j)], Scale(r, c), l);
    }
  }
  return out;
}

PackedMatrix Pack(const UnpackedMatrix& m) {
  const MatrixLayout& l = m.layout;
  PackedMatrix p;
  p.layout = l;
  p.scales = m.scales;
  const int64_t crb = l.code_row_bytes(), kept = l.kept_per_row();
  p.codes.assign(static_cast<size_t>(l.rows * crb), 0);
  for (int64_t r = 0; r < l.rows; ++r) {
    uint8_t* row = p.codes.data() + r * crb;
    for (int64_t j = 0; j < kept; ++j) {
      const uint32_t code = m.codes[static_cast<size_t>(r * kept + j)];
      for (int b = 0; b < l.bits; ++b) {
        if ((code >> b) & 1u) {
          const int64_t bit = j * l.bits + b;
          row[bit / 8] = static_cast<uint8_t>(row[bit / 8] | (1u << (bit % 8)));
        }
      }
    }
  }
  if (l.sparse24) {
    const int64_t mrb = l.mask_row_bytes(), n4 = l.cols / 4;
    p.mask.assign(static_cast<size_t>(l.rows * mrb), 0);
    for (int64_t r = 0; r < l.rows; ++r) {
      for (int64_t g = 0; g < n4; g += 3) {
        int v = 0, mul = 1;
        for (int64_t k = g; k < g + 3 && k < n4; ++k, mul *= 6)
          v += mul * m.patterns[static_cast<size_t>(r * n4 + k)];
        p.mask[static_cast<size_t>(r * mrb + g / 3)] = static_cast<uint8_t>(v);
      }
    }
  }
  return p;
}

Status CheckPacked(const PackedMatrix& p, const std::string& what) {
  return CheckPackedBytes(p.layout, p.codes.data(), p.codes.size(), p.mask.data(), p.mask.size(),
                          p.scales, what);
}

Status CheckPackedBytes(const MatrixLayout& l, const uint8_t* codes, size_t n_codes,
                        const uint8_t* mask, size_t n_mask, const std::vector<float>& scales,
                        const std::string& what) {
  CHORUS_RETURN_IF_ERROR(ValidateLayout(l, what));
  const int64_t crb = l.code_row_bytes();
  if (static_cast<int64_t>(n_codes) != l.rows * crb) {
    return DataLossError(what + ": codes hold " + std::to_string(n_codes) +
                         " bytes, the layout needs " + std::to_string(l.rows * crb));
  }
  if (static_cast<int64_t>(n_mask) != l.rows * l.mask_row_bytes()) {
    return DataLossError(what + ": 2:4 mask holds " + std::to_string(n_mask) +
                         " bytes, the layout needs " + std::to_string(l.rows * l.mask_row_bytes()));
  }
  if (static_cast<int64_t>(scales.size()) != l.n_scales()) {
    return DataLossError(what + ": " + std::to_string(scales.size()) +
                         " scales, the layout needs " + std::to_string(l.n_scales()));
  }
  for (size_t i = 0; i < scales.size(); ++i) {
    if (!std::isfinite(scales[i])) {
      return DataLossError(what + ": scale " + std::to_string(i) + " is not finite");
    }
  }
  // Padding: the bits of each row's last bytes past kept · bits.
  const int64_t used_bits = l.kept_per_row() * l.bits;
  if (used_bits < crb * 8) {
    const int64_t first = used_bits / 8;
    for (int64_t r = 0; r < l.rows; ++r) {
      const uint8_t* row = codes + r * crb;
      for (int64_t byte = first; byte < crb; ++byte) {
        const int64_t from = std::max<int64_t>(used_bits - byte * 8, 0);  // first padding bit
        if ((row[byte] >> from) != 0) {
          return DataLossError(what + ": row " + std::to_string(r) + " has non-zero padding bits");
        }
      }
    }
  }
  if (l.sparse24 && l.mask_row_bytes() > 0) {
    // Every byte holds 3 patterns (< 216) but a row's last, which may hold 1 or 2 (< 6, < 36).
    const int64_t mrb = l.mask_row_bytes(), n4 = l.cols / 4;
    const int n_last = static_cast<int>(n4 - 3 * (mrb - 1));
    const int last_limit = n_last == 3 ? 216 : (n_last == 2 ? 36 : 6);
    for (int64_t r = 0; r < l.rows; ++r) {
      const uint8_t* row = mask + r * mrb;
      uint8_t max_full = 0;
      for (int64_t b = 0; b + 1 < mrb; ++b) max_full = std::max(max_full, row[b]);
      if (max_full < 216 && row[mrb - 1] < last_limit) continue;
      for (int64_t b = 0; b < mrb; ++b) {  // the first bad byte, for the message
        const int limit = b == mrb - 1 ? last_limit : 216;
        if (row[b] >= limit) {
          return DataLossError(what + ": 2:4 mask byte " + std::to_string(r * mrb + b) + " is " +
                               std::to_string(row[b]) + ", above the largest pattern code " +
                               std::to_string(limit - 1));
        }
      }
    }
  }
  return OkStatus();
}

Result<UnpackedMatrix> Unpack(const PackedMatrix& p, const std::string& what) {
  CHORUS_RETURN_IF_ERROR(CheckPacked(p, what));
  const MatrixLayout& l = p.layout;
  const int64_t crb = l.code_row_bytes(), kept = l.kept_per_row();
  UnpackedMatrix m;
  m.layout = l;
  m.scales = p.scales;
  m.codes.resize(static_cast<size_t>(l.rows * kept));
  for (int64_t r = 0; r < l.rows; ++r) {
    const uint8_t* row = p.codes.data() + r * crb;
    for (int64_t j = 0; j < kept; ++j) {
      uint32_t code = 0;
      for (int b = 0; b < l.bits; ++b) {
        const int64_t bit = j * l.bits + b;
        code |= static_cast<uint32_t>((row[bit / 8] >> (bit % 8)) & 1u) << b;
      }
      m.codes[static_cast<size_t>(r * kept + j)] = static_cast<uint8_t>(code);
    }
  }
  if (l.sparse24) {
    const int64_t mrb = l.mask_row_bytes(), n4 = l.cols / 4;
    m.patterns.resize(static_cast<size_t>(l.rows * n4));
    for (int64_t r = 0; r < l.rows; ++r) {
      for (int64_t g = 0; g < n4; g += 3) {
        int v = p.mask[static_cast<size_t>(r * mrb + g / 3)];
        const int64_t n_here = std::min<int64_t>(3, n4 - g);
        for (int64_t k = g; k < g + n_here; ++k, v /= 6)
          m.patterns[static_cast<size_t>(r * n4 + k)] = static_cast<uint8_t>(v % 6);
      }
    }
  }
  return m;
}

float RoundToF16(float x) { return F16ToF32(F32ToF16(x)); }

float ScaleForMaxAbs(float max_abs, const MatrixLayout& l, bool f16) {
  float s = max_abs / l.half_range();
  if (!(s > 0) || !std::isfinite(s)) s = 6.103515625e-05f;  // smallest normal f16
  if (f16) {
    s = RoundToF16(s);
    if (!(s > 0)) s = 6.103515625e-05f;
    if (!std::isfinite(s)) s = 65504.0f;
  }
  return s;
}

}  // namespace chorus::delta

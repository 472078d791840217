#include "chorus/adapters/delta/delta_fuzz.h"

#include <algorithm>

#include "chorus/adapters/delta/delta_file.h"
#include "chorus/base/check.h"

namespace chorus::delta {

bool FuzzDeltaInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  auto d = ParseDelta("fuzz.safetensors", input);
  // Serving's in-place parse (codes and patterns left in the file) accepts and refuses exactly
  // what the copying parse does, with the same message, and sees the same bytes.
  auto mapped = ParseDeltaMapped("fuzz.safetensors", input);
  CHORUS_CHECK_EQ(mapped.ok(), d.ok()) << (d.ok() ? mapped.status() : d.status()).ToString();
  if (!d.ok()) {
    CHORUS_CHECK(!d.status().message().empty());
    CHORUS_CHECK_EQ(mapped.status().ToString(), d.status().ToString());
    return false;
  }
  CHORUS_CHECK_EQ(mapped->delta.matrices.size(), d->matrices.size());
  CHORUS_CHECK_EQ(mapped->in_file.size(), d->matrices.size());
  for (size_t i = 0; i < d->matrices.size(); ++i) {
    const PackedMatrix& a = d->matrices[i].packed;
    const PackedMatrix& b = mapped->delta.matrices[i].packed;
    const MappedDelta::Bytes& f = mapped->in_file[i];
    const auto codes = HeldBytes(f.codes, b.codes), mask = HeldBytes(f.mask, b.mask);
    CHORUS_CHECK(std::ranges::equal(codes, a.codes) && std::ranges::equal(mask, a.mask) &&
                 a.scales == b.scales)
        << "matrix " << d->matrices[i].name << " differs in place";
  }
  double acc = 0;
  for (const MatrixDelta& m : d->matrices) {
    auto u = Unpack(m.packed, m.name);
    CHORUS_CHECK(u.ok()) << u.status().ToString();
    for (float v : u->Decode()) acc += v;
  }
  for (const ExtraDelta& e : d->extras) {
    for (float v : e.Decode()) acc += v;
  }
  (void)acc;
  auto bytes = SerializeDelta(*d, 1);
  CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
  auto back = ParseDelta("fuzz-rt.safetensors", *std::move(bytes));
  CHORUS_CHECK(back.ok()) << back.status().ToString();
  CHORUS_CHECK(back->base_hash == d->base_hash && back->bits == d->bits &&
               back->group_size == d->group_size && back->sparse24 == d->sparse24);
  CHORUS_CHECK_EQ(back->matrices.size(), d->matrices.size());
  for (size_t i = 0; i < d->matrices.size(); ++i) {
    const PackedMatrix& a = d->matrices[i].packed;
    const PackedMatrix& b = back->matrices[i].packed;
    CHORUS_CHECK(a.codes == b.codes && a.mask == b.mask && a.scales == b.scales)
        << "matrix " << d->matrices[i].name << " changed";
  }
  CHORUS_CHECK_EQ(back->extras.size(), d->extras.size());
  for (size_t i = 0; i < d->extras.size(); ++i) {
    CHORUS_CHECK(back->extras[i].Decode() == d->extras[i].Decode()) << "extra changed";
  }
  return true;
}

std::vector<std::string> DeltaFuzzSeeds() {
  std::vector<std::string> seeds;
  struct Case {
    int bits;
    bool sparse;
    int64_t group;
    int64_t rows, cols;
  };
  uint32_t state = 1;
  auto next = [&] { return state = state * 1664525u + 1013904223u; };
  for (Case c : {Case{2, true, 8, 3, 24}, Case{4, false, 4, 2, 12}, Case{1, false, 0, 4, 16},
                 Case{3, true, 12, 2, 12}, Case{8, true, 0, 1, 8}, Case{2, true, 8, 64, 64}}) {
    Delta d;
    d.method = c.bits == 1 ? Method::kBitDelta : Method::kDeltaZip;
    d.bits = c.bits;
    d.sparse24 = c.sparse;
    d.group_size = c.group;
    d.base_hash = "fnv1a64:0123456789abcdef";
    for (int k = 0; k < 2; ++k) {
      UnpackedMatrix m;
      m.layout = {.rows = c.rows,
                  .cols = c.cols,
                  .bits = c.bits,
                  .sparse24 = c.sparse,
                  .group_size = c.group};
      m.codes.resize(static_cast<size_t>(c.rows * m.layout.kept_per_row()));
      // The large case has constant codes so its codes are stored zstd-compressed.
      for (auto& x : m.codes) x = static_cast<uint8_t>(c.rows == 64 ? 1 : next() % (1u << c.bits));
      if (c.sparse) {
        m.patterns.resize(static_cast<size_t>(c.rows * c.cols / 4));
        for (auto& x : m.patterns) x = static_cast<uint8_t>(next() % 6);
      }
      m.scales.assign(static_cast<size_t>(m.layout.n_scales()),
                      c.group == 0 ? 0.01f : RoundToF16(0.02f));
      d.matrices.push_back(
          {"model.layers.0.mlp.m" + std::to_string(k) + ".weight", Pack(m), false});
    }
    ExtraDelta e;
    e.name = "model.norm.weight";
    e.shape = {4};
    e.values = {0.5f, -0.25f, 0, 1};
    d.extras.push_back(e);
    ExtraDelta q;
    q.name = "model.embed_tokens.weight";
    q.kind = ExtraDelta::Kind::kInt8Rows;
    q.shape = {2, 3};
    q.q = {1, -2, 3, -127, 0, 127};
    q.row_scales = {0.01f, 0.5f};
    d.extras.push_back(q);
    auto bytes = SerializeDelta(d, 1);
    CHORUS_CHECK(bytes.ok()) << bytes.status().ToString();
    seeds.push_back(*std::move(bytes));
  }
  return seeds;
}

}  // namespace chorus::delta

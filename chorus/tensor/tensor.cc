#include "chorus/tensor/tensor.h"

#include <cstdlib>
#include <cstring>

namespace chorus {

std::string TensorView::ShapeString() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Tensor Tensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  TensorView v;
  v.dtype = dtype;
  v.shape = std::move(shape);
  size_t bytes = static_cast<size_t>(v.NumBytes());
  size_t alloc = (bytes + 63) / 64 * 64;
  if (alloc == 0) alloc = 64;
  void* p = std::aligned_alloc(64, alloc);
  CHORUS_CHECK(p != nullptr) << "out of memory allocating " << alloc << " bytes";
  std::memset(p, 0, alloc);
  v.data = p;
  return Tensor(std::move(v), std::shared_ptr<const void>(
                                  p, [](const void* q) { std::free(const_cast<void*>(q)); }));
}

Tensor Tensor::FromF32(const std::vector<float>& values, DType dtype, std::vector<int64_t> shape) {
  Tensor t = Zeros(dtype, std::move(shape));
  CHORUS_CHECK_EQ(static_cast<int64_t>(values.size()), t.view().NumElements());
  const int64_t cols = t.view().cols();
  for (int64_t r = 0; r < t.view().rows(); ++r) {
    QuantizeRow(dtype, values.data() + r * cols,
                static_cast<uint8_t*>(t.mutable_data()) + r * t.view().RowBytes(), cols);
  }
  return t;
}

Tensor Tensor::Slice(int64_t index) const {
  CHORUS_CHECK(view_.shape.size() >= 2 && index >= 0 && index < view_.shape[0]);
  TensorView v;
  v.dtype = view_.dtype;
  v.shape.assign(view_.shape.begin() + 1, view_.shape.end());
  v.data = static_cast<const uint8_t*>(view_.data) + index * v.NumBytes();
  return Tensor(std::move(v), keepalive_);
}

Tensor Tensor::Rows(int64_t begin, int64_t end) const {
  CHORUS_CHECK(view_.shape.size() == 2 && 0 <= begin && begin < end && end <= view_.shape[0]);
  TensorView v;
  v.dtype = view_.dtype;
  v.shape = {end - begin, view_.shape[1]};
  v.data = static_cast<const uint8_t*>(view_.data) + begin * view_.RowBytes();
  return Tensor(std::move(v), keepalive_);
}

Tensor Tensor::Reshaped(std::vector<int64_t> shape) const {
  TensorView v = view_;
  v.shape = std::move(shape);
  CHORUS_CHECK_EQ(v.NumElements(), view_.NumElements());
  return Tensor(std::move(v), keepalive_);
}

std::vector<float> Tensor::ToF32() const {
  std::vector<float> out(static_cast<size_t>(view_.NumElements()));
  if (out.empty()) return out;  // (out.data() may be null; never hand it to memcpy)
  const int64_t cols = view_.cols();
  for (int64_t r = 0; r < view_.rows(); ++r) {
    DequantizeRow(view_.dtype, view_.Row(r), out.data() + r * cols, cols);
  }
  return out;
}

}  // namespace chorus

// TensorView: a non-owning, typed view of a dense row-major tensor. `shape` is outermost
// first (PyTorch/safetensors order): a weight matrix is [out_features, in_features] and each
// of its rows is contiguous. For quantized dtypes the last dimension is a multiple of 32.
//
// Tensor: a TensorView plus shared ownership of the bytes behind it (an mmap or a heap buffer),
// so weights can point into a mapped file and stay valid as long as anyone holds them.
//
// Thread-safety: immutable after construction; safe to share.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "chorus/tensor/dtype.h"

namespace chorus {

struct TensorView {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // outermost first
  const void* data = nullptr;  // not owned

  int64_t n_dims() const { return static_cast<int64_t>(shape.size()); }
  int64_t NumElements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t NumBytes() const { return DTypeBytes(dtype, NumElements()); }
  // Rows/cols of a 2-D view (a 1-D view is one row).
  // A view with no elements has no rows (avoids dividing by a zero last dimension).
  int64_t rows() const {
    if (shape.size() < 2) return 1;
    return shape.back() == 0 ? 0 : NumElements() / shape.back();
  }
  int64_t cols() const { return shape.empty() ? 1 : shape.back(); }
  int64_t RowBytes() const { return DTypeBytes(dtype, cols()); }
  const uint8_t* Row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * RowBytes(); }
  std::string ShapeString() const;  // "[64, 512]"
};

class Tensor {
 public:
  Tensor() = default;
  Tensor(TensorView view, std::shared_ptr<const void> keepalive)
      : view_(std::move(view)), keepalive_(std::move(keepalive)) {}

  // A new zero-filled heap tensor (64-byte aligned).
  static Tensor Zeros(DType dtype, std::vector<int64_t> shape);
  // A new heap tensor holding `values` converted to `dtype`; `shape` must match values.size().
  static Tensor FromF32(const std::vector<float>& values, DType dtype, std::vector<int64_t> shape);

  const TensorView& view() const { return view_; }
  DType dtype() const { return view_.dtype; }
  const std::vector<int64_t>& shape() const { return view_.shape; }
  const void* data() const { return view_.data; }
  // Writable access; only for tensors this process created (Zeros/FromF32).
  void* mutable_data() const { return const_cast<void*>(view_.data); }
  bool empty() const { return view_.data == nullptr; }
  // Sub-tensor `index` of the outermost dimension (shares ownership), e.g. layer l of a
  // stacked [L, n, k] tensor. Requires: n_dims() >= 2, 0 <= index < shape[0].
  Tensor Slice(int64_t index) const;
  // Rows [begin, end) of a 2-D tensor as a view (shares ownership), e.g. q of a fused qkv
  // projection. Requires: n_dims() == 2, 0 <= begin < end <= shape[0].
  Tensor Rows(int64_t begin, int64_t end) const;
  // Same bytes, new shape with the same element count.
  Tensor Reshaped(std::vector<int64_t> shape) const;
  // Decodes the whole tensor to f32 (for tests, converters and oracles — not the hot path).
  std::vector<float> ToF32() const;

 private:
  TensorView view_;
  std::shared_ptr<const void> keepalive_;
};

}  // namespace chorus

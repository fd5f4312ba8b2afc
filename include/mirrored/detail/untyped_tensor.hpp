#pragma once
/// \file
/// Type-erased tensors: how collectives and nests handle tensors of any element type.
/// Needed by every template that crosses the compiled boundary: nests, `CollectiveStep`,
/// `CrossDeviceOps`, `PendingCollective<V>`, checkpoints, DLPack and dataset elements.

#include <memory>
#include <vector>

#include "mirrored/tensor.hpp"

namespace mirrored::detail {

/// A tensor with its element type as a runtime tag. Shares storage with the typed tensor.
struct UntypedTensor {
  DType dtype = DType::float32;
  Shape shape;
  int64_t numel = 0;
  std::shared_ptr<Storage> storage;

  UntypedTensor() noexcept;
  UntypedTensor(DType dtype, Shape shape, int64_t numel, std::shared_ptr<Storage> storage) noexcept;
  // Compiled, as Tensor<T>'s are: nests and collectives copy and destroy these everywhere.
  UntypedTensor(const UntypedTensor& other);
  UntypedTensor(UntypedTensor&& other) noexcept;
  UntypedTensor& operator=(const UntypedTensor& other);
  UntypedTensor& operator=(UntypedTensor&& other) noexcept;
  ~UntypedTensor();

  void* data() const noexcept { return storage ? storage->data() : nullptr; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel) * dtype_size(dtype); }
  const Device& device() const noexcept { return storage ? storage->device() : cpu0; }
};

/// Converts between typed and untyped tensors (sharing storage).
struct TensorAccess {
  template <class T>
  static UntypedTensor erase(const Tensor<T>& t) {
    return t.erased();
  }
  /// True when `t` is the only handle on its storage (so it may be updated in place).
  template <class T>
  static bool unique(const Tensor<T>& t) noexcept {
    return t.storage_ && t.storage_.use_count() == 1;
  }
  template <class T>
  static Tensor<T> restore(const UntypedTensor& u) {
    return Tensor<T>(u);
  }
};

/// A new tensor of `dtype` and `shape` on `device`, contents unspecified.
UntypedTensor make_untyped(DType dtype, const Shape& shape, const Device& device);
/// `t` converted to `dtype` (shares storage when already of that type).
UntypedTensor cast_untyped(const UntypedTensor& t, DType dtype);

}  // namespace mirrored::detail

#pragma once
/// \file
/// `Tensor<T>`: a typed, shaped buffer on one device.

#include <cstdint>
#include <initializer_list>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "mirrored/detail/binary_op.hpp"
#include "mirrored/device.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/shape.hpp"

struct DLManagedTensor;  // DLPack's (<dlpack/dlpack.h>); Tensor::from_dlpack is in <mirrored/dlpack.hpp>

namespace mirrored {

namespace detail {

struct TensorAccess;
struct UntypedTensor;  // detail/untyped_tensor.hpp
class DeviceBackend;   // detail/device_backend.hpp

/// Device memory owned by one or more tensors (tensors share storage, like torch tensors).
class Storage {
 public:
  /// Called once with its context when foreign memory is released (see the foreign constructor).
  using Release = void (*)(void* context) noexcept;

  /// `bytes` bytes allocated on `device` by its backend (and returned to it when destroyed).
  Storage(const Device& device, std::size_t bytes);
  /// Wraps `bytes` bytes at `ptr` on `device` that the library does not own (e.g. a DLPack
  /// producer's): on destruction, after this thread's work queued on the device has finished,
  /// `release(context)` is called exactly once (when `release` is not null), on the destroying
  /// thread. \throws NotFoundError when `device` is a GPU this process does not have (`release`
  /// is then not called).
  Storage(const Device& device, void* ptr, std::size_t bytes, Release release, void* context);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  const Device& device() const noexcept { return device_; }
  DeviceBackend& backend() const noexcept { return *backend_; }
  void* data() const noexcept { return ptr_; }
  std::size_t bytes() const noexcept { return bytes_; }
  /// True when the memory is not the library's (see the foreign constructor): others may read it.
  bool foreign() const noexcept { return foreign_; }

 private:
  Device device_;
  DeviceBackend* backend_;
  void* ptr_ = nullptr;
  std::size_t bytes_;
  bool foreign_ = false;  // ptr_ came from the constructor's caller, not from backend_
  Release release_ = nullptr;
  void* release_context_ = nullptr;
};

/// Throws InvalidArgumentError naming `op` unless both devices are the same.
void check_same_device(const char* op, const Device& a, const Device& b);
/// Throws InvalidArgumentError naming `op` and both shapes.
[[noreturn]] void throw_incompatible_shapes(const char* op, const Shape& a, const Shape& b);

}  // namespace detail

/// A dense, row-major tensor of `T` on one device. Copies are cheap handles that share storage
/// (like `torch.Tensor`); use `clone()` for an independent copy. Operators return new tensors on
/// the same device. Every factory and `reshape` check the shape: a negative dimension, or one whose
/// element count or size in bytes overflows int64 (`Tensor<float>::zeros({1 << 32, 1 << 32})`),
/// throws InvalidArgumentError naming the shape.
template <class T>
class Tensor {
  static_assert(is_tensor_element_v<T>,
                "Tensor<T> supports float, double, int32_t, int64_t, uint8_t, float16, bfloat16");

 public:
  using value_type = T;

  /// An empty rank-1 tensor (shape `(0,)`) on CPU:0.
  Tensor();
  // Copies share the storage. Compiled, like the members below: a tensor is copied and destroyed
  // in every expression, and these calls are smaller than the shape's and the storage handle's
  // inline code.
  Tensor(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(const Tensor& other);
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor();
  /// A rank-1 tensor of `values` on `default_device()` (the replica's device inside `run`, else
  /// CPU:0).
  Tensor(std::initializer_list<T> values)
      : Tensor(from_vector(std::vector<T>(values), {static_cast<int64_t>(values.size())})) {}

  // Every factory's device defaults to `default_device()`: the replica's inside `run`, else CPU:0.

  /// A rank-0 tensor holding `value`.
  static Tensor scalar(T value, const Device& d = default_device()) { return full({}, value, d); }
  /// A tensor of `shape` holding `values` (row-major). \throws InvalidArgumentError when the
  /// number of values differs from the shape's element count.
  static Tensor from_vector(std::vector<T> values, Shape shape, const Device& d = default_device());
  /// A tensor of `shape` filled with zeros.
  static Tensor zeros(Shape shape, const Device& d = default_device()) { return full(std::move(shape), T{0}, d); }
  /// A tensor of `shape` filled with `value`.
  static Tensor full(Shape shape, T value, const Device& d = default_device());
  /// A tensor of `shape` whose contents are unspecified (to be overwritten).
  static Tensor empty(Shape shape, const Device& d = default_device()) { return Tensor(std::move(shape), d); }
  /// A tensor sharing the memory of a DLPack tensor, without a copy: defined in
  /// `<mirrored/dlpack.hpp>` (include it to call this), which documents it.
  static Tensor from_dlpack(DLManagedTensor* managed, std::optional<Device> device = std::nullopt);

  const Shape& shape() const noexcept { return shape_; }
  int64_t rank() const noexcept { return static_cast<int64_t>(shape_.size()); }
  int64_t numel() const noexcept { return numel_; }
  const Device& device() const noexcept { return storage_ ? storage_->device() : cpu0; }
  static constexpr DType dtype() noexcept { return dtype_of<T>(); }

  /// Host copy of the elements, row-major.
  std::vector<T> to_vector() const;
  /// The single element. \throws InvalidArgumentError unless `numel() == 1`.
  T item() const;
  /// A copy on device `d` (a new storage even when `d` is this tensor's device).
  Tensor to(const Device& d) const;
  /// An independent copy on the same device.
  Tensor clone() const { return to(device()); }
  /// Same storage viewed with another shape. \throws InvalidArgumentError when the element counts
  /// differ.
  Tensor reshape(Shape shape) const;

  /// Element pointer in the memory of `device()` (host memory for CPU devices).
  T* data() noexcept { return storage_ ? static_cast<T*>(storage_->data()) : nullptr; }
  const T* data() const noexcept { return storage_ ? static_cast<const T*>(storage_->data()) : nullptr; }
  std::size_t bytes() const noexcept { return static_cast<std::size_t>(numel_) * sizeof(T); }

  /// Element-wise arithmetic on tensors of equal shape (a rank-0 operand broadcasts).
  /// \throws InvalidArgumentError on a shape or device mismatch, naming the op and both sides.
  friend Tensor operator+(const Tensor& a, const Tensor& b) { return binary(detail::BinaryOp::add, "add", a, b); }
  friend Tensor operator-(const Tensor& a, const Tensor& b) { return binary(detail::BinaryOp::sub, "sub", a, b); }
  friend Tensor operator*(const Tensor& a, const Tensor& b) { return binary(detail::BinaryOp::mul, "mul", a, b); }
  friend Tensor operator/(const Tensor& a, const Tensor& b) { return binary(detail::BinaryOp::div, "div", a, b); }

  /// Element-wise arithmetic with a number (converted to `T`).
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator+(const Tensor& a, U s) {
    return a + scalar(static_cast<T>(s), a.device());
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator-(const Tensor& a, U s) {
    return a - scalar(static_cast<T>(s), a.device());
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator*(const Tensor& a, U s) {
    return a * scalar(static_cast<T>(s), a.device());
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator/(const Tensor& a, U s) {
    return a / scalar(static_cast<T>(s), a.device());
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator+(U s, const Tensor& a) {
    return scalar(static_cast<T>(s), a.device()) + a;
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator-(U s, const Tensor& a) {
    return scalar(static_cast<T>(s), a.device()) - a;
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator*(U s, const Tensor& a) {
    return scalar(static_cast<T>(s), a.device()) * a;
  }
  template <class U, std::enable_if_t<std::is_arithmetic_v<U>, int> = 0>
  friend Tensor operator/(U s, const Tensor& a) {
    return scalar(static_cast<T>(s), a.device()) / a;
  }

  /// `<Tensor: shape=(2,), dtype=float32, value=[1.0, 2.0]>`
  friend std::ostream& operator<<(std::ostream& os, const Tensor& t) { return t.print(os); }

 private:
  friend struct detail::TensorAccess;

  // A tensor of `shape` on `d`, contents unspecified.
  Tensor(Shape shape, const Device& d);
  // detail::TensorAccess: a handle on `u`'s storage (whose dtype is T's), and the reverse.
  explicit Tensor(const detail::UntypedTensor& u);
  detail::UntypedTensor erased() const;
  static Tensor binary(detail::BinaryOp op, const char* name, const Tensor& a, const Tensor& b);
  std::ostream& print(std::ostream& os) const;

  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<detail::Storage> storage_;
};

// Tensor<T>'s members not defined above are compiled once per element type (src/device/tensor.cpp),
// not in every translation unit that uses them.

/// A tensor of element type `To` holding `t`'s values converted as by `static_cast` (`t` itself
/// when `To` is `From`).
template <class To, class From>
Tensor<To> cast(const Tensor<From>& t);

/// True for `Tensor<T>` types.
template <class X>
inline constexpr bool is_tensor_v = false;
template <class T>
inline constexpr bool is_tensor_v<Tensor<T>> = true;

}  // namespace mirrored

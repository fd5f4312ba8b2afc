#pragma once
/// \file
/// Element types a `Tensor<T>` may hold, and their TF names.

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace mirrored {

/// Runtime tag of a tensor's element type.
enum class DType { float32, float64, int32, int64, uint8 };

/// TF's name of a dtype: `float32 float64 int32 int64 uint8`.
const char* dtype_name(DType dtype) noexcept;
/// Size in bytes of one element.
std::size_t dtype_size(DType dtype) noexcept;
/// True for float32 and float64.
constexpr bool dtype_is_floating(DType d) noexcept { return d == DType::float32 || d == DType::float64; }

/// True for the element types `Tensor<T>` supports.
template <class T>
inline constexpr bool is_tensor_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
    std::is_same_v<T, uint8_t>;

/// The `DType` tag of element type `T`.
template <class T>
constexpr DType dtype_of() noexcept {
  static_assert(is_tensor_element_v<T>, "Tensor<T> supports float, double, int32_t, int64_t, uint8_t");
  if constexpr (std::is_same_v<T, float>)
    return DType::float32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::float64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::int64;
  else
    return DType::uint8;
}

/// Calls `f(T{})` with the element type matching `dtype` (a typed dispatch for kernels).
template <class F>
decltype(auto) visit_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::float64: return f(double{});
    case DType::int32: return f(int32_t{});
    case DType::int64: return f(int64_t{});
    case DType::uint8: break;
  }
  return f(uint8_t{});
}

}  // namespace mirrored

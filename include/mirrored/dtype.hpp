#pragma once
/// \file
/// Element types a `Tensor<T>` may hold, and their TF names.
///
/// `float16` and `bfloat16` (half.hpp) are storage types: every kernel converts them to float,
/// computes, and rounds once per element; sums (element-wise `sum_n`, all-reduce, `sum_axis`)
/// accumulate in float in input (replica) order and round once at the end, so that sums of
/// small integers are exact and equal on the host, the simulated GPUs and the CUDA kernels. MEAN
/// divides the float sum before that rounding (host reductions; the CUDA fused all-reduce and sum_n).
/// Paths that round more than once: across workers, each worker's local sum is rounded, the
/// workers' sums are added in float (Gloo exchanges them as float) and rounded again, and MEAN
/// divides after; NCCL reduces float16/bfloat16 in their own precision along its ring; a CUDA
/// `sum_n` of more than 32 inputs rounds its partial sum every 32 inputs. Integer-only operations do not exist
/// here; Eigen views (`eigen.hpp`) and the optimizers refuse the half types at compile time.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "mirrored/half.hpp"

namespace mirrored {

/// Runtime tag of a tensor's element type.
enum class DType { float32, float64, int32, int64, uint8, float16, bfloat16 };

/// TF's name of a dtype: `float32 float64 int32 int64 uint8 float16 bfloat16`.
const char* dtype_name(DType dtype) noexcept;
/// Size in bytes of one element.
std::size_t dtype_size(DType dtype) noexcept;
/// True for float32, float64, float16 and bfloat16.
constexpr bool dtype_is_floating(DType d) noexcept {
  return d == DType::float32 || d == DType::float64 || d == DType::float16 || d == DType::bfloat16;
}
/// True for the 2-byte floating dtypes, whose kernels compute in float.
constexpr bool dtype_is_half(DType d) noexcept { return d == DType::float16 || d == DType::bfloat16; }

/// True for `float16` and `bfloat16`.
template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

/// True for the floating element types: float, double, float16, bfloat16 (`std::is_floating_point_v`
/// is false for the two half types).
template <class T>
inline constexpr bool is_floating_element_v = std::is_floating_point_v<T> || is_half_v<T>;

/// True for the element types `Tensor<T>` supports.
template <class T>
inline constexpr bool is_tensor_element_v =
    std::is_same_v<T, float> || std::is_same_v<T, double> || std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t> ||
    std::is_same_v<T, uint8_t> || is_half_v<T>;

/// The type kernels compute `T` in: float for the half types, `T` itself otherwise.
template <class T>
using compute_type_t = std::conditional_t<is_half_v<T>, float, T>;

/// The `DType` tag of element type `T`.
template <class T>
constexpr DType dtype_of() noexcept {
  static_assert(is_tensor_element_v<T>,
                "Tensor<T> supports float, double, int32_t, int64_t, uint8_t, float16, bfloat16");
  if constexpr (std::is_same_v<T, float>)
    return DType::float32;
  else if constexpr (std::is_same_v<T, double>)
    return DType::float64;
  else if constexpr (std::is_same_v<T, int32_t>)
    return DType::int32;
  else if constexpr (std::is_same_v<T, int64_t>)
    return DType::int64;
  else if constexpr (std::is_same_v<T, float16>)
    return DType::float16;
  else if constexpr (std::is_same_v<T, bfloat16>)
    return DType::bfloat16;
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
    case DType::float16: return f(float16{});
    case DType::bfloat16: return f(bfloat16{});
    case DType::uint8: break;
  }
  return f(uint8_t{});
}

}  // namespace mirrored

#pragma once
/// \file
/// Number and shape formatting shared by the printed forms (Python/numpy style).
/// Needed by the printed forms of `Tensor<T>` (<mirrored/tensor.hpp>, <mirrored/repr.hpp>) and of
/// the input pipeline's specs.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "mirrored/dtype.hpp"
#include "mirrored/shape.hpp"

namespace mirrored::detail {

/// Python's `repr` of a float: shortest round-trip digits, `1.0`, `0.5`, `1e-05`, `nan`, `inf`.
std::string format_float(double value, bool single_precision);
/// The same for a float16 (`bfloat16` false) or bfloat16 value: the shortest digits that read back
/// as the same 16-bit value, laid out as numpy prints `np.float16` scalars (scientific from 1e3 up:
/// `65504` prints `6.55e+04`, `0.1` prints `0.1`); bfloat16 (which numpy lacks) is laid out as
/// float32 (scientific from 1e16 up).
std::string format_half(float value, bool bfloat16);

/// One element as numpy prints it inside an array (floats like Python floats, ints plainly).
template <class T>
std::string format_element(T v) {
  if constexpr (std::is_same_v<T, float>)
    return format_float(v, true);
  else if constexpr (is_half_v<T>)
    return format_half(static_cast<float>(v), std::is_same_v<T, bfloat16>);
  else if constexpr (std::is_floating_point_v<T>)
    return format_float(v, false);
  else if constexpr (std::is_same_v<T, bool>)
    return v ? "True" : "False";
  else if constexpr (std::is_signed_v<T>)
    return std::to_string(static_cast<long long>(v));
  else
    return std::to_string(static_cast<unsigned long long>(v));
}

/// `()`, `(2,)`, `(4, 1)`.
std::string format_shape(const Shape& shape);

/// Arrays of more than this many elements print summarised, like numpy's (`threshold`).
inline constexpr int64_t kPrintThreshold = 1000;
/// A summarised dimension longer than twice this prints its first and last this many items.
inline constexpr int64_t kPrintEdgeItems = 3;

/// Appends the nested-list rendering of the row-major `values` of `shape` from dimension `dim`;
/// with `summarize`, long dimensions show their edge items around `...`.
template <class T>
void append_values(std::string& out, const T* values, const Shape& shape, std::size_t dim, bool summarize) {
  if (dim == shape.size()) {
    out += format_element(*values);
    return;
  }
  int64_t stride = 1;
  for (std::size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
  const int64_t n = shape[dim];
  const bool cut = summarize && n > 2 * kPrintEdgeItems;
  out += '[';
  for (int64_t i = 0; i < n; ++i) {
    if (cut && i == kPrintEdgeItems) {
      out += ", ...";
      i = n - kPrintEdgeItems - 1;
      continue;
    }
    if (i) out += ", ";
    append_values(out, values + i * stride, shape, dim + 1, summarize);
  }
  out += ']';
}

/// Nested-list rendering of row-major values: `1.0`, `[1.0, 2.0]`, `[[1], [2]]`. More than
/// `kPrintThreshold` elements are summarised as numpy does: `[0, 1, 2, ..., 997, 998, 999]`.
template <class T>
std::string format_values(const T* values, const Shape& shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  std::string out;
  append_values(out, values, shape, 0, numel > kPrintThreshold);
  return out;
}

/// Number of elements of a shape (1 for rank 0), or nullopt when a dimension is negative or the
/// shape is too large: the product of its non-zero dimensions times `element_size` must fit in
/// int64 (so every sub-shape's element count, stride and byte size fits too, also when another
/// dimension is 0).
std::optional<int64_t> checked_numel(const Shape& shape, std::size_t element_size = 1) noexcept;

/// Number of elements of a shape (1 for rank 0). Every tensor shape goes through it (tensors,
/// checkpoint files, batches), so no element count or byte size ever overflows.
/// \throws InvalidArgumentError naming the shape on a negative dimension or when `checked_numel`
/// rejects the shape as too large for elements of `element_size` bytes.
int64_t shape_numel(const Shape& shape, std::size_t element_size = 1);

}  // namespace mirrored::detail

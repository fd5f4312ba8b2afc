#pragma once
/// \file
/// Number and shape formatting shared by the printed forms (Python/numpy style).

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

/// One element as numpy prints it inside an array (floats like Python floats, ints plainly).
template <class T>
std::string format_element(T v) {
  if constexpr (std::is_same_v<T, float>)
    return format_float(v, true);
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

/// Nested-list rendering of row-major values: `1.0`, `[1.0, 2.0]`, `[[1], [2]]`.
template <class T>
std::string format_values(const T* values, const Shape& shape, std::size_t dim = 0) {
  if (dim == shape.size()) return format_element(*values);
  std::string out = "[";
  int64_t stride = 1;
  for (std::size_t d = dim + 1; d < shape.size(); ++d) stride *= shape[d];
  for (int64_t i = 0; i < shape[dim]; ++i) {
    if (i) out += ", ";
    out += format_values(values + i * stride, shape, dim + 1);
  }
  return out + "]";
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

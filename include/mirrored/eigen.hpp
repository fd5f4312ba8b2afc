#pragma once
/// \file
/// Zero-copy Eigen views of host tensors, for users' own math. Include it explicitly; the core
/// headers do not depend on Eigen.

#include <Eigen/Core>

#include "mirrored/detail/format.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/tensor.hpp"

namespace mirrored {

/// Row-major dynamic matrix type that `as_matrix` maps.
template <class T>
using RowMatrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

namespace detail {
template <class T>
void require_host(const Tensor<T>& t, const char* op) {
  static_assert(!is_half_v<T>,
                "Eigen views of float16/bfloat16 tensors are not supported (Eigen has no arithmetic for mirrored's "
                "2-byte types): view cast<float>(t) instead");
  MIRRORED_ENFORCE(t.device().is_host(), InvalidArgumentError, op, ": tensor is on ", t.device().short_name(),
                   "; Eigen views need host memory (copy it with .to(cpu0) first)");
}
}  // namespace detail

/// All elements as a column vector view (writes go to the tensor). \throws InvalidArgumentError
/// for a tensor that is not in host memory.
template <class T>
Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>> as_vector(Tensor<T>& t) {
  detail::require_host(t, "as_vector");
  return {t.data(), t.numel()};
}
/// Read-only column vector view.
template <class T>
Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, 1>> as_vector(const Tensor<T>& t) {
  detail::require_host(t, "as_vector");
  return {t.data(), t.numel()};
}
/// A rank-2 tensor as a row-major matrix view. \throws InvalidArgumentError unless rank 2 and
/// in host memory.
template <class T>
Eigen::Map<RowMatrix<T>> as_matrix(Tensor<T>& t) {
  detail::require_host(t, "as_matrix");
  MIRRORED_ENFORCE(t.rank() == 2, InvalidArgumentError, "as_matrix: tensor of shape ", detail::format_shape(t.shape()),
                   " is not rank 2");
  return {t.data(), t.shape()[0], t.shape()[1]};
}
/// Read-only row-major matrix view.
template <class T>
Eigen::Map<const RowMatrix<T>> as_matrix(const Tensor<T>& t) {
  detail::require_host(t, "as_matrix");
  MIRRORED_ENFORCE(t.rank() == 2, InvalidArgumentError, "as_matrix: tensor of shape ", detail::format_shape(t.shape()),
                   " is not rank 2");
  return {t.data(), t.shape()[0], t.shape()[1]};
}

}  // namespace mirrored

#pragma once
/// \file
/// `TensorSpec`: the dtype and (possibly partly unknown) shape of one component of a dataset
/// element, as `Dataset::element_spec()` and `DistributedDataset::element_spec()` report it.

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "mirrored/detail/format.hpp"
#include "mirrored/dtype.hpp"

namespace mirrored::data {

/// Type of one tensor component of a dataset element (TF's `tf.TensorSpec`). A dimension of -1
/// is unknown (TF's `None`), e.g. the batch dimension of `batch(4)` without `drop_remainder`;
/// `known_rank == false` means even the rank is unknown (the result of `map`, whose output
/// shape is only known once the function has run).
struct TensorSpec {
  /// Dimensions, outermost first; -1 marks an unknown dimension. Empty when the rank is unknown.
  Shape shape;
  /// Element type.
  DType dtype = DType::float32;
  /// False when nothing is known about the shape.
  bool known_rank = true;

  /// Number of dimensions, or -1 when unknown.
  int64_t rank() const noexcept { return known_rank ? static_cast<int64_t>(shape.size()) : -1; }
  /// A spec of `dtype` whose shape is entirely unknown.
  static TensorSpec unknown_shape(DType dtype) { return TensorSpec{{}, dtype, false}; }

  friend bool operator==(const TensorSpec&, const TensorSpec&) = default;

  /// `TensorSpec(shape=(None, 2), dtype=int64)`; an unknown rank prints as `shape=<unknown>`.
  friend std::ostream& operator<<(std::ostream& os, const TensorSpec& s);  // src/data/tensor_spec.cpp
};

}  // namespace mirrored::data

#pragma once
/// \file
/// Rows of a tensor, for the examples' gradient accumulation (a replica's slice cut into
/// micro-batches).

#include <algorithm>
#include <cstdint>
#include <vector>

#include <mirrored/tensor.hpp>

namespace examples {

/// Rows [begin, end) of `t` (axis 0), on its device. Host tensors are copied row by row through
/// `data()`; a device tensor goes through the host (`to_vector`, `from_vector`), since Tensor has
/// no device-side slice, and a micro-batch is small.
template <class E>
mirrored::Tensor<E> rows_of(const mirrored::Tensor<E>& t, int64_t begin, int64_t end) {
  mirrored::Shape shape = t.shape();
  const int64_t row = shape[0] > 0 ? t.numel() / shape[0] : 0;
  shape[0] = end - begin;
  if (!t.device().is_host()) {
    const std::vector<E> all = t.to_vector();
    return mirrored::Tensor<E>::from_vector(std::vector<E>(all.begin() + begin * row, all.begin() + end * row),
                                            std::move(shape), t.device());
  }
  auto out = mirrored::Tensor<E>::empty(shape, t.device());
  std::copy_n(t.data() + begin * row, out.numel(), out.data());
  return out;
}

/// Where micro-batch `j` of `k` of `rows` rows begins, by the BALANCED rule (the first rows % k
/// micro-batches have one row more), as the strategy cuts a batch into replica slices.
inline int64_t micro_batch_begin(int64_t rows, int k, int j) {
  const int64_t floor = rows / k, extra = rows % k;
  return j * floor + std::min<int64_t>(j, extra);
}

}  // namespace examples

#pragma once
/// \file
/// Keras' default initialisation (Glorot uniform kernels), the same on every platform for a seed,
/// for the example models (digits/mlp.hpp, fashion/cnn.hpp).

#include <cmath>
#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include <mirrored/tensor.hpp>

namespace examples {

/// The generator the example models draw their weights from: `std::mt19937` seeded with the two
/// halves of `seed` (the standard distributions differ between standard libraries, so none is used).
inline std::mt19937 init_rng(uint64_t seed) {
  std::seed_seq seq{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  return std::mt19937(seq);
}

/// A kernel of `shape` drawn from U(-limit, limit), limit = sqrt(6 / (fan_in + fan_out)), in
/// row-major order: u = (draw + 0.5) / 2^32, value = limit * (2u - 1), in double, then converted to T.
template <class T>
mirrored::Tensor<T> glorot_uniform(std::mt19937& rng, mirrored::Shape shape, int64_t fan_in, int64_t fan_out) {
  const double limit = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<T> v(static_cast<std::size_t>(n));
  for (auto& x : v) {
    const double u = (static_cast<double>(rng()) + 0.5) / 4294967296.0;
    x = static_cast<T>(limit * (2.0 * u - 1.0));
  }
  return mirrored::Tensor<T>::from_vector(std::move(v), std::move(shape));
}

}  // namespace examples

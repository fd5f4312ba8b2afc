// Seed: Strategy.gather — the two-replica sample: each replica holds the same (2, 1) int32
// tensor and gather concatenates them along axis 0, on the host.
#include <cstdint>
#include <iostream>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  // tf.constant([[1], [2]]) is int32.
  auto distributed_values = strategy.experimental_distribute_values_from_function([](const ValueContext&) {
    return Tensor<int32_t>::from_vector({1, 2}, {2, 1});
  });

  std::cout << "# gather: a (2, 1) tensor per replica, axis=0\n";
  std::cout << strategy.gather(distributed_values, /*axis=*/0) << "\n";
}

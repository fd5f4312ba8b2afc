// Seed: Strategy.gather — "other combinations": four replicas (CPU:0..3 for the seed's four
// GPUs) each hold reshape(range(6), (1, 2, 3)); gathering along each axis grows that axis 4x.
#include <cstdint>
#include <iostream>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1", "CPU:2", "CPU:3"});
  const auto single_tensor = Tensor<int32_t>{0, 1, 2, 3, 4, 5}.reshape({1, 2, 3});
  // Tensor copies share storage; that is safe here because gather only reads the components.
  auto distributed_values =
      strategy.experimental_distribute_values_from_function([&](const ValueContext&) { return single_tensor; });

  std::cout << "# gather: 4 replicas, each holding reshape(range(6), (1, 2, 3))\n";
  for (int axis = 0; axis < 3; ++axis) {
    std::cout << "axis=" << axis << "\n";
    std::cout << strategy.gather(distributed_values, axis) << "\n";
  }
}

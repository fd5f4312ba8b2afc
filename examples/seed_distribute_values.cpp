// Seed: Strategy.experimental_distribute_values_from_function — the four usage samples, on two
// CPU replicas instead of two GPUs (the fourth, written for TPUStrategy, adapted to Mirrored).
#include <iostream>
#include <vector>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});

  std::cout << "# distribute_values_from_function: constant value per replica\n";
  auto constants = strategy.experimental_distribute_values_from_function(
      [](const ValueContext&) { return Tensor<float>::scalar(1.0f); });
  std::cout << repr(strategy.experimental_local_results(constants)) << "\n";

  std::cout << "# distribute_values_from_function: array value indexed by replica id\n";
  // np.array([3., 2., 1.]) holds float64, so the C++ counterpart is double.
  const std::vector<double> array_value{3.0, 2.0, 1.0};
  auto from_array = strategy.experimental_distribute_values_from_function(
      [&](const ValueContext& ctx) { return array_value[ctx.replica_id_in_sync_group]; });
  std::cout << repr(strategy.experimental_local_results(from_array)) << "\n";

  std::cout << "# distribute_values_from_function: num_replicas_in_sync\n";
  auto counts = strategy.experimental_distribute_values_from_function(
      [](const ValueContext& ctx) { return ctx.num_replicas_in_sync; });
  std::cout << repr(strategy.experimental_local_results(counts)) << "\n";

  std::cout << "# distribute_values_from_function: values placed on worker devices\n";
  // TF's `with tf.device(worker_devices[i])` becomes an explicit device argument: each replica's
  // value lives on that replica's device before it is distributed.
  const auto& worker_devices = strategy.extended().worker_devices();
  std::vector<Tensor<float>> multiple_values;
  for (int i = 0; i < strategy.num_replicas_in_sync(); ++i)
    multiple_values.push_back(Tensor<float>::scalar(1.0f, worker_devices[i]));
  auto placed = strategy.experimental_distribute_values_from_function(
      [&](const ValueContext& ctx) { return multiple_values[ctx.replica_id_in_sync_group]; });
  for (const auto& value : strategy.experimental_local_results(placed))
    std::cout << value << " on " << value.device().to_string() << "\n";
}

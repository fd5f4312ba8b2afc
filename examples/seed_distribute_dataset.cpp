// Seed: Strategy.experimental_distribute_dataset — tf.data.Dataset.range(4).batch(2) distributed
// over two replicas (CPU:0 and CPU:1 instead of two GPUs); the replica function doubles its
// input, and the results of the two steps are printed as a list of PerReplica.
#include <cstdint>
#include <iostream>
#include <mirrored/mirrored.hpp>
#include <vector>

using namespace mirrored;

int main() {
  std::cout << "# experimental_distribute_dataset: range(4).batch(2) on two replicas, replica_fn = input*2\n";
  const int64_t global_batch_size = 2;
  // Passing the devices is optional (the default is every GPU, else CPU:0).
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  // Create a dataset
  auto dataset = data::Dataset<>::range(4).batch(global_batch_size);
  // Distribute that dataset
  auto dist_dataset = strategy.experimental_distribute_dataset(dataset);
  auto replica_fn = [](const Tensor<int64_t>& input) { return input * 2; };
  std::vector<PerReplica<Tensor<int64_t>>> result;
  // Iterate over the DistributedDataset
  for (const auto& x : dist_dataset) {
    // process dataset elements
    result.push_back(strategy.run(replica_fn, x));
  }
  // print(result): a Python list, laid out as TF prints it.
  std::cout << "[";
  for (std::size_t i = 0; i < result.size(); ++i) std::cout << (i ? ", " : "") << result[i];
  std::cout << "]\n";
}

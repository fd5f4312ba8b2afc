// Seed: Strategy.experimental_distribute_dataset — the custom training loop sample
// (`distribute_train_epoch`): each epoch iterates the distributed dataset, runs replica_fn on
// every replica's slice and adds the replicas' results with reduce(SUM, …, axis=None).
//
// Made runnable: the dataset is range(10) shuffled (seed 42, reshuffled every epoch) in global
// batches of 4, on two replicas; replica_fn returns the sum of squares of its slice (a stand-in
// for a per-replica loss). The last global batch has 2 elements, one for each replica (the
// default BALANCED split, as TF). Whatever the order, every epoch's total is 0² + 1² + … + 9² = 285.
#include <cstdint>
#include <iostream>
#include <mirrored/mirrored.hpp>
#include <numeric>
#include <optional>

using namespace mirrored;

int main() {
  constexpr int EPOCHS = 2;
  MirroredStrategy my_strategy({"CPU:0", "CPU:1"});
  auto dataset = data::range(10).shuffle(10, /*seed=*/42).batch(4);
  {
    auto scope = my_strategy.scope();

    auto replica_fn = [](const Tensor<int64_t>& input) {
      const std::vector<int64_t> squares = (input * input).to_vector();
      return Tensor<int64_t>::scalar(std::accumulate(squares.begin(), squares.end(), int64_t{0}), input.device());
    };

    auto distribute_train_epoch = [&](const DistributedDataset<Tensor<int64_t>>& dataset) {
      auto total_result = Tensor<int64_t>::scalar(0);
      int step = 0;
      for (const auto& x : dataset) {
        std::cout << "  step " << ++step << ": replica 0 gets " << repr(x[0].to_vector()) << ", replica 1 gets "
                  << repr(x[1].to_vector()) << "\n";
        auto per_replica_result = my_strategy.run(replica_fn, x);
        total_result = total_result + my_strategy.reduce(ReduceOp::SUM, per_replica_result, std::nullopt);
      }
      return total_result;
    };

    auto dist_dataset = my_strategy.experimental_distribute_dataset(dataset);
    std::cout << "# distribute_train_epoch: " << EPOCHS
              << " epochs of range(10).shuffle(10, seed=42).batch(4) on two replicas\n";
    for (int epoch = 1; epoch <= EPOCHS; ++epoch) {
      std::cout << "epoch " << epoch << "\n";
      auto train_result = distribute_train_epoch(dist_dataset);
      std::cout << "  train_result = " << train_result << "\n";
    }
  }
}

// Seed: Strategy.reduce, "what should axis be?" — a global batch split across two replicas, reduced
// across replicas only (axis=None) or across replicas and the batch (axis=0), then the final
// partial batch, where only axis=0 works and MEAN weighs every example equally.
#include <algorithm>
#include <iostream>
#include <numeric>
#include <optional>
#include <vector>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

namespace {

// Replica r's slice of the global batch [0, 1, …, global_batch-1], as the input pipeline cuts it
// (RebatchPolicy::BALANCED): sizes as even as possible, the first replicas get the extra element.
PerReplica<Tensor<float>> split_batch(Strategy& strategy, int global_batch) {
  return strategy.experimental_distribute_values_from_function([=](const ValueContext& ctx) {
    const int r = ctx.replica_id_in_sync_group;
    const int floor = global_batch / ctx.num_replicas_in_sync;
    const int extra = global_batch % ctx.num_replicas_in_sync;
    const int begin = r * floor + std::min(r, extra);
    const int end = begin + floor + (r < extra ? 1 : 0);
    std::vector<float> values(static_cast<std::size_t>(end - begin));
    std::iota(values.begin(), values.end(), static_cast<float>(begin));
    return Tensor<float>::from_vector(values, {end - begin});
  });
}

}  // namespace

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});

  auto per_replica_result = split_batch(strategy, 8);
  std::cout << "# reduce: global batch 8 on 2 replicas\n" << per_replica_result << "\n";
  std::cout << "# reduce: SUM, axis=None (across replicas only)\n";
  std::cout << strategy.reduce("sum", per_replica_result, std::nullopt) << "\n";
  std::cout << "# reduce: SUM, axis=0 (across replicas and the batch)\n";
  std::cout << strategy.reduce("sum", per_replica_result, 0) << "\n";

  auto partial = split_batch(strategy, 5);
  std::cout << "# reduce: partial batch of 5 on 2 replicas\n" << partial << "\n";
  std::cout << "# reduce: SUM, axis=None (shapes differ across replicas)\n";
  try {
    std::cout << strategy.reduce("sum", partial, std::nullopt) << "\n";
  } catch (const InvalidArgumentError& e) {
    std::cout << "InvalidArgumentError: " << e.what() << "\n";
  }
  std::cout << "# reduce: MEAN, axis=0 (denominator 5, every example weighs 1/5)\n";
  std::cout << strategy.reduce(ReduceOp::MEAN, partial, 0) << "\n";

  // The alternative the seed warns about: average inside each replica, then average the means.
  // Each replica counts the same, so replica 0's examples weigh 1/6 and replica 1's weigh 1/4.
  auto replica_means = strategy.run(
      [](const Tensor<float>& batch) {
        const std::vector<float> v = batch.to_vector();
        return Tensor<float>::scalar(std::accumulate(v.begin(), v.end(), 0.0f) / static_cast<float>(v.size()));
      },
      partial);
  std::cout << "# reduce: MEAN, axis=None of the per-replica means (weights 1/6 and 1/4)\n";
  std::cout << replica_means << "\n";
  std::cout << strategy.reduce(ReduceOp::MEAN, replica_means, std::nullopt) << "\n";
}

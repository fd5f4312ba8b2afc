// The README's example: each CPU replica computes on its own input, all-reduces a gradient-like
// value inside the step, and the caller averages the per-replica losses.
#include <iostream>
#include <tuple>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  // One input per replica: replica r gets [r+1, r+1, r+1].
  auto inputs = strategy.experimental_distribute_values_from_function(
      [](const ValueContext& ctx) { return Tensor<float>::full({3}, float(ctx.replica_id_in_sync_group + 1)); });

  auto step = [](const Tensor<float>& x) {
    Tensor<float> grad = get_replica_context()->all_reduce(ReduceOp::SUM, x * 2.0f);  // same on every replica
    float loss = (x * x).to_vector()[0];                                              // this replica's own
    return std::make_tuple(grad, loss);
  };
  auto results = strategy.run(step, inputs);

  std::cout << "per-replica results: " << results << "\n";
  auto [grad, loss] = strategy.reduce(ReduceOp::MEAN, results, std::nullopt);
  std::cout << "mean gradient: " << grad << "\nmean loss: " << loss << "\n";
}

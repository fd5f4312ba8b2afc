// Seed: Strategy.run — the three usage samples: a plain tensor argument (shared by every
// replica), a distributed argument (each replica gets its own component), and an all-reduce
// inside the replica function.
#include <cstdint>
#include <iostream>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});

  std::cout << "# run: constant tensor input\n";
  const auto tensor_input = Tensor<float>::scalar(3.0f);
  auto replica_fn = [](const Tensor<float>& input) { return input * 2.0; };
  std::cout << strategy.run(replica_fn, tensor_input) << "\n";

  std::cout << "# run: distributed values input\n";
  auto distributed_values = strategy.experimental_distribute_values_from_function(
      [](const ValueContext& value_context) { return value_context.num_replicas_in_sync; });
  auto replica_fn2 = [](int input) { return input * 2; };
  // TF's tf.function collapses this to one tensor; run here always returns a PerReplica.
  std::cout << strategy.run(replica_fn2, distributed_values) << "\n";

  std::cout << "# run: all_reduce inside the replica function\n";
  auto replica_ids = strategy.experimental_distribute_values_from_function([](const ValueContext& value_context) {
    return Tensor<int32_t>::scalar(value_context.replica_id_in_sync_group);
  });
  auto all_reduce_fn = [](const Tensor<int32_t>& input) { return get_replica_context()->all_reduce("sum", input); };
  std::cout << strategy.run(all_reduce_fn, replica_ids) << "\n";
}

// Seed: Strategy.reduce — each replica returns its replica id; SUM across the two replicas is 1,
// and the reduced total lands on the host (CPU:0) whatever devices the replicas used.
#include <cstdint>
#include <iostream>

#include <mirrored/mirrored.hpp>

using namespace mirrored;

int main() {
  MirroredStrategy strategy({"CPU:0", "CPU:1"});
  auto step_fn = [] {
    ReplicaContext* ctx = get_replica_context();
    const int i = ctx->replica_id_in_sync_group();
    // TF's tf.identity(i) runs under the replica's device scope; here the device is explicit.
    return Tensor<int32_t>::scalar(i, ctx->strategy().extended().worker_devices()[i]);
  };

  std::cout << "# reduce: SUM of the replica ids\n";
  auto per_replica_result = strategy.run(step_fn);
  auto total = strategy.reduce("SUM", per_replica_result, std::nullopt);
  std::cout << total << "\n";

  std::cout << "# reduce: devices of the per-replica results and of the total\n";
  auto local_results = strategy.experimental_local_results(per_replica_result);
  std::cout << "local_results[0].device: " << local_results[0].device().to_string() << "\n";
  std::cout << "local_results[1].device: " << local_results[1].device().to_string() << "\n";
  std::cout << "total.device: " << total.device().to_string() << "\n";
}

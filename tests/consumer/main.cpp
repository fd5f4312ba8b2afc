// Smoke test for downstream consumers of mirrored (find_package, add_subdirectory and
// FetchContent); built by cmake/run_consumer.cmake.
#include <mirrored/mirrored.hpp>

#include <iostream>
#include <optional>

#if MIRRORED_CONSUMER_EIGEN
float eigen_sum();  // eigen_use.cpp
#endif

// MIRRORED_ENABLE_CUDA=AUTO means OFF when mirrored is embedded in another project.
#if defined(MIRRORED_CONSUMER_EMBEDDED) && MIRRORED_HAVE_CUDA
#error "an embedded mirrored with MIRRORED_ENABLE_CUDA=AUTO was built with CUDA"
#endif

int main() {
  mirrored::MirroredStrategy s({"CPU:0", "CPU:1"});
  auto r = s.run([] { return mirrored::get_replica_context()->replica_id_in_sync_group() + 1; });
  int total = s.reduce(mirrored::ReduceOp::SUM, r, std::nullopt);
  std::cout << total << "\n";
#if MIRRORED_CONSUMER_EIGEN
  if (eigen_sum() != 6.0f) return 1;
#endif
  // The multi-worker strategy links Gloo (privately): without TF_CONFIG it is one local worker.
  mirrored::SimpleClusterResolver none(mirrored::ClusterSpec{}, "", 0);
  mirrored::MultiWorkerMirroredStrategy mw({}, std::make_shared<mirrored::SimpleClusterResolver>(none), {"CPU:0"});
  if (mw.num_replicas_in_sync() != 1) return 1;
  return total == 3 ? 0 : 1;
}

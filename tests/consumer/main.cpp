// Smoke test for downstream consumers of mirrored (find_package,
// add_subdirectory and FetchContent); built by cmake/run_consumer.cmake.
#include <mirrored/mirrored.hpp>

#include <iostream>
#include <optional>

int main() {
  mirrored::MirroredStrategy s({"CPU:0", "CPU:1"});
  auto r = s.run([] { return mirrored::get_replica_context()->replica_id_in_sync_group() + 1; });
  int total = s.reduce(mirrored::ReduceOp::SUM, r, std::nullopt);
  std::cout << total << "\n";
  return total == 3 ? 0 : 1;
}

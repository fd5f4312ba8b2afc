#pragma once
// Shared by the benchmarks: one strategy per replica count for the whole process, so its replica
// threads are long-lived, like a training program's.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored_strategy.hpp>

namespace mirrored::bench {

inline MirroredStrategy& strategy_for(int n) {
  static std::map<int, std::unique_ptr<MirroredStrategy>> cache;
  auto& s = cache[n];
  if (!s) {
    std::vector<std::string> devices;
    for (int r = 0; r < n; ++r) devices.push_back("CPU:" + std::to_string(r));
    s = std::make_unique<MirroredStrategy>(devices);
  }
  return *s;
}

}  // namespace mirrored::bench

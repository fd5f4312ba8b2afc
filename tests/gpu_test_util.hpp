#pragma once
// The setup the GPU tests share: which GPUs a test runs on (and why it skips when there are too
// few), and whether they are the simulated ones (MIRRORED_SIMULATED_GPUS), where checks of CUDA
// itself do not apply.

#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "device/gpu/gpu_runtime.hpp"

namespace mirrored::testing {

/// True when the process's GPUs are simulated.
inline bool simulated_gpus() { return std::string(detail::gpu_runtime().name()) == "simulated"; }

/// The visible GPUs a test uses: their specs ("GPU:0", …, at most `max`), each GPU's CPU twin
/// ("CPU:0", …, for the same replicas on the host), and, when fewer than `min` are visible, why the
/// test skips (else empty).
struct VisibleGpus {
  std::vector<std::string> gpus, cpus;
  std::string skip;
};
inline VisibleGpus visible_gpus(std::size_t min = 1, std::size_t max = std::numeric_limits<std::size_t>::max()) {
  VisibleGpus out;
  const auto gpus = list_logical_devices(DeviceType::GPU);
  if (gpus.empty() && min == 1)
    out.skip = "no GPU visible to this process";
  else if (gpus.size() < min)
    out.skip = "needs at least " + std::to_string(min) + " GPUs (" + std::to_string(gpus.size()) + " visible)";
  for (std::size_t g = 0; g < gpus.size() && g < max; ++g) {
    out.gpus.push_back(gpus[g].short_name());
    out.cpus.push_back("CPU:" + std::to_string(gpus[g].index()));
  }
  return out;
}

}  // namespace mirrored::testing

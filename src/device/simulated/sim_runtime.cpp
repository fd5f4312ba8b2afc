// The simulated GPU runtime (sim_runtime.hpp).
#include "device/simulated/sim_runtime.hpp"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "device/gpu/logical_gpus.hpp"
#include "device/simulated/sim_backend.hpp"
#include "mirrored/errors.hpp"
#include "util/log.hpp"

namespace mirrored::detail {
namespace {

sim::Options options_from_env() {
  sim::Options o;
  o.seed = static_cast<uint64_t>(env_positive("MIRRORED_SIMULATED_GPU_SEED", static_cast<double>(o.seed)));
  // 0 is a valid delay (none), which env_positive cannot express: "0" reads as the fallback there.
  const char* delay = std::getenv("MIRRORED_SIMULATED_GPU_DELAY_US");
  o.max_delay_us = delay && std::string_view(delay) == "0"
                       ? 0
                       : static_cast<int>(env_positive("MIRRORED_SIMULATED_GPU_DELAY_US", o.max_delay_us));
  o.memory_bytes = static_cast<std::size_t>(
      env_positive("MIRRORED_SIMULATED_GPU_MEMORY_MB", static_cast<double>(o.memory_bytes >> 20)) * (1 << 20));
  return o;
}

class SimulatedGpuRuntime final : public GpuRuntime {
 public:
  explicit SimulatedGpuRuntime(int n) : options_(options_from_env()) {
    for (int p = 0; p < n; ++p) chips_.push_back(std::make_unique<sim::Chip>(p, options_.memory_bytes));
    MIRRORED_LOG(info, n, " simulated GPUs (MIRRORED_SIMULATED_GPUS), seed ", options_.seed, ", delays below ",
                 options_.max_delay_us, " us");
  }

  const char* name() const noexcept override { return "simulated"; }
  int physical_gpu_count() const noexcept override { return static_cast<int>(chips_.size()); }
  std::string unavailable_reason() const override {
    return std::to_string(chips_.size()) + " simulated (MIRRORED_SIMULATED_GPUS)";
  }
  bool drives_physical_gpus() const noexcept override { return false; }

  sim::Backend& backend(const Device& device) override {
    std::lock_guard lock(mu_);
    auto it = backends_.find(device.index());
    if (it != backends_.end()) return *it->second;
    const int physical = logical_gpu_location(device.index()).first;
    sim::Chip& chip = *chips_[static_cast<std::size_t>(physical)];
    auto* be = new sim::Backend(Device(DeviceType::GPU, device.index()), chip, options_);  // never destroyed
    chip.add(be);
    backends_.emplace(device.index(), be);
    return *be;
  }

  void enter_device(const Device& device) override {
    check_gpu_usable(device, logical_gpu_location(device.index()).first);
  }

  bool copy_gpu_to_gpu(void* dst, const Device& dst_device, const void* src, const Device& src_device,
                       std::size_t bytes) override {
    sim::Backend& to = backend(dst_device);
    sim::Backend& from = backend(src_device);
    // Simulated chips have no peer path to each other: copies between them take copy_between's
    // host staging, which the CUDA runtime (always able to copy peer to peer) never exercises.
    if (to.physical() != from.physical()) return false;
    // Within a chip, as the CUDA runtime does: the source's contents are final, the copy runs
    // on the destination's stream and is complete on return.
    from.synchronize();
    to.stream(to.current_stream()).enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
    to.synchronize();
    return true;
  }

 private:
  const sim::Options options_;
  std::vector<std::unique_ptr<sim::Chip>> chips_;
  std::mutex mu_;
  std::map<int, sim::Backend*> backends_;  // logical index -> backend
};

}  // namespace

int parse_simulated_gpu_count(const std::string& text) {
  int n = 0;
  bool digits = !text.empty() && text.size() <= 2;
  for (char c : text) {
    digits = digits && c >= '0' && c <= '9';
    if (digits) n = n * 10 + (c - '0');
  }
  MIRRORED_ENFORCE(digits && n >= 1 && n <= kMaxSimulatedGpus, InvalidArgumentError,
                   "MIRRORED_SIMULATED_GPUS must be a whole number of simulated GPUs from 1 to ", kMaxSimulatedGpus,
                   ", got '", text, "' (unset it for the platform's GPUs)");
  return n;
}

std::unique_ptr<GpuRuntime> make_simulated_gpu_runtime(int n) { return std::make_unique<SimulatedGpuRuntime>(n); }

sim::Backend* simulated_backend(const Device& device) {
  auto& runtime = gpu_runtime();
  if (std::string_view(runtime.name()) != "simulated" || device.is_host()) return nullptr;
  return &static_cast<SimulatedGpuRuntime&>(runtime).backend(device);
}

}  // namespace mirrored::detail

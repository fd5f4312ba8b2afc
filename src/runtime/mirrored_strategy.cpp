#include "mirrored/mirrored_strategy.hpp"

#include "util/log.hpp"

namespace mirrored {
namespace {

using detail::str_cat;

std::vector<Device> default_devices() {
  std::vector<Device> gpus = list_logical_devices(DeviceType::GPU);
  if (!gpus.empty()) return gpus;
  return {Device(DeviceType::CPU, 0)};
}

std::vector<Device> resolve_devices(const std::vector<std::string>& specs) {
  if (specs.empty()) return default_devices();
  std::vector<Device> devices;
  devices.reserve(specs.size());
  for (std::size_t i = 0; i < specs.size(); ++i) {
    Device d = Device::parse(specs[i]);
    // Another job or task is another process: running it here "locally" would silently train a
    // different model than the user asked for.
    MIRRORED_ENFORCE(d.job() == "localhost" && d.task() == 0 && d.replica() == 0, InvalidArgumentError,
                     "MirroredStrategy: device '", specs[i], "' names job '", d.job(), "', replica ", d.replica(),
                     ", task ", d.task(),
                     "; MirroredStrategy runs every replica in this process (job 'localhost', replica 0, task 0). "
                     "To train across several workers use MultiWorkerMirroredStrategy (docs/multi_worker.md)");
    for (std::size_t j = 0; j < devices.size(); ++j) {
      MIRRORED_ENFORCE(!(devices[j] == d), InvalidArgumentError, "No duplicates allowed in `devices` argument: '",
                       specs[j], "' and '", specs[i], "' both name ", d.to_string());
    }
    if (!device_exists(d)) {
      throw NotFoundError(str_cat("MirroredStrategy: device ", d.to_string(), " ('", specs[i],
                                  "') not found: ", list_logical_devices(DeviceType::GPU).size(), " GPUs are visible"));
    }
    devices.push_back(std::move(d));
  }
  return devices;
}

std::string device_tuple(const std::vector<Device>& devices) {
  std::string out = "(";
  for (std::size_t i = 0; i < devices.size(); ++i) out += str_cat(i ? ", '" : "'", devices[i].to_string(), "'");
  return out + (devices.size() == 1 ? ",)" : ")");
}

}  // namespace

MirroredStrategy::MirroredStrategy() : MirroredStrategy(std::vector<std::string>{}) {}

MirroredStrategy::MirroredStrategy(std::vector<std::string> devices, std::shared_ptr<CrossDeviceOps> cross_device_ops)
    : Strategy(resolve_devices(devices), std::move(cross_device_ops)) {
  start_replica_threads();
  MIRRORED_LOG(info, "Using MirroredStrategy with devices ", device_tuple(extended().worker_devices()), " and ",
               extended().cross_device_ops().name());
}

MirroredStrategy::~MirroredStrategy() = default;

}  // namespace mirrored

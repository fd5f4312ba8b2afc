#pragma once
/// \file
/// `MirroredStrategy`: synchronous training on several replicas of one machine.

#include <memory>
#include <string>
#include <vector>

#include "mirrored/cross_device_ops.hpp"
#include "mirrored/strategy.hpp"

namespace mirrored {

/// One replica per device, each on its own long-lived thread; values kept identical on every
/// replica by all-reduce. Any `CPU:k` is a replica on a host thread with host memory.
class MirroredStrategy : public Strategy {
 public:
  /// All visible GPUs; if there are none, one replica on CPU:0.
  MirroredStrategy();
  /// Replicas on `devices` (any spelling `Device::parse` accepts; empty = the default devices).
  /// `cross_device_ops` overrides the default choice (all host devices: `InProcessAllReduce`;
  /// distinct physical GPUs with NCCL: `NcclAllReduce`; otherwise the reduce-to-one-device path,
  /// see docs/gpu.md). Logs "Using MirroredStrategy with devices (…)".
  /// \throws InvalidArgumentError for an unparsable or duplicated device ("No duplicates allowed
  /// in `devices` argument"); NotFoundError for a GPU that is not visible.
  explicit MirroredStrategy(std::vector<std::string> devices,
                            std::shared_ptr<CrossDeviceOps> cross_device_ops = nullptr);
  ~MirroredStrategy() override;

  std::string name() const override { return "MirroredStrategy"; }
};

}  // namespace mirrored

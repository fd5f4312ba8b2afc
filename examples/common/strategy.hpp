#pragma once
/// \file
/// The strategy an example program's `--strategy` flag names, and the end of its `--timeline`
/// (train_digits, fashion_mnist).

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

namespace examples {

/// "mirrored": a MirroredStrategy over `devices`; "multi_worker": a MultiWorkerMirroredStrategy
/// over the workers TF_CONFIG names, `devices` being each worker's own replicas (tools/launch.sh
/// sets TF_CONFIG). \throws what the strategies' constructors throw.
inline std::unique_ptr<mirrored::Strategy> make_strategy(const std::string& name,
                                                         const std::vector<std::string>& devices) {
  if (name == "multi_worker")
    return std::make_unique<mirrored::MultiWorkerMirroredStrategy>(mirrored::CommunicationOptions{}, nullptr, devices);
  return std::make_unique<mirrored::MirroredStrategy>(devices);
}

/// Stops the timeline, if one is recording, and prints where it went ("wrote the timeline to ...").
inline void finish_timeline() {
  if (!mirrored::timeline::active()) return;
  const std::string written = mirrored::timeline::path();
  mirrored::timeline::stop();
  std::printf("wrote the timeline to %s\n", written.c_str());
}

}  // namespace examples

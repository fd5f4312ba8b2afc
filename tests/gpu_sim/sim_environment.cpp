// Every test of this executable runs on simulated GPUs, whatever the environment says: three
// physical GPUs, the first split into two logical GPUs. GPU:0 and GPU:1 share physical GPU 0,
// GPU:2 is physical GPU 1, and GPU:3 (physical GPU 2) is left to the test that breaks its device.
#include <gtest/gtest.h>

#include <cstdlib>

#include <mirrored/mirrored.hpp>

namespace mirrored {
namespace {

// Before main, so before anything can ask for the GPU runtime (and before any thread exists).
[[maybe_unused]] const bool kSimulated = [] {
  ::setenv("MIRRORED_SIMULATED_GPUS", "3", 1);
  return true;
}();

class SplitChipZero : public ::testing::Environment {
 public:
  void SetUp() override { config::set_logical_gpu_devices(0, 2); }
};
[[maybe_unused]] const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new SplitChipZero);

}  // namespace
}  // namespace mirrored

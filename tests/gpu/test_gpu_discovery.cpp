// GPU discovery. Built everywhere; skips in SetUp where no GPU is visible (no driver, no device,
// or a build without CUDA), before anything touches NCCL.
#include <gtest/gtest.h>

#include <mirrored/mirrored.hpp>

namespace mirrored {
namespace {

class GpuDiscovery : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
  }
};

TEST_F(GpuDiscovery, DevicesAreNumberedFromZeroAndExist) {
  const auto gpus = list_logical_devices(DeviceType::GPU);
  for (std::size_t i = 0; i < gpus.size(); ++i) {
    EXPECT_EQ(gpus[i].type(), DeviceType::GPU);
    EXPECT_EQ(gpus[i].index(), static_cast<int>(i));
    EXPECT_TRUE(device_exists(gpus[i]));
  }
  EXPECT_FALSE(device_exists(Device(DeviceType::GPU, static_cast<int>(gpus.size()))));
}

TEST_F(GpuDiscovery, MissingGpuIsNotFound) {
  const int n = static_cast<int>(list_logical_devices(DeviceType::GPU).size());
  EXPECT_THROW(MirroredStrategy({"GPU:" + std::to_string(n)}), NotFoundError);
}

// Splitting GPU 0 into logical GPUs is tested in tests/gpu_logical/ (its own executable: the
// split can be made only once per process, before any GPU use, and would change what GPU:1 means
// for the tests here).

// Runs everywhere: without a GPU the answer is an empty list, never a crash.
TEST(GpuDiscoveryWithoutGpu, NeverThrows) { EXPECT_NO_THROW((void)list_logical_devices(DeviceType::GPU)); }

}  // namespace
}  // namespace mirrored

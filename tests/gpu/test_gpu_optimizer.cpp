// The fused optimizer update on a GPU against the host's, what one update moves between the host
// and the device (nothing), and what the device-resident digits step moves (the batch in, the loss
// out). On CUDA the update contracts multiply-adds (FMA), so it agrees
// with the host within a tolerance; on simulated GPUs (the host's loops on the streams) bit for
// bit. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "device/gpu/gpu_runtime.hpp"
#include "digits/train.hpp"
#include "gpu_test_util.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace {

const Device kGpu0(DeviceType::GPU, 0);

class GpuOptimizer : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const auto gpus = testing::visible_gpus(); !gpus.skip.empty()) GTEST_SKIP() << gpus.skip;
  }
  static bool simulated() { return testing::simulated_gpus(); }
};

std::vector<float> values(int n, int salt) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + salt * 3) % 17 - 8) / 8;
  return v;
}

std::unique_ptr<optimizers::Optimizer<float>> make(testing::Kind kind) {
  return testing::make_optimizer<float>(kind, /*sharded=*/false);
}

// The tolerance on CUDA: after 100 steps every weight is within 2e-5 + 1e-5·|w| of the host's. A
// step rounds each multiply-add once instead of twice (and Adam's bias correction comes from the
// device's pow): about one unit in the last place of a weight in [-1, 1] (1.2e-7) per step, so
// 100 steps stay below 1.2e-5 even if every step's difference had the same sign.
TEST_F(GpuOptimizer, AgreesWithTheHost) {
  for (const testing::Kind kind : testing::kAllKinds) {
    auto on_gpu = make(kind);
    auto on_host = make(kind);
    std::vector<Variable<float>> gpu_vars, host_vars;
    const std::vector<int> sizes = {1, 31, 1000, 4099};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const int n = sizes[k];
      gpu_vars.emplace_back(Tensor<float>::from_vector(values(n, static_cast<int>(k)), {n}, kGpu0));
      host_vars.emplace_back(Tensor<float>::from_vector(values(n, static_cast<int>(k)), {n}));
    }
    for (int step = 1; step <= 100; ++step) {
      optimizers::GradsAndVars<float> g_gpu, g_host;
      for (std::size_t k = 0; k < sizes.size(); ++k) {
        const int n = sizes[k];
        const Tensor<float> g = Tensor<float>::from_vector(values(n, static_cast<int>(k) + step), {n});
        g_gpu.emplace_back(g.to(kGpu0), gpu_vars[k]);
        g_host.emplace_back(g, host_vars[k]);
      }
      on_gpu->apply_gradients(g_gpu);
      on_host->apply_gradients(g_host);
    }
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto gpu = gpu_vars[k].value().to_vector();
      const auto host = host_vars[k].value().to_vector();
      ASSERT_EQ(gpu.size(), host.size());
      if (simulated()) {
        EXPECT_EQ(gpu, host) << "optimizer " << testing::kind_name(kind) << ", variable " << k;
        continue;
      }
      for (std::size_t i = 0; i < gpu.size(); ++i)
        ASSERT_LE(std::abs(gpu[i] - host[i]), 2e-5f + 1e-5f * std::abs(host[i]))
            << "optimizer " << testing::kind_name(kind) << ", variable " << k << ", element " << i;
    }
    EXPECT_EQ(on_gpu->iterations(), 100);
  }
}

// One update of GPU variables from GPU gradients: no bytes either way, no host wait (the step
// count stays on the device too).
TEST_F(GpuOptimizer, AnUpdateMovesNothingAndDoesNotWait) {
  std::vector<Variable<float>> vars;
  optimizers::GradsAndVars<float> gv;
  for (int k = 0; k < 3; ++k) {
    vars.emplace_back(Tensor<float>::from_vector(values(100 + k, k), {100 + k}, kGpu0));
    gv.emplace_back(Tensor<float>::from_vector(values(100 + k, k + 1), {100 + k}, kGpu0), vars.back());
  }
  optimizers::AdamW<float> opt;
  opt.build(vars);
  const TransferCounts before = transfer_counts(kGpu0);
  for (int step = 0; step < 20; ++step) opt.apply_gradients(gv);
  const TransferCounts after = transfer_counts(kGpu0);
  EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, 0u);
  EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, 0u);
  EXPECT_EQ(after.host_syncs - before.host_syncs, 0u);
  EXPECT_EQ(opt.iterations(), 20);
}

// The device-resident digits step (train_digits --devices GPU:0): the model on the device (cuBLAS
// and the example's kernels), the gradients through GradientBuckets and the fused optimizer. Over
// a whole training run only these cross: the initial weights and every batch host->device, the
// loss of every step and the trained weights (for the held-out accuracy) device->host.
TEST_F(GpuOptimizer, TheDigitsStepOnCudaMovesOnlyTheBatchAndTheLoss) {
  if (simulated()) GTEST_SKIP() << "the example's kernels need real CUDA GPUs";
  static const digits::Split data = digits::split_digits(digits::load_digits(digits::default_digits_path()), 0.2, 7);
  MirroredStrategy s({"GPU:0"});
  digits::TrainConfig cfg;
  cfg.epochs = 2;
  cfg.global_batch = 64;
  const TransferCounts before = transfer_counts(kGpu0);
  int64_t steps = 0;
  const auto result = digits::train(s, data, cfg, [&](const digits::EpochReport&) { ++steps; });
  const TransferCounts after = transfer_counts(kGpu0);
  const uint64_t weights = (64 * 64 + 64 + 64 * 10 + 10) * sizeof(float);
  const uint64_t examples = static_cast<uint64_t>(data.train.size());
  const uint64_t batches = cfg.epochs * examples * (64 * sizeof(float) + sizeof(int32_t));
  EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes, weights + sizeof(int64_t) + batches);
  EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes, weights + steps * sizeof(double));
  EXPECT_GE(result.test_accuracy, 0.9);
}

}  // namespace
}  // namespace mirrored

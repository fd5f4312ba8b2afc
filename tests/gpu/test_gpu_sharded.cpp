// reduce_scatter and sharded optimizer state on GPU replicas (one per visible GPU): the slices and
// the weights against the host's. On simulated GPUs (the host's loops on streams) bit for bit; on
// CUDA the fused kernel contracts multiply-adds and NCCL sums in its own order, so within a
// tolerance. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "device/gpu/gpu_runtime.hpp"
#include "gpu_test_util.hpp"

namespace mirrored {
namespace {

class GpuSharded : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpus = testing::visible_gpus();
    if (!gpus.skip.empty()) GTEST_SKIP() << gpus.skip;
    gpus_ = std::move(gpus.gpus);
  }
  static bool simulated() { return testing::simulated_gpus(); }
  int n() const { return static_cast<int>(gpus_.size()); }
  std::vector<std::string> gpus_;
};

TEST_F(GpuSharded, ReduceScatterGivesEachGpuItsRowsOfTheSum) {
  MirroredStrategy s(gpus_);
  const int64_t rows = 2 * n() + 1;
  auto out = s.run([&] {
    auto* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    std::vector<float> v;
    for (int64_t i = 0; i < rows * 3; ++i) v.push_back(static_cast<float>(i + r));
    const auto x = Tensor<float>::from_vector(v, {rows, 3}, Device(DeviceType::GPU, r));
    auto pending = ctx->reduce_scatter_async(ReduceOp::SUM, x);
    const Tensor<float> sync = ctx->reduce_scatter(ReduceOp::SUM, x);
    const Tensor<float> async = pending.wait();
    return std::make_tuple(sync.device(), sync.shape(), sync.to_vector(), async.to_vector());
  });
  const int ids = n() * (n() - 1) / 2;
  for (int r = 0; r < n(); ++r) {
    const auto piece = detail::balanced_piece(rows, n(), r);
    const auto& [device, shape, sync, async] = out[r];
    EXPECT_EQ(device, Device(DeviceType::GPU, r));
    EXPECT_EQ(shape, (Shape{piece.count, 3}));
    std::vector<float> want;
    for (int64_t i = piece.begin * 3; i < (piece.begin + piece.count) * 3; ++i)
      want.push_back(static_cast<float>(n() * i + ids));
    EXPECT_EQ(sync, want) << "replica " << r;
    EXPECT_EQ(async, want) << "replica " << r;
  }
}

// Adam with and without sharded state on the GPUs, and on as many CPU replicas: the same weights.
TEST_F(GpuSharded, ShardedAdamKeepsTheWeightsOfTheUnshardedOne) {
  std::vector<std::string> cpus;
  for (int r = 0; r < n(); ++r) cpus.push_back("CPU:" + std::to_string(r));
  auto train = [&](const std::vector<std::string>& devices, bool sharded) {
    MirroredStrategy s(devices);
    std::vector<Variable<float>> vars;
    {
      auto scope = s.scope();
      vars.emplace_back(Tensor<float>::full({7, 3}, 0.25f));
      vars.emplace_back(Tensor<float>::full({5}, -0.5f));
    }
    optimizers::Adam<float> opt({.learning_rate = 0.01, .shard_optimizer_state = sharded});
    for (int step = 0; step < 20; ++step) {
      s.run([&] {
        const int r = get_replica_context()->replica_id_in_sync_group();
        optimizers::GradsAndVars<float> gv;
        for (const auto& v : vars) {
          const Device d = v.components()[static_cast<std::size_t>(r)].device();
          gv.emplace_back(Tensor<float>::full(v.shape(), 0.3f * static_cast<float>(r + 1) + 0.01f * step, d), v);
        }
        opt.apply_gradients(gv);
      });
    }
    std::vector<std::vector<float>> out;
    for (const auto& v : vars)
      for (const auto& c : v.components()) out.push_back(c.to_vector());
    out.push_back(opt.get_slot(vars[0], "v").value().to_vector());
    return out;
  };
  const auto host = train(cpus, false);
  for (const bool sharded : {false, true}) {
    const auto gpu = train(gpus_, sharded);
    ASSERT_EQ(gpu.size(), host.size());
    for (std::size_t k = 0; k < host.size(); ++k) {
      if (simulated()) {
        EXPECT_EQ(gpu[k], host[k]) << "sharded " << sharded << ", tensor " << k;
        continue;
      }
      for (std::size_t i = 0; i < host[k].size(); ++i)
        ASSERT_LE(std::abs(gpu[k][i] - host[k][i]), 1e-5f + 1e-5f * std::abs(host[k][i]))
            << "sharded " << sharded << ", tensor " << k << ", element " << i;
    }
  }
}

}  // namespace
}  // namespace mirrored

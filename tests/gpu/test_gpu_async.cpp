// Asynchronous collectives and GradientBuckets on GPU replicas: the communication stream starts
// after the compute-stream work that produced the inputs, wait() orders the compute stream after
// the communication stream, results equal the synchronous call's. Skips without a GPU; on
// simulated GPUs (MIRRORED_SIMULATED_GPUS; streams on threads with random delays) an ordering
// mistake gives wrong numbers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "harness.hpp"

namespace mirrored {
namespace {

class GpuAsync : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
  }
  static std::vector<std::string> gpus() {
    std::vector<std::string> out;
    const int n = static_cast<int>(list_logical_devices(DeviceType::GPU).size());
    for (int g = 0; g < n && g < 4; ++g) out.push_back("GPU:" + std::to_string(g));
    return out;
  }
};

// A value made by a chain of kernels on the replica's compute stream: any collective that read it
// before the chain finished would see an intermediate.
Tensor<float> produced(int replica, int64_t len, const Device& d) {
  Tensor<float> x = Tensor<float>::zeros({len}, d);
  for (int k = 0; k < 8; ++k) x = x + float(replica + 1);
  return x;  // 8 (r + 1) everywhere
}

TEST_F(GpuAsync, EqualsTheSynchronousCallAndIsOrderedBetweenStreams) {
  const auto specs = gpus();
  MirroredStrategy s(specs);
  const int n = static_cast<int>(specs.size());
  for (int round = 0; round < 3; ++round) {
    auto out = s.run([&] {
      ReplicaContext* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      const Device d = s.extended().worker_devices()[static_cast<std::size_t>(r)];
      auto a = ctx->all_reduce_async(ReduceOp::SUM, produced(r, 100000, d));
      auto b = ctx->all_reduce_async(ReduceOp::MEAN, produced(r, 777, d) * 0.3f);
      // The compute stream goes on meanwhile; the results are used on it without a host wait.
      Tensor<float> busy = produced(r, 100000, d) * 2.0f;
      Tensor<float> mean = b.wait() + 1.0f;
      Tensor<float> sum = a.wait() + busy;
      Tensor<float> sync_sum = ctx->all_reduce(ReduceOp::SUM, produced(r, 100000, d)) + busy;
      Tensor<float> sync_mean = ctx->all_reduce(ReduceOp::MEAN, produced(r, 777, d) * 0.3f) + 1.0f;
      return std::make_tuple(sum.to_vector(), sync_sum.to_vector(), mean.to_vector(), sync_mean.to_vector(),
                             sum.device() == d);
    });
    const float total = 8.0f * float(n * (n + 1) / 2);
    for (int r = 0; r < n; ++r) {
      const auto& [sum, sync_sum, mean, sync_mean, on_device] = out[r];
      EXPECT_EQ(sum, std::vector<float>(100000, total + 16.0f * float(r + 1))) << "replica " << r;
      EXPECT_EQ(sum, sync_sum) << "replica " << r;
      EXPECT_EQ(mean, sync_mean) << "replica " << r;
      EXPECT_TRUE(on_device);
    }
  }
}

TEST_F(GpuAsync, BucketsOfDeviceGradients) {
  const auto specs = gpus();
  MirroredStrategy s(specs);
  const int n = static_cast<int>(specs.size());
  auto out = s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    const Device d = s.extended().worker_devices()[static_cast<std::size_t>(r)];
    GradientBuckets<float> buckets(ReduceOp::SUM, 4096);
    for (int k = 1; k <= 6; ++k) buckets.push(produced(r, 500 * k, d) * float(k));
    std::vector<std::vector<float>> got;
    for (const auto& g : buckets.finish()) got.push_back(g.to_vector());
    return got;
  });
  const float total = 8.0f * float(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(out[r].size(), 6u);
    for (int k = 1; k <= 6; ++k)
      EXPECT_EQ(out[r][static_cast<std::size_t>(k - 1)], std::vector<float>(500 * k, total * float(k)))
          << "replica " << r << " gradient " << k;
  }
}

TEST_F(GpuAsync, TheDestructorWaitsAndTheNextRunWorksAfterAFailure) {
  const auto specs = gpus();
  MirroredStrategy s(specs);
  const int n = static_cast<int>(specs.size());
  EXPECT_THROW(s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    const Device d = s.extended().worker_devices()[static_cast<std::size_t>(r)];
    auto p = ctx->all_reduce_async(ReduceOp::SUM, produced(r, 1000, d));
    if (r == 0) throw std::runtime_error("boom");
    (void)p.wait();
  }),
               std::runtime_error);
  auto out = s.run([&] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    const Device d = s.extended().worker_devices()[static_cast<std::size_t>(r)];
    { auto dropped = ctx->all_reduce_async(ReduceOp::SUM, produced(r, 1000, d)); }
    return ctx->all_reduce_async(ReduceOp::SUM, produced(r, 1000, d)).wait().to_vector();
  });
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[r], std::vector<float>(1000, 8.0f * float(n * (n + 1) / 2)));
}

}  // namespace
}  // namespace mirrored

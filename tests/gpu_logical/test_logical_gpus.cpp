// Two and four logical GPUs on physical GPU 0 (config::set_logical_gpu_devices), compared bit
// for bit with host replicas. This executable splits GPU 0 into four logical GPUs before any test
// runs (a split can be made once per process, before any GPU use); the tests use the first two
// or all four. Every test skips in SetUp when no GPU is visible. On simulated GPUs
// (MIRRORED_SIMULATED_GPUS) the checks of CUDA itself (streams, cudaMalloc counts) are left out.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include <mirrored/config.hpp>
#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"
#if MIRRORED_HAVE_CUDA
#include <mirrored/cuda.hpp>
#endif

#include "conformance.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "device/gpu/logical_gpus.hpp"
#include "device/simulated/sim_backend.hpp"
#include "device/simulated/sim_runtime.hpp"
#include "device_contracts.hpp"
#include "digits/train.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using conformance::expect_same;
using ::testing::HasSubstr;
using testing::message_of;

constexpr int kSplit = 4;

#if MIRRORED_HAVE_CUDA
bool real_cuda() { return std::string(detail::gpu_runtime().name()) == "CUDA"; }
#endif

// Device allocations (cudaMalloc, or the simulated chip's) of a logical GPU's allocator so far.
unsigned long long device_allocations(const Device& d) {
#if MIRRORED_HAVE_CUDA
  if (real_cuda()) return cuda::allocator_stats(d).device_allocations;
#endif
  return detail::simulated_backend(d)->allocator_stats().device_allocations;
}

class SplitGpuZero : public ::testing::Environment {
 public:
  void SetUp() override {
    if (detail::gpu_runtime().physical_gpu_count() > 0) config::set_logical_gpu_devices(0, kSplit);
  }
};
[[maybe_unused]] const auto* const kEnvironment = ::testing::AddGlobalTestEnvironment(new SplitGpuZero);

std::vector<std::string> specs(const char* type, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(std::string(type) + ":" + std::to_string(i));
  return out;
}

class LogicalGpus : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
  }
  int n() const { return GetParam(); }
  std::vector<std::string> gpus() const { return specs("GPU", n()); }
  std::vector<std::string> cpus() const { return specs("CPU", n()); }
};

TEST_P(LogicalGpus, AreLogicalGpusOfPhysicalGpuZero) {
  EXPECT_EQ(static_cast<int>(list_logical_devices(DeviceType::GPU).size()),
            detail::gpu_runtime().physical_gpu_count() + kSplit - 1);
  for (int i = 0; i < kSplit; ++i) EXPECT_EQ(detail::logical_gpu_location(i), std::make_pair(0, i));
#if MIRRORED_HAVE_CUDA
  if (!real_cuda()) return;
  std::vector<cudaStream_t> streams;
  for (const auto& g : gpus()) {
    EXPECT_EQ(cuda::physical_device(Device::parse(g)), 0);
    streams.push_back(cuda::stream(Device::parse(g)));
  }
  for (std::size_t i = 1; i < streams.size(); ++i) EXPECT_NE(streams[i], streams[0]) << "one stream per logical GPU";
#endif
}

TEST_P(LogicalGpus, CopiesAndReductionHelpersAreCompleteOnReturn) {
  std::vector<Device> devices = {cpu0};
  for (const auto& g : gpus()) devices.push_back(Device::parse(g));  // logical GPUs of one chip
  contracts::expect_complete_on_return(devices);
}

TEST_P(LogicalGpus, ReduceToOneDeviceByDefault) {
  MirroredStrategy s(gpus());
  EXPECT_EQ(s.extended().cross_device_ops().name(), "ReductionToOneDevice");
}

TEST_P(LogicalGpus, CollectivesMatchTheHost) {
  expect_same(conformance::collectives(cpus()), conformance::collectives(gpus()), "default ops");
  expect_same(conformance::ordered_sums(cpus()), conformance::ordered_sums(gpus()), "ordered sums");
}

TEST_P(LogicalGpus, DistributedInputLandsOnEachGpuAndMatchesTheHost) {
  expect_same(conformance::distributed_input(cpus()), conformance::distributed_input(gpus()), "input pipeline");
}

TEST_P(LogicalGpus, ReduceGatherAndMergeCallMatchTheHost) {
  expect_same(conformance::reduce_and_gather(cpus()), conformance::reduce_and_gather(gpus()), "default ops");
}

TEST_P(LogicalGpus, VariablesMatchTheHost) {
  expect_same(conformance::variables(cpus()), conformance::variables(gpus()), "default ops");
}

TEST_P(LogicalGpus, ExplicitOpsMatchTheHost) {
  const auto reference = conformance::collectives(cpus());
  // A reduction device given: the general path (staged sums, copies), not the one-kernel one.
  expect_same(reference, conformance::collectives(gpus(), std::make_shared<ReductionToOneDevice>("GPU:1")),
              "ReductionToOneDevice(GPU:1)");
  expect_same(reference, conformance::collectives(gpus(), std::make_shared<ReductionToOneDevice>("CPU:0")),
              "ReductionToOneDevice(CPU:0)");
  expect_same(reference, conformance::collectives(gpus(), std::make_shared<HierarchicalCopyAllReduce>()),
              "HierarchicalCopyAllReduce");
  expect_same(conformance::variables(cpus()),
              conformance::variables(gpus(), std::make_shared<HierarchicalCopyAllReduce>()),
              "HierarchicalCopyAllReduce variables");
}

TEST_P(LogicalGpus, MixedWithHostReplicas) {
  std::vector<std::string> mixed = gpus();
  mixed[1] = "CPU:0";
  expect_same(conformance::collectives(cpus()), conformance::collectives(mixed), "mixed");
  expect_same(conformance::variables(cpus()), conformance::variables(mixed), "mixed variables");
}

TEST_P(LogicalGpus, NcclRefusesTwoReplicasOnOneChip) {
  if (!detail::nccl_compiled_in()) GTEST_SKIP() << "this build has no NCCL";
  MirroredStrategy s(gpus(), std::make_shared<NcclAllReduce>());
  const auto devices = s.extended().worker_devices();
  const std::string msg = message_of<InvalidArgumentError>([&] {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({4}, 1, devices[r]));
    });
  });
  EXPECT_THAT(msg, HasSubstr("same physical GPU 0"));
  EXPECT_THAT(msg, HasSubstr("ReductionToOneDevice"));
  // Numbers (host tensors) still go through the host path.
  EXPECT_EQ(s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 2); })[0], 2 * n());
}

TEST_P(LogicalGpus, SteadyStateCollectivesDoNotAllocateDeviceMemory) {
  MirroredStrategy s(gpus());
  const auto devices = s.extended().worker_devices();
  auto step = [&] {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      auto x = Tensor<float>::full({4096, 3}, float(r), devices[r]);
      return get_replica_context()->all_reduce(ReduceOp::SUM, std::make_tuple(x, x * 2.0f, 1.0f));
    });
  };
  for (int i = 0; i < 3; ++i) step();
  std::vector<unsigned long long> before;
  for (const auto& d : devices) before.push_back(device_allocations(d));
  for (int i = 0; i < 30; ++i) step();
  for (std::size_t r = 0; r < devices.size(); ++r) EXPECT_EQ(device_allocations(devices[r]), before[r]) << devices[r];
}

TEST_P(LogicalGpus, TrainingGivesTheHostsWeights) {
  // Batches, weights and gradients go through the logical GPUs (the model's math is on the host):
  // the same weights as host replicas, bit for bit.
  static const digits::Split data = digits::split_digits(digits::load_digits(digits::default_digits_path()), 0.2, 7);
  auto train = [&](const std::vector<std::string>& devices) {
    MirroredStrategy s(devices);
    digits::TrainConfig cfg;
    cfg.epochs = 1;
    cfg.global_batch = 32;
    const auto result = digits::train(s, data, cfg);
    std::vector<std::vector<float>> w;
    for (const auto& v : result.variables)
      for (const auto& c : v.components()) w.push_back(c.to_vector());
    return w;
  };
  EXPECT_EQ(train(gpus()), train(cpus()));
}

INSTANTIATE_TEST_SUITE_P(OnGpuZero, LogicalGpus, ::testing::Values(2, 4),
                         [](const auto& info) { return std::to_string(info.param) + "logical"; });

// A resolver of one local worker that says it is `place` among the workers of its machine.
class PlacedResolver : public ClusterResolver {
 public:
  explicit PlacedResolver(LocalPlacement place) : place_(std::move(place)) {}
  ClusterSpec cluster_spec() const override { return {}; }
  std::string task_type() const override { return ""; }
  int task_id() const override { return 0; }
  LocalPlacement local_placement() const override { return place_; }

 private:
  LocalPlacement place_;
};

std::vector<std::string> default_devices_of(const LocalPlacement& place) {
  MultiWorkerMirroredStrategy s(CommunicationOptions{}, std::make_shared<PlacedResolver>(place));
  std::vector<std::string> out;
  for (const auto& d : s.extended().worker_devices()) out.push_back(d.short_name());
  return out;
}

// The machine's workers share out its physical GPUs, each with every logical GPU split from it:
// the first half of them takes GPU 0's four logical GPUs, the second half never one of them.
TEST(LogicalGpuSplit, WorkersOfAMachineShareOutPhysicalGpus) {
  const int physical = detail::gpu_runtime().physical_gpu_count();
  if (physical < 2 || physical % 2 != 0) GTEST_SKIP() << "needs an even number of GPUs, this process sees " << physical;
  // Chip 0 is logical GPUs 0-3; chip c >= 1 is logical GPU kSplit - 1 + c.
  std::vector<std::string> first = specs("GPU", kSplit), second;
  for (int c = 1; c < physical / 2; ++c) first.push_back("GPU:" + std::to_string(kSplit - 1 + c));
  for (int c = physical / 2; c < physical; ++c) second.push_back("GPU:" + std::to_string(kSplit - 1 + c));
  EXPECT_EQ(default_devices_of({0, 2, 0, "test's"}), first);
  EXPECT_EQ(default_devices_of({1, 2, 0, "test's"}), second);
  EXPECT_EQ(default_devices_of({}), specs("GPU", kSplit + physical - 1));  // alone: every logical GPU
}

TEST(LogicalGpuSplit, CannotChangeOnceGpusAreUsed) {
  if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
  (void)Tensor<float>::zeros({1}, Device(DeviceType::GPU, 0));
  EXPECT_THROW(config::set_logical_gpu_devices(0, 2), FailedPreconditionError);
}

}  // namespace
}  // namespace mirrored

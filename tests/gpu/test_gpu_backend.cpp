// The GPU backend: tensors, copies, streams, the caching allocator, errors, and the conformance
// scenarios (conformance.hpp) compared bit for bit with the host backend's. Built in every
// configuration; every test skips in SetUp when no GPU is visible. Under simulated GPUs
// (MIRRORED_SIMULATED_GPUS) every device-generic test runs against them; the tests of CUDA itself
// (mirrored::cuda, the allocator's cudaMalloc counts) skip there.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/checkpoint.hpp>
#include <mirrored/config.hpp>
#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"
#if MIRRORED_HAVE_CUDA
#include <mirrored/cuda.hpp>
#endif

#include "conformance.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "device/simulated/sim_backend.hpp"
#include "device/simulated/sim_runtime.hpp"
#include "device_contracts.hpp"
#include "digits/train.hpp"
#include "harness.hpp"
#if MIRRORED_HAVE_CUDA
#include "device/cuda/cuda_backend.hpp"
#endif

namespace mirrored {
namespace {

using conformance::expect_same;
using ::testing::HasSubstr;
using testing::message_of;

class Gpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
  }
  static int gpus() { return static_cast<int>(list_logical_devices(DeviceType::GPU).size()); }
};

// Tests of CUDA itself: they skip on simulated GPUs.
class CudaGpu : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    if (IsSkipped()) return;
    if (std::string(detail::gpu_runtime().name()) != "CUDA")
      GTEST_SKIP() << "needs real CUDA GPUs: the GPUs are " << detail::gpu_runtime().name();
  }
};

TEST_F(Gpu, TensorOpsMatchTheHostBackend) {
  expect_same(conformance::tensor_ops("CPU:0"), conformance::tensor_ops("GPU:0"), "GPU:0");
}

TEST_F(Gpu, DistributedInputLandsOnTheGpuAndMatchesTheHost) {
  expect_same(conformance::distributed_input({"CPU:0"}), conformance::distributed_input({"GPU:0"}), "GPU:0");
}

TEST_F(Gpu, CollectivesOnOneGpuMatchTheHost) {
  expect_same(conformance::collectives({"CPU:0"}), conformance::collectives({"GPU:0"}), "collectives on GPU:0");
  expect_same(conformance::ordered_sums({"CPU:0"}), conformance::ordered_sums({"GPU:0"}), "ordered sums on GPU:0");
}

TEST_F(Gpu, ReduceGatherAndMergeCallOnOneGpuMatchTheHost) {
  expect_same(conformance::reduce_and_gather({"CPU:0"}), conformance::reduce_and_gather({"GPU:0"}), "GPU:0");
}

TEST_F(Gpu, VariablesOnOneGpuMatchTheHost) {
  expect_same(conformance::variables({"CPU:0"}), conformance::variables({"GPU:0"}), "GPU:0");
}

TEST_F(Gpu, MixedHostAndGpuReplicasMatchTheHost) {
  const std::vector<std::string> mixed = {"CPU:0", "GPU:0"}, host = {"CPU:0", "CPU:1"};
  {
    MirroredStrategy s(mixed);
    EXPECT_EQ(s.extended().cross_device_ops().name(), "ReductionToOneDevice");
  }
  expect_same(conformance::collectives(host), conformance::collectives(mixed), "collectives CPU:0 + GPU:0");
  expect_same(conformance::ordered_sums(host), conformance::ordered_sums(mixed), "ordered sums CPU:0 + GPU:0");
  expect_same(conformance::reduce_and_gather(host), conformance::reduce_and_gather(mixed), "reduce CPU:0 + GPU:0");
  expect_same(conformance::variables(host), conformance::variables(mixed), "variables CPU:0 + GPU:0");
  auto hier = [] { return std::make_shared<HierarchicalCopyAllReduce>(); };
  expect_same(conformance::collectives(host), conformance::collectives(mixed, hier()), "hierarchical CPU:0 + GPU:0");
  const std::vector<std::string> gpu_first = {"GPU:0", "CPU:1"};
  expect_same(conformance::collectives(host), conformance::collectives(gpu_first), "collectives GPU:0 + CPU:1");
}

TEST_F(Gpu, HalfMeanReducedOnAGpuRoundsOnceAsOnTheHost) {
  // Three replicas of 683: the sum 2049 is not a float16 (it would round to 2048, and 2048 / 3 to
  // 682.5), but 2049 / 3 = 683 is. With a GPU first, ReductionToOneDevice sums on the GPU.
  for (const std::vector<std::string>& devices :
       {std::vector<std::string>{"GPU:0", "CPU:1", "CPU:2"}, std::vector<std::string>{"CPU:0", "CPU:1", "CPU:2"}}) {
    MirroredStrategy s(devices);
    auto out = s.run([] {
      const auto x = Tensor<float16>::from_vector({float16(683.0f), float16(-683.0f)}, {2});
      return get_replica_context()->all_reduce(ReduceOp::MEAN, x);
    });
    for (int r = 0; r < 3; ++r) {
      const auto v = out[r].to_vector();
      ASSERT_EQ(v.size(), 2u);
      EXPECT_EQ(static_cast<float>(v[0]), 683.0f) << devices[0] << ", replica " << r;
      EXPECT_EQ(static_cast<float>(v[1]), -683.0f) << devices[0] << ", replica " << r;
    }
  }
}

TEST_F(Gpu, DefaultStrategyTakesEveryGpu) {
  MirroredStrategy s;
  EXPECT_EQ(s.extended().worker_devices(), list_logical_devices(DeviceType::GPU));
  // Distinct physical GPUs: NCCL when it can serve them (a build with NCCL, real GPUs).
  EXPECT_EQ(s.extended().cross_device_ops().name(), detail::nccl_can_run() ? "NcclAllReduce" : "ReductionToOneDevice");
}

TEST_F(Gpu, TrainingOnAGpuGivesTheHostsWeights) {
  // The model's math runs on the host either way; the GPU run moves batches, weights and
  // gradients through the device, which must not change a bit.
  static const digits::Split data = digits::split_digits(digits::load_digits(digits::default_digits_path()), 0.2, 7);
  auto train = [&](const std::string& device) {
    MirroredStrategy s({device});
    digits::TrainConfig cfg;
    cfg.epochs = 2;
    cfg.global_batch = 30;
    cfg.optimizer = "adam";
    const auto result = digits::train(s, data, cfg);
    std::vector<std::vector<float>> w;
    for (const auto& v : result.variables) w.push_back(v.components()[0].to_vector());
    return std::make_pair(w, result.test_accuracy);
  };
  const auto host = train("CPU:0");
  const auto gpu = train("GPU:0");
  EXPECT_EQ(gpu.first, host.first);
  EXPECT_EQ(gpu.second, host.second);
  EXPECT_GT(gpu.second, 0.85);
}

TEST_F(Gpu, CopiesAndReductionHelpersAreCompleteOnReturn) {
  std::vector<Device> devices = {cpu0, Device(DeviceType::GPU, 0)};
  if (gpus() > 1) devices.push_back(Device(DeviceType::GPU, 1));  // another physical GPU
  contracts::expect_complete_on_return(devices);
}

// Saving reads GPU tensors into the file: values computed just before (still queued on the
// device) must be the ones saved.
TEST_F(Gpu, CheckpointsOfGpuTensorsHoldTheirValues) {
  const Device gpu0(DeviceType::GPU, 0);
  std::vector<int64_t> values(detail::kCheckpointChunkBytes / sizeof(int64_t) * 2 + 1000);  // > 2 write chunks
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int64_t>(i) * 3 - 7;
  const auto x = Tensor<int64_t>::from_vector(values, {int64_t(values.size())}, gpu0) * int64_t{2} + int64_t{1};
  const auto y = Tensor<float>::full({3, 4}, 0.5f, gpu0) + 2.0f;
  const std::string path = ::testing::TempDir() + "mirrored_gpu_checkpoint.safetensors";
  checkpoint::save_tensors(path, {{"x", checkpoint::untyped(x)}, {"y", checkpoint::untyped(y)}});
  const auto loaded = checkpoint::load(path);
  std::remove(path.c_str());
  std::vector<int64_t> expected(values.size());
  for (std::size_t i = 0; i < values.size(); ++i) expected[i] = values[i] * 2 + 1;
  EXPECT_EQ(loaded.get<int64_t>("x").to_vector(), expected);
  EXPECT_EQ(loaded.get<float>("y").to_vector(), std::vector<float>(12, 2.5f));
}

TEST_F(Gpu, ErrorsAreTyped) {
  const Device gpu0(DeviceType::GPU, 0);
  // Far more than any GPU has: the allocator gives up with UnavailableError naming the device.
  const std::string oom = message_of<UnavailableError>([&] { (void)Tensor<float>::empty({int64_t{1} << 45}, gpu0); });
  EXPECT_THAT(oom, HasSubstr("out of memory on GPU:0 (physical GPU 0)"));
  // Inside run the replica is named too.
  MirroredStrategy s({"GPU:0"});
  const std::string in_run =
      message_of<UnavailableError>([&] { s.run([&] { (void)Tensor<float>::empty({int64_t{1} << 45}, gpu0); }); });
  EXPECT_THAT(in_run, HasSubstr("replica 0"));
  // The strategy is still usable.
  EXPECT_EQ(s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 3); })[0], 3);
  EXPECT_THROW((void)Tensor<float>::zeros({1}, Device(DeviceType::GPU, gpus())), NotFoundError);
}

// The allocator statistics of a GPU's backend (the CUDA or the simulated one).
detail::CachingAllocatorStats allocator_stats_of(const Device& d) {
#if MIRRORED_HAVE_CUDA
  if (std::string(detail::gpu_runtime().name()) == "CUDA") return detail::cuda_backend(d).allocator_stats();
#endif
  return detail::simulated_backend(d)->allocator_stats();
}

TEST_F(Gpu, SteadyStateStepsDoNotAllocateDeviceMemory) {
  MirroredStrategy s({"GPU:0"});
  const Device d(DeviceType::GPU, 0);
  auto step = [&] {
    s.run([&] {
      auto x = Tensor<float>::full({1000, 33}, 2.0f, d);
      auto y = (x * x + 1.0f) / 3.0f;
      auto z = get_replica_context()->all_reduce(ReduceOp::MEAN, y);
      return cast<double>(z).to_vector().size();
    });
  };
  for (int i = 0; i < 3; ++i) step();
  const auto before = allocator_stats_of(d);
  for (int i = 0; i < 50; ++i) step();
  const auto after = allocator_stats_of(d);
  EXPECT_EQ(after.device_allocations, before.device_allocations);
  EXPECT_GT(after.cache_hits, before.cache_hits);
#if MIRRORED_HAVE_CUDA
  if (std::string(detail::gpu_runtime().name()) == "CUDA") {
    EXPECT_EQ(cuda::allocator_stats(d).device_allocations, after.device_allocations);
    cuda::empty_cache(d);
    EXPECT_EQ(cuda::allocator_stats(d).bytes_cached, 0u);
  }
#endif
}

#if MIRRORED_HAVE_CUDA

TEST_F(CudaGpu, TensorsLiveInDeviceMemoryOfTheirGpu) {
  for (int g = 0; g < gpus(); ++g) {
    const Device d(DeviceType::GPU, g);
    const auto t = Tensor<double>::full({5}, 1.5, d);
    cudaPointerAttributes attr{};
    ASSERT_EQ(cudaPointerGetAttributes(&attr, t.data()), cudaSuccess);
    EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
    EXPECT_EQ(attr.device, cuda::physical_device(d));
    EXPECT_EQ(t.device(), d);
  }
}

TEST_F(CudaGpu, PinnedAndPageableHostMemoryRoundTrip) {
  const Device d(DeviceType::GPU, 0);
  auto& be = detail::backend_for(d);
  constexpr std::size_t kBytes = (std::size_t{9} << 20) + 12;  // several staging slots, odd tail
  void* pinned = nullptr;
  ASSERT_EQ(cudaHostAlloc(&pinned, kBytes, cudaHostAllocDefault), cudaSuccess);
  std::vector<unsigned char> pageable(kBytes), back(kBytes);
  for (std::size_t i = 0; i < kBytes; ++i) pageable[i] = static_cast<unsigned char>(i * 7 + 3);
  std::memcpy(pinned, pageable.data(), kBytes);
  void* dev = be.allocate(kBytes);
  be.copy_from_host(dev, pinned, kBytes);     // direct DMA
  be.copy_to_host(back.data(), dev, kBytes);  // staged
  EXPECT_EQ(back, pageable);
  std::memset(pinned, 0, kBytes);
  be.copy_from_host(dev, pageable.data(), kBytes);  // staged
  be.copy_to_host(pinned, dev, kBytes);             // direct DMA
  EXPECT_EQ(std::memcmp(pinned, pageable.data(), kBytes), 0);
  be.deallocate(dev, kBytes);
  cudaFreeHost(pinned);
}

TEST_F(CudaGpu, RunMakesEachReplicasDeviceCurrentAndGivesItsStream) {
  std::vector<std::string> specs;
  for (int g = 0; g < gpus() && g < 4; ++g) specs.push_back("GPU:" + std::to_string(g));
  MirroredStrategy s(specs);
  const auto& devices = s.extended().worker_devices();
  for (int round = 0; round < 2; ++round) {
    auto seen = s.run([&] {
      int current = -1;
      cudaGetDevice(&current);
      const int r = get_replica_context()->replica_id_in_sync_group();
      const bool same_stream = cuda::current_stream() == cuda::stream(devices[static_cast<std::size_t>(r)]);
      cudaSetDevice(0);  // a user's change does not leak into the next run's other replicas
      return std::make_pair(current, same_stream);
    });
    for (std::size_t r = 0; r < devices.size(); ++r) {
      EXPECT_EQ(seen[r].first, cuda::physical_device(devices[r])) << "replica " << r;
      EXPECT_TRUE(seen[r].second);
    }
  }
  EXPECT_THROW(cuda::current_stream(), FailedPreconditionError);
  EXPECT_THROW(cuda::stream(Device(DeviceType::CPU, 0)), InvalidArgumentError);
}

TEST_F(CudaGpu, UserWorkOnTheReplicaStreamIsOrderedWithTheLibrarys) {
  MirroredStrategy s({"GPU:0"});
  auto out = s.run([] {
    auto x = Tensor<int32_t>::full({1 << 20}, 5, Device(DeviceType::GPU, 0));
    // The user's own work on the replica's stream, no synchronisation: the library's next
    // operation on x comes after it.
    cudaMemsetAsync(x.data(), 0, x.bytes() / 2, cuda::current_stream());
    return get_replica_context()->all_reduce(ReduceOp::SUM, x + 1).to_vector();
  });
  EXPECT_EQ(out[0][0], 1);
  EXPECT_EQ(out[0][(1 << 19) - 1], 1);
  EXPECT_EQ(out[0][1 << 19], 6);
}

#endif  // MIRRORED_HAVE_CUDA

}  // namespace
}  // namespace mirrored

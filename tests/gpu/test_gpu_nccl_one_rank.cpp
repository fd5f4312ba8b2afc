// NCCL on one GPU: a one-rank communicator is legal, and MIRRORED_NCCL_SINGLE_RANK=1 (a test-only
// switch, set for this whole executable below) sends a single GPU replica through the real NCCL
// path instead of a plain copy. So the single-GPU tests of this executable that use the default
// ops (NcclAllReduce for one GPU when NCCL can serve it) run NCCL too, and the tests here cover
// what the two-GPU tests would: all_reduce, all_gather, batch_all_reduce, a failed replica, the
// deadline, abort and re-creation. They skip without a GPU, without NCCL, and on simulated GPUs.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <mirrored/config.hpp>
#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"
#if MIRRORED_HAVE_CUDA
#include <chrono>
#include <thread>

#include <mirrored/cuda.hpp>
#endif

#include "conformance.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using conformance::expect_same;
using ::testing::HasSubstr;

// Before main: before any NcclAllReduce is made and before any thread exists (setenv is not safe
// beside other threads' getenv).
[[maybe_unused]] const bool kSingleRank = [] {
  ::setenv("MIRRORED_NCCL_SINGLE_RANK", "1", 1);
  return true;
}();

class NcclOneRank : public ::testing::Test {
 protected:
  void SetUp() override {
    if (list_logical_devices(DeviceType::GPU).empty()) GTEST_SKIP() << "no GPU visible to this process";
    if (!detail::nccl_can_run())
      GTEST_SKIP() << "NCCL cannot serve these GPUs (" << detail::gpu_runtime().name() << " runtime, NCCL "
                   << (detail::nccl_compiled_in() ? "compiled in" : "not compiled in") << ")";
  }
};

TEST_F(NcclOneRank, IsTheDefaultForOneGpu) {
  MirroredStrategy s({"GPU:0"});
  EXPECT_EQ(s.extended().cross_device_ops().name(), "NcclAllReduce");
}

TEST_F(NcclOneRank, CollectivesMatchTheHost) {
  const auto reference = conformance::collectives({"CPU:0"});
  for (int packs : {0, 1, 3}) {
    expect_same(reference, conformance::collectives({"GPU:0"}, std::make_shared<NcclAllReduce>(packs)),
                "one-rank NcclAllReduce(" + std::to_string(packs) + ")");
  }
}

// reduce_to / batch_reduce_to onto a mirrored variable: batch_all_reduce with one rank.
TEST_F(NcclOneRank, BatchReduceAndVariablesMatchTheHost) {
  expect_same(conformance::reduce_and_gather({"CPU:0"}),
              conformance::reduce_and_gather({"GPU:0"}, std::make_shared<NcclAllReduce>()), "reduce");
  expect_same(conformance::variables({"CPU:0"}), conformance::variables({"GPU:0"}, std::make_shared<NcclAllReduce>()),
              "variables");
}

TEST_F(NcclOneRank, StrategyStaysUsableAfterTheReplicaFails) {
  MirroredStrategy s({"GPU:0"}, std::make_shared<NcclAllReduce>());
  const Device gpu0(DeviceType::GPU, 0);
  auto step = [&](bool fail) {
    return s.run([&] {
      auto sum = get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({1000}, 2, gpu0));
      if (fail) throw InvalidArgumentError("the replica gives up after its collective");
      return sum.to_vector()[999];
    });
  };
  EXPECT_EQ(step(false)[0], 2.0f);
  EXPECT_THROW(step(true), InvalidArgumentError);
  EXPECT_EQ(step(false)[0], 2.0f);
}

// The sharded optimizer step through the one-rank communicator (NcclAllReduce::all_reduce_and_update:
// a grouped reduce-scatter, the fused update of the slice and a grouped all-gather on the
// replica's stream, one wait): the unsharded step's weights and slots, bit for bit (integer-valued
// gradients: every sum is exact).
TEST_F(NcclOneRank, ShardedStepGivesTheUnshardedBits) {
  const Device gpu0(DeviceType::GPU, 0);
  auto train = [&](bool sharded) {
    MirroredStrategy s({"GPU:0"}, std::make_shared<NcclAllReduce>());
    const std::vector<Shape> shapes{{7, 3}, {1000}, {1}};
    std::vector<Variable<float>> vars;
    {
      auto scope = s.scope();
      for (const Shape& shape : shapes) vars.emplace_back(Tensor<float>::full(shape, 0.25f));
    }
    optimizers::Adam<float> adam({.learning_rate = 0.01, .shard_optimizer_state = sharded});
    for (int step = 0; step < 3; ++step) {
      s.run([&] {
        optimizers::GradsAndVars<float> gv;
        for (std::size_t k = 0; k < vars.size(); ++k)
          gv.emplace_back(Tensor<float>::full(shapes[k], static_cast<float>(step + static_cast<int>(k)) - 2.0f, gpu0),
                          vars[k]);
        adam.apply_gradients(gv);
      });
    }
    std::vector<std::vector<float>> out;
    for (const auto& v : vars) {
      out.push_back(v.components()[0].to_vector());
      out.push_back(adam.get_slot(v, "m").value().to_vector());
      out.push_back(adam.get_slot(v, "v").value().to_vector());
    }
    out.push_back({static_cast<float>(adam.iterations())});
    return out;
  };
  const auto sharded = train(true);
  EXPECT_EQ(sharded, train(false));
  EXPECT_EQ(sharded.back()[0], 3.0f);
}

#if MIRRORED_HAVE_CUDA
// The fused sharded step's one wait has the step's deadline: behind a stalled stream it raises
// DeadlineExceededError, having aborted the communicator, and changes nothing (the step commits
// only once it completed); once the stream is free the next step makes a new communicator and
// completes.
TEST_F(NcclOneRank, AStalledShardedStepMissesItsDeadlineAndTheNextOneRuns) {
  MirroredStrategy s({"GPU:0"}, std::make_shared<NcclAllReduce>());
  const Device gpu0(DeviceType::GPU, 0);
  std::optional<Variable<float>> w;
  {
    auto scope = s.scope();
    w.emplace(Tensor<float>::full({1 << 16}, 1.0f));
  }
  // With momentum: plain SGD has no slots, so nothing to shard, and its step would not be sharded.
  optimizers::SGD<float> sgd({.learning_rate = 1.0, .momentum = 0.5, .shard_optimizer_state = true});
  sgd.communication.timeout_seconds = 1;
  auto step = [&](bool stall) {
    s.run([&] {
      if (stall) {
        cudaLaunchHostFunc(
            cuda::current_stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(4)); }, nullptr);
      }
      sgd.apply_gradients({{Tensor<float>::full({1 << 16}, 2.0f, gpu0), *w}});
    });
  };
  const std::string msg = testing::message_of<DeadlineExceededError>([&] { step(true); });
  EXPECT_THAT(msg, HasSubstr("apply_gradients"));
  EXPECT_THAT(msg, HasSubstr("communicators were aborted"));
  ASSERT_EQ(cudaStreamSynchronize(cuda::stream(gpu0)), cudaSuccess);
  // The failed step changed nothing: neither the weights nor the step count.
  EXPECT_EQ(w->components()[0].to_vector(), std::vector<float>(1 << 16, 1.0f));
  EXPECT_EQ(sgd.iterations(), 0);
  step(false);
  EXPECT_EQ(w->components()[0].to_vector(), std::vector<float>(1 << 16, -1.0f));
  EXPECT_EQ(sgd.iterations(), 1);
}

// The replica's stream is busy (a host function sleeping 4 s) when the all-reduce is enqueued
// behind it: the collective cannot complete within its 1 s deadline. The communicator is aborted,
// DeadlineExceededError is raised, and once the stream is free the next collective makes a new
// communicator and succeeds.
TEST_F(NcclOneRank, ADeadlineAbortsTheCommunicatorAndTheNextCollectiveMakesANewOne) {
  MirroredStrategy s({"GPU:0"}, std::make_shared<NcclAllReduce>());
  const Device gpu0(DeviceType::GPU, 0);
  auto step = [&](bool stall) {
    return s.run([&] {
      auto x = Tensor<float>::full({1 << 16}, 3, gpu0);
      if (stall) {
        cudaLaunchHostFunc(
            cuda::current_stream(), [](void*) { std::this_thread::sleep_for(std::chrono::seconds(4)); }, nullptr);
      }
      CommunicationOptions o;
      o.timeout_seconds = 1;
      return get_replica_context()->all_reduce(ReduceOp::SUM, x, o).to_vector()[0];
    });
  };
  const std::string msg = testing::message_of<DeadlineExceededError>([&] { step(true); });
  EXPECT_THAT(msg, HasSubstr("within 1 s"));
  EXPECT_THAT(msg, HasSubstr("communicators were aborted"));
  ASSERT_EQ(cudaStreamSynchronize(cuda::stream(gpu0)), cudaSuccess);
  EXPECT_EQ(step(false)[0], 3.0f);
}
#endif  // MIRRORED_HAVE_CUDA

}  // namespace
}  // namespace mirrored

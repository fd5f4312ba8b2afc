// Replicas on distinct physical GPUs (skipped unless the machine has at least two): the default
// ops and the device-generic ones against host runs (also on simulated GPUs), and NcclAllReduce
// (real GPUs with NCCL only): the default choice, results equal to the host's bit for bit (the
// scenarios' inputs make every sum exact in any order), failure and deadline.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

#include <mirrored/mirrored.hpp>
#include "collectives/ops_selection.hpp"

#include "conformance.hpp"
#include "device/gpu/gpu_runtime.hpp"
#include "gpu_test_util.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using conformance::expect_same;
using ::testing::HasSubstr;

class MultiGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    auto gpus = testing::visible_gpus(2, 4);
    if (!gpus.skip.empty()) GTEST_SKIP() << gpus.skip;
    gpu_specs_ = std::move(gpus.gpus);
    cpu_specs_ = std::move(gpus.cpus);
  }
  std::vector<std::string> gpu_specs_, cpu_specs_;
};

class Nccl : public MultiGpu {
 protected:
  void SetUp() override {
    MultiGpu::SetUp();
    if (IsSkipped()) return;
    if (!detail::nccl_can_run())
      GTEST_SKIP() << "NCCL cannot serve these GPUs (" << detail::gpu_runtime().name() << " runtime, NCCL "
                   << (detail::nccl_compiled_in() ? "compiled in" : "not compiled in") << ")";
  }
};

TEST_F(Nccl, IsTheDefaultForDistinctPhysicalGpus) {
  MirroredStrategy s(gpu_specs_);
  EXPECT_EQ(s.extended().cross_device_ops().name(), "NcclAllReduce");
}

TEST_F(Nccl, CollectivesMatchTheHost) {
  const auto reference = conformance::collectives(cpu_specs_);
  for (int packs : {0, 1, 3}) {
    expect_same(reference, conformance::collectives(gpu_specs_, std::make_shared<NcclAllReduce>(packs)),
                "NcclAllReduce(" + std::to_string(packs) + ")");
  }
}

TEST_F(MultiGpu, DefaultOpsMatchTheHost) {
  expect_same(conformance::collectives(cpu_specs_), conformance::collectives(gpu_specs_), "collectives");
  expect_same(conformance::distributed_input(cpu_specs_), conformance::distributed_input(gpu_specs_), "input");
}

TEST_F(MultiGpu, ReduceGatherMergeCallAndVariablesMatchTheHost) {
  expect_same(conformance::reduce_and_gather(cpu_specs_), conformance::reduce_and_gather(gpu_specs_), "reduce");
  expect_same(conformance::variables(cpu_specs_), conformance::variables(gpu_specs_), "variables");
}

TEST_F(MultiGpu, OtherOpsOnPhysicalGpusMatchTheHost) {
  expect_same(conformance::collectives(cpu_specs_),
              conformance::collectives(gpu_specs_, std::make_shared<ReductionToOneDevice>()), "ReductionToOneDevice");
  expect_same(conformance::ordered_sums(cpu_specs_),
              conformance::ordered_sums(gpu_specs_, std::make_shared<ReductionToOneDevice>()), "ordered sums");
  if (gpu_specs_.size() % 2 == 0) {
    expect_same(conformance::collectives(cpu_specs_),
                conformance::collectives(gpu_specs_, std::make_shared<HierarchicalCopyAllReduce>()), "hierarchical");
  }
}

TEST_F(MultiGpu, StrategyStaysUsableAfterAReplicaFails) {
  MirroredStrategy s(gpu_specs_);
  const auto devices = s.extended().worker_devices();
  auto step = [&](bool fail) {
    return s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      if (fail && r == 1) throw InvalidArgumentError("replica 1 gives up");
      return get_replica_context()
          ->all_reduce(ReduceOp::SUM, Tensor<float>::full({1000}, 1, devices[r]))
          .to_vector()[0];
    });
  };
  EXPECT_EQ(step(false)[0], float(devices.size()));
  EXPECT_THROW(step(true), InvalidArgumentError);
  EXPECT_EQ(step(false)[1], float(devices.size()));
}

// Replica 1 skips its NCCL call (and stays away longer than the deadline, so that its own wait
// at the end of the collective does not time out first): replica 0's collective can never
// complete. Its deadline aborts the communicators and raises DeadlineExceededError; the next
// collective creates new ones.
class SkipsReplicaOne : public NcclAllReduce {
 public:
  std::atomic<bool> skip{true};
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    if (skip && step.replica() == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(6));
      return;
    }
    NcclAllReduce::all_reduce(op, step);
  }
};

TEST_F(Nccl, ACollectivePastItsDeadlineAbortsTheCommunicators) {
  auto ops = std::make_shared<SkipsReplicaOne>();
  MirroredStrategy s(gpu_specs_, ops);
  const auto devices = s.extended().worker_devices();
  auto step = [&] {
    return s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      CommunicationOptions o;
      o.timeout_seconds = 3;
      return get_replica_context()
          ->all_reduce(ReduceOp::SUM, Tensor<float>::full({1 << 16}, 1, devices[r]), o)
          .to_vector()[0];
    });
  };
  const std::string msg = testing::message_of<DeadlineExceededError>([&] { step(); });
  // Depending on when NCCL notices the missing peer: not completed, or not even enqueued.
  EXPECT_THAT(msg, HasSubstr("within 3 s"));
  EXPECT_THAT(msg, HasSubstr("communicators were aborted"));
  ops->skip = false;
  EXPECT_EQ(step()[0], float(devices.size()));
}

}  // namespace
}  // namespace mirrored

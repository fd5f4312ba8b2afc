// CollectivePlan (collectives/collective_plan.hpp) in the cross-replica context, with a double of
// its cross-worker stage: a pretend second worker whose contribution, agreement and failures the
// test scripts. Checks exact results of the normal paths, and that a stage's error reaches the
// caller as it was thrown and fails the job (WorkerStage::local_failure) with the same cause.
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "collectives/collective_group.hpp"
#include "collectives/collective_plan.hpp"
#include "collectives/worker_stage.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/errors.hpp"
#include "util/exceptions.hpp"

namespace mirrored {
namespace {

using detail::CollectiveGroup;
using detail::CollectivePlan;
using detail::UntypedTensor;

// The other worker of a two-worker job, as the stage presents it: it contributes `other` to
// every element of a sum, has the same counts, is the chief of a broadcast (its value `chiefs`)
// and says yes to count_workers. `agree_error`, `sum_error` and `broadcast_error` make those
// calls throw instead.
class ScriptedStage : public detail::WorkerStage {
 public:
  float other = 100.0f;
  float chiefs = 7.0f;
  std::exception_ptr agree_error, sum_error, broadcast_error;
  // What the plan passed and how the job failed.
  std::vector<std::string> agreed;
  int sums = 0;
  Deadline::Clock::time_point sum_deadline{};
  std::vector<std::string> local_failures;

  int num_workers() const noexcept override { return 2; }
  int worker_index() const noexcept override { return 1; }
  bool reduces_in_place(const CrossDeviceOps&) const noexcept override { return false; }
  void all_reduce(ReduceOp, CrossDeviceOps&, CollectiveStep&, detail::CollectiveGroup*) override { unused(); }
  void reduce_scatter(ReduceOp, CrossDeviceOps&, CollectiveStep&, detail::CollectiveGroup*) override { unused(); }
  void all_gather(int, CrossDeviceOps&, CollectiveStep&, detail::CollectiveGroup*,
                  std::vector<UntypedTensor>&) override {
    unused();
  }
  void agree(const std::string& op, const std::function<std::string()>& signature, const Deadline&) override {
    agreed.push_back(op + ": " + signature());
    if (agree_error) std::rethrow_exception(agree_error);
  }
  void sum(std::vector<UntypedTensor>& tensors, std::vector<int64_t>& counts, const Deadline& deadline) override {
    ++sums;
    sum_deadline = deadline.time_point();
    if (sum_error) std::rethrow_exception(sum_error);
    for (auto& t : tensors) {
      auto* p = static_cast<float*>(t.data());
      for (int64_t i = 0; i < t.numel; ++i) p[i] += other;
    }
    for (auto& c : counts) c *= 2;
  }
  UntypedTensor gather(const std::vector<UntypedTensor>&, int, const Deadline&, const detail::Parallel&) override {
    unused();
  }
  void broadcast(UntypedTensor& value, const Deadline&) override {
    if (broadcast_error) std::rethrow_exception(broadcast_error);
    auto* p = static_cast<float*>(value.data());
    for (int64_t i = 0; i < value.numel; ++i) p[i] = chiefs + static_cast<float>(i);
  }
  int count_workers(const char*, bool mine, const Deadline&) override { return (mine ? 1 : 0) + 1; }
  void local_failure(const std::exception_ptr& error) noexcept override {
    local_failures.push_back(detail::describe_exception(error));
  }

 private:
  [[noreturn]] static void unused() { throw std::logic_error("the cross-replica tests make no replica calls"); }
};

UntypedTensor floats(const std::vector<float>& values, int device) {
  auto t = detail::make_untyped(DType::float32, {static_cast<int64_t>(values.size())}, Device(DeviceType::CPU, device));
  std::copy(values.begin(), values.end(), static_cast<float*>(t.data()));
  return t;
}

std::vector<float> values_of(const UntypedTensor& t) {
  const auto* p = static_cast<const float*>(t.data());
  return std::vector<float>(p, p + t.numel);
}

class PlanWithScriptedStage : public ::testing::Test {
 protected:
  PlanWithScriptedStage() : group_(2, 60.0), plan_(group_, std::make_shared<ReductionToOneDevice>()) {
    plan_.set_stage(stage_);
  }

  // Two local replicas' values of one leaf.
  std::vector<UntypedTensor> reduce(ReduceOp op) {
    return plan_.reduce(op, {{floats({1, 2, 3}, 0)}, {floats({10, 20, 30}, 1)}}, {"leaf", "leaf"}, std::nullopt, true,
                        Deadline::after(30));
  }

  std::shared_ptr<ScriptedStage> stage_ = std::make_shared<ScriptedStage>();
  CollectiveGroup group_;
  CollectivePlan plan_;
};

TEST_F(PlanWithScriptedStage, ReduceSumAddsTheLocalReplicasThenTheOtherWorker) {
  const auto out = reduce(ReduceOp::SUM);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{111, 122, 133}));
  ASSERT_EQ(stage_->agreed.size(), 1u);
  EXPECT_EQ(stage_->agreed[0].rfind("reduce: SUM of leaf: ", 0), 0u) << stage_->agreed[0];
  EXPECT_EQ(stage_->sums, 1);
  EXPECT_TRUE(stage_->local_failures.empty());
}

TEST_F(PlanWithScriptedStage, ReduceMeanDividesByEveryReplicaOfEveryWorker) {
  const auto out = reduce(ReduceOp::MEAN);
  ASSERT_EQ(out.size(), 1u);
  // (1 + 10 + 100) / 4 replicas in all, and so on.
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{27.75f, 30.5f, 33.25f}));
}

TEST_F(PlanWithScriptedStage, ReduceMeanAlongAnAxisDividesByTheElementsCountedOnEveryWorker) {
  // Each replica sums its 3 elements (6 and 60); 6 elements here and 6 on the other worker, whose
  // contribution makes the sum 96.
  stage_->other = 30.0f;
  const auto out = plan_.reduce(ReduceOp::MEAN, {{floats({1, 2, 3}, 0)}, {floats({10, 20, 30}, 1)}}, {"leaf", "leaf"},
                                0, true, Deadline::after(30));
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(values_of(out[0]), (std::vector<float>{8.0f}));
}

TEST_F(PlanWithScriptedStage, TheStageGetsTheCallsDeadline) {
  const auto deadline = Deadline::after(30);
  plan_.reduce(ReduceOp::SUM, {{floats({1}, 0)}, {floats({2}, 1)}}, {"leaf", "leaf"}, std::nullopt, true, deadline);
  EXPECT_EQ(stage_->sum_deadline, deadline.time_point());
}

TEST_F(PlanWithScriptedStage, AWorkerThatDisagreesStopsTheReduceBeforeAnyByteMovesAndFailsTheJob) {
  stage_->agree_error = std::make_exception_ptr(InvalidArgumentError("worker 0 reduces MEAN of leaf"));
  try {
    reduce(ReduceOp::SUM);
    ADD_FAILURE() << "reduced despite the disagreement";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "worker 0 reduces MEAN of leaf");
  }
  EXPECT_EQ(stage_->sums, 0);
  ASSERT_EQ(stage_->local_failures.size(), 1u);
  EXPECT_NE(stage_->local_failures[0].find("worker 0 reduces MEAN of leaf"), std::string::npos)
      << stage_->local_failures[0];
}

TEST_F(PlanWithScriptedStage, AStageThatTimesOutFailsTheCallWithItsOwnError) {
  stage_->sum_error = std::make_exception_ptr(DeadlineExceededError("worker 0 did not answer within 30 s"));
  try {
    reduce(ReduceOp::SUM);
    ADD_FAILURE() << "reduced without the other worker";
  } catch (const DeadlineExceededError& e) {
    EXPECT_STREQ(e.what(), "worker 0 did not answer within 30 s");
  }
  ASSERT_EQ(stage_->local_failures.size(), 1u);
  EXPECT_NE(stage_->local_failures[0].find("worker 0 did not answer within 30 s"), std::string::npos)
      << stage_->local_failures[0];
}

TEST_F(PlanWithScriptedStage, ReplicasThatDisagreeFailBeforeTheStageIsAsked) {
  try {
    plan_.reduce(ReduceOp::SUM, {{floats({1, 2}, 0)}, {floats({1, 2, 3}, 1)}}, {"leaf", "leaf"}, std::nullopt, true,
                 Deadline::after(30));
    ADD_FAILURE() << "reduced tensors of different shapes";
  } catch (const InvalidArgumentError& e) {
    EXPECT_NE(std::string(e.what()).find("shapes differ across replicas"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(stage_->agreed.empty());
  EXPECT_EQ(stage_->sums, 0);
  EXPECT_EQ(stage_->local_failures.size(), 1u);
}

TEST_F(PlanWithScriptedStage, BroadcastTakesTheChiefsValue) {
  auto value = floats({1, 2, 3}, 0);
  plan_.broadcast(value, Deadline::after(30));
  EXPECT_EQ(values_of(value), (std::vector<float>{7, 8, 9}));
  EXPECT_TRUE(stage_->local_failures.empty());
}

TEST_F(PlanWithScriptedStage, ABroadcastThatFailsFailsTheJobWithTheSameCause) {
  stage_->broadcast_error = std::make_exception_ptr(UnavailableError("the chief is gone"));
  auto value = floats({1}, 0);
  EXPECT_THROW(plan_.broadcast(value, Deadline::after(30)), UnavailableError);
  ASSERT_EQ(stage_->local_failures.size(), 1u);
  EXPECT_NE(stage_->local_failures[0].find("the chief is gone"), std::string::npos) << stage_->local_failures[0];
  EXPECT_EQ(values_of(value), (std::vector<float>{1}));
}

TEST_F(PlanWithScriptedStage, CountWorkersAsksTheStage) {
  EXPECT_EQ(plan_.count_workers("end of input", true, Deadline::after(30)), 2);
  EXPECT_EQ(plan_.count_workers("end of input", false, Deadline::after(30)), 1);
}

}  // namespace
}  // namespace mirrored

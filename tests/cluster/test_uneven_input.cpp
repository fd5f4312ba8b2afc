// Uneven input across worker processes on 127.0.0.1 (the scenario "uneven" of mirrored_mw_worker,
// tests/cluster/mw_uneven.cpp): for experimental_distribute_dataset with DATA and FILE sharding
// (a worker with no data at all among 3) and distribute_datasets_from_function with unequal batch
// counts, every worker runs the same number of steps, the loops end together, the empty batches
// have the element spec's shapes and the elements summed across workers are the data's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cluster/process_harness.hpp"

namespace mirrored {
namespace uneven_input_test {

using ::testing::HasSubstr;
using testing::Job;

struct Cluster {
  int workers;
  int replicas;
  bool shm;
};

class UnevenInput : public ::testing::TestWithParam<Cluster> {};

TEST_P(UnevenInput, EveryWorkerRunsTheSameStepsAndTheElementsAddUp) {
  const Cluster c = GetParam();
  std::vector<int> ranks;
  for (int r = 0; r < c.workers; ++r) ranks.push_back(r);
  const std::map<std::string, std::string> env{{"MIRRORED_SHARED_MEMORY", c.shm ? "1" : "0"}};
  Job job(c.workers, ranks, {MIRRORED_MW_WORKER, "uneven", "--replicas", std::to_string(c.replicas)}, env);
  ASSERT_TRUE(job.wait(120)) << job.outputs();
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w))) << job.outputs();
  }
}

INSTANTIATE_TEST_SUITE_P(Clusters, UnevenInput,
                         ::testing::Values(Cluster{2, 1, false}, Cluster{2, 2, true}, Cluster{3, 1, true},
                                           Cluster{3, 2, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "Workers" + std::to_string(info.param.replicas) +
                                  "Replicas" + (info.param.shm ? "SharedMemory" : "Tcp");
                         });

// A worker whose input pipeline fails: it gets the error; the others, which would wait for its
// next step's agreement, get AbortedError naming it instead of waiting for their deadline.
TEST(UnevenInputFailure, AWorkersPipelineErrorAbortsTheOthers) {
  Job job(3, {0, 1, 2}, {MIRRORED_MW_WORKER, "uneven_failure", "--victim", "1", "--step", "2", "--timeout", "300"},
          {{"MIRRORED_SHARED_MEMORY", "0"}});
  ASSERT_TRUE(job.wait(120)) << job.outputs();
  for (int w = 0; w < 3; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w))) << job.outputs();
  }
  EXPECT_THAT(job.output(1), HasSubstr("worker 1 threw after 2 steps: boom in the input pipeline"));
}

// The agreement is checked like every collective: a worker taking a step while the others
// all-reduce fails on every worker with the same error, and the strategy stays usable.
TEST(UnevenInputMismatch, AStepAgainstAnAllReduceFailsEveryWorker) {
  for (int workers : {2, 3}) {
    std::vector<int> ranks;
    for (int r = 0; r < workers; ++r) ranks.push_back(r);
    Job job(workers, ranks, {MIRRORED_MW_WORKER, "uneven_mismatch"}, {{"MIRRORED_SHARED_MEMORY", "0"}});
    ASSERT_TRUE(job.wait(120)) << job.outputs();
    for (int w = 0; w < workers; ++w) {
      EXPECT_EQ(job.code(w), 0) << job.outputs();
      EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w))) << job.outputs();
    }
  }
}

}  // namespace uneven_input_test
}  // namespace mirrored

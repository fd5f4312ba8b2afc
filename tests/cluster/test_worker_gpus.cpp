// The GPUs a worker of MultiWorkerMirroredStrategy takes when given no local_devices
// (runtime/worker_gpus.hpp): the rule over (local rank, local size, GPUs seen) case by case, and
// workers started like torchrun's, on one machine with four simulated GPUs each, taking their shares.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "cluster/process_harness.hpp"
#include "gtest_util.hpp"
#include "runtime/worker_gpus.hpp"

namespace mirrored {
namespace {

using detail::GpuShare;
using detail::share_of_gpus;
using ::testing::HasSubstr;

const std::string kWorker = "worker 1 (node0:2222)";

// Worker `r` of `n` on its machine as torchrun says it, seeing `gpus` GPUs.
GpuShare torchrun_share(int r, int n, int gpus, std::optional<std::string> visible = std::nullopt) {
  const LocalPlacement place{r, n, 0,
                             "torchrun's LOCAL_RANK=" + std::to_string(r) + ", LOCAL_WORLD_SIZE=" + std::to_string(n)};
  return share_of_gpus(place, gpus, visible, kWorker);
}

std::pair<int, int> range_of(const GpuShare& s) { return {s.first, s.count}; }

std::string share_error(const LocalPlacement& place, int gpus, std::optional<std::string> visible = std::nullopt) {
  return testing::error_of<InvalidArgumentError>([&] { share_of_gpus(place, gpus, visible, kWorker); });
}

TEST(WorkerGpus, NoGpuMeansNone) {
  EXPECT_EQ(share_of_gpus({}, 0, std::nullopt, kWorker), (GpuShare{0, 0, "no GPU is visible"}));
  EXPECT_EQ(range_of(torchrun_share(1, 2, 0)), std::make_pair(0, 0));
  EXPECT_EQ(range_of(torchrun_share(3, 4, 0, "0")), std::make_pair(0, 0));
}

TEST(WorkerGpus, AWorkerAloneOnItsMachineTakesEveryGpu) {
  EXPECT_EQ(share_of_gpus({}, 4, std::nullopt, kWorker),
            (GpuShare{0, 4, "its cluster resolver names no other worker on its machine"}));
  EXPECT_EQ(share_of_gpus({}, 1, "2", kWorker),
            (GpuShare{0, 1, "its cluster resolver names no other worker on its machine"}));
  EXPECT_EQ(torchrun_share(0, 1, 3),
            (GpuShare{0, 3, "it is the only worker on its machine (torchrun's LOCAL_RANK=0, LOCAL_WORLD_SIZE=1)"}));
}

TEST(WorkerGpus, WorkersOfAMachineTakeEqualSharesInLocalRankOrder) {
  // (local rank, local size, GPUs seen) -> (first GPU, GPUs taken)
  const std::vector<std::pair<std::tuple<int, int, int>, std::pair<int, int>>> cases{
      {{0, 2, 2}, {0, 1}}, {{1, 2, 2}, {1, 1}}, {{0, 2, 4}, {0, 2}}, {{1, 2, 4}, {2, 2}},
      {{0, 4, 4}, {0, 1}}, {{1, 4, 4}, {1, 1}}, {{2, 4, 4}, {2, 1}}, {{3, 4, 4}, {3, 1}},
      {{0, 3, 3}, {0, 1}}, {{2, 3, 3}, {2, 1}}, {{1, 3, 6}, {2, 2}}, {{2, 3, 6}, {4, 2}},
      {{0, 4, 8}, {0, 2}}, {{3, 4, 8}, {6, 2}}, {{1, 2, 8}, {4, 4}}, {{7, 8, 8}, {7, 1}}};
  for (const auto& [in, want] : cases) {
    const auto [r, n, g] = in;
    EXPECT_EQ(range_of(torchrun_share(r, n, g)), want) << "worker " << r << " of " << n << " with " << g << " GPUs";
  }
  EXPECT_EQ(torchrun_share(1, 2, 4).why,
            "it is local worker 1 of the 2 on its machine (torchrun's LOCAL_RANK=1, LOCAL_WORLD_SIZE=2), each of which "
            "takes 2 GPUs");
  EXPECT_EQ(torchrun_share(3, 4, 4).why,
            "it is local worker 3 of the 4 on its machine (torchrun's LOCAL_RANK=3, LOCAL_WORLD_SIZE=4), each of which "
            "takes 1 GPU");
  // CUDA_VISIBLE_DEVICES the same for every worker (Slurm's --gres without per-task binding): shared out too.
  EXPECT_EQ(range_of(torchrun_share(1, 2, 4, "0,1,2,3")), std::make_pair(2, 2));
}

TEST(WorkerGpus, GpusThatDoNotDivideAmongTheWorkersAreAnError) {
  EXPECT_EQ(share_error({0, 3, 0, "torchrun's LOCAL_RANK=0, LOCAL_WORLD_SIZE=3"}, 4),
            "MultiWorkerMirroredStrategy: worker 1 (node0:2222) is local worker 0 of the 3 on its machine (torchrun's "
            "LOCAL_RANK=0, LOCAL_WORLD_SIZE=3) and sees 4 GPUs, which do not divide evenly among 3 workers: choose "
            "each worker's GPUs with local_devices (the examples' --devices), or run 1, 2 or 4 workers on each "
            "machine");
  EXPECT_THAT(
      share_error({3, 4, 0, "MPI's OMPI_COMM_WORLD_LOCAL_RANK=3, OMPI_COMM_WORLD_LOCAL_SIZE=4"}, 6, "0,1,2,3,4,5"),
      HasSubstr("is local worker 3 of the 4 on its machine (MPI's OMPI_COMM_WORLD_LOCAL_RANK=3, "
                "OMPI_COMM_WORLD_LOCAL_SIZE=4) and sees 6 GPUs, which do not divide evenly among 4 workers"));
  EXPECT_THAT(share_error({1, 2, 0, ""}, 5), HasSubstr("(as its cluster resolver says) and sees 5 GPUs"));
  EXPECT_THAT(share_error({1, 2, 0, ""}, 5), HasSubstr("or run 1 or 5 workers on each machine"));
}

TEST(WorkerGpus, FewerGpusThanWorkersNeedAViewOfTheirOwn) {
  // Without CUDA_VISIBLE_DEVICES every worker sees the machine's GPUs: too few for one each.
  EXPECT_EQ(share_error({2, 4, 0, "torchrun's LOCAL_RANK=2, LOCAL_WORLD_SIZE=4"}, 2),
            "MultiWorkerMirroredStrategy: worker 1 (node0:2222) is local worker 2 of the 4 on its machine (torchrun's "
            "LOCAL_RANK=2, LOCAL_WORLD_SIZE=4) but sees only 2 GPUs, and no CUDA_VISIBLE_DEVICES gives it a view of "
            "its own: the machine's 4 workers cannot each have a GPU of their own. Run at most 2 workers on this "
            "machine, give each worker GPUs of its own (CUDA_VISIBLE_DEVICES per worker, Slurm's --gpus-per-task), "
            "or choose its devices with local_devices (the examples' --devices; workers that share a GPU cannot use "
            "NCCL)");
  EXPECT_THAT(share_error({0, 2, 0, "x"}, 1), HasSubstr("but sees only 1 GPU, and no CUDA_VISIBLE_DEVICES"));
  // With it, the launcher (or a wrapper) gave each worker its own view: every GPU of it.
  EXPECT_EQ(
      torchrun_share(3, 4, 1, "3"),
      (GpuShare{0, 1,
                "it is local worker 3 of the 4 on its machine (torchrun's LOCAL_RANK=3, LOCAL_WORLD_SIZE=4) and sees "
                "fewer GPUs than that, so CUDA_VISIBLE_DEVICES=3 is its own view"}));
  EXPECT_EQ(range_of(torchrun_share(1, 4, 2, "2,3")), std::make_pair(0, 2));
}

TEST(WorkerGpus, GpusTheLauncherGaveEachWorkerAreAllItsOwn) {
  // Slurm's --gpus-per-task=2 with two tasks on the node: each task sees its own two.
  const std::string slurm = "Slurm's SLURM_LOCALID=1, SLURM_STEP_TASKS_PER_NODE=2, SLURM_GPUS_PER_TASK=2";
  EXPECT_EQ(share_of_gpus({1, 2, 2, slurm}, 2, "2,3", kWorker),
            (GpuShare{0, 2,
                      "it is local worker 1 of the 2 on its machine (" + slurm +
                          "), and the launcher gave each of them 2 GPUs of its own"}));
  EXPECT_EQ(range_of(share_of_gpus({1, 4, 2, slurm}, 1, "5", kWorker)), std::make_pair(0, 1));
  // More than its own (the binding turned off, --gpu-bind=none): the machine's GPUs, shared out.
  EXPECT_EQ(range_of(share_of_gpus({1, 2, 2, slurm}, 4, "0,1,2,3", kWorker)), std::make_pair(2, 2));
  EXPECT_THAT(testing::error_of<InvalidArgumentError>([&] {
                share_of_gpus({1, 2, 2, slurm}, 3, "0,1,2", kWorker);
              }),
              HasSubstr("sees 3 GPUs, which do not divide evenly among 2 workers"));
}

TEST(WorkerGpus, APlaceThatIsNoneIsAnError) {
  for (const LocalPlacement& bad : {LocalPlacement{2, 2, 0, "R"}, LocalPlacement{0, 0, 0, "R"},
                                    LocalPlacement{-1, 2, 0, "R"}, LocalPlacement{0, 2, -1, "R"}}) {
    EXPECT_THAT(share_error(bad, 4),
                HasSubstr("MultiWorkerMirroredStrategy: worker 1 (node0:2222) has no place among the workers of its "
                          "machine: local_rank " +
                          std::to_string(bad.local_rank) + " of local_size " + std::to_string(bad.local_size) +
                          ", gpus_per_worker " + std::to_string(bad.gpus_per_worker) + " (R)"));
  }
}

// Workers started like torchrun's two workers on one machine (its variables only), each seeing
// four simulated GPUs: the chief takes GPU:0 and GPU:1, the other GPU:2 and GPU:3, and an
// all-reduce over the four replicas sums 1 + 2 + 3 + 4.
std::vector<std::map<std::string, std::string>> torchrun_on_one_machine(int n, int gpus) {
  const std::string port = std::to_string(testing::free_port());
  std::vector<std::map<std::string, std::string>> out;
  for (int r = 0; r < n; ++r) {
    out.push_back({{"RANK", std::to_string(r)},
                   {"WORLD_SIZE", std::to_string(n)},
                   {"LOCAL_RANK", std::to_string(r)},
                   {"LOCAL_WORLD_SIZE", std::to_string(n)},
                   {"MASTER_ADDR", "127.0.0.1"},
                   {"MASTER_PORT", port},
                   {"MIRRORED_SIMULATED_GPUS", std::to_string(gpus)},
                   {"CUDA_VISIBLE_DEVICES", ""},  // empty: as if unset (no view of its own)
                   {"MIRRORED_LOG_LEVEL", "INFO"}});
  }
  return out;
}

constexpr double kJobSeconds = 120;

TEST(WorkerGpusJob, TwoWorkersOfOneMachineTakeHalfItsGpusEach) {
  testing::Job job(torchrun_on_one_machine(2, 4), {MIRRORED_MW_WORKER, "default_devices", "--timeout", "60"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(job.code(r), 0) << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr("OK worker " + std::to_string(r))) << job.outputs();
  }
  EXPECT_THAT(job.output(0), HasSubstr("worker 0 devices GPU:0,GPU:1\n"));
  EXPECT_THAT(job.output(1), HasSubstr("worker 1 devices GPU:2,GPU:3\n"));
  EXPECT_THAT(
      job.output(1),
      HasSubstr("MultiWorkerMirroredStrategy: worker 1 takes GPU:2, GPU:3 (2 of the 4 GPUs it sees): it is local "
                "worker 1 of the 2 on its machine (torchrun's LOCAL_RANK=1, LOCAL_WORLD_SIZE=2), each of "
                "which takes 2 GPUs; local_devices chooses otherwise"));
}

TEST(WorkerGpusJob, MoreWorkersThanGpusOnAMachineFailAtOnceNamingThemselves) {
  testing::Job job(torchrun_on_one_machine(3, 2), {MIRRORED_MW_WORKER, "default_devices", "--timeout", "60"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(job.code(r), 1) << job.outputs();
    EXPECT_THAT(job.output(r),
                HasSubstr("unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy: worker " + std::to_string(r)))
        << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr(" is local worker " + std::to_string(r) +
                                         " of the 3 on its machine (torchrun's LOCAL_RANK=" + std::to_string(r) +
                                         ", LOCAL_WORLD_SIZE=3) but sees only 2 GPUs"));
  }
}

}  // namespace
}  // namespace mirrored

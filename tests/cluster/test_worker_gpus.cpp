// The GPUs a worker of MultiWorkerMirroredStrategy takes when given no local_devices
// (runtime/worker_gpus.hpp): the rule over (local rank, local size, GPUs seen) case by case, the
// names a machine gives its GPUs and the workers' check that no two of one machine took the same
// (cluster/coordinator/shared_gpus.hpp); and jobs of workers on one machine with simulated GPUs:
// started like torchrun's, they take their shares; with TF_CONFIGs, which say nothing of machines,
// they fail rather than share a GPU, unless CUDA_VISIBLE_DEVICES gives each its own.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <mirrored/mirrored.hpp>

#include "cluster/coordinator/shared_gpus.hpp"
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

TEST(WorkerGpus, AMachineNamesItsGpusAsCudaVisibleDevicesDoes) {
  using detail::machine_gpu_name;
  EXPECT_EQ(machine_gpu_name(0, std::nullopt, std::nullopt), "0");
  EXPECT_EQ(machine_gpu_name(3, std::nullopt, std::nullopt), "3");
  EXPECT_EQ(machine_gpu_name(0, "2,3", std::nullopt), "2");
  EXPECT_EQ(machine_gpu_name(1, "2, 3", std::nullopt), "3");
  EXPECT_EQ(machine_gpu_name(1, "GPU-8e1f,MIG-77aa", std::nullopt), "MIG-77aa");
  EXPECT_EQ(machine_gpu_name(2, "5", std::nullopt), "2 of CUDA_VISIBLE_DEVICES=5");
  // A container's GPUs are numbered within it.
  EXPECT_EQ(machine_gpu_name(0, std::nullopt, "2,3"), "0 of NVIDIA_VISIBLE_DEVICES=2,3");
  EXPECT_EQ(machine_gpu_name(0, "1", "all"), "1");
}

detail::cluster::WorkerInfo on(const std::string& host, const std::string& boot, std::vector<std::string> gpus = {}) {
  detail::cluster::WorkerInfo w;
  w.hostname = host;
  w.boot_id = boot;
  w.default_gpus = std::move(gpus);
  return w;
}

TEST(WorkerGpus, WorkersOfOneMachineThatTookTheSameGpuAreFound) {
  using detail::cluster::first_shared_gpu;
  using detail::cluster::SharedGpu;
  auto a = [](std::vector<std::string> g) { return on("node0", "boot-a", std::move(g)); };
  auto b = [](std::vector<std::string> g) { return on("node1", "boot-b", std::move(g)); };
  EXPECT_EQ(first_shared_gpu({a({"0", "1"}), a({"2", "3"})}), std::nullopt);
  EXPECT_EQ(first_shared_gpu({a({"0", "1"}), a({"1", "2"})}), (SharedGpu{0, 1, "1"}));
  EXPECT_EQ(first_shared_gpu({a({"0"}), b({"0"})}), std::nullopt);  // two machines
  // The same host name on another kernel (a machine restarted, or another machine named alike).
  EXPECT_EQ(first_shared_gpu({a({"0"}), on("node0", "boot-c", {"0"})}), std::nullopt);
  EXPECT_EQ(first_shared_gpu({a({"0"}), b({"1"}), a({"2"}), b({"1"})}), (SharedGpu{1, 3, "1"}));
  EXPECT_EQ(first_shared_gpu({a({"0"}), b({"5"}), a({"0"}), b({"5"})}), (SharedGpu{0, 2, "0"}));
  EXPECT_EQ(first_shared_gpu({a({}), a({"0"}), a({})}), std::nullopt);  // given devices are not compared
  // The lowest first rank of a pair, whichever of the second's GPUs it shares.
  EXPECT_EQ(first_shared_gpu({a({"1"}), a({"0"}), a({"0", "1"})}), (SharedGpu{0, 2, "1"}));
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

// Workers with TF_CONFIGs (as tools/launch.sh starts them), each seeing the machine's two
// simulated GPUs: each counts as alone on its machine and takes both, so once joined they find
// they share them and fail alike, naming both.
TEST(WorkerGpusJob, WorkersThatKnowNothingOfTheirMachineFailRatherThanShareAGpu) {
  testing::Job job(2, {0, 1}, {MIRRORED_MW_WORKER, "default_devices", "--timeout", "60"},
                   {{"MIRRORED_SIMULATED_GPUS", "2"}, {"CUDA_VISIBLE_DEVICES", ""}, {"NVIDIA_VISIBLE_DEVICES", ""}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(job.code(r), 1) << job.outputs();
    EXPECT_THAT(job.output(r),
                HasSubstr("unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy: worker 0 (" + job.addresses()[0] +
                          ") and worker 1 (" + job.addresses()[1] + ") run on one machine ("))
        << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr(") and both took its GPU 0 by default"));
  }
}

// The same workers, each given a GPU of its own by CUDA_VISIBLE_DEVICES: each takes it, and the
// machine's names of their GPUs (1 and 0) differ.
TEST(WorkerGpusJob, WorkersWithViewsOfTheirOwnKeepTheirGpus) {
  std::vector<std::string> addresses;
  for (int r = 0; r < 2; ++r) addresses.push_back("127.0.0.1:" + std::to_string(testing::free_port()));
  std::vector<std::map<std::string, std::string>> per;
  for (int r = 0; r < 2; ++r) {
    per.push_back({{"TF_CONFIG", testing::tf_config(addresses, r)},
                   {"CUDA_VISIBLE_DEVICES", std::to_string(1 - r)},
                   {"MIRRORED_SIMULATED_GPUS", "1"},
                   {"NVIDIA_VISIBLE_DEVICES", ""}});
  }
  testing::Job job(per, {MIRRORED_MW_WORKER, "default_devices", "--timeout", "60"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(job.code(r), 0) << job.outputs();
    EXPECT_THAT(job.output(r), HasSubstr("worker " + std::to_string(r) + " devices GPU:0\n"));
  }
}

}  // namespace
}  // namespace mirrored

// train_digits --strategy multi_worker started by real launchers — torchrun (--no_python, one
// host), Open MPI's mpirun, and srun on a one-node Slurm cluster that the test starts itself —
// finds its cluster in their variables (cluster_resolver_from_environment) and ends with the
// weights it ends with under tools/launch.sh, bit for bit (the same 2 workers x 2 CPU replicas and
// the same cross-worker transport). And a worker killed under torchrun --max_restarts makes the
// agent restart the job, which resumes from its checkpoints and ends bitwise equal to an
// uninterrupted run. A launcher that is not installed (or Slurm without root) skips with the reason.
//
// Compiled twice (tests/CMakeLists.txt): the quick launches for the default run, and with
// MIRRORED_LAUNCHER_RESTARTS the restart (about 20 s) for the `slow` label.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "cluster/finished_training.hpp"
#include "cluster/process_harness.hpp"

namespace mirrored {
namespace launcher_tests {

using ::testing::HasSubstr;
using testing::Job;
using Weights = std::map<std::string, std::vector<unsigned char>>;

constexpr double kJobSeconds = 120;
const std::string kLaunch = std::string(MIRRORED_SOURCE_DIR) + "/tools/launch.sh";
const std::string kSlurmCluster = std::string(MIRRORED_SOURCE_DIR) + "/tests/cluster/slurm_cluster.sh";

// The executable `program` on PATH ("" when there is none).
std::string on_path(const std::string& program) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    const std::size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (end > start && ::access(candidate.c_str(), X_OK) == 0) return candidate;
    start = end + 1;
  }
  return "";
}

// What `command` prints (stdout and stderr) and its exit status.
std::pair<std::string, int> shell(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (!p) return {"popen failed", -1};
  char buf[4096];
  while (std::size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  return {out, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// The training every launcher runs: 2 workers of 2 CPU replicas each; `extra` adds flags.
std::vector<std::string> training(const std::vector<std::string>& extra) {
  std::vector<std::string> argv{
      MIRRORED_TRAIN_DIGITS, "--strategy", "multi_worker", "--devices", "CPU:0,CPU:1", "--epochs", "2", "--seed", "3",
      "--global-batch",      "32"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<std::string> plus(std::vector<std::string> launcher, const std::vector<std::string>& program) {
  launcher.insert(launcher.end(), program.begin(), program.end());
  return launcher;
}

// Runs `argv` (a launcher and its workers) as one process, with no TF_CONFIG of the harness.
Job run(const std::vector<std::string>& argv, std::map<std::string, std::string> env) {
  env["MIRRORED_LOG_LEVEL"] = "INFO";  // which resolver, which transport
  return Job(std::vector<std::map<std::string, std::string>>{{}}, argv, env);
}

// What a finished launch ended with: its output, and the weights the chief saved to `path`.
struct Trained {
  std::string output;
  Weights weights;
};

Trained finish(Job& job, const std::string& path) {
  Trained t;
  EXPECT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  t.output = job.output(0);
  EXPECT_EQ(job.code(0), 0) << t.output;
  if (std::filesystem::exists(path)) t.weights = testing::model_and_optimizer(path);
  return t;
}

// The weights under tools/launch.sh, once per transport ("shared memory" or "Gloo ring over TCP").
const Weights& under_launch_sh(const std::string& transport) {
  static std::map<std::string, Weights> cache;
  if (!cache.count(transport)) {
    testing::TempDir dir;
    const std::string path = dir.path() + "/weights.safetensors";
    Job job = run(plus({"/bin/bash", kLaunch, "2", "--"}, training({"--save", path})),
                  {{"MIRRORED_SHARED_MEMORY", transport == "shared memory" ? "1" : "0"}});
    const Trained t = finish(job, path);
    EXPECT_THAT(t.output, HasSubstr("cross-worker transport: " + transport));
    EXPECT_EQ(t.weights.size(), 4u) << t.output;
    cache[transport] = t.weights;
  }
  return cache[transport];
}

void expect_bitwise_equal(const Weights& got, const Weights& want, const std::string& reference) {
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << "tensor " << name << " differs from " << reference;
  }
}

void expect_same_weights(const Trained& got, const std::string& transport) {
  expect_bitwise_equal(got.weights, under_launch_sh(transport), "the run under tools/launch.sh");
}

// torchrun 1.13 under Python 3.11 fails at start-up on its default redirects ("'NoneType' object
// has no attribute 'get'"): naming them (for a local rank that does not exist) avoids that path.
std::vector<std::string> torchrun(const std::string& program, int max_restarts) {
  return {program,
          "--nnodes",
          "1",
          "--nproc_per_node",
          "2",
          "--rdzv_backend",
          "c10d",
          "--rdzv_endpoint",
          "127.0.0.1:" + std::to_string(testing::free_port()),
          "--max_restarts",
          std::to_string(max_restarts),
          "--monitor_interval",
          "0.2",
          "-r",
          "9:1",
          "-t",
          "9:1",
          "--no_python"};
}

#ifndef MIRRORED_LAUNCHER_RESTARTS
TEST(RealLaunchers, TorchrunTrainsTheWeightsOfLaunchSh) {
  const std::string program = on_path("torchrun");
  if (program.empty()) GTEST_SKIP() << "torchrun is not installed (Debian's python3-torch; scripts/install-deps.sh)";
  const std::string transport = "shared memory";
  (void)under_launch_sh(transport);
  testing::TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  Job job = run(plus(torchrun(program, 0), training({"--save", path})), {});
  const Trained t = finish(job, path);
  EXPECT_THAT(t.output, HasSubstr("cluster_resolver_from_environment: RANK or WORLD_SIZE is set (torchrun); the "
                                  "cluster comes from torchrun's variables (RANK=1, WORLD_SIZE=2, MASTER_ADDR="));
  EXPECT_THAT(t.output, HasSubstr("cross-worker transport: " + transport));
  expect_same_weights(t, transport);
}

TEST(RealLaunchers, MpirunTrainsTheWeightsOfLaunchSh) {
  const std::string program = on_path("mpirun");
  if (program.empty()) GTEST_SKIP() << "mpirun is not installed (Debian's openmpi-bin; scripts/install-deps.sh)";
  if (shell(program + " --version").first.find("Open MPI") == std::string::npos)
    GTEST_SKIP() << program << " is not Open MPI's (the test passes Open MPI's flags)";
  // Over TCP: the worker that mpirun names no address for listens on its route to the chief.
  const std::string transport = "Gloo ring over TCP";
  (void)under_launch_sh(transport);
  testing::TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  const std::string port = std::to_string(testing::free_port());
  Job job = run(plus({program, "--oversubscribe", "--allow-run-as-root", "-n", "2", "-x", "MASTER_ADDR=127.0.0.1", "-x",
                      "MASTER_PORT=" + port, "-x", "MIRRORED_SHARED_MEMORY", "-x", "MIRRORED_LOG_LEVEL"},
                     training({"--save", path})),
                {{"MIRRORED_SHARED_MEMORY", "0"}});
  const Trained t = finish(job, path);
  EXPECT_THAT(t.output, HasSubstr("cluster_resolver_from_environment: OMPI_COMM_WORLD_RANK is set (Open MPI); the "
                                  "cluster comes from MPI's variables (OMPI_COMM_WORLD_RANK=1, PMIX_RANK=1, "
                                  "OMPI_COMM_WORLD_SIZE=2, MASTER_ADDR=127.0.0.1, MASTER_PORT=" +
                                  port + ")"));
  EXPECT_THAT(t.output, HasSubstr("cross-worker transport: " + transport));
  expect_same_weights(t, transport);
}

// A one-node Slurm cluster in a directory of its own (tests/cluster/slurm_cluster.sh), stopped
// when the object goes (or by `stop()`, before the Job whose srun used it reaps its children:
// the daemons, adopted by this subreaper process, would be killed there).
class SlurmCluster {
 public:
  SlurmCluster() {
    auto [out, code] = shell("/bin/bash " + kSlurmCluster + " start " + dir_.path());
    if (code == 77) {
      unavailable_ = out;
      return;
    }
    started_ = code == 0;
    if (!started_) error_ = out;
    conf_ = dir_.path() + "/slurm.conf";
  }
  ~SlurmCluster() { stop(); }
  void stop() {
    if (!started_) return;
    started_ = false;
    shell("/bin/bash " + kSlurmCluster + " stop " + dir_.path());
  }
  const std::string& unavailable() const { return unavailable_; }
  const std::string& error() const { return error_; }
  bool started() const { return started_; }
  const std::string& conf() const { return conf_; }

 private:
  testing::TempDir dir_;
  std::string unavailable_, error_, conf_;
  bool started_ = false;
};

TEST(RealLaunchers, SrunOnASlurmClusterOfItsOwnTrainsTheWeightsOfLaunchSh) {
  const std::string program = on_path("srun");
  if (program.empty()) GTEST_SKIP() << "srun is not installed (Debian's slurm-wlm; scripts/install-deps.sh)";
  const std::string transport = "shared memory";
  (void)under_launch_sh(transport);  // before the cluster: that job's end reaps this process's orphans
  SlurmCluster cluster;
  if (!cluster.unavailable().empty()) GTEST_SKIP() << cluster.unavailable();
  ASSERT_TRUE(cluster.started()) << cluster.error();
  testing::TempDir dir;
  const std::string path = dir.path() + "/weights.safetensors";
  Trained t;
  {
    Job job = run(plus({program, "-n", "2"}, training({"--save", path})),
                  {{"SLURM_CONF", cluster.conf()}, {"MIRRORED_SLURM_PORT_BASE", std::to_string(testing::free_port())}});
    t = finish(job, path);
    cluster.stop();
  }
  EXPECT_THAT(t.output, HasSubstr("cluster_resolver_from_environment: SLURM_STEP_ID and SLURM_PROCID are set (a task "
                                  "of a Slurm job step); the cluster comes from Slurm's variables (SLURM_PROCID=1, "
                                  "SLURM_STEP_NUM_TASKS=2)"));
  EXPECT_THAT(t.output, HasSubstr("cross-worker transport: " + transport));
  expect_same_weights(t, transport);
}

#else
// Fault-tolerant training (docs/fault_tolerance.md): Adam, periodic saves every 7 steps.
std::vector<std::string> resumable(const std::string& dir) {
  return training({"--optimizer", "adam", "--checkpoint-dir", dir, "--save-every-steps", "7"});
}

TEST(RealLaunchers, TorchrunRestartsTheJobWhenAWorkerIsKilledAndItEndsBitwiseEqual) {
  const std::string program = on_path("torchrun");
  if (program.empty()) GTEST_SKIP() << "torchrun is not installed (Debian's python3-torch; scripts/install-deps.sh)";
  testing::TempDir reference_dir, dir;
  Job reference = run(plus({"/bin/bash", kLaunch, "2", "--"}, resumable(reference_dir.path())), {});
  ASSERT_TRUE(reference.wait(kJobSeconds)) << reference.outputs();
  ASSERT_EQ(reference.code(0), 0) << reference.outputs();
  const std::string want = testing::finished_checkpoint(reference.output(0));
  ASSERT_FALSE(want.empty()) << reference.output(0);
  // Worker 1 kills itself after step 20 of the first attempt (TORCHELASTIC_RESTART_COUNT 0): its
  // peer sees it gone and exits with 75, the agent restarts both, and they resume at step 14.
  Job job = run(plus(torchrun(program, 3), resumable(dir.path())), {{"MIRRORED_TEST_RAISE_AT_STEP", "20:KILL:1"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  const std::string out = job.output(0);
  ASSERT_EQ(job.code(0), 0) << out;
  EXPECT_THAT(out, HasSubstr("train_digits: a worker of the job was lost; exiting with status 75 so that the "
                             "launcher restarts the job"));
  EXPECT_THAT(out, HasSubstr("resumed from the checkpoint of step 14"));
  const std::string got = testing::finished_checkpoint(out);
  ASSERT_FALSE(got.empty()) << out;
  const Weights uninterrupted = testing::model_and_optimizer(want);
  ASSERT_TRUE(uninterrupted.count("optimizer/iterations")) << "the step counter is saved";
  expect_bitwise_equal(testing::model_and_optimizer(got), uninterrupted, "the uninterrupted run");
}

#endif

}  // namespace launcher_tests
}  // namespace mirrored

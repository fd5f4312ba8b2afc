// fashion_mnist interrupted and resumed (docs/fault_tolerance.md): stopped by SIGTERM (it saves
// and exits with status 75) or SIGKILL (the restart resumes from the last periodic save), then run
// again, it ends with the weights, Adam's slots and step counter, and the metrics of an
// uninterrupted run, bit for bit, and prints the same epoch lines: 2 CPU replicas in one process,
// and 2 workers under tools/launch.sh --max-restarts 1.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <sstream>

#include "cluster/finished_training.hpp"
#include "cluster/process_harness.hpp"
#include "fashion_test_data.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::Job;

constexpr double kJobSeconds = 240;
constexpr int kStepsPerEpoch = 5;  // 640 examples in global batches of 128 (2 replicas x 64)
const std::string kLaunch = std::string(MIRRORED_SOURCE_DIR) + "/tools/launch.sh";

std::vector<std::string> command(const std::string& dir, bool multi_worker, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv;
  if (multi_worker) argv = {"/bin/bash", kLaunch, "2", "--max-restarts", "1", "--"};
  argv.insert(argv.end(), {MIRRORED_FASHION_MNIST, "--epochs", "2", "--train-examples", "640", "--test-examples", "128",
                           "--seed", "3", "--checkpoint-dir", dir});
  if (multi_worker) argv.insert(argv.end(), {"--strategy", "multi_worker", "--devices", "CPU:0"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

Job start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
  return Job(1, {0}, argv, env);  // launch.sh makes its own cluster; MirroredStrategy ignores TF_CONFIG
}

// The "Epoch N, Loss: ..." lines (of worker 0 under launch.sh).
std::vector<std::string> epoch_lines(const std::string& output) {
  std::vector<std::string> out;
  std::istringstream in(output);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("[worker 0] ", 0) == 0) line = line.substr(11);
    if (line.rfind("Epoch ", 0) == 0) out.push_back(line);
  }
  return out;
}

struct Finished {
  std::map<std::string, std::vector<unsigned char>> tensors;
  std::vector<std::string> epochs;
};

// The uninterrupted run (one process, or two workers), once per test process.
const Finished& reference(bool multi_worker) {
  static std::map<bool, Finished> cache;
  static std::map<bool, std::unique_ptr<testing::TempDir>> dirs;
  if (!cache.count(multi_worker)) {
    dirs[multi_worker] = std::make_unique<testing::TempDir>();
    Job job = start(command(dirs[multi_worker]->path(), multi_worker));
    EXPECT_TRUE(job.wait(kJobSeconds)) << job.outputs();
    EXPECT_EQ(job.code(0), 0) << job.outputs();
    const std::string path = testing::finished_checkpoint(job.output(0));
    EXPECT_FALSE(path.empty()) << job.outputs();
    Finished& f = cache[multi_worker];
    if (path.empty()) return f;
    f.tensors = testing::model_and_optimizer(path);
    f.epochs = epoch_lines(job.output(0));
    EXPECT_EQ(f.epochs.size(), 2u) << job.outputs();
    EXPECT_TRUE(f.tensors.count("optimizer/iterations") && f.tensors.count("train_metrics"));
  }
  return cache[multi_worker];
}

void expect_same_training(bool multi_worker, const std::string& output, const std::string& what) {
  const std::string path = testing::finished_checkpoint(output);
  ASSERT_FALSE(path.empty()) << what << "\n" << output;
  const auto got = testing::model_and_optimizer(path);
  const Finished& want = reference(multi_worker);
  ASSERT_FALSE(want.tensors.empty());
  ASSERT_EQ(got.size(), want.tensors.size()) << what;
  for (const auto& [name, bytes] : want.tensors) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_TRUE(got.at(name) == bytes) << what << ": tensor " << name << " differs from the uninterrupted run";
  }
}

// A SIGTERM after `step`: the handler saves after the next step and exits with 75; run again, it
// resumes there and prints every epoch line the uninterrupted run printed (the epoch's metrics
// are in the checkpoint, and an epoch saved after its last step but not reported is reported).
void sigterm_and_resume(int step) {
  FASHION_REQUIRE_DATA();
  testing::TempDir dir;
  Job first = start(command(dir.path(), false), {{"MIRRORED_TEST_RAISE_AT_STEP", std::to_string(step) + ":TERM"}});
  ASSERT_TRUE(first.wait(kJobSeconds)) << first.outputs();
  ASSERT_EQ(first.code(0), 75) << first.outputs();
  EXPECT_THAT(first.output(0), HasSubstr("preempted; saved step " + std::to_string(step + 1)));
  Job second = start(command(dir.path(), false));
  ASSERT_TRUE(second.wait(kJobSeconds)) << second.outputs();
  ASSERT_EQ(second.code(0), 0) << second.outputs();
  EXPECT_THAT(second.output(0), HasSubstr("resumed from the checkpoint of step " + std::to_string(step + 1)));
  std::vector<std::string> printed = epoch_lines(first.output(0));
  for (const auto& line : epoch_lines(second.output(0))) printed.push_back(line);
  EXPECT_EQ(printed, reference(false).epochs);
  expect_same_training(false, second.output(0), "SIGTERM after step " + std::to_string(step));
}

TEST(FashionResume, AfterSigtermMidEpochEndsBitwiseEqual) { sigterm_and_resume(2); }

TEST(FashionResume, AfterSigtermAtTheEpochsLastStepReportsThatEpoch) { sigterm_and_resume(kStepsPerEpoch - 1); }

// A SIGKILL after step 7 of 10 with a save every 3 steps: the restart resumes from step 6, with
// the sharded optimizer state (whose checkpoint holds the whole slots, as the reference's).
TEST(FashionResume, AfterSigkillTheRestartResumesFromThePeriodicSave) {
  FASHION_REQUIRE_DATA();
  testing::TempDir dir;
  const std::vector<std::string> extra = {"--save-every-steps", "3", "--shard-optimizer-state"};
  Job first = start(command(dir.path(), false, extra), {{"MIRRORED_TEST_RAISE_AT_STEP", "7:KILL"}});
  ASSERT_TRUE(first.wait(kJobSeconds)) << first.outputs();
  ASSERT_EQ(first.code(0), -SIGKILL) << first.outputs();
  Job second = start(command(dir.path(), false, extra));
  ASSERT_TRUE(second.wait(kJobSeconds)) << second.outputs();
  ASSERT_EQ(second.code(0), 0) << second.outputs();
  EXPECT_THAT(second.output(0), HasSubstr("resumed from the checkpoint of step 6"));
  std::vector<std::string> printed = epoch_lines(first.output(0));
  for (const auto& line : epoch_lines(second.output(0))) printed.push_back(line);
  EXPECT_EQ(printed, reference(false).epochs);
  expect_same_training(false, second.output(0), "SIGKILL after step 7, saves every 3");
}

// Two workers of one replica each under launch.sh: worker 1 is signalled, both save at the same
// step and exit with 75, the launcher restarts the job, which resumes and finishes.
TEST(FashionResume, OnTwoWorkersTheRestartedJobEndsBitwiseEqual) {
  FASHION_REQUIRE_DATA();
  testing::TempDir dir;
  Job job = start(command(dir.path(), true), {{"MIRRORED_TEST_RAISE_AT_STEP", "3:TERM:1"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  ASSERT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: restart 1 of 1: worker"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 0] resumed from the checkpoint of step 4"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] resumed from the checkpoint of step 4"));
  EXPECT_EQ(epoch_lines(job.output(0)), reference(true).epochs);
  expect_same_training(true, job.output(0), "two workers, SIGTERM on worker 1 after step 3");
}

}  // namespace
}  // namespace mirrored

// Fault-tolerant training end to end (docs/fault_tolerance.md): train_digits with Adam (sharded
// and not) on a shuffled dataset repeated over the epochs, stopped by SIGTERM (it saves and exits
// with status 75) or SIGKILL (it resumes from the last periodic save), then restarted, ends with
// the weights, optimizer slots and step counter of an uninterrupted run, bit for bit: 2 CPU
// replicas in one process, and 2 workers x 2 replicas under tools/launch.sh --max-restarts.
//
// Each case runs for the seeds [MIRRORED_RESUME_FIRST_SEED, + MIRRORED_RESUME_SEEDS); a seed
// picks the step (or the moment) of the interruption. The CI suite runs a few seeds; the
// `slow`-labelled executable runs the long sweep.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <random>
#include <thread>

#include <mirrored/checkpoint.hpp>

#include "cluster/finished_training.hpp"
#include "cluster/process_harness.hpp"

#ifndef MIRRORED_RESUME_FIRST_SEED
#define MIRRORED_RESUME_FIRST_SEED 0
#endif
#ifndef MIRRORED_RESUME_SEEDS
#define MIRRORED_RESUME_SEEDS 2
#endif

namespace mirrored {
namespace resume_tests {

using ::testing::HasSubstr;
using testing::Job;

constexpr double kJobSeconds = 240;
constexpr int kEpochs = 2;
constexpr int kStepsPerEpoch = 45;  // 1438 training rows in global batches of 32
constexpr int kSteps = kEpochs * kStepsPerEpoch;
const std::string kLaunch = std::string(MIRRORED_SOURCE_DIR) + "/tools/launch.sh";

struct Case {
  bool sharded = false;
  bool multi_worker = false;
};

std::vector<std::string> command(const Case& c, const std::string& dir, int save_every) {
  std::vector<std::string> argv;
  if (c.multi_worker) argv = {"/bin/bash", kLaunch, "2", "--max-restarts", "1", "--"};
  argv.insert(argv.end(), {MIRRORED_TRAIN_DIGITS, "--optimizer", "adam", "--epochs", std::to_string(kEpochs),
                           "--global-batch", "32", "--seed", "5", "--checkpoint-dir", dir});
  if (c.multi_worker) argv.insert(argv.end(), {"--strategy", "multi_worker", "--devices", "CPU:0,CPU:1"});
  if (c.sharded) argv.push_back("--shard-optimizer-state");
  if (save_every > 0) argv.insert(argv.end(), {"--save-every-steps", std::to_string(save_every)});
  return argv;
}

Job start(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
  // The harness's TF_CONFIG names a cluster of one; MirroredStrategy and launch.sh ignore it.
  return Job(1, {0}, argv, env);
}

using testing::finished_checkpoint;
using testing::model_and_optimizer;

// The uninterrupted run of a case, once per process.
const std::map<std::string, std::vector<unsigned char>>& reference(const Case& c) {
  static std::map<std::pair<bool, bool>, std::map<std::string, std::vector<unsigned char>>> cache;
  static std::map<std::pair<bool, bool>, std::unique_ptr<testing::TempDir>> dirs;
  const auto key = std::make_pair(c.sharded, c.multi_worker);
  if (!cache.count(key)) {
    dirs[key] = std::make_unique<testing::TempDir>();
    Job job = start(command(c, dirs[key]->path(), 0));
    EXPECT_TRUE(job.wait(kJobSeconds)) << job.outputs();
    EXPECT_EQ(job.code(0), 0) << job.outputs();
    const std::string path = finished_checkpoint(job.output(0));
    EXPECT_FALSE(path.empty()) << job.outputs();
    if (path.empty()) return cache[key];
    cache[key] = model_and_optimizer(path);
    EXPECT_TRUE(cache[key].count("optimizer/iterations")) << "the step counter is saved";
  }
  return cache[key];
}

void expect_same_training(const Case& c, const std::string& finished_output, const std::string& what) {
  const std::string path = finished_checkpoint(finished_output);
  ASSERT_FALSE(path.empty()) << what << "\n" << finished_output;
  const auto got = model_and_optimizer(path);
  const auto& want = reference(c);
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": " << name;
    EXPECT_TRUE(got.at(name) == bytes) << what << ": tensor " << name << " differs from the uninterrupted run";
  }
}

class Resume : public ::testing::TestWithParam<int> {
 protected:
  std::mt19937 rng{static_cast<unsigned>(GetParam())};
  int pick(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }
};

// A SIGTERM after a random step, in one process: the handler saves after the next step and exits
// with 75; run again, it resumes there.
void sigterm_in_process(int seed, Case c, int step) {
  testing::TempDir dir;
  Job first = start(command(c, dir.path(), 0), {{"MIRRORED_TEST_RAISE_AT_STEP", std::to_string(step) + ":TERM"}});
  ASSERT_TRUE(first.wait(kJobSeconds)) << first.outputs();
  ASSERT_EQ(first.code(0), 75) << first.outputs();
  EXPECT_THAT(first.output(0), HasSubstr("preempted; saved step " + std::to_string(step + 1)));
  Job second = start(command(c, dir.path(), 0));
  ASSERT_TRUE(second.wait(kJobSeconds)) << second.outputs();
  ASSERT_EQ(second.code(0), 0) << second.outputs();
  EXPECT_THAT(second.output(0), HasSubstr("resumed from the checkpoint of step " + std::to_string(step + 1)));
  expect_same_training(c, second.output(0),
                       "seed " + std::to_string(seed) + ", SIGTERM after step " + std::to_string(step));
}

TEST_P(Resume, AfterSigtermInOneProcessEndsBitwiseEqual) {
  sigterm_in_process(GetParam(), Case{false, false}, pick(1, kSteps - 2));
}

TEST_P(Resume, AfterSigtermInOneProcessEndsBitwiseEqualWithShardedState) {
  sigterm_in_process(GetParam(), Case{true, false}, pick(1, kSteps - 2));
}

// A SIGKILL after a random step: the restart resumes from the newest periodic save.
TEST_P(Resume, AfterSigkillInOneProcessResumesFromThePeriodicSave) {
  const Case c{GetParam() % 2 == 1, false};
  const int every = pick(3, 11), step = pick(1, kSteps - 1);
  testing::TempDir dir;
  Job first = start(command(c, dir.path(), every), {{"MIRRORED_TEST_RAISE_AT_STEP", std::to_string(step) + ":KILL"}});
  ASSERT_TRUE(first.wait(kJobSeconds)) << first.outputs();
  ASSERT_EQ(first.code(0), -SIGKILL) << first.outputs();
  Job second = start(command(c, dir.path(), every));
  ASSERT_TRUE(second.wait(kJobSeconds)) << second.outputs();
  ASSERT_EQ(second.code(0), 0) << second.outputs();
  const int saved = step / every * every;
  if (saved > 0)
    EXPECT_THAT(second.output(0), HasSubstr("resumed from the checkpoint of step " + std::to_string(saved)));
  else
    EXPECT_THAT(second.output(0), ::testing::Not(HasSubstr("resumed from")));
  expect_same_training(c, second.output(0),
                       "SIGKILL after step " + std::to_string(step) + ", saves every " + std::to_string(every));
}

// A SIGKILL at a random moment (mid-step, mid-save, or after the end), from outside.
TEST_P(Resume, AfterSigkillAtARandomMomentEndsBitwiseEqual) {
  const Case c{GetParam() % 2 == 0, false};
  const int every = pick(2, 9);
  testing::TempDir dir;
  Job first = start(command(c, dir.path(), every));
  ASSERT_TRUE(first.wait_for_output(0, "training on", kJobSeconds)) << first.outputs();
  std::this_thread::sleep_for(std::chrono::microseconds(pick(0, 150000)));
  first.signal(0, SIGKILL);
  ASSERT_TRUE(first.wait(kJobSeconds)) << first.outputs();
  Job second = start(command(c, dir.path(), every));
  ASSERT_TRUE(second.wait(kJobSeconds)) << second.outputs();
  ASSERT_EQ(second.code(0), 0) << second.outputs();
  expect_same_training(c, second.output(0), "SIGKILL at a random moment, saves every " + std::to_string(every));
  // No temporary file of an interrupted save is left once a later save ran.
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << e.path();
}

// 2 workers x 2 replicas under launch.sh --max-restarts 1: one worker is signalled, every worker
// saves at the same step, exits 75, and the launcher restarts the job, which resumes.
TEST_P(Resume, AfterSigtermOnOneWorkerTheRestartedJobEndsBitwiseEqual) {
  const Case c{GetParam() % 2 == 1, true};
  const int step = pick(1, kSteps - 2), worker = pick(0, 1);
  testing::TempDir dir;
  Job job = start(command(c, dir.path(), 0),
                  {{"MIRRORED_TEST_RAISE_AT_STEP", std::to_string(step) + ":TERM:" + std::to_string(worker)}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  ASSERT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: restart 1 of 1: worker"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 0] resumed from the checkpoint of step " + std::to_string(step + 1)));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] resumed from the checkpoint of step " + std::to_string(step + 1)));
  expect_same_training(c, job.output(0),
                       "worker " + std::to_string(worker) + " terminated after step " + std::to_string(step));
}

// The kill lands at a random moment after a random step: inside a later step, its collectives or a
// periodic save (a kill after the last step leaves a finished job, which is not restarted).
TEST_P(Resume, AfterSigkillOfOneWorkerTheRestartedJobEndsBitwiseEqual) {
  const Case c{GetParam() % 2 == 0, true};
  const int every = pick(3, 11), step = pick(1, kSteps - 30), worker = pick(0, 1), delay_us = pick(0, 2000);
  testing::TempDir dir;
  Job job = start(command(c, dir.path(), every),
                  {{"MIRRORED_TEST_RAISE_AT_STEP",
                    std::to_string(step) + ":KILL:" + std::to_string(worker) + ":" + std::to_string(delay_us)},
                   {"MIRRORED_LAUNCH_GRACE_S", "2"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  ASSERT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0),
              HasSubstr("launch: restart 1 of 1: worker " + std::to_string(worker) + " was killed by signal 9"));
  expect_same_training(c, job.output(0),
                       "worker " + std::to_string(worker) + " killed " + std::to_string(delay_us) + " us after step " +
                           std::to_string(step) + ", saves every " + std::to_string(every));
}

INSTANTIATE_TEST_SUITE_P(Seeds, Resume,
                         ::testing::Range(MIRRORED_RESUME_FIRST_SEED,
                                          MIRRORED_RESUME_FIRST_SEED + MIRRORED_RESUME_SEEDS));

}  // namespace resume_tests
}  // namespace mirrored

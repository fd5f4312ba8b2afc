// tools/launch.sh: TF_CONFIGs, output prefixes, exit status, signal forwarding; and train_digits
// on 2 workers x 2 CPU replicas ends with the weights of 1 worker x 4 replicas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cmath>
#include <mirrored/checkpoint.hpp>

#include "cluster/process_harness.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::Job;

constexpr double kJobSeconds = 240;
const std::string kLaunch = std::string(MIRRORED_SOURCE_DIR) + "/tools/launch.sh";

// Runs `argv` as one process (the harness's "job" of one, without a cluster of its own).
Job run(const std::vector<std::string>& argv, const std::map<std::string, std::string>& env = {}) {
  return Job(1, {0}, argv, env);
}

TEST(Launcher, StartsTheWorkersWithTheirTfConfigAndPrefixesTheirOutput) {
  Job job = run({"/bin/bash", kLaunch, "2", "--", MIRRORED_MW_WORKER, "hello", "--timeout", "60"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("[worker 0] hello from worker 0 of 2"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] hello from worker 1 of 2"));
}

TEST(Launcher, ExitsWithTheStatusOfAFailingWorker) {
  Job job = run({"/bin/bash", kLaunch, "3", "--", "/bin/bash", "-c",
                 "echo \"$TF_CONFIG\"; [ \"$MIRRORED_LAUNCH_RANK\" = 1 ] && exit 5; exit 0"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 5) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: worker 1 exited with status 5"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 2] {\"cluster\": {\"worker\": [\"127.0.0.1:"));
  EXPECT_THAT(job.output(0), HasSubstr("\"task\": {\"type\": \"worker\", \"index\": 2}}"));
}

TEST(Launcher, TerminatesTheOthersAfterTheGracePeriod) {
  Job job = run({"/bin/bash", kLaunch, "2", "--", "/bin/bash", "-c",
                 "[ \"$MIRRORED_LAUNCH_RANK\" = 0 ] && exit 4; trap 'echo terminated; exit 9' TERM; "
                 "while true; do sleep 0.1; done"},
                {{"MIRRORED_LAUNCH_GRACE_S", "1"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 4) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] terminated"));
}

TEST(Launcher, ForwardsSignalsToEveryWorker) {
  testing::TempDir dir;
  const std::string ready = dir.path() + "/ready";
  Job job = run(
      {"/bin/bash", kLaunch, "2", "--", "/bin/bash", "-c",
       "trap 'echo got TERM; exit 7' TERM; touch " + ready + ".$MIRRORED_LAUNCH_RANK; while true; do sleep 0.1; done"});
  // Both workers are up (and have their trap) before the launcher is signalled.
  for (int i = 0; i < 1000 && !(std::filesystem::exists(ready + ".0") && std::filesystem::exists(ready + ".1")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  job.signal(0, SIGTERM);
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 7) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("[worker 0] got TERM"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] got TERM"));
}

TEST(Launcher, RestartsEveryWorkerWhenOneAsksForARestart) {
  // Worker 1 asks for a restart (status 75) in rounds 0 and 1; round 2 succeeds.
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "3", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT job $MIRRORED_JOB_ID\"; "
                 "[ \"$MIRRORED_LAUNCH_RANK\" = 1 ] && [ \"$MIRRORED_RESTART_COUNT\" -lt 2 ] && exit 75; exit 0"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  const std::string out = job.output(0);
  for (const char* line : {"[worker 0] round 0", "[worker 1] round 0", "[worker 0] round 1", "[worker 1] round 1",
                           "[worker 0] round 2", "[worker 1] round 2"})
    EXPECT_THAT(out, HasSubstr(line));
  EXPECT_THAT(out, HasSubstr("launch: restart 1 of 3: worker 1 exited with status 75 (restart requested)"));
  EXPECT_THAT(out, HasSubstr("launch: restart 2 of 3:"));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("restart 3 of 3")));
  EXPECT_THAT(out, ::testing::Not(HasSubstr("round 3")));
}

TEST(Launcher, RestartsAfterAWorkerIsKilledAndGivesUpAfterTheLimit) {
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "2", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT\"; [ \"$MIRRORED_LAUNCH_RANK\" = 0 ] && kill -KILL $$; exit 0"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 128 + SIGKILL) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: restart 1 of 2: worker 0 was killed by signal 9"));
  EXPECT_THAT(job.output(0), HasSubstr("launch: restart 2 of 2: worker 0 was killed by signal 9"));
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] round 2"));
  EXPECT_THAT(job.output(0), HasSubstr("launch: giving up after 2 restart(s): worker 0 was killed by signal 9"));
}

TEST(Launcher, DoesNotRestartAnErrorThatWouldOnlyHappenAgain) {
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "5", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT\"; exit 3"});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 3) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: not restarting: the failure was not a preemption or a crash"));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("round 1")));
}

TEST(Launcher, DoesNotRestartWhenItIsToldToStop) {
  // The workers save and ask for a restart when terminated, as a preemption handler does; the
  // launcher, terminated itself, passes their status on and starts nothing.
  testing::TempDir dir;
  const std::string ready = dir.path() + "/ready";
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "3", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT\"; trap 'exit 75' TERM; touch " + ready +
                     ".$MIRRORED_LAUNCH_RANK.$MIRRORED_RESTART_COUNT; while true; do sleep 0.1; done"});
  for (int i = 0; i < 1000 && !(std::filesystem::exists(ready + ".0.0") && std::filesystem::exists(ready + ".1.0")); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  job.signal(0, SIGTERM);
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 75) << job.outputs();
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("round 1")));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("launch: restart")));
}

TEST(Launcher, RejectsABadRestartCount) {
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "-1", "--", "true"});
  ASSERT_TRUE(job.wait(kJobSeconds));
  EXPECT_EQ(job.code(0), 2);
  EXPECT_THAT(job.output(0), HasSubstr("--max-restarts K"));
}

TEST(Launcher, RejectsBadArguments) {
  Job job = run({"/bin/bash", kLaunch, "two", "--", "true"});
  ASSERT_TRUE(job.wait(kJobSeconds));
  EXPECT_EQ(job.code(0), 2);
  EXPECT_THAT(job.output(0), HasSubstr("usage: tools/launch.sh N"));
}

#ifdef MIRRORED_TRAIN_DIGITS
std::map<std::string, std::vector<float>> weights(const std::string& path) {
  std::map<std::string, std::vector<float>> out;
  const auto ckpt = checkpoint::load(path);
  for (const auto& name : ckpt.names()) out[name] = ckpt.get<float>(name).to_vector();
  return out;
}

TEST(Launcher, TrainDigitsOnTwoWorkersMatchesOneWorkerWithFourReplicas) {
  testing::TempDir dir;
  const std::vector<std::string> common{"--epochs", "2", "--global-batch", "30", "--seed", "7"};
  std::vector<std::string> multi{
      "/bin/bash",    kLaunch,     "2",           "--",     MIRRORED_TRAIN_DIGITS,   "--strategy",
      "multi_worker", "--devices", "CPU:0,CPU:1", "--save", dir.path() + "/multi.st"};
  multi.insert(multi.end(), common.begin(), common.end());
  std::vector<std::string> single{MIRRORED_TRAIN_DIGITS, "--devices", "CPU:0,CPU:1,CPU:2,CPU:3", "--save",
                                  dir.path() + "/single.st"};
  single.insert(single.end(), common.begin(), common.end());
  Job a = run(multi);
  Job b = run(single);
  ASSERT_TRUE(a.wait(kJobSeconds)) << a.outputs();
  ASSERT_TRUE(b.wait(kJobSeconds)) << b.outputs();
  ASSERT_EQ(a.code(0), 0) << a.outputs();
  ASSERT_EQ(b.code(0), 0) << b.outputs();
  EXPECT_THAT(a.output(0), HasSubstr("[worker 0] training on"));
  EXPECT_THAT(a.output(0), HasSubstr("4 replicas"));
  const auto m = weights(dir.path() + "/multi.st");
  const auto s = weights(dir.path() + "/single.st");
  ASSERT_EQ(m.size(), 4u);
  for (const auto& [name, want] : s) {
    ASSERT_TRUE(m.count(name)) << name;
    const auto& got = m.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    float largest = 0;
    for (float x : want) largest = std::max(largest, std::fabs(x));
    for (std::size_t i = 0; i < want.size(); ++i) {
      // Only the order of the sums differs (within a worker, then across workers).
      EXPECT_LE(std::fabs(got[i] - want[i]), 1e-5f * std::max({std::fabs(got[i]), std::fabs(want[i]), largest}))
          << name << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
}
#endif

}  // namespace
}  // namespace mirrored

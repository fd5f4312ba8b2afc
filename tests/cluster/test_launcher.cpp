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
  for (int i = 0; i < 1000 && !(std::filesystem::exists(ready + ".0.0") && std::filesystem::exists(ready + ".1.0"));
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  job.signal(0, SIGTERM);
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 75) << job.outputs();
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("round 1")));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("launch: restart")));
}

TEST(Launcher, DoesNotRestartWhenTheFirstFailureWasAnErrorAndTheOthersWereTerminatedAfterIt) {
  // Worker 0 fails for good (a usage error); worker 1 would run on and is terminated by the
  // launcher after the grace period: that death by SIGTERM is the launcher's doing, not a crash.
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "3", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT\"; [ \"$MIRRORED_LAUNCH_RANK\" = 0 ] && exit 2; "
                 "while true; do sleep 0.1; done"},
                {{"MIRRORED_LAUNCH_GRACE_S", "1"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 2) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: worker 1 exited with status 143"));
  EXPECT_THAT(job.output(0), HasSubstr("launch: not restarting: the failure was not a preemption or a crash"));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("round 1")));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("launch: restart")));
}

TEST(Launcher, PrintsNoShellNoticeWhenItKillsAWorker) {
  // Worker 1 ignores SIGTERM, so the launcher kills it 10 s after the grace period; the output
  // says so in the launcher's words only, and keeps what the worker printed.
  Job job = run({"/bin/bash", kLaunch, "2", "--", "/bin/bash", "-c",
                 "[ \"$MIRRORED_LAUNCH_RANK\" = 0 ] && exit 4; trap '' TERM; echo waiting; "
                 "while true; do sleep 0.1; done"},
                {{"MIRRORED_LAUNCH_GRACE_S", "1"}});
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 4) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("[worker 1] waiting"));
  EXPECT_THAT(job.output(0), HasSubstr("launch: worker 1 exited with status 137"));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("Killed")));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("TF_CONFIG=")));
}

TEST(Launcher, ForwardsSigintAndSighupAsTheSignalTheWorkersSaveOn) {
  // Ctrl-C or a closed terminal must not cost the training: the workers get SIGTERM, which
  // PreemptionCheckpointHandler saves on (here: a trap that says so and exits 75, as it does).
  for (int sig : {SIGINT, SIGHUP}) {
    testing::TempDir dir;
    const std::string ready = dir.path() + "/ready";
    Job job = run(
        {"/bin/bash", kLaunch, "2", "--", "/bin/bash", "-c",
         "trap 'echo saved; exit 75' TERM; touch " + ready + ".$MIRRORED_LAUNCH_RANK; while true; do sleep 0.1; done"});
    for (int i = 0; i < 1000 && !(std::filesystem::exists(ready + ".0") && std::filesystem::exists(ready + ".1")); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    job.signal(0, sig);
    ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
    EXPECT_EQ(job.code(0), 75) << "signal " << sig << "\n" << job.outputs();
    EXPECT_THAT(job.output(0), HasSubstr("[worker 0] saved")) << "signal " << sig;
    EXPECT_THAT(job.output(0), HasSubstr("[worker 1] saved")) << "signal " << sig;
  }
}

TEST(Launcher, StartsNoFurtherRoundWhenItIsSignalledBetweenTwoRounds) {
  // Round 0 ends with a restart request; the launcher is terminated while it waits to restart
  // (a long MIRRORED_LAUNCH_RESTART_DELAY_S holds it between the rounds): round 1 never starts.
  Job job = run({"/bin/bash", kLaunch, "2", "--max-restarts", "3", "--", "/bin/bash", "-c",
                 "echo \"round $MIRRORED_RESTART_COUNT\"; "
                 "[ \"$MIRRORED_LAUNCH_RANK\" = 1 ] && [ \"$MIRRORED_RESTART_COUNT\" = 0 ] && exit 75; "
                 "trap 'exit 75' TERM; while true; do sleep 0.1; done"},
                {{"MIRRORED_LAUNCH_GRACE_S", "1"}, {"MIRRORED_LAUNCH_RESTART_DELAY_S", "600"}});
  ASSERT_TRUE(job.wait_for_output(0, "launch: restart 1 of 3:", kJobSeconds)) << job.outputs();
  job.signal(0, SIGTERM);
  ASSERT_TRUE(job.wait(kJobSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 75) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("launch: not restarting: the launcher was told to stop"));
  EXPECT_THAT(job.output(0), ::testing::Not(HasSubstr("round 1")));
}

TEST(Launcher, RejectsNumbersOutOfRangeAsUsageErrors) {
  // Bash's arithmetic would wrap these around (a restart count that never runs out).
  struct Case {
    std::vector<std::string> argv;
    std::map<std::string, std::string> env;
    std::string message;
  };
  const std::vector<Case> cases{
      {{"2", "--max-restarts", "99999999999999999999", "--", "true"},
       {},
       "launch: --max-restarts must be a whole number from 0 to 1000000, not '99999999999999999999'"},
      {{"2", "--max-restarts", "1000001", "--", "true"},
       {},
       "launch: --max-restarts must be a whole number from 0 to 1000000, not '1000001'"},
      {{"2", "--max-restarts", "+3", "--", "true"},
       {},
       "launch: --max-restarts must be a whole number from 0 to 1000000, not '+3'"},
      {{"2", "--", "true"},
       {{"MIRRORED_LAUNCH_GRACE_S", "1e3"}},
       "launch: MIRRORED_LAUNCH_GRACE_S must be a number of seconds (digits, an optional fraction), not '1e3'"},
      {{"99999999999999999999", "--", "true"},
       {},
       "launch: N (the number of workers) must be a whole number from 1 to 1024, not '99999999999999999999'"},
      {{"1025", "--", "true"},
       {},
       "launch: N (the number of workers) must be a whole number from 1 to 1024, not '1025'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv{"/bin/bash", kLaunch};
    argv.insert(argv.end(), c.argv.begin(), c.argv.end());
    Job job = run(argv, c.env);
    // ASSERT: a count the launcher took would start that many rounds or workers.
    ASSERT_TRUE(job.wait(kJobSeconds)) << c.message;
    ASSERT_EQ(job.code(0), 2) << c.message << "\n" << job.output(0);
    EXPECT_THAT(job.output(0), HasSubstr(c.message));
    EXPECT_THAT(job.output(0), HasSubstr("usage: tools/launch.sh N"));
  }
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

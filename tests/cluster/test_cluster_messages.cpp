// What the workers of a job say when they are configured differently (each fails at once, naming
// the difference), and the warnings of clean and failed runs: none that are wrong or repeated.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <sstream>

#include "cluster/process_harness.hpp"

namespace mirrored {
namespace cluster_messages {
namespace {

using ::testing::HasSubstr;
using testing::Job;
using ::testing::Not;
using testing::tf_config;
using testing::TfConfigs;

// Generous bounds for loaded machines and sanitizer builds; never a claim about speed.
constexpr double kRunSeconds = 120;
// The start-up timeout of the misconfigured jobs: failing at once means well before it.
constexpr double kStartupTimeout = 300;
constexpr double kAtOnceSeconds = 60;

std::vector<std::string> hello(double timeout) {
  return {MIRRORED_MW_WORKER, "hello", "--timeout", std::to_string(timeout)};
}

const std::map<std::string, std::string> kTcp{{"MIRRORED_SHARED_MEMORY", "0"}};

// The lines of `text` that contain `what`.
int lines_with(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find(what) != std::string::npos;
  return n;
}

int occurrences(const std::string& text, const std::string& what) {
  int n = 0;
  for (auto at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

std::string line_with(const std::string& text, const std::string& what) {
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(what) != std::string::npos) return line;
  return "";
}

TEST(StartUp, TwoWorkersWithTaskIndexZeroBothFailAtOnceNamingTheIndex) {
  Job job(TfConfigs{[](const auto& a) {
            return std::vector<std::string>{tf_config(a, 0), tf_config(a, 0)};
          }},
          2, hello(kStartupTimeout), kTcp);
  ASSERT_TRUE(job.wait(kAtOnceSeconds)) << job.outputs();
  const std::string expected =
      "unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy start-up: two workers "
      "claim task index 0 (worker 0 (" +
      job.addresses()[0] + "))";
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(job.code(p), 1) << job.outputs();
    EXPECT_THAT(job.output(p), HasSubstr(expected)) << job.outputs();
    EXPECT_THAT(job.output(p), Not(HasSubstr("Address already in use"))) << job.outputs();
  }
}

TEST(StartUp, DifferentWorkerListsFailEveryWorkerAtOnceNamingBothLists) {
  // Worker 1 lists another second worker: by default the job ids (derived from the lists) differ.
  Job job(TfConfigs{[](const auto& a) {
            return std::vector<std::string>{tf_config({a[0], a[1]}, 0), tf_config({a[0], a[2]}, 1)};
          }},
          3, hello(kStartupTimeout), {{"MIRRORED_SHARED_MEMORY", "0"}, {"MIRRORED_JOB_ID", ""}});
  ASSERT_TRUE(job.wait(kAtOnceSeconds)) << job.outputs();
  const auto& a = job.addresses();
  const std::string expected =
      "unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy start-up: the workers' "
      "TF_CONFIGs differ: worker 1 (" +
      a[2] + ") has a cluster of 2 workers [worker 0 (" + a[0] + "), worker 1 (" + a[2] +
      ")] but the chief, worker 0 (" + a[0] + "), has 2 workers [worker 0 (" + a[0] + "), worker 1 (" + a[1] + ")]\n";
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(job.code(p), 1) << job.outputs();
    EXPECT_THAT(job.output(p), HasSubstr(expected)) << job.outputs();
  }
}

TEST(StartUp, ClusterSizesThatDifferUnderOneJobIdFailEveryWorkerAtOnceNamingBothSizes) {
  Job job(TfConfigs{[](const auto& a) {
            return std::vector<std::string>{tf_config({a[0], a[1]}, 0), tf_config({a[0], a[1], a[2]}, 1)};
          }},
          3, hello(kStartupTimeout), {{"MIRRORED_SHARED_MEMORY", "1"}});
  ASSERT_TRUE(job.wait(kAtOnceSeconds)) << job.outputs();
  const auto& a = job.addresses();
  const std::string expected =
      "unexpected INVALID_ARGUMENT: MultiWorkerMirroredStrategy start-up: the workers' "
      "TF_CONFIGs differ: worker 1 (" +
      a[1] + ") has a cluster of 3 workers [worker 0 (" + a[0] + "), worker 1 (" + a[1] + "), worker 2 (" + a[2] +
      ")] but the chief, worker 0 (" + a[0] + "), has 2 workers [worker 0 (" + a[0] + "), worker 1 (" + a[1] + ")]\n";
  for (int p = 0; p < 2; ++p) {
    EXPECT_EQ(job.code(p), 1) << job.outputs();
    EXPECT_THAT(job.output(p), HasSubstr(expected)) << job.outputs();
    EXPECT_THAT(job.output(p), Not(HasSubstr("shared memory"))) << job.outputs();
  }
}

TEST(StartUp, AMissingChiefIsNamedWithItsAddressOnce) {
  Job job(2, {1}, hello(2), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(1), 1) << job.outputs();
  const std::string chief = job.addresses()[0];
  const std::string line = line_with(job.output(1), "DEADLINE_EXCEEDED");
  EXPECT_THAT(line, HasSubstr("MultiWorkerMirroredStrategy: worker 0, the chief, never joined within 2 s: could not "
                              "connect to the chief's store at " +
                              chief + " ("))
      << job.outputs();
  EXPECT_EQ(occurrences(line, chief), 1) << line;
}

TEST(Warnings, ABadFlightRecorderSizeIsWarnedOncePerProcess) {
  std::map<std::string, std::string> env = kTcp;
  env["MIRRORED_FLIGHT_RECORDER_ENTRIES"] = "lots";
  Job job(2, {0, 1}, {MIRRORED_MW_WORKER, "collectives", "--replicas", "2", "--timeout", "60"}, env);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w = 0; w < 2; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_EQ(lines_with(job.output(w),
                         "MIRRORED_FLIGHT_RECORDER_ENTRIES must be an integer in [0, 1048576], got "
                         "'lots'; using 256"),
              1)
        << job.outputs();
  }
}

TEST(Warnings, CleanRunsSayGoodbyeWithoutAWarning) {
  for (int run = 0; run < 10; ++run) {
    Job job(3, {0, 1, 2}, hello(60), kTcp);
    ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
    for (int w = 0; w < 3; ++w) {
      EXPECT_EQ(job.code(w), 0) << "run " << run << "\n" << job.outputs();
      EXPECT_THAT(job.output(w), Not(HasSubstr("could not say goodbye"))) << "run " << run << "\n" << job.outputs();
      EXPECT_THAT(job.output(w), Not(HasSubstr("leaves before every other worker"))) << job.outputs();
    }
  }
}

TEST(Warnings, TheChiefNeverReportsItselfGone) {
  Job job(2, {0, 1}, {MIRRORED_MW_WORKER, "kill", "--victim", "1", "--step", "3", "--timeout", "60"}, kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(1), -SIGKILL) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("worker 1 (" + job.addresses()[1] + ") is gone")) << job.outputs();
  EXPECT_THAT(job.output(0), Not(HasSubstr("worker 0 (" + job.addresses()[0] + ") is gone"))) << job.outputs();
}

}  // namespace
}  // namespace cluster_messages
}  // namespace mirrored

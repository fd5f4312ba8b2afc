// MultiWorkerMirroredStrategy across processes on 127.0.0.1: every collective with exact values
// (Gloo over TCP, shared memory, the file store), calls that differ between workers, and the
// faults — a worker killed, stopped, never joining, or leaving early.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cluster/process_harness.hpp"
#include "fs_test_util.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::Job;

// Generous bounds for loaded machines and sanitizer builds; never a claim about speed.
constexpr double kRunSeconds = 120;

std::vector<std::string> worker(const std::string& scenario, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{MIRRORED_MW_WORKER, scenario};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return argv;
}

std::vector<int> ranks(int n) {
  std::vector<int> out;
  for (int r = 0; r < n; ++r) out.push_back(r);
  return out;
}

const std::map<std::string, std::string> kTcp{{"MIRRORED_SHARED_MEMORY", "0"}};
// Small slots: a 1.2 MB all-reduce crosses many of them.
const std::map<std::string, std::string> kShm{{"MIRRORED_SHARED_MEMORY", "1"}, {"MIRRORED_SHM_SLOT_KB", "64"}};

struct Config {
  int workers;
  int replicas;
  bool shm;
};

class Collectives : public ::testing::TestWithParam<Config> {};

TEST_P(Collectives, EveryCollectiveSpansTheWorkersWithExactValues) {
  const Config c = GetParam();
  Job job(c.workers, ranks(c.workers), worker("collectives", {"--replicas", std::to_string(c.replicas)}),
          c.shm ? kShm : kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w)));
  }
}

INSTANTIATE_TEST_SUITE_P(Clusters, Collectives,
                         ::testing::Values(Config{2, 1, false}, Config{2, 2, true}, Config{3, 2, false},
                                           Config{3, 1, true}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "Workers" + std::to_string(info.param.replicas) +
                                  "Replicas" + (info.param.shm ? "SharedMemory" : "Tcp");
                         });

// The ring between workers (TCP) at uneven sizes, in place (2 replicas: the local sum is reduced
// across workers where it lies) and not (1 replica: input and output differ).
class RingSizes : public ::testing::TestWithParam<Config> {};

TEST_P(RingSizes, EveryElementIsTheExactSum) {
  const Config c = GetParam();
  Job job(c.workers, ranks(c.workers), worker("ring", {"--replicas", std::to_string(c.replicas)}), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w)));
  }
}

INSTANTIATE_TEST_SUITE_P(Clusters, RingSizes, ::testing::Values(Config{2, 1, false}, Config{3, 2, false}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "Workers" + std::to_string(info.param.replicas) +
                                  "Replicas";
                         });

// checkpoint::CheckpointManager across workers (tests/cluster/mw_checkpoint.cpp): every worker
// saves (sharded Adam slots gathered, every worker's iterator state collected), only the chief
// writes, and every worker restores bitwise into a fresh model and optimizer from the shared
// directory, its own iterator state included.
TEST(CheckpointManagerWorkers, SaveGathersEveryWorkerAndEveryWorkerRestores) {
  for (const Config c : {Config{2, 1, false}, Config{2, 2, true}}) {
    SCOPED_TRACE(std::to_string(c.workers) + " workers of " + std::to_string(c.replicas) + " replicas");
    testing::TempDir dir;
    std::map<std::string, std::string> env = c.shm ? kShm : kTcp;
    env["MW_CHECKPOINT_DIR"] = dir.path() + "/ckpts";
    Job job(c.workers, ranks(c.workers), worker("checkpoint", {"--replicas", std::to_string(c.replicas)}), env);
    ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
    for (int w = 0; w < c.workers; ++w) {
      EXPECT_EQ(job.code(w), 0) << job.outputs();
      EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w)));
    }
  }
}

// CommunicationOptions::compression (tests/cluster/mw_compression.cpp): FP16 and BF16 all-reduces,
// asynchronous ones, reduce_scatter, GradientBuckets and apply_gradients follow the documented
// rounding bit for bit; other dtypes are untouched; workers passing different compressions fail
// together. Over Gloo/TCP (chosen by CommunicationImplementation::RING) and shared memory (the
// default on one host), which the log line checked here confirms.
class CompressedCollectives : public ::testing::TestWithParam<Config> {};

// Runs mw_worker's compression scenario on `c` (over Gloo's ring where not shared memory, with
// `args` and `env` added) and checks that every worker passed it; `also` is one more line each
// worker's output must hold ("" for none).
void expect_compression_passes(const Config& c, std::vector<std::string> args, std::map<std::string, std::string> env,
                               const std::string& also) {
  args.insert(args.end(), {"--replicas", std::to_string(c.replicas)});
  if (c.shm) {
    env.insert(kShm.begin(), kShm.end());
  } else {
    args.insert(args.end(), {"--implementation", "ring"});
  }
  Job job(c.workers, ranks(c.workers), worker("compression", args), env);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w = 0; w < c.workers; ++w) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("OK worker " + std::to_string(w)));
    if (!also.empty()) {
      EXPECT_THAT(job.output(w), HasSubstr(also));
    }
  }
}

TEST_P(CompressedCollectives, FollowTheRoundingRule) {
  const Config c = GetParam();
  expect_compression_passes(
      c, {}, {{"MIRRORED_LOG_LEVEL", "INFO"}},
      c.shm ? "cross-worker transport: shared memory" : "cross-worker transport: Gloo ring over TCP");
}

INSTANTIATE_TEST_SUITE_P(Clusters, CompressedCollectives,
                         ::testing::Values(Config{2, 1, false}, Config{2, 2, false}, Config{2, 1, true},
                                           Config{2, 2, true}, Config{3, 1, false}, Config{3, 2, true}),
                         [](const auto& info) {
                           return std::to_string(info.param.workers) + "Workers" + std::to_string(info.param.replicas) +
                                  "Replicas" + (info.param.shm ? "SharedMemory" : "Tcp");
                         });

// The same scenario with every replica on a simulated GPU of its worker (MIRRORED_SIMULATED_GPUS:
// the device-generic paths CI runs), where the compressed packs are rounded and widened by the
// GPUs' cast kernels: the same bits, and half the bytes from the GPU to the host.
class CompressedCollectivesOnGpus : public ::testing::TestWithParam<Config> {};

TEST_P(CompressedCollectivesOnGpus, RoundOnTheGpuAndFollowTheRoundingRule) {
  const Config c = GetParam();
  std::map<std::string, std::string> env{{"MIRRORED_SIMULATED_GPUS", std::to_string(c.replicas)}};
  if (!c.shm) env.insert(kTcp.begin(), kTcp.end());
  expect_compression_passes(c, {"--gpus", "1"}, env, "");
}

INSTANTIATE_TEST_SUITE_P(Clusters, CompressedCollectivesOnGpus,
                         ::testing::Values(Config{2, 1, false}, Config{2, 2, true}), [](const auto& info) {
                           return std::to_string(info.param.workers) + "Workers" + std::to_string(info.param.replicas) +
                                  "Gpus" + (info.param.shm ? "SharedMemory" : "Tcp");
                         });

TEST(MultiWorker, TheFileStoreWorksLikeTheChiefsStore) {
  testing::TempDir dir;
  Job job(2, ranks(2), worker("collectives", {"--replicas", "1"}),
          {{"MIRRORED_STORE", "file:" + dir.path()}, {"MIRRORED_SHARED_MEMORY", "0"}});
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
}

TEST(MultiWorker, WorkersCallingDifferentCollectivesAllFail) {
  Job job(2, ranks(2), worker("mismatch"), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
}

// A killed worker: every survivor gets UnavailableError naming it within 2 s (checked by the
// workers), then FailedPreconditionError.
class Kill : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(Kill, SurvivorsReportTheDeadWorker) {
  const auto [victim, shm] = GetParam();
  Job job(3, ranks(3), worker("kill", {"--victim", std::to_string(victim), "--step", "3", "--timeout", "60"}),
          shm ? kShm : kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(victim), -SIGKILL) << job.outputs();
  for (int w = 0; w < 3; ++w) {
    if (w == victim) continue;
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("UnavailableError")) << job.outputs();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Victims, Kill, ::testing::Values(std::make_tuple(2, false), std::make_tuple(0, false), std::make_tuple(1, true)),
    [](const auto& info) {
      return "Worker" + std::to_string(std::get<0>(info.param)) + (std::get<1>(info.param) ? "SharedMemory" : "Tcp");
    });

// Without the chief's store (which notices a dead worker's connections close), workers on one host
// notice a peer's process is gone while they wait for it in shared memory.
TEST(MultiWorker, ADeadWorkerIsNoticedInSharedMemoryWithTheFileStore) {
  testing::TempDir dir;
  Job job(2, ranks(2), worker("kill", {"--victim", "1", "--step", "2", "--timeout", "60"}),
          {{"MIRRORED_STORE", "file:" + dir.path()}, {"MIRRORED_SHARED_MEMORY", "1"}});
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(1), -SIGKILL) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("its process")) << job.outputs();
}

// A worker whose step fails (its replica function throws) fails the job for the others at once.
TEST(MultiWorker, AFailingReplicaFunctionAbortsTheOtherWorkers) {
  Job job(3, ranks(3), worker("replica_throws", {"--victim", "1", "--step", "2", "--replicas", "2", "--timeout", "60"}),
          kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w = 0; w < 3; ++w) EXPECT_EQ(job.code(w), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("AbortedError")) << job.outputs();
  EXPECT_THAT(job.output(1), HasSubstr("victim threw: boom")) << job.outputs();
}

// A stopped (hung) worker: DeadlineExceededError after the timeout, naming it.
TEST(MultiWorker, AStoppedWorkerGivesDeadlineExceededAfterTheTimeout) {
  Job job(3, ranks(3), worker("stop", {"--victim", "1", "--step", "2", "--timeout", "3"}), kTcp);
  // The survivors report, then the stopped worker is killed (the chief's store serves until then).
  job.wait_for_output(0, "OK", kRunSeconds);
  ASSERT_TRUE(job.wait_for(2, kRunSeconds)) << job.outputs();
  job.signal(1, SIGKILL);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w : {0, 2}) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("DeadlineExceededError")) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("worker 1 (")) << job.outputs();
  }
}

// One deadline per collective across workers: a peer that never arrives fails the all-reduce at
// the timeout plus the grace, counted from the first local replica's call, even though the leader
// replica entered late (measured inside the workers; over TCP and shared memory).
TEST(MultiWorker, APeerThatNeverArrivesFailsTheCollectiveAtTheTimeoutPlusTheGrace) {
  for (const auto* env : {&kTcp, &kShm}) {
    Job job(2, ranks(2), worker("late_leader", {"--victim", "1", "--timeout", "2"}), *env);
    job.wait_for_output(0, "OK", kRunSeconds);
    job.signal(1, SIGKILL);
    ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
    EXPECT_EQ(job.code(0), 0) << job.outputs();
    EXPECT_THAT(job.output(0), HasSubstr("DeadlineExceededError after")) << job.outputs();
    const std::string out = job.output(0);
    const auto at = out.find("DeadlineExceededError after");
    if (at != std::string::npos)  // the measurement, for the record
      std::cout << (env == &kTcp ? "tcp: " : "shm: ") << out.substr(at, out.find(':', at) - at) << "\n";
  }
}

// Across workers as within one process, a collective that waits longer than
// MIRRORED_STALL_WARN_S says so, naming the worker that shows no sign of life (here stopped,
// with a peer timeout longer than the collective's so that the timeout decides).
TEST(MultiWorker, ACollectiveWaitingForAStoppedWorkerWarnsAfterTheStallTime) {
  auto env = kTcp;
  env["MIRRORED_STALL_WARN_S"] = "2.5";
  env["MIRRORED_PEER_TIMEOUT_S"] = "60";
  Job job(2, ranks(2), worker("stop", {"--victim", "1", "--step", "2", "--timeout", "5"}), env);
  job.wait_for_output(0, "OK", kRunSeconds);
  job.signal(1, SIGKILL);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("has waited 2.5 s in cross-worker collective #")) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("stopped or hung (no sign of life for 2 s): worker 1 (")) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("DeadlineExceededError")) << job.outputs();
}

TEST(MultiWorker, AStoppedWorkerOnSharedMemoryGivesDeadlineExceeded) {
  Job job(2, ranks(2), worker("stop", {"--victim", "1", "--step", "2", "--timeout", "2"}), kShm);
  job.wait_for_output(0, "OK", kRunSeconds);
  job.signal(1, SIGKILL);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_THAT(job.output(0), HasSubstr("DeadlineExceededError")) << job.outputs();
}

// What tools/flight_report.py prints for the dumps in `dir`.
std::string flight_report_of(const std::string& dir) {
  const std::string command =
      std::string("python3 ") + MIRRORED_SOURCE_DIR + "/tools/flight_report.py " + dir + " 2>&1";
  std::string out;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) out.append(buf, n);
    ::pclose(pipe);
  }
  return out;
}

// tools/flight_report.py's output (stdout and stderr) and exit status for `args`.
struct ToolRun {
  std::string out;
  int status = -1;
};
ToolRun flight_report_run(const std::string& args) {
  const std::string command =
      std::string("python3 ") + MIRRORED_SOURCE_DIR + "/tools/flight_report.py " + args + " 2>&1";
  ToolRun run;
  if (FILE* pipe = ::popen(command.c_str(), "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), pipe)) > 0) run.out.append(buf, n);
    const int st = ::pclose(pipe);
    run.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }
  return run;
}

// A dump of one replica (CPU:0) of `worker` of 2 that completed all_reduce #1..#done; `identity`
// is the dump's "job_id" and "attempt" members (empty: a dump that names neither).
std::string fake_dump(int worker, int done, const std::string& identity) {
  std::string entries;
  for (int i = 1; i <= done; ++i)
    entries += (i > 1 ? ", " : "") + std::string("{\"seq\": ") + std::to_string(i) +
               ", \"kind\": \"all_reduce\", \"state\": \"done\"}";
  return "{\"worker\": " + std::to_string(worker) + ", \"num_workers\": 2, \"pid\": 1, " + identity +
         (identity.empty() ? "" : ", ") +
         "\"strategies\": [{\"replicas\": [{\"replica\": 0, \"device\": " + "\"CPU:0\", \"entries\": [" + entries +
         "]}]}]}\n";
}

using testing::write_file;  // fs_test_util.hpp's

// Worker 1 wrote a dump in attempt 0 (behind at #4) and none in attempt 1, where worker 0 wrote
// one: merging the two would blame worker 1 for attempt 0's state.
TEST(FlightReportTool, UsesTheNewestAttemptAndNamesTheDumpsItLeftOut) {
  testing::TempDir dir;
  write_file(dir.path() + "/flight_recorder.worker0.json",
             fake_dump(0, 5, "\"job_id\": \"launch-9-1\", \"attempt\": 1"));
  write_file(dir.path() + "/flight_recorder.worker1.json",
             fake_dump(1, 3, "\"job_id\": \"launch-9-0\", \"attempt\": 0"));
  const ToolRun run = flight_report_run(dir.path());
  EXPECT_EQ(run.status, 0) << run.out;
  EXPECT_THAT(run.out, HasSubstr("flight_report.py: using attempt 1 (job launch-9-1); left out: " + dir.path() +
                                 "/flight_recorder.worker1.json (attempt 0, job launch-9-0)\n"));
  EXPECT_THAT(run.out, HasSubstr("worker 1 wrote no dump"));
  EXPECT_THAT(run.out, ::testing::Not(HasSubstr("is behind")));
  // An earlier attempt on request.
  const ToolRun earlier = flight_report_run("--attempt 0 " + dir.path());
  EXPECT_EQ(earlier.status, 0) << earlier.out;
  EXPECT_THAT(earlier.out, HasSubstr("flight_report.py: using attempt 0 (job launch-9-0)"));
  EXPECT_THAT(earlier.out, HasSubstr("worker 0 wrote no dump"));
}

TEST(FlightReportTool, RefusesDumpsThatDoNotBelongToOneJob) {
  testing::TempDir dir;
  const std::string a = dir.path() + "/a.json", b = dir.path() + "/b.json", c = dir.path() + "/c.json";
  write_file(a, fake_dump(0, 3, "\"job_id\": \"launch-1-0\", \"attempt\": 0"));
  write_file(b, fake_dump(1, 3, "\"job_id\": \"launch-2-0\", \"attempt\": 0"));
  write_file(c, fake_dump(1, 3, ""));
  const ToolRun two_jobs = flight_report_run(a + " " + b);
  EXPECT_EQ(two_jobs.status, 2) << two_jobs.out;
  EXPECT_EQ(two_jobs.out,
            "flight_report.py: the dumps of attempt 0 are of different jobs (launch-1-0, launch-2-0): name the files "
            "of one job\n");
  const ToolRun unknown = flight_report_run(a + " " + c);
  EXPECT_EQ(unknown.status, 2) << unknown.out;
  EXPECT_EQ(unknown.out, "flight_report.py: cannot tell which dumps belong together: " + c +
                             " named no attempt, the others did (attempt 0, job launch-1-0)\n");
  // Dumps that name neither (written before dumps named them, or outside the launcher) are one job.
  const ToolRun old = flight_report_run(c);
  EXPECT_EQ(old.status, 0) << old.out;
  EXPECT_THAT(old.out, HasSubstr("no divergence: every replica made the same calls up to #3"));
}

TEST(FlightReportTool, SaysWhatIsWrongWithAMalformedDumpAndExitsWith2) {
  testing::TempDir dir;
  const std::string path = dir.path() + "/dump.json";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"[1, 2]\n", "not a flight-recorder dump: a JSON object expected, not list"},
      {"{\"worker\": 0, \"strategies\": [{\"replicas\": [{\"replica\": 0, \"device\": \"CPU:0\", \"entries\": "
       "[{\"kind\": \"all_reduce\", \"state\": \"done\"}]}]}]}\n",
       "not a flight-recorder dump: an entry without a \"seq\" number: {\"kind\": \"all_reduce\", \"state\": "
       "\"done\"}"},
      {"{\"worker\": 0, \"strategies\": {}}\n", "not a flight-recorder dump: \"strategies\" must be a list"},
      {"{\"worker\": \"0\"}\n", "not a flight-recorder dump: \"worker\" must be a number >= 0"},
      {"{\"worker\": 0, \"strategies\": [{\"replicas\": [{\"replica\": 0}]}]}\n",
       "not a flight-recorder dump: a replica must be an object with \"replica\" (a number), \"device\" (a string) "
       "and \"entries\" (a list)"},
      {"{\"worker\": 0, \"attempt\": -1}\n", "not a flight-recorder dump: \"attempt\" must be a number >= 0 or null"},
  };
  for (const auto& [text, message] : cases) {
    write_file(path, text);
    const ToolRun run = flight_report_run(path);
    EXPECT_EQ(run.status, 2) << text << run.out;
    EXPECT_EQ(run.out, "flight_report.py: " + path + ": " + message + "\n") << text;
  }
  const ToolRun truncated = (write_file(path, "{\"worker\": 0, \"stra"), flight_report_run(path));
  EXPECT_EQ(truncated.status, 2) << truncated.out;
  EXPECT_THAT(truncated.out, HasSubstr("flight_report.py: cannot read " + path + ": "));
  EXPECT_THAT(truncated.out, ::testing::Not(HasSubstr("Traceback")));
}

bool exists_eventually(const std::string& path) {
  for (int i = 0; i < 600 && !std::filesystem::exists(path); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  return std::filesystem::exists(path);
}

// A worker that skips an all-reduce and goes on computing: the others fail at the timeout (plus
// the grace) with a flight-recorder report naming it and the collective it has not entered
// (checked inside the workers), and tools/flight_report.py on every worker's dump names it too.
TEST(MultiWorker, AWorkerSkippingACollectiveIsNamedByTheReportAndTheTool) {
  testing::TempDir dir;
  auto env = kTcp;
  env["MIRRORED_FLIGHT_RECORDER_DIR"] = dir.path();
  Job job(3, ranks(3), worker("skip", {"--victim", "1", "--step", "3", "--timeout", "2"}), env);
  job.wait_for_output(0, "OK", kRunSeconds);
  job.wait_for_output(2, "OK", kRunSeconds);
  // The victim's monitor dumps its rings when it learns of the failure.
  EXPECT_TRUE(exists_eventually(dir.path() + "/flight_recorder.worker1.json")) << job.outputs();
  job.signal(1, SIGKILL);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w : {0, 2}) {
    EXPECT_EQ(job.code(w), 0) << job.outputs();
    EXPECT_THAT(job.output(w), HasSubstr("DeadlineExceededError")) << job.outputs();
  }
  const std::string report = flight_report_of(dir.path());
  std::cout << job.output(0) << report << "\n";  // for the record
  EXPECT_THAT(report, HasSubstr("first divergence at #4")) << report;
  EXPECT_THAT(report, HasSubstr("worker 1 replica 0 (CPU:0) is behind: last completed #3 and never entered #4"))
      << report;
  EXPECT_THAT(report, ::testing::Not(HasSubstr("worker 0 replica 0 (CPU:0) is behind"))) << report;
  EXPECT_THAT(report, ::testing::Not(HasSubstr("worker 2 replica 0 (CPU:0) is behind"))) << report;
}

// One worker calls all_gather where the others call all_reduce: every worker's error names it.
TEST(MultiWorker, AWorkerCallingADifferentCollectiveIsNamedByEveryWorker) {
  testing::TempDir dir;
  auto env = kTcp;
  env["MIRRORED_FLIGHT_RECORDER_DIR"] = dir.path();
  Job job(2, ranks(2), worker("wrong_call", {"--victim", "1", "--step", "2", "--timeout", "10"}), env);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  for (int w : {0, 1}) EXPECT_EQ(job.code(w), 0) << job.outputs();
  const std::string report = flight_report_of(dir.path());
  std::cout << job.output(0) << report << "\n";  // for the record
  EXPECT_THAT(report, HasSubstr("worker 1 replica 0 (CPU:0) made a different call at #3: all_gather instead of "
                                "all_reduce"))
      << report;
}

TEST(MultiWorker, AWorkerThatNeverJoinsIsNamedAtStartUp) {
  Job job(3, {0, 1}, worker("never_join", {"--victim", "2", "--timeout", "2"}), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
}

TEST(MultiWorker, AChiefThatNeverJoinsIsNamedAtStartUp) {
  Job job(2, {1}, worker("never_join", {"--victim", "0", "--timeout", "2"}), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
}

TEST(MultiWorker, AWorkerLeavingEarlyFailsTheOthersNextCollective) {
  Job job(2, ranks(2), worker("leave_early", {"--victim", "1", "--step", "3", "--timeout", "60"}), kTcp);
  ASSERT_TRUE(job.wait(kRunSeconds)) << job.outputs();
  EXPECT_EQ(job.code(0), 0) << job.outputs();
  EXPECT_EQ(job.code(1), 0) << job.outputs();
}

}  // namespace
}  // namespace mirrored

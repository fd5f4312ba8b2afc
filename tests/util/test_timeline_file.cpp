// The timeline's file and its life cycle (<mirrored/timeline.hpp>): start and stop, the file opened
// as a hostile file system demands, one file per worker, the file completed at exit, and
// MIRRORED_TIMELINE.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "mirrored/logging.hpp"
#include "mirrored/mirrored.hpp"
#include "mirrored/timeline.hpp"
#include "util/timeline.hpp"
#include "util/timeline_trace.hpp"

namespace mirrored::timeline_test {
namespace {

using ::testing::HasSubstr;

TEST_F(TimelineTest, StopTwiceAndStopWithoutStartAreHarmless) {
  timeline::stop();
  const std::string path = file("twice.json");
  timeline::start(path);
  timeline::stop();
  timeline::stop();
  const Trace trace(path);
  EXPECT_EQ(trace.named("run").size(), 0u);
  // Started again: a new, complete file.
  MirroredStrategy strategy(cpus(2));
  timeline::start(path);
  strategy.run([] {});
  timeline::stop();
  EXPECT_EQ(Trace(path).named("run").size(), 2u);
}

TEST_F(TimelineTest, StartWhileActiveIsRefused) {
  const std::string first = file("first.json"), second = file("second.json");
  timeline::start(first);
  try {
    timeline::start(second);
    FAIL() << "a second start was accepted";
  } catch (const FailedPreconditionError& e) {
    EXPECT_THAT(e.what(), HasSubstr(first));
    EXPECT_THAT(e.what(), HasSubstr(second));
  }
  EXPECT_EQ(timeline::path(), first);
  EXPECT_FALSE(fs::exists(second));
  timeline::stop();
  const Trace check(first);
}

TEST_F(TimelineTest, BadPathsAreRefusedWithTypedErrors) {
  EXPECT_THROW(timeline::start(""), InvalidArgumentError);
  try {
    timeline::start(file("no/such/dir/t.json"));
    FAIL();
  } catch (const NotFoundError& e) {
    EXPECT_THAT(e.what(), HasSubstr(file("no/such/dir/t.json")));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
  try {
    timeline::start(dir_);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr(dir_));
    EXPECT_THAT(e.what(), HasSubstr("Is a directory"));
  }
  EXPECT_FALSE(timeline::active());
}

TEST_F(TimelineTest, ASymbolicLinkIsNotFollowed) {
  const std::string target = file("target.txt"), link = file("link.json");
  { std::ofstream(target) << "precious"; }
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  try {
    timeline::start(link);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("symbolic link"));
    EXPECT_THAT(e.what(), HasSubstr(link));
  }
  EXPECT_EQ(read_file(target), "precious");
  EXPECT_FALSE(timeline::active());
}

TEST_F(TimelineTest, AFifoIsRefusedWithoutBlocking) {
  const std::string fifo = file("fifo.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Nobody reads it: a blocking open would wait forever.
  try {
    timeline::start(fifo);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("not a regular file"));
    EXPECT_THAT(e.what(), HasSubstr(fifo));
  }
  // With a reader the open succeeds, and the file's type refuses it.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  ASSERT_GE(reader, 0);
  try {
    timeline::start(fifo);
    FAIL();
  } catch (const InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), HasSubstr("is not a regular file (it is a FIFO)"));
  }
  char c;
  EXPECT_EQ(::read(reader, &c, 1), 0) << "nothing was written into the FIFO";
  ::close(reader);
  EXPECT_FALSE(timeline::active());
}

TEST_F(TimelineTest, AnExistingFileIsReplacedAndItsDescriptorIsCloseOnExec) {
  const std::string path = file("old.json");
  { std::ofstream(path) << std::string(100000, 'x'); }
  timeline::start(path);
  int found = -1;
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    if (fs::read_symlink(entry.path(), ec) == fs::path(path)) found = std::stoi(entry.path().filename().string());
  }
  ASSERT_GE(found, 0) << "the timeline's descriptor";
  EXPECT_NE(::fcntl(found, F_GETFD) & FD_CLOEXEC, 0);
  timeline::stop();
  const std::string text = read_file(path);
  EXPECT_EQ(text.find('x'), std::string::npos);
  const Trace check(path);
}

TEST_F(TimelineTest, WorkersWriteFilesOfTheirOwn) {
  using detail::timeline::worker_path;
  EXPECT_EQ(worker_path("trace.json", 0, 1), "trace.json");
  EXPECT_EQ(worker_path("trace.json", 1, 2), "trace.worker1.json");
  EXPECT_EQ(worker_path("/a.b/trace", 3, 4), "/a.b/trace.worker3");
  EXPECT_EQ(worker_path("dir/.trace", 0, 2), "dir/.trace.worker0");
  EXPECT_EQ(worker_path("t.tar.json", 2, 3), "t.tar.worker2.json");

  detail::timeline::set_worker(1, 2);
  const std::string path = file("job.json");
  try {
    timeline::start(path);
  } catch (...) {
    detail::timeline::set_worker(0, 1);
    throw;
  }
  detail::timeline::set_worker(0, 1);
  EXPECT_EQ(timeline::path(), file("job.worker1.json"));
  { detail::timeline::Scope s("work", "test"); }
  timeline::stop();
  EXPECT_FALSE(fs::exists(path));
  const Trace trace(file("job.worker1.json"));
  ASSERT_EQ(trace.named("work").size(), 1u);
  EXPECT_EQ(trace.named("work")[0]->pid, 1);
  bool named = false;
  for (const Event& e : trace.events)
    if (e.ph == "M" && e.name == "process_name") named = e.pid == 1 && e.str("name") == "mirrored worker 1";
  EXPECT_TRUE(named);
}

TEST(TimelineExit, TheFileIsCompleteWhenTheProcessExits) {
  // The child process runs this test again up to EXPECT_EXIT: it finds the path in its environment.
  constexpr const char* kVar = "MIRRORED_TEST_TIMELINE_EXIT";
  const char* inherited = std::getenv(kVar);
  std::string dir;
  if (!inherited) {
    std::string tmpl = (fs::temp_directory_path() / "mirrored_timeline_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir = tmpl;
    ::setenv(kVar, (dir + "/exit.json").c_str(), 1);
  }
  const std::string path = inherited ? inherited : dir + "/exit.json";
  const std::string saved_style = ::testing::GTEST_FLAG(death_test_style);
  ::testing::GTEST_FLAG(death_test_style) = "threadsafe";
  EXPECT_EXIT(
      {
        static MirroredStrategy strategy(cpus(2));  // its replica threads still wait for work at exit
        timeline::start(path);
        strategy.run([] {});
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "");
  ::testing::GTEST_FLAG(death_test_style) = saved_style;
  ::unsetenv(kVar);
  const Trace trace(path);
  EXPECT_EQ(trace.named("run").size(), 2u);
  std::error_code ec;
  fs::remove_all(dir, ec);
}

// ---- MIRRORED_TIMELINE: read once per process, so these run in processes of their own (ctest
// util.timeline_env_*, which set it); without it they skip. ----

TEST(TimelineEnvironment, ABadPathIsWarnedOnceAndTheJobRuns) {
  const char* env = std::getenv("MIRRORED_TIMELINE");
  if (!env || std::string(env).find("/no-such-dir") == std::string::npos)
    GTEST_SKIP() << "run by ctest util.timeline_env_bad_path";
  std::mutex mu;
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, std::string_view message) {
    std::lock_guard lock(mu);
    if (level == LogLevel::warn) warnings.emplace_back(message);
  });
  for (int i = 0; i < 2; ++i) {
    MirroredStrategy strategy(cpus(2));
    auto out = strategy.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>{1.0f}); });
    EXPECT_EQ(out.values()[1].to_vector()[0], 2.0f);
  }
  set_log_sink(nullptr);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_THAT(warnings[0], HasSubstr(std::string("MIRRORED_TIMELINE='") + env + "'"));
  EXPECT_THAT(warnings[0], HasSubstr("No such file or directory"));
  EXPECT_THAT(warnings[0], HasSubstr("without a timeline"));
  EXPECT_FALSE(timeline::active());
}

TEST(TimelineEnvironment, APathStartsTheTimelineAtTheFirstStrategy) {
  const char* env = std::getenv("MIRRORED_TIMELINE");
  if (!env || std::string(env).find("timeline_env_ok") == std::string::npos)
    GTEST_SKIP() << "run by ctest util.timeline_env_path";
  EXPECT_FALSE(timeline::active()) << "read when the first strategy is made, not before";
  MirroredStrategy strategy(cpus(2));
  EXPECT_TRUE(timeline::active());
  EXPECT_EQ(timeline::path(), env);
  for (int i = 0; i < 3; ++i) strategy.run([] {});
  timeline::stop();
  EXPECT_EQ(Trace(env).named("run").size(), 6u);
  std::remove(env);
}

}  // namespace
}  // namespace mirrored::timeline_test

// The flight recorder (docs/api.md §15): what the rings hold, and the reports that name the replica at
// fault when a collective times out, a replica skips one, or replicas call different ones.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "collectives/flight_recorder.hpp"
#include "harness.hpp"
#include "mirrored/flight_recorder.hpp"
#include "util/json.hpp"

namespace mirrored {
namespace flight_recorder_test {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

int id() { return get_replica_context()->replica_id_in_sync_group(); }

class ScratchDir {
 public:
  ScratchDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("mirrored_flight_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path_);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string path(const std::string& name) const { return (path_ / name).string(); }
  std::string dir() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

detail::json::Value read_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return detail::json::parse(text.str());
}

int64_t integer(const detail::json::Value* v) { return v && v->as_int64() ? *v->as_int64() : -1; }
std::string text(const detail::json::Value* v) { return v && v->is_string() ? v->as_string() : "<none>"; }

// The replicas' entries of the newest strategy in a dump.
const std::vector<detail::json::Value>& replicas_of(const detail::json::Value& dump) {
  return dump.find("strategies")->items().back().find("replicas")->items();  // the newest
}

TEST(FlightRecorder, RingsHoldEveryReplicasCollectivesInOrder) {
  MirroredStrategy s(cpus(2));
  s.run([] {
    auto* ctx = get_replica_context();
    ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({3, 5}, 1.0f));
    ctx->merge_call([](Strategy&) {});
    auto pending = ctx->all_reduce_async(ReduceOp::MEAN, Tensor<double>::full({7}, 2.0));
    pending.wait();
    ctx->all_gather(Tensor<int32_t>::full({2, 4}, 1), 0);
  });
  ScratchDir dir;
  flight_recorder::dump(dir.path("dump.json"));
  const auto dump = read_json(dir.path("dump.json"));
  EXPECT_EQ(integer(dump.find("worker")), 0);
  EXPECT_EQ(integer(dump.find("num_workers")), 1);
  const auto& replicas = replicas_of(dump);
  ASSERT_EQ(replicas.size(), 2u);
  for (int r = 0; r < 2; ++r) {
    const auto& rep = replicas[static_cast<std::size_t>(r)];
    EXPECT_EQ(text(rep.find("device")), "CPU:" + std::to_string(r));
    const auto& e = rep.find("entries")->items();
    ASSERT_EQ(e.size(), 4u);
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(integer(e[static_cast<std::size_t>(i)].find("seq")), i + 1);
      EXPECT_EQ(text(e[static_cast<std::size_t>(i)].find("state")), "done");
    }
    EXPECT_EQ(text(e[0].find("kind")), "all_reduce");
    EXPECT_EQ(text(e[0].find("op")), "SUM");
    EXPECT_EQ(text(e[0].find("dtype")), "float32");
    EXPECT_EQ(e[0].find("shape")->items().size(), 2u);
    EXPECT_EQ(integer(&e[0].find("shape")->items()[0]), 3);
    EXPECT_EQ(integer(&e[0].find("shape")->items()[1]), 5);
    EXPECT_EQ(integer(e[0].find("bytes")), 60);
    EXPECT_FALSE(e[0].find("async")->as_bool());
    EXPECT_EQ(text(e[1].find("kind")), "merge_call");
    EXPECT_TRUE(e[1].find("op")->is_null());
    EXPECT_EQ(text(e[2].find("kind")), "all_reduce_async");
    EXPECT_EQ(text(e[2].find("op")), "MEAN");
    EXPECT_EQ(text(e[2].find("dtype")), "float64");
    EXPECT_EQ(integer(e[2].find("bytes")), 56);
    EXPECT_TRUE(e[2].find("async")->as_bool());
    EXPECT_EQ(text(e[3].find("kind")), "all_gather");
    EXPECT_EQ(text(e[3].find("dtype")), "int32");
    EXPECT_EQ(integer(e[3].find("bytes")), 32);
    for (const auto& entry : e) {
      // Issued, entered and ended in that order (the clock is monotonic).
      EXPECT_LE(entry.find("issue_s")->as_double(), entry.find("start_s")->as_double());
      EXPECT_LE(entry.find("start_s")->as_double(), entry.find("end_s")->as_double());
    }
  }
}

TEST(FlightRecorder, TheRingKeepsTheLast256AndNumbersGoOnAcrossRuns) {
  MirroredStrategy s(cpus(2));
  for (int run = 0; run < 3; ++run)
    s.run([] {
      for (int i = 0; i < 100; ++i) get_replica_context()->all_reduce(ReduceOp::SUM, 1);
    });
  ScratchDir dir;
  flight_recorder::dump(dir.path("dump.json"));
  const auto dump = read_json(dir.path("dump.json"));
  for (const auto& rep : replicas_of(dump)) {
    const auto& e = rep.find("entries")->items();
    ASSERT_EQ(e.size(), 256u);
    EXPECT_EQ(integer(e.front().find("seq")), 300 - 256 + 1);
    EXPECT_EQ(integer(e.back().find("seq")), 300);
  }
}

TEST(FlightRecorder, APausedRingRecordsNothingAndTimesAreSteadyClockNanoseconds) {
  detail::FlightRing ring(8);
  const std::vector<int64_t> shape{4, 5};
  const int64_t before = detail::flight_now_ns();
  {
    detail::FlightCall call(ring, Deadline::after(60), detail::CollectiveKind::all_reduce, 0, 0, &shape, 80, false);
    std::this_thread::sleep_for(2ms);
    call.done();
  }
  {
    detail::FlightCall failed(ring, Deadline::after(60), detail::CollectiveKind::all_gather, -1, 0, &shape, 80, false);
  }
  ring.set_recording(false);
  {
    detail::FlightCall paused(ring, Deadline::after(60), detail::CollectiveKind::all_reduce, 0, 0, &shape, 80, false);
    paused.done();
  }
  ring.set_recording(true);
  {
    detail::FlightCall again(ring, Deadline::after(60), detail::CollectiveKind::merge_call, -1, -1, nullptr, 0, false);
    again.done();
  }
  const int64_t after = detail::flight_now_ns();
  const auto e = ring.snapshot();
  ASSERT_EQ(e.size(), 3u);  // not the paused call
  EXPECT_EQ(e[0].seq, 1u);
  EXPECT_EQ(e[0].state, detail::FlightState::done);
  EXPECT_EQ(e[1].seq, 2u);
  EXPECT_EQ(e[1].state, detail::FlightState::failed);  // ended without done()
  EXPECT_EQ(e[2].seq, 3u);
  EXPECT_EQ(e[2].kind, detail::CollectiveKind::merge_call);
  // Issue times from the calls' deadlines, end times converted from ticks: within the
  // steady-clock interval around the calls, in order, and the 2 ms sleep seen as at least 2 ms
  // (less 1 % for the conversion's rate).
  for (const auto& x : e) {
    EXPECT_GE(x.issue_ns, before - 1000);
    EXPECT_LE(x.end_ns, after + 1000);
    EXPECT_LE(x.issue_ns, x.end_ns);
  }
  EXPECT_GE(e[0].end_ns - e[0].issue_ns, 1'980'000);
  EXPECT_LE(e[0].end_ns, e[1].issue_ns + 1000);
  // A synchronous call is entered when it is issued: where its deadline was made.
  EXPECT_EQ(e[0].start_ns, e[0].issue_ns);
}

TEST(FlightRecorder, TheIssueTimeIsWhenTheCallsDeadlineWasMade) {
  detail::FlightRing ring(4);
  const Deadline d = Deadline::after(60);
  std::this_thread::sleep_for(1ms);
  {
    detail::FlightCall call(ring, d, detail::CollectiveKind::all_reduce, 0, 0, nullptr, 0, false);
    call.done();
  }
  const auto e = ring.snapshot();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].issue_ns, std::chrono::duration_cast<std::chrono::nanoseconds>(d.made().time_since_epoch()).count());
  EXPECT_GE(e[0].end_ns - e[0].issue_ns, 990'000);
  // extended() keeps when the call entered.
  EXPECT_EQ(d.extended(5).made(), d.made());
}

TEST(FlightRecorder, ACapacityThatIsNoPowerOfTwoKeepsExactlyThatMany) {
  detail::FlightRing ring(5);  // 8 slots underneath
  for (int i = 0; i < 12; ++i) {
    detail::FlightCall call(ring, Deadline::after(60), detail::CollectiveKind::all_reduce, 0, 0, nullptr, 0, false);
    call.done();
  }
  const auto e = ring.snapshot();
  ASSERT_EQ(e.size(), 5u);
  for (std::size_t i = 0; i < e.size(); ++i) EXPECT_EQ(e[i].seq, 8 + i);
}

TEST(FlightRecorder, ReplicaStuckInUserCodeIsNamedWithTheCollectiveItHasNotEntered) {
  MirroredStrategy s(cpus(3));
  const double timeout = 0.3;
  std::vector<double> failed_after(3, -1.0);  // when each waiting replica's collective threw
  std::string msg = message_of<DeadlineExceededError>([&] {
    s.run([&] {
      CommunicationOptions o;
      o.timeout_seconds = timeout;
      for (int i = 0; i < 3; ++i) get_replica_context()->all_reduce(ReduceOp::SUM, 1, o);
      if (id() == 1) std::this_thread::sleep_for(1500ms);  // user code, far past the deadline
      const auto start = Clock::now();
      try {
        get_replica_context()->all_reduce(ReduceOp::SUM, 1, o);
      } catch (const Error&) {
        failed_after[static_cast<std::size_t>(id())] = std::chrono::duration<double>(Clock::now() - start).count();
        throw;
      }
    });
  });
  EXPECT_THAT(msg, HasSubstr("flight recorder: worker 0 replica 1 (CPU:1) last completed all_reduce #3 and has not "
                             "entered #4 for "));
  EXPECT_THAT(msg, HasSubstr("; every other replica waits in all_reduce #4"));
  // The replicas that wait are released by the deadline and its grace, not by the stuck one.
  for (int r : {0, 2}) {
    EXPECT_GE(failed_after[static_cast<std::size_t>(r)], 0.0) << "replica " << r;
    EXPECT_LT(failed_after[static_cast<std::size_t>(r)], timeout + kCollectiveGraceSeconds) << "replica " << r;
  }
}

TEST(FlightRecorder, StallWarningsNameTheReplicaThatIsBehind) {
  ::setenv("MIRRORED_STALL_WARN_S", "0.05", 1);
  MirroredStrategy s(cpus(2));
  ::unsetenv("MIRRORED_STALL_WARN_S");
  ::testing::internal::CaptureStderr();
  s.run([&] {
    get_replica_context()->all_reduce(ReduceOp::SUM, 1);
    if (id() == 1) std::this_thread::sleep_for(300ms);
    get_replica_context()->all_reduce(ReduceOp::SUM, 1);
  });
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_THAT(err, HasSubstr("flight recorder: worker 0 replica 1 (CPU:1) last completed all_reduce #1 and has not "
                             "entered #2 for "));
}

TEST(FlightRecorder, ReplicaSkippingACollectiveIsNamed) {
  MirroredStrategy s(cpus(2));
  s.extended().set_collective_timeout_seconds(600);  // the skip, not the timeout, ends the wait
  std::string msg = message_of<FailedPreconditionError>([&] {
    s.run([&] {
      get_replica_context()->all_reduce(ReduceOp::SUM, 1);
      if (id() == 0) get_replica_context()->all_reduce(ReduceOp::SUM, 2);  // replica 1 skips it
    });
  });
  EXPECT_THAT(msg, HasSubstr("worker 0 replica 1 (CPU:1) last completed all_reduce #1 and has not entered #2"));
  EXPECT_THAT(msg, HasSubstr("every other replica waits in all_reduce #2"));
}

TEST(FlightRecorder, DifferentCallsAtTheSameNumberAreNamed) {
  MirroredStrategy s(cpus(3));
  std::string msg = message_of<FailedPreconditionError>([&] {
    s.run([&] {
      get_replica_context()->all_reduce(ReduceOp::SUM, 1);
      if (id() == 2)
        get_replica_context()->all_gather(Tensor<float>::full({2}, 1.0f), 0);
      else
        get_replica_context()->all_reduce(ReduceOp::SUM, 2);
    });
  });
  EXPECT_THAT(msg, HasSubstr("worker 0 replica 2 (CPU:2) waits in all_gather #2"));
  EXPECT_THAT(msg, HasSubstr("a different call at the same number (all_reduce)"));
  EXPECT_THAT(msg, HasSubstr("every other replica waits in all_reduce #2"));
  // The next run starts every replica at the same number again.
  s.run([] { get_replica_context()->all_reduce(ReduceOp::SUM, 1); });
  ScratchDir dir;
  flight_recorder::dump(dir.path("dump.json"));
  const auto dump = read_json(dir.path("dump.json"));
  for (const auto& rep : replicas_of(dump)) {
    const auto& e = rep.find("entries")->items();
    ASSERT_EQ(e.size(), 3u);
    EXPECT_EQ(text(e[1].find("state")), "failed");
    EXPECT_EQ(integer(e[2].find("seq")), 3);
    EXPECT_EQ(text(e[2].find("state")), "done");
  }
}

TEST(FlightRecorder, EventsDumpTheRingsIntoTheDirectory) {
  ScratchDir dir;
  ::setenv("MIRRORED_FLIGHT_RECORDER_DIR", dir.dir().c_str(), 1);
  MirroredStrategy s(cpus(2));
  std::string msg = message_of<DeadlineExceededError>([&] {
    s.run([&] {
      CommunicationOptions o;
      o.timeout_seconds = 0.2;
      if (id() == 0) std::this_thread::sleep_for(600ms);
      get_replica_context()->all_reduce(ReduceOp::SUM, 1, o);
    });
  });
  ::unsetenv("MIRRORED_FLIGHT_RECORDER_DIR");
  EXPECT_THAT(msg, HasSubstr("worker 0 replica 0 (CPU:0) has not entered any collective (#1) for "));
  const auto dump = read_json(dir.path("flight_recorder.worker0.json"));
  const auto& replicas = replicas_of(dump);
  ASSERT_EQ(replicas.size(), 2u);
  const auto& waiting = replicas[1].find("entries")->items();
  ASSERT_EQ(waiting.size(), 1u);
  EXPECT_EQ(text(waiting[0].find("state")), "waiting");
}

TEST(FlightRecorder, ADumpNamesItsJobAndAttempt) {
  // tools/flight_report.py tells the dumps of an earlier attempt in the same directory by these.
  MirroredStrategy s(cpus(1));
  s.run([] { get_replica_context()->all_reduce(ReduceOp::SUM, 1); });
  ScratchDir dir;
  ::setenv("MIRRORED_JOB_ID", "launch-12-34-2", 1);
  ::setenv("MIRRORED_RESTART_COUNT", "2", 1);
  flight_recorder::dump(dir.path("launched.json"));
  ::unsetenv("MIRRORED_JOB_ID");
  ::unsetenv("MIRRORED_RESTART_COUNT");
  flight_recorder::dump(dir.path("plain.json"));
  const auto launched = read_json(dir.path("launched.json"));
  EXPECT_EQ(text(launched.find("job_id")), "launch-12-34-2");
  EXPECT_EQ(integer(launched.find("attempt")), 2);
  const auto plain = read_json(dir.path("plain.json"));
  ASSERT_NE(plain.find("job_id"), nullptr);
  EXPECT_TRUE(plain.find("job_id")->is_null());
  ASSERT_NE(plain.find("attempt"), nullptr);
  EXPECT_TRUE(plain.find("attempt")->is_null());
}

TEST(FlightRecorder, DumpToAMissingDirectoryIsATypedError) {
  MirroredStrategy s(cpus(1));
  EXPECT_THROW(flight_recorder::dump("/no-such-dir/mirrored/flight.json"), NotFoundError);
}

// ----- The report composed from every replica's state (also what the workers exchange).

detail::ReplicaFlight waiting_in(int worker, int replica, uint64_t seq, const std::string& kind) {
  detail::ReplicaFlight f;
  f.worker = worker;
  f.replica = replica;
  f.device = "CPU:" + std::to_string(replica);
  f.last_done = seq - 1;
  f.last_kind = "all_reduce";
  f.current = seq;
  f.current_kind = kind;
  f.current_state = "waiting";
  f.current_for_s = 10;
  return f;
}

TEST(FlightReport, NamesTheWorkerThatIsBehind) {
  auto late = waiting_in(1, 0, 18, "all_reduce");
  late.current = 0;
  late.current_kind.clear();
  late.last_done = 17;
  late.since_done_s = 10.04;
  const auto report =
      detail::compose_flight_report({waiting_in(0, 0, 18, "all_reduce"), waiting_in(0, 1, 18, "all_reduce"), late}, {});
  EXPECT_EQ(report,
            "flight recorder: worker 1 replica 0 (CPU:0) last completed all_reduce #17 and has not entered #18 for "
            "10.0 s; every other replica waits in all_reduce #18");
}

TEST(FlightReport, NamesADifferentCallAndSilentWorkers) {
  const auto report = detail::compose_flight_report(
      {waiting_in(0, 0, 3, "all_reduce"), waiting_in(1, 0, 3, "all_gather")}, {"worker 2 did not answer"});
  EXPECT_EQ(report,
            "flight recorder: worker 1 replica 0 (CPU:0) waits in all_gather #3 (for 10.0 s): a different call at the "
            "same number (all_reduce); every other replica waits in all_reduce #3; worker 2 did not answer");
  EXPECT_EQ(detail::compose_flight_report({waiting_in(0, 0, 3, "all_reduce")}, {}),
            "flight recorder: every replica waits in all_reduce #3");
}

TEST(FlightReport, StatesSurviveTheirEncoding) {
  auto a = waiting_in(1, 2, 7, "merge_call");
  auto b = waiting_in(0, 0, 7, "all_reduce");
  b.current = 0;
  b.current_kind.clear();
  b.current_state.clear();
  b.since_done_s = 2.5;
  const auto back = detail::decode_flights(detail::encode_flights({a, b}) + "garbage line\n");
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(detail::compose_flight_report(back, {}), detail::compose_flight_report({a, b}, {}));
  EXPECT_EQ(back[0].current_kind, "merge_call");
  EXPECT_EQ(back[1].current, 0u);
  EXPECT_EQ(back[1].current_kind, "");
}

}  // namespace flight_recorder_test
}  // namespace mirrored

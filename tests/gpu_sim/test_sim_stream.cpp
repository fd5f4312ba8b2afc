// The simulated GPU's streams and events on their own (src/device/simulated/sim_stream.hpp): order,
// their own thread, waits with deadlines, events like CUDA's, sticky failures.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "device/simulated/sim_stream.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using detail::sim::Clock;
using detail::sim::Event;
using detail::sim::Stream;
using namespace std::chrono_literals;
using ::testing::HasSubstr;

TEST(SimStream, RunsItsWorkInOrderOnAThreadOfItsOwn) {
  Stream s("test stream", 7, 200, nullptr);
  std::vector<int> seen;  // written by the stream's thread only; read after the wait
  std::thread::id worker;
  for (int i = 0; i < 500; ++i) {
    s.enqueue([&, i] {
      seen.push_back(i);
      worker = std::this_thread::get_id();
    });
  }
  EXPECT_EQ(s.last_ticket(), 500u);
  ASSERT_TRUE(s.wait(s.last_ticket(), Clock::now() + 60s));
  ASSERT_EQ(seen.size(), 500u);
  for (int i = 0; i < 500; ++i) ASSERT_EQ(seen[static_cast<std::size_t>(i)], i);
  EXPECT_NE(worker, std::this_thread::get_id());
  EXPECT_TRUE(s.reached(500));
  EXPECT_FALSE(s.reached(501));
}

TEST(SimStream, AHeldStreamRunsNothingAndItsWaitsMeetTheirDeadline) {
  Stream s("held stream", 7, 0, nullptr);
  std::atomic<int> ran{0};
  s.hold();
  const uint64_t t = s.enqueue([&] { ++ran; });
  EXPECT_FALSE(s.wait(t, Clock::now() + 50ms));
  EXPECT_EQ(ran.load(), 0);
  EXPECT_FALSE(s.reached(t));
  s.release();
  ASSERT_TRUE(s.wait(t, Clock::now() + 60s));
  EXPECT_EQ(ran.load(), 1);
}

TEST(SimStream, FailedWorkIsStickyAndReported) {
  std::string reported;  // written on the stream's thread before the failed work counts as finished
  Stream s("failing stream", 7, 0, [&](const std::string& what) { reported = what; });
  std::atomic<int> after{0};
  s.enqueue([] { throw InvalidArgumentError("the kernel faulted"); });
  const uint64_t t = s.enqueue([&] { ++after; });
  ASSERT_TRUE(s.wait(t, Clock::now() + 60s));
  EXPECT_EQ(after.load(), 0) << "work after a failure must not run";
  EXPECT_EQ(s.failure(), "the kernel faulted");
  EXPECT_EQ(reported, "the kernel faulted");
}

TEST(SimEvent, NeverRecordedIsReached) {
  Event e("GPU:9");
  EXPECT_TRUE(e.query());
  EXPECT_NO_THROW(e.synchronize(Deadline::after(0.01)));
}

TEST(SimEvent, MarksTheWorkEnqueuedBeforeItsRecord) {
  Stream a("stream a", 7, 0, nullptr);
  Event e("GPU:9");
  std::atomic<int> first{0}, second{0};
  a.hold();
  a.enqueue([&] { first = 1; });
  e.record(a);
  a.enqueue([&] { second = 1; });
  EXPECT_FALSE(e.query());
  const std::string msg = testing::message_of<DeadlineExceededError>([&] { e.synchronize(Deadline::after(0.05)); });
  EXPECT_THAT(msg, HasSubstr("GPU:9"));
  EXPECT_THAT(msg, HasSubstr("stream a"));
  EXPECT_THAT(msg, HasSubstr("0.05 s"));
  a.release();
  e.synchronize(Deadline::after(60));
  EXPECT_EQ(first.load(), 1);
  EXPECT_TRUE(e.query());
  ASSERT_TRUE(a.wait(a.last_ticket(), Clock::now() + 60s));
  EXPECT_EQ(second.load(), 1);
  // A record replaces the earlier one.
  a.hold();
  a.enqueue([] {});
  e.record(a);
  EXPECT_FALSE(e.query());
  a.release();
  e.synchronize(Deadline::after(60));
}

// A stream that waits for an event (what DeviceBackend::wait_event enqueues) runs its later work
// only after the other stream's work before the record, however late that work runs.
TEST(SimEvent, AWaitingStreamRunsAfterTheRecordedWork) {
  Stream a("stream a", 7, 200, nullptr), b("stream b", 11, 200, nullptr);
  std::vector<int> order;  // a writes, then b (ordered by the event)
  Event e("GPU:9");
  a.delay_next(100ms);
  a.enqueue([&] { order.push_back(1); });
  e.record(a);
  const auto [stream, ticket] = e.latest();
  b.enqueue([stream = stream, ticket = ticket] { stream->wait(ticket, Clock::time_point::max()); });
  b.enqueue([&] { order.push_back(2); });
  ASSERT_TRUE(b.wait(b.last_ticket(), Clock::now() + 60s));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
}

}  // namespace
}  // namespace mirrored

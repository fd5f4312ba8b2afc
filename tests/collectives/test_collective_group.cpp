// The rendezvous itself, driven by plain threads (ranks-as-threads): barriers, sequence checks,
// deadlines and aborts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>

#include "collectives/collective_group.hpp"
#include "harness.hpp"

namespace mirrored::detail {
namespace {

using ::testing::HasSubstr;
using testing::message_of;
using testing::run_ranks;
using namespace std::chrono_literals;

TEST(CollectiveGroup, JoinPublishesEveryPayloadAndSyncOrdersPhases) {
  for (int n : {1, 2, 3, 4, 8}) {
    CollectiveGroup g(n, 60);
    g.begin_run();
    std::vector<int> values(n);
    std::atomic<int> wrong{0};
    run_ranks(n, [&](int r) {
      for (int round = 0; round < 100; ++round) {
        const int mine = r * 1000 + round;
        g.join(r, CollectiveKind::all_reduce, &mine, Deadline::after(10));
        for (int q = 0; q < n; ++q) wrong += *static_cast<const int*>(g.payload(q)) != q * 1000 + round;
        g.sync(r, Deadline::after(10));  // nobody's payload changes before everyone has read it
      }
    });
    EXPECT_EQ(wrong.load(), 0) << n << " ranks";
    for (int r = 0; r < n; ++r) EXPECT_EQ(g.calls(r), 100);
  }
}

TEST(CollectiveGroup, DifferentKindsFailOnEveryRank) {
  CollectiveGroup g(3, 60);
  g.begin_run();
  std::vector<std::string> msgs(3);
  run_ranks(3, [&](int r) {
    msgs[r] = message_of<FailedPreconditionError>([&] {
      g.join(r, r == 2 ? CollectiveKind::all_gather : CollectiveKind::all_reduce, nullptr, Deadline::after(10));
    });
  });
  for (const auto& m : msgs) {
    EXPECT_THAT(m, HasSubstr("replica 0 called all_reduce (collective call 1), replica 1 called all_reduce "
                             "(collective call 1), replica 2 called all_gather (collective call 1)"));
  }
}

TEST(CollectiveGroup, FinishedRankReleasesWaitersWithFailedPrecondition) {
  CollectiveGroup g(2, 60);
  g.begin_run();
  std::string msg;
  run_ranks(2, [&](int r) {
    if (r == 1) {
      std::this_thread::sleep_for(20ms);
      g.finish(1);
    } else {
      msg = message_of<FailedPreconditionError>(
          [&] { g.join(0, CollectiveKind::merge_call, nullptr, Deadline::after(60)); });
    }
  });
  EXPECT_THAT(msg, HasSubstr("replica 1 returned from the replica function after 0 collective calls, while replica 0 "
                             "waits in merge_call (collective call 1)"));
}

TEST(CollectiveGroup, DeadlineNamesTheMissingRanks) {
  CollectiveGroup g(4, 60);
  g.begin_run();
  std::vector<std::string> msgs(4);
  run_ranks(4, [&](int r) {
    if (r == 1 || r == 3) return;  // never arrive
    // The first rank to time out aborts the group; the other sees AbortedError with its reason.
    msgs[r] = message_of<Error>([&] { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(0.1)); });
  });
  for (int r : {0, 2}) {
    EXPECT_THAT(msgs[r], HasSubstr("for replicas [1, 3] that never arrived"));
    EXPECT_THAT(msgs[r], HasSubstr("collective timeout 0.1 s"));
  }
  EXPECT_TRUE(g.aborted());
}

TEST(CollectiveGroup, AbortReleasesWaitersAndLaterArrivals) {
  CollectiveGroup g(3, 60);
  g.begin_run();
  std::vector<std::string> msgs(3);
  run_ranks(3, [&](int r) {
    if (r == 2) {
      std::this_thread::sleep_for(30ms);
      g.abort("replica 2 gave up");
      msgs[r] = message_of<AbortedError>([&] { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(60)); });
      return;
    }
    msgs[r] = message_of<AbortedError>([&] { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(60)); });
  });
  for (const auto& m : msgs) EXPECT_EQ(m, "replica 2 gave up");
  EXPECT_TRUE(g.aborted());
  // A new run starts clean.
  g.begin_run();
  EXPECT_FALSE(g.aborted());
  run_ranks(3, [&](int r) { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(10)); });
  EXPECT_EQ(g.calls(0), 1);
}

// Regression: a replica that arrived in an aborted run counted as arrived in the next
// one, so a replica waiting for it there never saw it return and waited out its whole deadline.
TEST(CollectiveGroup, ArrivalsOfAnAbortedRunDoNotCountInTheNext) {
  constexpr double kTimeout = 30;  // a regression shows as a 30 s wait
  for (int n : {2, 3, 4}) {
    for (int stale = 0; stale < n; ++stale) {
      CollectiveGroup g(n, 60);
      // Run 1: `stale` waits in a collective, the others fail, which aborts the run.
      g.begin_run();
      run_ranks(n, [&](int r) {
        if (r == stale) {
          (void)message_of<AbortedError>(
              [&] { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(kTimeout)); });
        } else {
          std::this_thread::sleep_for(50ms);  // so that `stale` has arrived (else it is not stale)
          g.abort("replica failed");
          g.finish(r);
        }
      });
      // Run 2: `stale` returns at once; the others must be released as soon as it has.
      g.begin_run();
      std::vector<std::string> msgs(n);
      const auto start = std::chrono::steady_clock::now();
      run_ranks(n, [&](int r) {
        if (r == stale) {
          g.finish(r);
          return;
        }
        // The first to notice throws FailedPreconditionError and aborts the group; the others see
        // AbortedError with the same reason.
        msgs[r] = message_of<Error>([&] { g.join(r, CollectiveKind::all_reduce, nullptr, Deadline::after(kTimeout)); });
      });
      EXPECT_LT(std::chrono::steady_clock::now() - start, 5s) << n << " ranks, stale " << stale;
      for (int r = 0; r < n; ++r) {
        if (r == stale) continue;
        EXPECT_THAT(msgs[r], HasSubstr("returned from the replica function after 0 collective calls"))
            << n << " ranks, stale " << stale << ", rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace mirrored::detail

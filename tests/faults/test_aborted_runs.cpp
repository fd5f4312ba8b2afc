// Fault injection (ctest label `faults`): a run aborted by a failure leaves nothing behind that
// the next run could trip on. The one checked here: a replica that had arrived in a collective of
// the aborted run still counted as arrived, so when it returned at once in the next run, the
// replicas waiting for it there did not notice and waited out their whole deadline.
#include <gtest/gtest.h>

#include "faults/faults.hpp"

namespace mirrored {
namespace {

using namespace std::chrono_literals;
using testing::call_collective;
using testing::Kind;
using testing::kind_name;
using testing::observe;
using testing::Outcome;

// Long enough that a replica waiting it out is unmistakable; no case may come near it.
constexpr double kDeadline = 30;

class AbortedRuns : public ::testing::TestWithParam<int> {};

// Every (thrower, waiter, early returner) combination, and every kind of collective in the second
// run, on one strategy (so whatever a run leaves behind meets every later combination):
//   run 1: `thrower` throws, `waiter` waits in all_reduce, the others return at once;
//   run 2: `returner` returns at once, the others make a collective of `kind`;
//   run 3: every replica makes every kind of collective, with exact results.
TEST_P(AbortedRuns, EveryThrowerWaiterAndEarlyReturnerFailsFast) {
  const int n = GetParam();
  MirroredStrategy s(testing::cpus(n));
  s.extended().set_collective_timeout_seconds(kDeadline);
  int combinations = 0;
  for (int thrower = 0; thrower < n; ++thrower) {
    for (int waiter = 0; waiter < n; ++waiter) {
      if (waiter == thrower) continue;
      for (int returner = 0; returner < n; ++returner) {
        for (Kind kind : {Kind::all_reduce, Kind::all_gather, Kind::merge_call}) {
          SCOPED_TRACE(testing::str(n, " replicas: thrower ", thrower, ", waiter ", waiter, ", returner ", returner,
                                    ", then ", kind_name(kind)));
          ++combinations;
          // Run 1. Whether the waiter first sees the thrower's failure or another replica's
          // return is a race, so run rethrows either the injected fault or that
          // FailedPreconditionError; either way at once.
          Outcome waited;
          std::string error;
          std::atomic<bool> waiter_calls{false};
          try {
            s.run([&] {
              const int r = get_replica_context()->replica_id_in_sync_group();
              if (r == thrower) {
                // Throw once the waiter has arrived (else it would find the run aborted before
                // arriving, and nothing could be left behind).
                const auto give_up = std::chrono::steady_clock::now() + 5s;
                while (!waiter_calls.load() && std::chrono::steady_clock::now() < give_up) std::this_thread::yield();
                std::this_thread::sleep_for(2ms);
                throw testing::InjectedFault("injected");
              }
              if (r == waiter) {
                waiter_calls = true;
                observe(waited, [] { call_collective(Kind::all_reduce); });
              }
            });
          } catch (...) {
            error = testing::error_type(std::current_exception());
          }
          EXPECT_TRUE(error == "InjectedFault" || error == "FailedPreconditionError") << error;
          EXPECT_LT(waited.seconds, 5.0);

          // Run 2: the replicas that call wait only for the returner, which they must notice.
          std::vector<Outcome> seen(n);
          error.clear();
          const auto start = std::chrono::steady_clock::now();
          try {
            s.run([&] {
              const int r = get_replica_context()->replica_id_in_sync_group();
              if (r == returner) return;
              observe(seen[r], [&] { call_collective(kind); });
            });
          } catch (...) {
            error = testing::error_type(std::current_exception());
          }
          EXPECT_EQ(error, "FailedPreconditionError");
          EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
          for (int r = 0; r < n; ++r) {
            if (r == returner) continue;
            EXPECT_TRUE(seen[r].type == "FailedPreconditionError" || seen[r].type == "AbortedError")
                << "replica " << r << " saw " << seen[r].type;
          }

          // Run 3.
          EXPECT_EQ(testing::check_strategy_works(s), "");
          if (::testing::Test::HasFailure()) return;  // one failing combination tells enough
        }
      }
    }
  }
  EXPECT_EQ(combinations, n * (n - 1) * n * 3);
}

INSTANTIATE_TEST_SUITE_P(Faults, AbortedRuns, ::testing::Values(2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

// ReplicaPool: every execute runs the task once per replica thread and returns after all of them,
// many times over, with work of varying length so that the caller both catches the end while it
// spins and goes to sleep on the futex. A lost wake-up hangs `execute` for good, so a watchdog
// thread aborts the test with a message when the count stops moving, instead of leaving ctest to
// time out.
//
// The lost wake-up fixed in replica_pool.cpp (a plain store before `notify_one`) hung the
// run-overhead benchmark's timeline loop on the 2-vCPU VM within three runs of about 400k
// executes each, and 25 runs passed after the fix; this test did not hit it in 8 tries on the old
// code, so it guards the pool in general rather than reproducing that race on demand.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "harness.hpp"
#include "runtime/replica_pool.hpp"

namespace mirrored::detail {
namespace {

constexpr int kScale = testing::kSanitized ? 20 : 1;

struct Counts {
  std::vector<std::atomic<long>> per_replica;
  long step = 0;  // written by the caller between executes
  explicit Counts(int n) : per_replica(n) {}
};

// Work of a varying length (0 to about 10 us), so that the caller sometimes catches the end while
// it spins and sometimes has gone to sleep on the futex: both paths of `execute` get exercised.
void vary(long step) noexcept {
  volatile long sink = 0;
  for (long i = 0, n = (step * 7919) % 4096; i < n; ++i) sink = sink + i;
}

// Aborts the process when `progress` has not moved for `stall`: a hung execute never returns.
class StallWatchdog {
 public:
  StallWatchdog(const std::atomic<long>& progress, std::chrono::seconds stall)
      : thread_([this, &progress, stall] {
          long last = -1;
          auto last_change = std::chrono::steady_clock::now();
          while (!stop_.load()) {
            std::this_thread::sleep_for(std::chrono::milliseconds(50));
            const long now = progress.load();
            if (now != last) {
              last = now;
              last_change = std::chrono::steady_clock::now();
            } else if (std::chrono::steady_clock::now() - last_change > stall) {
              std::fprintf(stderr, "ReplicaPool::execute made no progress for %lld s after %ld runs: a lost wake-up\n",
                           static_cast<long long>(stall.count()), now);
              std::abort();
            }
          }
        }) {}
  ~StallWatchdog() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

void run_many(int replicas, long runs) {
  ReplicaPool pool(replicas);
  Counts counts(replicas);
  std::atomic<long> done{0};
  {
    StallWatchdog watchdog(done, std::chrono::seconds(10));
    for (long i = 0; i < runs; ++i) {
      counts.step = i;
      pool.execute(
          [](void* c, int r) noexcept {
            auto* counts = static_cast<Counts*>(c);
            if (r == 0) vary(counts->step);
            counts->per_replica[r].fetch_add(1);
          },
          &counts);
      done.store(i + 1, std::memory_order_relaxed);
    }
  }
  for (int r = 0; r < replicas; ++r) EXPECT_EQ(counts.per_replica[r].load(), runs) << "replica " << r;
}

TEST(ReplicaPool, OneThreadManyEmptyRuns) { run_many(1, 200000 / kScale); }

TEST(ReplicaPool, TwoThreadsManyEmptyRuns) { run_many(2, 100000 / kScale); }

TEST(ReplicaPool, MoreThreadsThanCores) { run_many(5, 20000 / kScale); }

}  // namespace
}  // namespace mirrored::detail

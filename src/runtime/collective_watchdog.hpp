#pragma once
// Private: the one thread per strategy that enforces the deadlines of asynchronous collectives.
// A replica that issued a collective goes on computing and may not look at it again for a long
// time, so nobody would notice a deadline passing; rather than one timer (or a polling waiter) per
// collective, every pending collective is an entry ordered by deadline here, and one thread sleeps
// until the earliest.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <utility>

namespace mirrored::detail {

class CollectiveWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  /// What `watch` returns: the entry's key, for `cancel`.
  using Ticket = std::pair<Clock::time_point, uint64_t>;

  CollectiveWatchdog() = default;
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;
  /// Stops the thread; entries still watched are dropped (their callbacks are not called).
  ~CollectiveWatchdog();

  /// Calls `on_expiry` on the watchdog's thread at `deadline` unless `cancel`led first. The callback
  /// runs without the watchdog's lock held; it may race with a `cancel` of its own entry (the caller
  /// settles that under a lock of its own). Starts the thread on first use.
  Ticket watch(Clock::time_point deadline, std::function<void()> on_expiry);
  /// Forgets an entry (nothing happens when it already expired).
  void cancel(const Ticket& ticket) noexcept;

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::map<Ticket, std::function<void()>> entries_;  // ordered by deadline: the first is due first
  uint64_t next_id_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mirrored::detail

#pragma once
// Private: the streams and events of the simulated GPU (src/device/simulated/). A stream runs its
// queued work on a thread of its own, in order, each piece after a random (seeded) delay, so that
// a host read that skips a synchronisation sees stale or half-written memory, and ThreadSanitizer
// sees the race. Events and waits behave like CUDA's: an event marks the work enqueued on a stream
// so far; a stream that waits for an event runs its later work only once that work has finished;
// a never-recorded event counts as reached.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <utility>

#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail::sim {

using Clock = std::chrono::steady_clock;

/// One simulated stream: a thread that runs enqueued work in order.
class Stream {
 public:
  /// `name` appears in messages ("GPU:1 compute stream"); `seed` fixes its delays; every piece of
  /// work waits a random time below `max_delay_us` first (one in four does; 0: none).
  /// `on_failure` is called once, on the stream's thread, when a piece of work throws.
  Stream(std::string name, uint64_t seed, int max_delay_us, std::function<void(const std::string&)> on_failure);
  /// Runs the queued work, then stops the thread (the runtime's streams live as long as the process).
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  const std::string& name() const noexcept { return name_; }

  /// Queues `work` after everything enqueued before; returns its ticket (1, 2, …). Work that
  /// throws is a device failure: it and everything after it is skipped (a sticky error).
  uint64_t enqueue(std::function<void()> work);
  /// The ticket of the latest enqueued work (0 before any).
  uint64_t last_ticket() const;
  /// True when the work up to `ticket` has finished.
  bool reached(uint64_t ticket) const;
  /// Blocks until the work up to `ticket` has finished; false at `deadline` (`time_point::max()`:
  /// no deadline).
  bool wait(uint64_t ticket, Clock::time_point deadline) const;
  /// What the first failed piece of work threw ("" while none failed).
  std::string failure() const;

  /// Test hook: the next piece of work starts no earlier than `delay` from now.
  void delay_next(std::chrono::milliseconds delay);
  /// Test hooks: while held (holds nest), the stream's thread takes no further work from its
  /// queue. A host read made before `release` is thereby ordered before the work it skipped.
  void hold();
  void release();

 private:
  void run();

  const std::string name_;
  const int max_delay_us_;
  const std::function<void(const std::string&)> on_failure_;
  std::mt19937_64 rng_;  // the worker's alone
  mutable std::mutex mu_;
  std::condition_variable work_cv_;          // the worker: new work or stop
  mutable std::condition_variable done_cv_;  // waiters: work finished
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_;
  uint64_t enqueued_ = 0;
  uint64_t completed_ = 0;
  std::string failure_;
  Clock::time_point not_before_{};  // delay_next
  int holds_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

/// An event of the simulated GPU: the latest (stream, ticket) it was recorded at.
class Event final : public DeviceEvent {
 public:
  /// `owner` names the device in messages; `counts` (when given) counts each host wait.
  explicit Event(std::string owner, DeviceBackend* counts = nullptr) : owner_(std::move(owner)), counts_(counts) {}

  /// Marks the work enqueued on `stream` so far.
  void record(const Stream& stream);
  /// The latest record (nullptr: never recorded).
  std::pair<const Stream*, uint64_t> latest() const;

  bool query() const override;
  /// \throws DeadlineExceededError past `timeout_s`, InternalError when the stream failed.
  void synchronize(const Deadline& deadline) const override;

 private:
  const std::string owner_;
  DeviceBackend* const counts_;
  mutable std::mutex mu_;
  const Stream* stream_ = nullptr;
  uint64_t ticket_ = 0;
};

}  // namespace mirrored::detail::sim

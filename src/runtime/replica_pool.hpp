#pragma once
/// \file
/// One long-lived thread per replica. `execute` hands every thread the same task and returns when
/// all have finished; no thread is created per call.

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace mirrored::detail {

class ReplicaPool {
 public:
  /// A task: `fn(ctx, replica)`; it must not throw (the strategy wraps user code).
  using Task = void (*)(void* ctx, int replica) noexcept;

  /// `timeline_names[r]`, if given, names thread r in timelines (`timeline::name_this_thread`),
  /// once, as the thread starts: not on each run, where the check would sit on the run's critical path.
  explicit ReplicaPool(int num_replicas, std::vector<std::string> timeline_names = {});
  ~ReplicaPool();
  ReplicaPool(const ReplicaPool&) = delete;
  ReplicaPool& operator=(const ReplicaPool&) = delete;

  int size() const noexcept { return static_cast<int>(threads_.size()); }
  /// Runs `task(ctx, r)` on replica thread r for every r, concurrently; returns when all are done.
  /// Not reentrant: one `execute` at a time (the strategy serialises runs).
  void execute(Task task, void* ctx);

 private:
  void worker(int replica);

  std::vector<std::thread> threads_;
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  // Bumped to hand out work; workers wait on it with atomic wait (futex), after a short spin.
  alignas(64) std::atomic<uint32_t> epoch_{0};
  alignas(64) std::atomic<int32_t> pending_{0};
  alignas(64) std::atomic<uint32_t> done_epoch_{0};
  std::atomic<bool> stop_{false};
  // When run `epoch` was handed out, for the timeline (the beginning of each replica's run event),
  // in slot epoch % 2: the caller writes slot e % 2 again only for run e + 2, which needs every
  // worker to have finished run e + 1, so a worker still reading run e's slot is never overwritten.
  struct alignas(64) Dispatch {
    std::atomic<uint32_t> epoch{0};  // released after `ticks`
    std::int64_t ticks = 0;
  };
  Dispatch dispatch_[2];
  // Run `epoch`'s dispatch time, once the caller has stamped it (a bounded wait: the caller stamps
  // it right after handing the run out); -1 if it was not stamped.
  std::int64_t dispatch_ticks(uint32_t epoch) const noexcept;
};

}  // namespace mirrored::detail

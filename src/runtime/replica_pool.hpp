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
};

}  // namespace mirrored::detail

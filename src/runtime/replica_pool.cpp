#include "runtime/replica_pool.hpp"

#include <chrono>
#include <string>

#include "util/spin.hpp"
#include "util/thread_name.hpp"
#include "util/timeline.hpp"

namespace mirrored::detail {

ReplicaPool::ReplicaPool(int num_replicas, std::vector<std::string> timeline_names) {
  threads_.reserve(num_replicas);
  for (int r = 0; r < num_replicas; ++r) {
    std::string traced = r < static_cast<int>(timeline_names.size()) ? std::move(timeline_names[r]) : std::string();
    threads_.emplace_back([this, r, traced = std::move(traced)]() mutable {
      if (!traced.empty()) timeline::name_this_thread(std::move(traced));
      worker(r);
    });
    set_os_thread_name(threads_.back(), "mirrored/r" + std::to_string(r));
  }
}

ReplicaPool::~ReplicaPool() {
  stop_.store(true, std::memory_order_release);
  epoch_.fetch_add(1, std::memory_order_release);
  epoch_.notify_all();
  for (auto& t : threads_) t.join();
}

void ReplicaPool::execute(Task task, void* ctx) {
  task_ = task;
  ctx_ = ctx;
  pending_.store(size(), std::memory_order_relaxed);
  // Publishes task_/ctx_ to the workers; a read-modify-write for the reason given at `done_epoch_`
  // in `worker`.
  const uint32_t epoch = epoch_.fetch_add(1, std::memory_order_seq_cst) + 1;
  // Stamped after the hand-out, while spinning replicas start their part, and before sleeping ones
  // are woken: the clock read delays neither (the replicas use it after signalling their end).
  if (timeline::enabled()) {
    Dispatch& d = dispatch_[epoch % 2];
    d.ticks = timeline::now_ticks();
    d.epoch.store(epoch, std::memory_order_release);
  }
  epoch_.notify_all();
  // Wait for the last worker to publish done_epoch_ == epoch.
  if (!spin_until([&] { return done_epoch_.load(std::memory_order_acquire) == epoch; })) {
    for (uint32_t seen = done_epoch_.load(std::memory_order_acquire); seen != epoch;
         seen = done_epoch_.load(std::memory_order_acquire)) {
      done_epoch_.wait(seen, std::memory_order_acquire);
    }
  }
}

std::int64_t ReplicaPool::dispatch_ticks(uint32_t epoch) const noexcept {
  const Dispatch& d = dispatch_[epoch % 2];
  // The caller stamps right after the hand-out; only a caller preempted in between (or a timeline
  // that started during the hand-out) leaves it unstamped for longer. A replica that began its part
  // before the stamp gets a run event that begins no later than what it recorded inside
  // (`commit_deferred`).
  if (d.epoch.load(std::memory_order_acquire) != epoch) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    for (Backoff backoff; d.epoch.load(std::memory_order_acquire) != epoch; backoff.pause())
      if (std::chrono::steady_clock::now() >= deadline) return -1;
  }
  return d.ticks;
}

void ReplicaPool::worker(int replica) {
  uint32_t seen = 0;
  while (true) {
    if (!spin_until([&] { return epoch_.load(std::memory_order_acquire) != seen; })) {
      epoch_.wait(seen, std::memory_order_acquire);
      if (epoch_.load(std::memory_order_acquire) == seen) continue;  // spurious wake-up
    }
    seen = epoch_.load(std::memory_order_acquire);
    if (stop_.load(std::memory_order_acquire)) return;
    task_(ctx_, replica);
    timeline::seal_deferred();  // a span the task left open (see below): `stop` now waits for it
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // A read-modify-write, not a plain store: `notify_one` skips the futex wake when it reads no
      // registered waiter, and a plain (release) store may still be invisible when that read runs
      // (a store may pass a later load, even on x86). The caller can then register, read the old
      // value and sleep with nobody left to wake it: that hung `execute` on a 2-vCPU VM about once
      // in a million runs. The exchange orders the store before the waiter check.
      done_epoch_.exchange(seen, std::memory_order_seq_cst);
      done_epoch_.notify_one();
    }
    // A span the task left open (the strategy's "run" event) ends and is appended now, while the
    // caller is already on its way; it began when the run was handed out.
    if (timeline::deferred_open()) timeline::commit_deferred(dispatch_ticks(seen));
  }
}

}  // namespace mirrored::detail

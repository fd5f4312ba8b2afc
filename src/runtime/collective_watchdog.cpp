#include "runtime/collective_watchdog.hpp"

#include "util/log.hpp"

namespace mirrored::detail {

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

CollectiveWatchdog::Ticket CollectiveWatchdog::watch(Clock::time_point deadline, std::function<void()> on_expiry) {
  std::lock_guard lock(mu_);
  const Ticket ticket{deadline, next_id_++};
  const bool earliest = entries_.empty() || ticket < entries_.begin()->first;
  entries_.emplace(ticket, std::move(on_expiry));
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
  } else if (earliest) {
    cv_.notify_all();  // the thread sleeps until a later deadline
  }
  return ticket;
}

void CollectiveWatchdog::cancel(const Ticket& ticket) noexcept {
  std::lock_guard lock(mu_);
  entries_.erase(ticket);  // the thread may wake for nothing at that deadline, which is harmless
}

void CollectiveWatchdog::loop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    if (entries_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto first = entries_.begin();
    // A copy: wait_until reads its deadline while the lock is released, when `cancel` may erase
    // the entry that holds it.
    const Clock::time_point due = first->first.first;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    std::function<void()> expire = std::move(first->second);
    entries_.erase(first);
    lock.unlock();
    try {
      expire();
    } catch (const std::exception& e) {
      // The callbacks abort collectives; one that fails must not take the process down.
      MIRRORED_LOG(error, "collective watchdog: expiry handler failed: ", e.what());
    }
    lock.lock();
  }
}

}  // namespace mirrored::detail

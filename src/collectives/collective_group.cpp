#include "collectives/collective_group.hpp"

#include <algorithm>

#include "mirrored/errors.hpp"
#include "util/log.hpp"
#include "util/spin.hpp"

namespace mirrored::detail {
namespace {
constexpr double kMaxWaitSeconds = 1e9;  // ~32 years: "forever" without overflowing steady_clock
}  // namespace

const char* collective_kind_name(CollectiveKind kind) noexcept {
  switch (kind) {
    case CollectiveKind::all_reduce: return "all_reduce";
    case CollectiveKind::all_gather: return "all_gather";
    case CollectiveKind::merge_call: return "merge_call";
    case CollectiveKind::broadcast: return "broadcast";
    case CollectiveKind::batch_reduce: return "batch_reduce";
    case CollectiveKind::all_reduce_async: return "all_reduce_async";
    case CollectiveKind::reduce_scatter: return "reduce_scatter";
    case CollectiveKind::reduce_scatter_async: return "reduce_scatter_async";
    case CollectiveKind::apply_gradients: return "apply_gradients";
  }
  return "collective";
}

CollectiveGroup::CollectiveGroup(int num_replicas, double stall_warn_seconds)
    : n_(num_replicas),
      stall_warn_s_(stall_warn_seconds),
      arrived_gen_(num_replicas, 0),
      finished_(num_replicas, 0),
      calls_(num_replicas, 0),
      kinds_(num_replicas, CollectiveKind::all_reduce),
      payloads_(num_replicas, nullptr),
      deadlines_(num_replicas, Deadline::after(0)),
      deadline_(Deadline::after(0)) {}

void CollectiveGroup::begin_run() {
  std::lock_guard lock(mu_);
  arrived_ = 0;
  inside_ = 0;
  join_failed_.store(false);
  aborted_.store(false, std::memory_order_release);
  abort_reason_.clear();
  join_error_.clear();
  // A replica that arrived in an aborted run must not count as arrived in this one: waiters
  // would then never see it return, and would wait out their whole deadline.
  std::fill(arrived_gen_.begin(), arrived_gen_.end(), 0);
  std::fill(finished_.begin(), finished_.end(), 0);
  std::fill(calls_.begin(), calls_.end(), 0);
  std::fill(payloads_.begin(), payloads_.end(), nullptr);
}

std::string CollectiveGroup::describe_call(int r) const {
  return str_cat(collective_kind_name(kinds_[r]), " (collective call ", calls_[r], ")");
}

void CollectiveGroup::check_same_calls_locked() {
  join_error_.clear();
  join_failed_.store(false, std::memory_order_relaxed);  // published by the generation's release
  bool same = true;
  for (int r = 1; r < n_; ++r) same &= kinds_[r] == kinds_[0];
  if (same) return;
  join_failed_.store(true, std::memory_order_relaxed);
  std::string detail;
  for (int r = 0; r < n_; ++r) detail += str_cat(r ? ", " : "", "replica ", r, " called ", describe_call(r));
  join_error_ =
      "Some replicas made a different number of collective or merge_call calls, or made them in a "
      "different order: " +
      detail;
}

template <class E>
void CollectiveGroup::fail_locked(const std::string& message) {
  // Whoever gives up on a wait aborts the group, so that no late arrival can complete the
  // barrier and read the payload of a replica that has left.
  if (!aborted_.load(std::memory_order_relaxed)) {
    abort_reason_ = message;
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
  throw E(message);
}

void CollectiveGroup::join(int replica, CollectiveKind kind, const void* payload, const Deadline& deadline) {
  // One lock per join on the way in; the verdict on the call sequence comes with the barrier's
  // generation (acquired by every waiter), so only a failed join takes the lock again.
  arrive_and_wait(replica, Phase::join, deadline, kind, payload);
  if (join_failed_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(mu_);
    fail_locked<FailedPreconditionError>(join_error_);
  }
}

void CollectiveGroup::leave(int /*replica*/) {
  if (inside_.fetch_sub(1) == 1 && sleepers_.load() > 0) {
    std::lock_guard lock(mu_);
    cv_.notify_all();
  }
}

void CollectiveGroup::leave_failed(int replica, const std::string& reason) {
  std::unique_lock lock(mu_);
  if (!aborted_.load(std::memory_order_relaxed)) {
    abort_reason_ = str_cat("replica ", replica, " failed, so this collective was aborted: ", reason);
    aborted_.store(true, std::memory_order_release);
  }
  --inside_;
  cv_.notify_all();
  ++sleepers_;
  cv_.wait(lock, [&] { return inside_ == 0; });
  --sleepers_;
}

void CollectiveGroup::sync(int replica, const Deadline& deadline) { arrive_and_wait(replica, Phase::sync, deadline); }

void CollectiveGroup::arrive_and_wait(int replica, Phase phase, const Deadline& until, CollectiveKind kind,
                                      const void* payload) {
  std::unique_lock lock(mu_);
  if (aborted_.load(std::memory_order_relaxed)) throw AbortedError(abort_reason_);
  if (phase == Phase::join) {
    ++calls_[replica];
    kinds_[replica] = kind;
    payloads_[replica] = payload;
    deadlines_[replica] = until;
  }
  const uint64_t gen = generation_.load(std::memory_order_relaxed);
  arrived_gen_[replica] = gen + 1;
  if (++arrived_ == n_) {
    if (phase == Phase::join) {
      check_same_calls_locked();
      // Counted here, atomically with the barrier, so no replica can see the others as gone
      // before they have even woken up.
      if (join_error_.empty()) inside_ += n_;
      // The collective ends by the earliest deadline of its replicas: the first to arrive waits
      // no longer than its own timeout, so neither may the collective.
      deadline_ = deadlines_[0];
      for (int q = 1; q < n_; ++q)
        if (deadlines_[q].time_point() < deadline_.time_point()) deadline_ = deadlines_[q];
    }
    arrived_ = 0;
    generation_.store(gen + 1, std::memory_order_release);
    if (sleepers_) cv_.notify_all();
    return;
  }
  lock.unlock();
  const auto start = std::chrono::steady_clock::now();
  if (spin_until([&] {
        return generation_.load(std::memory_order_acquire) != gen || aborted_.load(std::memory_order_relaxed);
      }) &&
      !aborted_.load(std::memory_order_acquire)) {
    return;
  }
  lock.lock();
  // The collective's deadline, set where it entered the library; only the stall warning counts
  // from the start of this wait. Capped so that a huge warning time cannot overflow the clock.
  const auto deadline = until.time_point();
  const auto warn_at = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(std::min(stall_warn_s_, kMaxWaitSeconds)));
  bool warned = false;
  ++sleepers_;
  struct Leave {
    std::atomic<int>& sleepers;
    ~Leave() { --sleepers; }
  } leave{sleepers_};
  while (generation_.load(std::memory_order_relaxed) == gen) {
    if (aborted_.load(std::memory_order_relaxed)) throw AbortedError(abort_reason_);
    for (int q = 0; q < n_; ++q) {
      if (arrived_gen_[q] != gen + 1 && finished_[q]) {
        fail_locked<FailedPreconditionError>(
            str_cat("Some replicas made a different number of collective or merge_call calls: replica ", q,
                    " returned from the replica function after ", calls_[q], " collective calls, while replica ",
                    replica, " waits in ", describe_call(replica)));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (now >= deadline) {
      fail_locked<DeadlineExceededError>(
          str_cat(describe_call(replica), " on replica ", replica, ": waited ", waited, " s for replicas ",
                  describe_missing(), " that never arrived (collective timeout ", until.timeout_seconds(),
                  " s; set CommunicationOptions::timeout_seconds or MIRRORED_COLLECTIVE_TIMEOUT_S)"));
    }
    if (!warned && now >= warn_at) {
      warned = true;
      MIRRORED_LOG(warn, "replica ", replica, " has waited ", waited, " s in ", describe_call(replica),
                   " for replicas ", describe_missing(), " (deadline in ", until.seconds_left(), " s)");
    }
    cv_.wait_until(lock, warned ? deadline : std::min(deadline, warn_at));
  }
}

std::string CollectiveGroup::describe_missing() const {
  const uint64_t target = generation_.load(std::memory_order_relaxed) + 1;
  std::string out = "[";
  bool first = true;
  for (int q = 0; q < n_; ++q) {
    if (arrived_gen_[q] == target) continue;
    out += str_cat(first ? "" : ", ", q);
    first = false;
  }
  return out + "]";
}

std::string CollectiveGroup::missing_replicas() const {
  std::lock_guard lock(mu_);
  return describe_missing();
}

void CollectiveGroup::finish(int replica) {
  std::lock_guard lock(mu_);
  finished_[replica] = 1;
  if (sleepers_) cv_.notify_all();
}

void CollectiveGroup::abort(const std::string& reason) {
  std::lock_guard lock(mu_);
  if (!aborted_.load(std::memory_order_relaxed)) {
    abort_reason_ = reason;
    aborted_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

}  // namespace mirrored::detail

#include "collectives/collective_group.hpp"

#include <algorithm>

#include "collectives/flight_recorder.hpp"
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
    case CollectiveKind::agree_on_variables: return "agree_on_variables";
  }
  return "collective";
}

CollectiveGroup::CollectiveGroup(int num_replicas, double stall_warn_seconds)
    : n_(num_replicas),
      stall_warn_s_(stall_warn_seconds),
      recorder_(std::make_unique<FlightRecorder>(num_replicas)),
      arrived_gen_(std::make_unique<std::atomic<uint64_t>[]>(static_cast<std::size_t>(num_replicas))),
      finished_(num_replicas, 0),
      calls_(num_replicas, 0),
      kinds_(num_replicas, CollectiveKind::all_reduce),
      payloads_(num_replicas, nullptr),
      deadlines_(num_replicas, Deadline::after(0)),
      deadline_(Deadline::after(0)) {}

CollectiveGroup::~CollectiveGroup() = default;

std::string CollectiveGroup::flight_report_for(const std::string& message) const {
  if (!recorder_->enabled() || message.find("flight recorder: ") != std::string::npos) return "";
  dump_flight_recorders_on_event(recorder_->worker());
  const std::string report = recorder_->local_report();
  return report.empty() ? report : "; " + report;
}

void CollectiveGroup::begin_run() {
  std::lock_guard lock(mu_);
  // Replicas of an aborted run may have stopped at different collectives; the next run starts
  // them at the same sequence number again. After a clean run (as many joins on every replica)
  // they are there already, and the rings are left alone: each is written by its replica's
  // thread, and reading it from here every run took its cache line from that thread's core
  // (a few percent of a lone 64 KiB collective).
  const bool uneven = std::any_of(calls_.begin(), calls_.end(), [&](int64_t c) { return c != calls_[0]; });
  if (n_ > 1 && (aborted_.load(std::memory_order_relaxed) || uneven)) recorder_->align();
  // The generation goes on; the arrivals and the abort of the last run are forgotten.
  state_.store(generation_of(state_.load()) << kGenerationShift);
  inside_ = 0;
  join_failed_.store(false);
  aborted_.store(false, std::memory_order_release);
  abort_reason_.clear();
  join_error_.clear();
  // A replica that arrived in an aborted run must not count as arrived in this one: waiters
  // would then never see it return, and would wait out their whole deadline.
  for (int r = 0; r < n_; ++r) arrived_gen_[r].store(0, std::memory_order_relaxed);
  std::fill(finished_.begin(), finished_.end(), 0);
  std::fill(calls_.begin(), calls_.end(), 0);
  std::fill(payloads_.begin(), payloads_.end(), nullptr);
}

std::string CollectiveGroup::describe_call(int r) const {
  return str_cat(collective_kind_name(kinds_[r]), " (collective call ", calls_[r], ")");
}

void CollectiveGroup::check_same_calls() {
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
  join_error_ += flight_report_for(join_error_);
}

void CollectiveGroup::abort_locked(const std::string& reason) {
  if (!aborted_.load(std::memory_order_relaxed)) {
    abort_reason_ = reason + flight_report_for(reason);
    aborted_.store(true, std::memory_order_release);
  }
  state_.fetch_or(kAbortBit);  // no arrival is counted from now on
  cv_.notify_all();
}

bool CollectiveGroup::give_up_locked(uint64_t gen, const std::string& message) {
  uint64_t s = state_.load();
  for (;;) {
    // Every replica arrived (the last one is publishing the next generation): the wait succeeds.
    if (generation_of(s) != gen || (s & kCountMask) == static_cast<uint64_t>(n_)) return false;
    // Whoever gives up on a wait aborts the group in the same step, so that no late arrival can
    // complete the barrier and read the payload of a replica that has left.
    if (state_.compare_exchange_weak(s, s | kAbortBit)) break;
  }
  abort_locked(message);
  return true;
}

void CollectiveGroup::join(int replica, CollectiveKind kind, const void* payload, const Deadline& deadline) {
  arrive_and_wait(replica, Phase::join, deadline, kind, payload);
  // The verdict on the call sequence comes with the barrier's generation (acquired by every
  // waiter), so only a failed join takes the lock.
  if (join_failed_.load(std::memory_order_relaxed)) {
    std::lock_guard lock(mu_);
    abort_locked(join_error_);
    throw FailedPreconditionError(join_error_);
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
  abort_locked(str_cat("replica ", replica, " failed, so this collective was aborted: ", reason));
  --inside_;
  cv_.notify_all();
  ++sleepers_;
  cv_.wait(lock, [&] { return inside_ == 0; });
  --sleepers_;
}

void CollectiveGroup::sync(int replica, const Deadline& deadline) { arrive_and_wait(replica, Phase::sync, deadline); }

void CollectiveGroup::arrive_and_wait(int replica, Phase phase, const Deadline& until, CollectiveKind kind,
                                      const void* payload) {
  // What a join posts is written before its arrival is counted (the count's read-modify-writes
  // publish it to the last arriver, and the next generation to everyone).
  if (phase == Phase::join) {
    ++calls_[replica];
    kinds_[replica] = kind;
    payloads_[replica] = payload;
    deadlines_[replica] = until;
  }
  uint64_t s = state_.load(std::memory_order_acquire);
  uint64_t gen = 0;
  for (;;) {
    if (s & kAbortBit) {
      std::lock_guard lock(mu_);
      throw AbortedError(abort_reason_);
    }
    gen = generation_of(s);
    arrived_gen_[replica].store(gen + 1, std::memory_order_relaxed);
    if (state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel, std::memory_order_acquire)) break;
  }
  if ((s & kCountMask) + 1 == static_cast<uint64_t>(n_)) {
    // The last to arrive: everybody's post is visible here. It checks the call sequence, then
    // publishes the next generation (keeping an abort that came meanwhile); nobody else writes
    // these fields until that generation is published.
    if (phase == Phase::join) {
      check_same_calls();
      if (join_error_.empty()) inside_ += n_;
      // The collective ends by the earliest deadline of its replicas: the first to arrive waits
      // no longer than its own timeout, so neither may the collective.
      deadline_ = deadlines_[0];
      for (int q = 1; q < n_; ++q)
        if (deadlines_[q].time_point() < deadline_.time_point()) deadline_ = deadlines_[q];
    }
    uint64_t cur = state_.load(std::memory_order_relaxed);
    while (!state_.compare_exchange_weak(cur, ((gen + 1) << kGenerationShift) | (cur & kAbortBit))) {
    }
    // After the generation (both sequentially consistent): a sleeper counted itself before it read
    // the generation, so either it sees the new one or this sees it and wakes it.
    if (sleepers_.load() > 0) {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
    return;
  }
  const auto done = [&] {
    return generation_of(state_.load(std::memory_order_acquire)) != gen || aborted_.load(std::memory_order_relaxed);
  };
  if (spin_until(done) && generation_of(state_.load(std::memory_order_acquire)) != gen) return;
  wait_slowly(replica, gen, until);
}

void CollectiveGroup::wait_slowly(int replica, uint64_t gen, const Deadline& until) {
  std::unique_lock lock(mu_);
  // The collective's deadline, set where it entered the library; only the stall warning counts
  // from the start of this wait. Capped so that a huge warning time cannot overflow the clock.
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = until.time_point();
  const auto warn_at = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                   std::chrono::duration<double>(std::min(stall_warn_s_, kMaxWaitSeconds)));
  bool warned = false;
  ++sleepers_;
  struct Leave {
    std::atomic<int>& sleepers;
    ~Leave() { --sleepers; }
  } leave{sleepers_};
  while (generation_of(state_.load()) == gen) {
    if (aborted_.load(std::memory_order_relaxed)) throw AbortedError(abort_reason_);
    std::string give_up;  // why this wait ends in an error, if it does
    bool deadline_passed = false;
    for (int q = 0; q < n_ && give_up.empty(); ++q) {
      if (arrived_gen_[q].load(std::memory_order_relaxed) != gen + 1 && finished_[q]) {
        give_up = str_cat("Some replicas made a different number of collective or merge_call calls: replica ", q,
                          " returned from the replica function after ", calls_[q], " collective calls, while replica ",
                          replica, " waits in ", describe_call(replica));
      }
    }
    const auto now = std::chrono::steady_clock::now();
    const double waited = std::chrono::duration<double>(now - start).count();
    if (give_up.empty() && now >= deadline) {
      deadline_passed = true;
      give_up = str_cat(describe_call(replica), " on replica ", replica, ": waited ", waited, " s for replicas ",
                        describe_missing(), " that never arrived (collective timeout ", until.timeout_seconds(),
                        " s; set CommunicationOptions::timeout_seconds or MIRRORED_COLLECTIVE_TIMEOUT_S)");
    }
    if (!give_up.empty()) give_up += flight_report_for(give_up);
    if (!give_up.empty()) {
      if (give_up_locked(gen, give_up)) {
        if (deadline_passed) throw DeadlineExceededError(give_up);
        throw FailedPreconditionError(give_up);
      }
      // Every replica arrived just now: the barrier completes in a moment and notifies.
      cv_.wait_for(lock, std::chrono::microseconds(100));
      continue;
    }
    if (!warned && now >= warn_at) {
      warned = true;
      MIRRORED_LOG(warn, "replica ", replica, " has waited ", waited, " s in ", describe_call(replica),
                   " for replicas ", describe_missing(), " (deadline in ", until.seconds_left(), " s)",
                   flight_report_for(""));
    }
    cv_.wait_until(lock, warned ? deadline : std::min(deadline, warn_at));
  }
}

std::string CollectiveGroup::describe_missing() const {
  const uint64_t target = generation_of(state_.load()) + 1;
  std::string out = "[";
  bool first = true;
  for (int q = 0; q < n_; ++q) {
    if (arrived_gen_[q].load(std::memory_order_relaxed) == target) continue;
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
  abort_locked(reason);
}

}  // namespace mirrored::detail

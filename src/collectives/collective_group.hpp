#pragma once
/// \file
/// The rendezvous of replica threads: every collective (all-reduce, all-gather, merge_call) starts
/// with all replicas joining it. Joining checks that the replicas agree on the call sequence, and
/// every wait has a deadline and is released when the run is aborted.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "mirrored/collective_step.hpp"
#include "mirrored/deadline.hpp"

namespace mirrored::detail {

class FlightRecorder;

/// The collective calls replicas make (public: a CollectiveRequest names its kind).
using CollectiveKind = mirrored::CollectiveKind;

/// "all_reduce", "merge_call", …
const char* collective_kind_name(CollectiveKind kind) noexcept;

/// Synchronisation shared by the replica threads of one strategy (ranks-as-threads).
class CollectiveGroup {
 public:
  /// `stall_warn_seconds`: a wait longer than this logs one warning naming the missing replicas.
  CollectiveGroup(int num_replicas, double stall_warn_seconds);
  ~CollectiveGroup();
  CollectiveGroup(const CollectiveGroup&) = delete;
  CollectiveGroup& operator=(const CollectiveGroup&) = delete;

  int size() const noexcept { return n_; }

  /// Resets per-run state (call counts, arrivals, abort flag). Called with no replica running.
  void begin_run();

  /// Replica `replica` enters its next collective, of `kind`, posting `payload` for the others,
  /// and waits until every replica has entered. On success the replica is *inside* the
  /// collective until it calls `leave` or `leave_failed`; on any error the whole group is aborted
  /// first, so no replica can go on to read a payload whose owner has left. \throws FailedPreconditionError when the
  /// replicas entered different kinds of collective or one returned from its function instead;
  /// DeadlineExceededError past `deadline` (the collective's, made where it entered the library),
  /// naming the replicas that never arrived; AbortedError when another replica failed.
  void join(int replica, CollectiveKind kind, const void* payload, const Deadline& deadline);

  /// What replica `r` posted in the current collective (valid until that collective's last sync).
  const void* payload(int r) const noexcept { return payloads_[r]; }

  /// The deadline of the current collective, once joined: the earliest of those its replicas
  /// joined with (each made where that replica's call entered the library). Every later wait of
  /// the collective, in every layer, ends by it.
  const Deadline& deadline() const noexcept { return deadline_; }

  /// A barrier of all replicas inside the current collective (same errors as `join`).
  void sync(int replica, const Deadline& deadline);

  /// Leaves the current collective after its last `sync` (nobody reads this replica's payload
  /// any more).
  void leave(int replica);

  /// Leaves the current collective because of an error: aborts the group with `reason`, then
  /// waits until every other replica has left too, so that this replica's payload (which may
  /// live on its stack) outlives every reader. Waits no longer than replicas inside the
  /// collective take to notice the abort (each of their waits is bounded).
  void leave_failed(int replica, const std::string& reason);

  /// Replica `replica` returned from its function; replicas still waiting for it fail fast.
  void finish(int replica);

  /// Releases every current and future waiter of this run with AbortedError(`reason`).
  void abort(const std::string& reason);

  /// True once `abort` was called in this run.
  bool aborted() const noexcept { return aborted_.load(std::memory_order_acquire); }

  /// "[1, 3]": the replicas that have not arrived at the barrier now open (for the watchdog's
  /// messages).
  std::string missing_replicas() const;

  /// Number of collectives replica `r` joined in the current run.
  int64_t calls(int r) const noexcept { return calls_[r]; }

  /// The replicas' flight recorder (collectives record themselves in the plan; the deadline,
  /// stall and abort messages of this group end with its report).
  FlightRecorder& recorder() noexcept { return *recorder_; }
  /// "; flight recorder: ..." (with the recorder's dump when MIRRORED_FLIGHT_RECORDER_DIR is set),
  /// or "" when the recorder is off or `message` carries a report already.
  std::string flight_report_for(const std::string& message) const;

 private:
  enum class Phase { join, sync };
  // `kind` and `payload`: what a join posts (before its arrival is counted).
  void arrive_and_wait(int replica, Phase phase, const Deadline& deadline,
                       CollectiveKind kind = CollectiveKind::all_reduce, const void* payload = nullptr);
  // The slow half of a wait for generation `gen` to end: sleeps, warns of stalls, and gives up
  // past the deadline or when a replica it waits for has returned from its function.
  void wait_slowly(int replica, uint64_t gen, const Deadline& until);
  // Aborts the wait for generation `gen` unless that barrier completed (or is completing) first:
  // true when this call aborted the group (the caller then throws), false when the barrier got
  // there first (the caller goes on waiting for it, which ends at once). Under mu_.
  bool give_up_locked(uint64_t gen, const std::string& message);
  // Marks the group aborted with `reason` (the first reason stays) and wakes every waiter. Under mu_.
  void abort_locked(const std::string& reason);
  std::string describe_missing() const;
  std::string describe_call(int replica) const;
  void check_same_calls();

  // The barrier's state in one word, so that an arrival and an abort are ordered once and for all
  // (an arrival after an abort throws; an abort never overtakes a barrier that has all its
  // arrivals): bits 0-31 count the arrivals at the open barrier, bit 32 is set once the group is
  // aborted, and the bits above count the barriers completed (the generation).
  static constexpr uint64_t kCountMask = 0xffffffffu;
  static constexpr uint64_t kAbortBit = uint64_t{1} << 32;
  static constexpr int kGenerationShift = 33;
  static uint64_t generation_of(uint64_t state) noexcept { return state >> kGenerationShift; }

  const int n_;
  const double stall_warn_s_;
  std::unique_ptr<FlightRecorder> recorder_;
  mutable std::mutex mu_;  // the slow paths: sleeping, abort reasons, failure messages
  std::condition_variable cv_;
  std::atomic<uint64_t> state_{0};
  std::atomic<bool> aborted_{false};
  // Atomic so that `leave` (once per collective and replica) needs the lock only when someone
  // sleeps: a leaver decrements `inside_` then reads `sleepers_`, a sleeper increments `sleepers_`
  // then reads `inside_` (both sequentially consistent), so one of them sees the other.
  std::atomic<int> sleepers_{0};
  std::atomic<int> inside_{0};  // replicas between a successful join and leaving
  std::string abort_reason_;
  std::string join_error_;  // set by the last arriver when calls disagree
  // join_error_ is not empty; published with the barrier's generation, so a joiner reads it
  // without the lock.
  std::atomic<bool> join_failed_{false};
  // Generation + 1 at which each replica last arrived (read by whoever describes who is missing).
  std::unique_ptr<std::atomic<uint64_t>[]> arrived_gen_;
  std::vector<char> finished_;
  std::vector<int64_t> calls_;
  std::vector<CollectiveKind> kinds_;
  std::vector<const void*> payloads_;
  std::vector<Deadline> deadlines_;  // what each replica joined the current collective with
  Deadline deadline_;                // their earliest; written by the last arriver of a join
};

}  // namespace mirrored::detail

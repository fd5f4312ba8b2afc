#pragma once
// Private: the flight recorder's rings (include/mirrored/flight_recorder.hpp). One ring per local
// replica, written only by that replica's own calls (its thread, or its lane's for an asynchronous
// collective, which the replica thread never overlaps with a write of its own to the same entry):
// no lock, no allocation, a few relaxed stores per collective. Readers (the reports, dumps) copy
// an entry under a per-entry sequence lock and drop it when it was being rewritten meanwhile.
//
// Sequence numbers count a replica's collectives. Replicas make the same collectives in the same
// order, so the same number names the same call on every replica (and on every worker); a run
// that ended early on some replicas is followed by `align`, so the next run starts all of them at
// the same number again.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collectives/collective_group.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/untyped_tensor.hpp"

namespace mirrored::detail {

enum class FlightState : uint8_t { issued, waiting, done, failed };
const char* flight_state_name(FlightState s) noexcept;

/// One entry as read back.
struct FlightEntry {
  uint64_t seq = 0;  // 1-based; 0: no entry
  CollectiveKind kind = CollectiveKind::all_reduce;
  int op = -1;     // a ReduceOp, or -1
  int dtype = -1;  // a DType, or -1
  bool async = false;
  FlightState state = FlightState::issued;
  int ndims = 0;  // of the first tensor; up to kMaxDims kept
  static constexpr int kMaxDims = 4;
  int64_t shape[kMaxDims] = {};
  int64_t bytes = 0;
  int64_t issue_ns = 0, start_ns = 0, end_ns = 0;  // steady clock (ns); 0: not yet
};

/// The entries' capacity from MIRRORED_FLIGHT_RECORDER_ENTRIES (default 256; 0 turns the
/// recorder off, for the overhead benchmark), read when a strategy is made.
std::size_t flight_recorder_entries();

/// Nanoseconds of the steady clock.
int64_t flight_now_ns() noexcept;

// Cache lines of its own (a pair: the L2 prefetcher fetches lines in aligned pairs): a ring that
// shared one with data another thread writes (the replica pool's, the group's, the next replica's
// ring) missed on every call's first load, which cost twice the ring's own work.
class alignas(128) FlightRing {
 public:
  explicit FlightRing(std::size_t capacity);
  FlightRing(const FlightRing&) = delete;
  FlightRing& operator=(const FlightRing&) = delete;

  bool enabled() const noexcept { return capacity_ != 0; }
  /// Pauses or resumes recording (a ring without capacity never records): for the overhead
  /// benchmark, which compares the same replicas with and without it. Between runs only.
  void set_recording(bool on) noexcept { recording_.store(on && capacity_ != 0, std::memory_order_relaxed); }
  /// A new entry (state issued, or waiting when `entered`) for a call that entered the library at
  /// `made` (its deadline's making: the issue time, and the start time when `entered`); returns
  /// its sequence number (0 when the recorder is off). Only the ring's replica calls it.
  uint64_t issue(CollectiveKind kind, int op, int dtype, const std::vector<int64_t>* shape, int64_t bytes, bool async,
                 bool entered, Deadline::Clock::time_point made) noexcept;
  /// Entry `seq` entered its collective (waits for the others) / ended.
  void enter(uint64_t seq) noexcept;
  void end(uint64_t seq, bool ok) noexcept;
  /// The next sequence number (one past the last issued).
  uint64_t next_seq() const noexcept { return next_.load(std::memory_order_relaxed); }
  /// Makes the next sequence number `next` (between runs only, when nothing is in flight).
  void set_next_seq(uint64_t next) noexcept { next_.store(next, std::memory_order_relaxed); }
  /// Copies of the entries still in the ring, oldest first (any thread).
  std::vector<FlightEntry> snapshot() const;

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};    // odd while being rewritten: 2 * number + 1; else 2 * number
    std::atomic<uint64_t> meta{0};   // kind, op, dtype, async, ndims
    std::atomic<uint32_t> state{0};  // FlightState
    std::atomic<int64_t> shape[FlightEntry::kMaxDims];
    std::atomic<int64_t> bytes{0};
    // Steady-clock nanoseconds; 0: not yet.
    std::atomic<int64_t> issue_ns{0}, start_ns{0};
    // Ticks of the ring's clock (flight_recorder.cpp), converted by snapshot(); 0: not yet.
    std::atomic<int64_t> end_ticks{0};
  };
  Slot* slot_of(uint64_t seq) const noexcept { return &slots_[(seq - 1) & mask_]; }
  std::size_t capacity_;  // the entries kept (MIRRORED_FLIGHT_RECORDER_ENTRIES)
  // Slots: capacity_ rounded up to a power of two, so that finding one is a mask, not a division
  // (a division was a sixth of a recorded collective's cost).
  uint64_t mask_;
  std::unique_ptr<Slot[]> slots_;
  std::atomic<uint64_t> next_{1};
  std::atomic<bool> recording_;
};

/// What one replica is doing, for the reports: its last completed collective and the one it is
/// in (if any). Also what the workers exchange through the job's store.
struct ReplicaFlight {
  int worker = 0;
  int replica = 0;  // local index
  std::string device;
  uint64_t last_done = 0;  // 0: none this strategy
  std::string last_kind;
  double since_done_s = 0;  // since that one ended (or since the recorder started)
  uint64_t current = 0;     // 0: in none
  std::string current_kind;
  std::string current_state;  // issued, waiting, failed
  double current_for_s = 0;   // since it was entered (or issued)
};

/// "worker 1 replica 0 (CPU:0) last completed all_reduce #17 and has not entered #18 for 10.0 s;
/// every other replica waits in all_reduce #18": who is behind (or called something else at the
/// same number), from every replica's state. `silent` names workers whose state is unknown.
std::string compose_flight_report(const std::vector<ReplicaFlight>& replicas, const std::vector<std::string>& silent);

/// One line per replica, and back (for the exchange between workers). Malformed lines are skipped.
std::string encode_flights(const std::vector<ReplicaFlight>& replicas);
std::vector<ReplicaFlight> decode_flights(const std::string& text);

/// The rings of one strategy's local replicas.
class FlightRecorder {
 public:
  explicit FlightRecorder(int num_replicas);
  ~FlightRecorder();
  FlightRecorder(const FlightRecorder&) = delete;
  FlightRecorder& operator=(const FlightRecorder&) = delete;

  FlightRing& ring(int replica) noexcept { return *rings_[static_cast<std::size_t>(replica)]; }
  int size() const noexcept { return static_cast<int>(rings_.size()); }
  bool enabled() const noexcept { return rings_[0]->enabled(); }
  /// `FlightRing::set_recording` on every ring.
  void set_recording(bool on) noexcept {
    for (auto& r : rings_) r->set_recording(on);
  }

  /// Who the replicas are, for the reports (set once, before any collective).
  void set_identity(int worker, int num_workers, std::vector<std::string> devices);
  int worker() const noexcept { return worker_; }
  int num_workers() const noexcept { return num_workers_; }

  /// Between runs: every ring continues at the highest next sequence number of any.
  void align() noexcept;

  /// Whether any replica made a collective yet.
  bool recorded() const noexcept;
  /// Every local replica's state now.
  std::vector<ReplicaFlight> flights() const;
  /// The report on the local replicas alone ("" when the recorder is off).
  std::string local_report() const;
  /// This recorder as JSON (one element of a dump's "strategies").
  void append_json(std::string& out) const;

 private:
  std::vector<std::unique_ptr<FlightRing>> rings_;
  std::vector<std::string> devices_;
  int worker_ = 0;
  int num_workers_ = 1;
  int64_t created_ns_;
};

/// `FlightRecorder::set_recording` on every live recorder of this process (the overhead
/// benchmark's switch; between runs only).
void set_flight_recording(bool on) noexcept;
/// Writes every live recorder of this process to `path` (mirrored::flight_recorder::dump).
void dump_flight_recorders(const std::string& path);
/// With MIRRORED_FLIGHT_RECORDER_DIR set: the same to `<dir>/flight_recorder.worker<W>.json`, for
/// a timeout, stall, abort or peer loss; never throws (a failed dump is logged).
void dump_flight_recorders_on_event(int worker) noexcept;

/// A RAII record of one collective on a replica's ring: issued (or adopted, for an asynchronous
/// one issued earlier) at construction, ended at destruction: done when `done()` was called
/// first (where the collective returns), else failed (destroyed by an exception). An explicit
/// `done()` rather than `std::uncaught_exceptions()` twice: the two calls were a tenth of a
/// recorded collective's cost. The issue time is when `deadline` was made, where the call entered
/// the library.
class FlightCall {
 public:
  FlightCall(FlightRing& ring, const Deadline& deadline, CollectiveKind kind, int op, int dtype,
             const std::vector<int64_t>* shape, int64_t bytes, bool async, uint64_t adopted_seq = 0) noexcept
      : ring_(ring) {
    // A collective made of others (an optimizer step's reduction) is one entry.
    if (active_) return;
    active_ = true;
    outer_ = true;
    if (adopted_seq) {
      seq_ = adopted_seq;
      ring_.enter(seq_);
    } else {
      seq_ = ring_.issue(kind, op, dtype, shape, bytes, async, true, deadline.made());
    }
  }
  /// The same for a replica's post (inputs, op).
  FlightCall(FlightRing& ring, const Deadline& deadline, CollectiveKind kind, const std::vector<UntypedTensor>* inputs,
             int op, bool async, uint64_t adopted_seq = 0) noexcept
      : FlightCall(ring, deadline, kind, op, inputs && !inputs->empty() ? static_cast<int>((*inputs)[0].dtype) : -1,
                   inputs && !inputs->empty() ? &(*inputs)[0].shape : nullptr, total_bytes(inputs), async,
                   adopted_seq) {}
  ~FlightCall() {
    if (!outer_) return;
    active_ = false;
    ring_.end(seq_, ok_);
  }
  /// The collective succeeded (call it on every path that returns normally).
  void done() noexcept { ok_ = true; }
  FlightCall(const FlightCall&) = delete;
  FlightCall& operator=(const FlightCall&) = delete;

 private:
  static int64_t total_bytes(const std::vector<UntypedTensor>* inputs) noexcept {
    int64_t bytes = 0;
    if (inputs)
      for (const auto& t : *inputs) bytes += static_cast<int64_t>(t.bytes());
    return bytes;
  }
  static inline thread_local bool active_ = false;
  FlightRing& ring_;
  uint64_t seq_ = 0;
  bool outer_ = false;
  bool ok_ = false;
};

}  // namespace mirrored::detail

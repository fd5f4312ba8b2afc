#include "collectives/flight_recorder.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>

#include "mirrored/dtype.hpp"
#include "mirrored/errors.hpp"
#include "mirrored/flight_recorder.hpp"
#include "mirrored/reduce_op.hpp"
#include "util/atomic_file.hpp"
#include "util/files.hpp"
#include "util/json.hpp"
#include "util/log.hpp"
#include "util/tick_clock.hpp"

namespace mirrored::detail {
namespace {

// Every live recorder, for dumps. Touched when a strategy is made or destroyed and by dumps;
// never on a collective's path.
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::vector<FlightRecorder*>& registry() {
  static std::vector<FlightRecorder*> all;
  return all;
}

// meta: kind (8 bits), op + 1 (8), dtype + 1 (8), async (1), ndims (3).
uint64_t pack_meta(CollectiveKind kind, int op, int dtype, bool async, int ndims) noexcept {
  return static_cast<uint64_t>(kind) | static_cast<uint64_t>(op + 1) << 8 | static_cast<uint64_t>(dtype + 1) << 16 |
         static_cast<uint64_t>(async) << 24 | static_cast<uint64_t>(ndims) << 25;
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f", s);
  return buf;
}

std::string who(const ReplicaFlight& f) {
  return str_cat("worker ", f.worker, " replica ", f.replica, " (", f.device, ")");
}

bool in_flight(const ReplicaFlight& f) { return f.current != 0; }

}  // namespace

const char* flight_state_name(FlightState s) noexcept {
  switch (s) {
    case FlightState::issued: return "issued";
    case FlightState::waiting: return "waiting";
    case FlightState::done: return "done";
    case FlightState::failed: return "failed";
  }
  return "unknown";
}

std::size_t flight_recorder_entries() {
  // Read for each strategy (never on a collective's path), so that a benchmark can compare a
  // strategy with the recorder off against one with it on in one process.
  const char* v = std::getenv("MIRRORED_FLIGHT_RECORDER_ENTRIES");
  if (!v || !*v) return 256;
  char* end = nullptr;
  errno = 0;
  const long long n = std::strtoll(v, &end, 10);
  if (errno || *end || n < 0 || n > (1 << 20)) {
    // Read for every strategy and recorder: one warning per process says it all.
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      MIRRORED_LOG(warn, "MIRRORED_FLIGHT_RECORDER_ENTRIES must be an integer in [0, 1048576], got '", v,
                   "'; using 256");
    return 256;
  }
  return static_cast<std::size_t>(n);
}

int64_t flight_now_ns() noexcept { return tick_clock::now_ns(); }

// ---------------------------------------------------------------------------------------------
// The ring's clock: the library's tick clock (util/tick_clock.hpp). Reading the steady clock was two
// thirds of a recorded collective's cost on a VM (2 x 28 ns of 83 ns); a time-stamp counter read
// costs about half of one. The ring stores ticks; `snapshot` converts them to steady-clock
// nanoseconds by the line through an anchor (taken when the first recorder is made) and one taken
// then.
namespace flight_clock {

inline bool tsc() noexcept {
  static const bool use = tick_clock::tsc_is_the_clock();
  return use;
}

inline int64_t ticks() noexcept { return tick_clock::now(tsc()); }

const tick_clock::Anchor& anchor() noexcept {
  static const tick_clock::Anchor a = tick_clock::take_anchor(tsc());
  return a;
}

/// Converts ticks to steady-clock nanoseconds (the identity without the counter).
class Converter {
 public:
  Converter() noexcept {
    if (!tsc()) return;
    // At least 1 ms after the anchor: the rate is then exact to about 1e-4 (each anchor is exact
    // to tens of ns), and more exact the later the conversion.
    const tick_clock::Anchor& a = anchor();
    do {
      now_ = tick_clock::take_anchor(true);
    } while ((now_.ns - a.ns < 1'000'000 || now_.ticks <= a.ticks) && now_.ns - a.ns < 10'000'000);
  }
  int64_t operator()(int64_t t) const noexcept {
    if (!tsc() || t == 0 || now_.ticks <= anchor().ticks) return t;  // 0: not yet
    return tick_clock::to_ns(t, anchor(), now_);
  }

 private:
  tick_clock::Anchor now_{0, 0};
};

}  // namespace flight_clock

// ---------------------------------------------------------------------------------------------
// The ring.

namespace {
uint64_t slots_for(std::size_t capacity) noexcept { return capacity ? std::bit_ceil(uint64_t{capacity}) : 0; }
}  // namespace

FlightRing::FlightRing(std::size_t capacity)
    : capacity_(capacity),
      mask_(capacity ? slots_for(capacity) - 1 : 0),
      slots_(capacity ? std::make_unique<Slot[]>(slots_for(capacity)) : nullptr),
      recording_(capacity != 0) {
  flight_clock::anchor();  // before any entry: the conversions' baseline starts here
}

uint64_t FlightRing::issue(CollectiveKind kind, int op, int dtype, const std::vector<int64_t>* shape, int64_t bytes,
                           bool async, bool entered, Deadline::Clock::time_point made) noexcept {
  if (!recording_.load(std::memory_order_relaxed)) return 0;
  const uint64_t seq = next_.load(std::memory_order_relaxed);
  next_.store(seq + 1, std::memory_order_relaxed);
  Slot& s = *slot_of(seq);
  // A sequence lock: odd while the fields change, so that a reader copying them meanwhile sees
  // the number change and drops its copy.
  s.seq.store(2 * seq + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const int ndims = shape ? static_cast<int>(std::min<std::size_t>(shape->size(), FlightEntry::kMaxDims)) : 0;
  s.meta.store(pack_meta(kind, op, dtype, async, ndims), std::memory_order_relaxed);
  for (int d = 0; d < ndims; ++d) s.shape[d].store((*shape)[static_cast<std::size_t>(d)], std::memory_order_relaxed);
  s.bytes.store(bytes, std::memory_order_relaxed);
  // The time the call's deadline was made: no clock read here (the counter read was a third of a
  // recorded collective's cost).
  const int64_t issued = std::chrono::duration_cast<std::chrono::nanoseconds>(made.time_since_epoch()).count();
  s.issue_ns.store(issued, std::memory_order_relaxed);
  s.start_ns.store(entered ? issued : 0, std::memory_order_relaxed);
  s.end_ticks.store(0, std::memory_order_relaxed);
  s.state.store(static_cast<uint32_t>(entered ? FlightState::waiting : FlightState::issued), std::memory_order_relaxed);
  s.seq.store(2 * seq, std::memory_order_release);
  // The next entry's slot, into the cache while this collective runs: between two collectives the
  // data they move evicts the ring, and a slot is two cache lines.
  const char* next = reinterpret_cast<const char*>(slot_of(seq + 1));
  __builtin_prefetch(next, 1, 3);
  __builtin_prefetch(next + 64, 1, 3);
  return seq;
}

void FlightRing::enter(uint64_t seq) noexcept {
  if (!seq) return;
  Slot& s = *slot_of(seq);
  if (s.seq.load(std::memory_order_relaxed) != 2 * seq) return;  // overwritten (more pending than the ring holds)
  // Steady-clock nanoseconds, like the issue time (only an asynchronous collective's lane enters
  // after its issue, so this read is off the synchronous path).
  s.start_ns.store(flight_now_ns(), std::memory_order_relaxed);
  s.state.store(static_cast<uint32_t>(FlightState::waiting), std::memory_order_release);
}

void FlightRing::end(uint64_t seq, bool ok) noexcept {
  if (!seq) return;
  Slot& s = *slot_of(seq);
  if (s.seq.load(std::memory_order_relaxed) != 2 * seq) return;
  s.end_ticks.store(flight_clock::ticks(), std::memory_order_relaxed);
  s.state.store(static_cast<uint32_t>(ok ? FlightState::done : FlightState::failed), std::memory_order_release);
}

std::vector<FlightEntry> FlightRing::snapshot() const {
  std::vector<FlightEntry> out;
  if (!capacity_) return out;
  const uint64_t next = next_.load(std::memory_order_relaxed);
  const uint64_t first = next > capacity_ ? next - capacity_ : 1;
  out.reserve(static_cast<std::size_t>(next - first));
  const flight_clock::Converter to_ns;
  for (uint64_t seq = first; seq < next; ++seq) {
    const Slot& s = *slot_of(seq);
    const uint64_t before = s.seq.load(std::memory_order_acquire);
    if (before != 2 * seq) continue;  // being written, or already reused
    FlightEntry e;
    e.seq = seq;
    const uint32_t state = s.state.load(std::memory_order_acquire);
    const uint64_t meta = s.meta.load(std::memory_order_relaxed);
    e.kind = static_cast<CollectiveKind>(meta & 0xff);
    e.op = static_cast<int>((meta >> 8) & 0xff) - 1;
    e.dtype = static_cast<int>((meta >> 16) & 0xff) - 1;
    e.async = (meta >> 24) & 1;
    e.ndims = static_cast<int>((meta >> 25) & 7);
    for (int d = 0; d < e.ndims; ++d) e.shape[d] = s.shape[d].load(std::memory_order_relaxed);
    e.bytes = s.bytes.load(std::memory_order_relaxed);
    e.issue_ns = s.issue_ns.load(std::memory_order_relaxed);
    e.start_ns = s.start_ns.load(std::memory_order_relaxed);
    e.end_ns = to_ns(s.end_ticks.load(std::memory_order_relaxed));
    e.state = static_cast<FlightState>(state);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.seq.load(std::memory_order_relaxed) != before) continue;
    out.push_back(e);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The report.

std::string compose_flight_report(const std::vector<ReplicaFlight>& replicas, const std::vector<std::string>& silent) {
  std::string out;
  auto add = [&](const std::string& part) { out += (out.empty() ? "" : "; ") + part; };
  if (!replicas.empty()) {
    uint64_t frontier = 0;  // the furthest any replica got
    for (const auto& f : replicas) frontier = std::max({frontier, f.last_done, f.current});
    // Nothing recorded (a group used without the plan): nothing to tell.
    if (frontier == 0 && silent.empty()) return "";
    // The reference call at the frontier: the kind most replicas wait in there (ties: the first
    // replica's in worker order, like the agreement checks compare against the chief's replica 0).
    std::vector<std::pair<std::string, int>> kinds;
    for (const auto& f : replicas) {
      if (!in_flight(f) || f.current != frontier) continue;
      auto it = std::find_if(kinds.begin(), kinds.end(), [&](const auto& k) { return k.first == f.current_kind; });
      if (it == kinds.end())
        kinds.emplace_back(f.current_kind, 1);
      else
        ++it->second;
    }
    std::string reference;
    int most = 0;
    for (const auto& [k, n] : kinds) {
      if (n > most) {
        reference = k;
        most = n;
      }
    }
    int odd = 0;
    for (const auto& f : replicas) {
      if (in_flight(f) && f.current == frontier && f.current_kind == reference && f.current_state != "failed") continue;
      ++odd;
      if (in_flight(f)) {
        const std::string verb = f.current_state == "failed"   ? "failed in "
                                 : f.current_state == "issued" ? "issued (not yet entered) "
                                                               : "waits in ";
        add(str_cat(who(f), " ", verb, f.current_kind, " #", f.current, " (for ", seconds_text(f.current_for_s), " s)",
                    f.current == frontier && f.current_kind != reference
                        ? str_cat(": a different call at the same number (", reference, ")")
                        : ""));
      } else if (f.last_done) {
        add(str_cat(who(f), " last completed ", f.last_kind, " #", f.last_done, " and has not entered #",
                    f.last_done + 1, " for ", seconds_text(f.since_done_s), " s"));
      } else {
        add(str_cat(who(f), " has not entered any collective (#1) for ", seconds_text(f.since_done_s), " s"));
      }
    }
    if (most > 0) {
      add(str_cat(odd ? "every other replica" : "every replica", " waits in ", reference, " #", frontier));
    }
  }
  for (const auto& s : silent) add(s);
  return out.empty() ? out : "flight recorder: " + out;
}

std::string encode_flights(const std::vector<ReplicaFlight>& replicas) {
  std::string out;
  auto field = [](const std::string& s) { return s.empty() ? std::string("-") : s; };
  for (const auto& f : replicas) {
    out += str_cat(f.worker, " ", f.replica, " ", field(f.device), " ", f.last_done, " ", field(f.last_kind), " ",
                   f.since_done_s, " ", f.current, " ", field(f.current_kind), " ", field(f.current_state), " ",
                   f.current_for_s, "\n");
  }
  return out;
}

std::vector<ReplicaFlight> decode_flights(const std::string& text) {
  std::vector<ReplicaFlight> out;
  std::istringstream lines(text);
  std::string line;
  auto field = [](std::string s) { return s == "-" ? std::string() : s; };
  while (std::getline(lines, line)) {
    std::istringstream in(line);
    ReplicaFlight f;
    if (!(in >> f.worker >> f.replica >> f.device >> f.last_done >> f.last_kind >> f.since_done_s >> f.current >>
          f.current_kind >> f.current_state >> f.current_for_s))
      continue;
    f.device = field(f.device);
    f.last_kind = field(f.last_kind);
    f.current_kind = field(f.current_kind);
    f.current_state = field(f.current_state);
    out.push_back(std::move(f));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// A strategy's recorder.

FlightRecorder::FlightRecorder(int num_replicas) : created_ns_(flight_now_ns()) {
  const std::size_t entries = flight_recorder_entries();
  for (int r = 0; r < num_replicas; ++r) {
    rings_.push_back(std::make_unique<FlightRing>(entries));
    devices_.push_back(str_cat("replica ", r));
  }
  std::lock_guard lock(registry_mu());
  registry().push_back(this);
}

FlightRecorder::~FlightRecorder() {
  std::lock_guard lock(registry_mu());
  auto& all = registry();
  all.erase(std::remove(all.begin(), all.end(), this), all.end());
}

void FlightRecorder::set_identity(int worker, int num_workers, std::vector<std::string> devices) {
  worker_ = worker;
  num_workers_ = num_workers;
  if (devices.size() == rings_.size()) devices_ = std::move(devices);
}

bool FlightRecorder::recorded() const noexcept {
  for (const auto& r : rings_)
    if (r->next_seq() > 1) return true;
  return false;
}

void FlightRecorder::align() noexcept {
  uint64_t next = 1;
  for (const auto& r : rings_) next = std::max(next, r->next_seq());
  // Written only where it differs (after an aborted run): this runs on the thread that starts
  // every run, and a store would take each ring's cache line from its replica's core every run.
  for (const auto& r : rings_)
    if (r->next_seq() != next) r->set_next_seq(next);
}

std::vector<ReplicaFlight> FlightRecorder::flights() const {
  std::vector<ReplicaFlight> out;
  const int64_t now = flight_now_ns();
  for (std::size_t r = 0; r < rings_.size(); ++r) {
    ReplicaFlight f;
    f.worker = worker_;
    f.replica = static_cast<int>(r);
    f.device = devices_[r];
    int64_t done_at = created_ns_;
    for (const FlightEntry& e : rings_[r]->snapshot()) {
      if (e.state == FlightState::done) {
        f.last_done = e.seq;
        f.last_kind = collective_kind_name(e.kind);
        done_at = e.end_ns;
        f.current = 0;  // an older one still in flight ended out of order: the newer result counts
      } else {
        f.current = e.seq;
        f.current_kind = collective_kind_name(e.kind);
        f.current_state = flight_state_name(e.state);
        f.current_for_s = static_cast<double>(now - (e.start_ns ? e.start_ns : e.issue_ns)) * 1e-9;
      }
    }
    f.since_done_s = static_cast<double>(now - done_at) * 1e-9;
    out.push_back(std::move(f));
  }
  return out;
}

std::string FlightRecorder::local_report() const {
  if (!enabled()) return "";
  return compose_flight_report(flights(), {});
}

void FlightRecorder::append_json(std::string& out) const {
  // Steady-clock times as seconds of the system clock, for lining up the dumps of several hosts.
  const double offset_s = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count() -
                          static_cast<double>(flight_now_ns()) * 1e-9;
  auto time = [&](int64_t ns) { return ns ? str_cat(static_cast<double>(ns) * 1e-9 + offset_s) : std::string("null"); };
  out += "{\"replicas\": [";
  for (std::size_t r = 0; r < rings_.size(); ++r) {
    out += str_cat(r ? ", " : "", "{\"replica\": ", r, ", \"device\": ");
    json::append_json_string(out, devices_[r]);
    out += ", \"entries\": [";
    bool first = true;
    for (const FlightEntry& e : rings_[r]->snapshot()) {
      out += str_cat(first ? "" : ", ", "{\"seq\": ", e.seq, ", \"kind\": \"", collective_kind_name(e.kind),
                     "\", \"op\": ",
                     e.op >= 0 ? str_cat("\"", reduce_op_name(static_cast<ReduceOp>(e.op)), "\"") : std::string("null"),
                     ", \"dtype\": ",
                     e.dtype >= 0 ? str_cat("\"", dtype_name(static_cast<DType>(e.dtype)), "\"") : std::string("null"),
                     ", \"shape\": [");
      for (int d = 0; d < e.ndims; ++d) out += str_cat(d ? ", " : "", e.shape[d]);
      out += str_cat("], \"bytes\": ", e.bytes, ", \"async\": ", e.async ? "true" : "false", ", \"state\": \"",
                     flight_state_name(e.state), "\", \"issue_s\": ", time(e.issue_ns),
                     ", \"start_s\": ", time(e.start_ns), ", \"end_s\": ", time(e.end_ns), "}");
      first = false;
    }
    out += "]}";
  }
  out += "]}";
}

void set_flight_recording(bool on) noexcept {
  std::lock_guard lock(registry_mu());
  for (FlightRecorder* r : registry()) r->set_recording(on);
}

void dump_flight_recorders(const std::string& path) {
  std::string out;
  {
    std::lock_guard lock(registry_mu());
    int worker = 0, num_workers = 1;
    for (const FlightRecorder* r : registry()) {
      worker = std::max(worker, r->worker());
      num_workers = std::max(num_workers, r->num_workers());
    }
    out =
        str_cat("{\"worker\": ", worker, ", \"num_workers\": ", num_workers, ", \"pid\": ", getpid(), ", \"job_id\": ");
    // Which job and which attempt of it (tools/launch.sh sets both, a new job id per restart): the
    // dumps of an earlier attempt in the same directory must not be merged with this one's. null
    // where the process was not told.
    if (const char* job = std::getenv("MIRRORED_JOB_ID"); job && *job)
      json::append_json_string(out, job);
    else
      out += "null";
    out += ", \"attempt\": ";
    const char* attempt = std::getenv("MIRRORED_RESTART_COUNT");
    char* end = nullptr;
    const long long n = attempt && *attempt ? std::strtoll(attempt, &end, 10) : -1;
    out += n >= 0 && end && *end == '\0' ? str_cat(n) : std::string("null");
    out += ", \"strategies\": [";
    bool first = true;
    for (const FlightRecorder* r : registry()) {
      if (!r->enabled() || !r->recorded()) continue;  // e.g. the default strategy
      if (!first) out += ", ";
      r->append_json(out);
      first = false;
    }
    out += "]}\n";
  }
  const std::string prefix = "flight_recorder::dump: ";
  AtomicFileWriter file(path, prefix);
  const char* p = out.data();
  std::size_t left = out.size();
  while (left > 0) {
    const ssize_t n = ::write(file.fd(), p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw_file_error(prefix, "cannot write", file.temp_path(), errno);
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  file.commit(false, false);  // diagnostics: a machine crash may lose them
}

void dump_flight_recorders_on_event(int worker) noexcept {
  const char* dir = std::getenv("MIRRORED_FLIGHT_RECORDER_DIR");
  if (!dir || !*dir) return;
  const std::string path = str_cat(dir, "/flight_recorder.worker", worker, ".json");
  try {
    dump_flight_recorders(path);
    MIRRORED_LOG(info, "flight recorder: wrote ", path);
  } catch (const std::exception& e) {
    MIRRORED_LOG(warn, "flight recorder: could not write ", path, ": ", e.what());
  }
}

}  // namespace mirrored::detail

namespace mirrored::flight_recorder {

void dump(const std::string& path) { detail::dump_flight_recorders(path); }

}  // namespace mirrored::flight_recorder

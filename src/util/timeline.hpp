#pragma once
// Private: the hooks through which the library records the timeline (<mirrored/timeline.hpp> is the
// public side: start, stop, active). See docs/timeline.md for the file format and the events.
//
// The hot path is cheap on purpose. With the timeline off, a `Scope` costs one relaxed atomic load.
// With it on, a `Scope` reads the clock twice (`now_ticks`) and appends one fixed-size record (static names,
// integer arguments) to its thread's own ring buffer, with no lock and no formatting; a writer thread
// turns the records into JSON off the hot path. A ring that fills up (the writer fell behind) is
// written by its own thread under the writer's lock, so no event is lost and memory stays bounded.
//
// Every event is a complete event ("ph":"X") recorded when it ends, on the thread that began it:
// events are balanced by construction, and an event that has not ended when the timeline stops is
// not written at all. Scopes on one thread nest like the C++ scopes that hold them.
//
// For asynchronous work (a collective issued now and waited for later): make the issuing call and the
// waiting call each a `Scope` on the calling thread ("all_reduce_async" and "all_reduce_async.wait",
// with the same `id` argument), and the transfer itself a `Scope` on whichever thread moves the bytes.
// Do not record one span from issue to completion on a thread that does other work meanwhile: events
// of one thread must nest.

#include <atomic>
#include <cstdint>
#include <string>

#include "util/tick_clock.hpp"

namespace mirrored::detail::timeline {

/// The state the hot path reads: not yet decided (MIRRORED_TIMELINE not read yet), off, on.
enum class State : int { unknown = 0, off = 1, on = 2 };

/// The one atomic the hot path loads (relaxed).
extern std::atomic<int> g_state;

/// Reads MIRRORED_TIMELINE if nobody has yet (once per process) and returns whether a timeline is on.
bool decide_from_environment() noexcept;

/// True while a timeline is being recorded. Off: one relaxed atomic load.
inline bool enabled() noexcept {
  const int s = g_state.load(std::memory_order_relaxed);
  if (s == static_cast<int>(State::on)) return true;
  if (s == static_cast<int>(State::off)) return false;
  return decide_from_environment();
}

/// Steady-clock nanoseconds.
std::int64_t now_ns() noexcept;

/// Whether events are stamped with the CPU's time-stamp counter (x86, where the kernel's own clock
/// source is the TSC, so it runs at a constant rate and agrees across cores). Decided once, before
/// the first timeline starts; never changes afterwards.
extern std::atomic<bool> g_use_tsc;

/// The clock of every event, in ticks: the time-stamp counter when `g_use_tsc`, else `now_ns()`.
/// A counter read costs about half a steady-clock read on a VM; the writer converts ticks to
/// nanoseconds through (counter, steady clock) pairs it takes as it goes.
inline std::int64_t now_ticks() noexcept { return tick_clock::now(g_use_tsc.load(std::memory_order_relaxed)); }

/// Most arguments one event carries.
inline constexpr int kMaxArgs = 4;

/// One argument: a static key with an integer or a static string value.
struct Arg {
  const char* key;
  const char* str;  // null: the value is `num`
  std::int64_t num;
};

/// One recorded event, as the ring stores it (fixed size; `text`, rare, is the only allocation).
/// Trivial on purpose: a `Scope` of a timeline that is off initialises none of it.
struct Record {
  const char* name;
  const char* category;
  std::int64_t begin;  // now_ticks()
  std::int64_t end;
  std::string* text;  // owned: a string argument that is not static (a file path), or null
  int num_args;
  Arg args[kMaxArgs];
};

/// Appends a complete event (begin and end in `now_ticks()` time) to this thread's buffer if `session`
/// is still recording. Used by `Scope`; call it directly for a span whose times were taken apart.
void record(std::uint64_t session, Record& event) noexcept;

/// The session being recorded (0: none): written under the recorder's lock by start and stop.
extern std::atomic<std::uint64_t> g_session;

/// The session being recorded (0: none). Read when an event begins.
inline std::uint64_t current_session() noexcept { return g_session.load(std::memory_order_acquire); }

/// A span of work on the calling thread: from construction to destruction. `name` and `category`
/// and every key and string value given to `arg` must be string literals (or otherwise live for the
/// whole program): they are stored as pointers and read by the writer thread later.
class Scope {
 public:
  Scope(const char* name, const char* category) noexcept {
    if (!enabled()) return;
    session_ = current_session();
    if (session_ == 0) return;
    event_.name = name;
    event_.category = category;
    event_.text = nullptr;
    event_.num_args = 0;
    event_.begin = now_ticks();
  }
  ~Scope() {
    if (session_ == 0) return;
    event_.end = now_ticks();
    record(session_, event_);  // takes `text`
  }
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  /// True when this span will be recorded (compute expensive arguments only then).
  bool active() const noexcept { return session_ != 0; }
  /// Adds an integer argument (beyond kMaxArgs they are dropped).
  void arg(const char* key, std::int64_t value) noexcept {
    if (session_ != 0 && event_.num_args < kMaxArgs) event_.args[event_.num_args++] = Arg{key, nullptr, value};
  }
  /// Adds a static string argument (a literal, `dtype_name`, `reduce_op_name`).
  void arg(const char* key, const char* static_value) noexcept {
    if (session_ != 0 && event_.num_args < kMaxArgs) event_.args[event_.num_args++] = Arg{key, static_value, 0};
  }
  /// Adds one string argument that is not static (copied; escaped when written), under key "path".
  void path(const std::string& value);

 private:
  std::uint64_t session_ = 0;
  Record event_;  // set only when session_ != 0
};

/// Opens the calling thread's deferred span and returns its record (for arguments), or null while no
/// timeline is recorded. Reads no clock. For work whose thread signals another when it ends and
/// whose start is stamped elsewhere: `seal_deferred` just before the signal, `commit_deferred(begin)`
/// after it stamps the end and appends the span, so neither the clock read nor the append delays
/// the thread that waits. A replica's run is the one user: the pool stamps the hand-out (while the
/// replicas wake) and commits each replica's span once that replica has told the caller it is
/// done. One per thread: opening another commits the first.
Record* open_deferred(const char* name, const char* category) noexcept;
/// Whether the calling thread has an open deferred span.
bool deferred_open() noexcept;
/// The calling thread's open deferred span has ended and will be committed: `stop`, from now on,
/// waits for it (up to a second). An open span that is not sealed is no more waited for than a
/// `Scope` that has not ended.
void seal_deferred() noexcept;
/// Ends the calling thread's deferred span now and appends it, beginning at `begin` (ticks; a
/// negative one, or one after the end, means its end), but no later than the events the thread
/// recorded inside it began, and no earlier than the thread's previous deferred span ended: spans
/// of one thread nest.
void commit_deferred(std::int64_t begin) noexcept;

/// `open_deferred` as a handle for arguments. Its destructor does nothing: the span lasts until
/// `commit_deferred`. Names and keys must be static, as for `Scope`.
class DeferredSpan {
 public:
  DeferredSpan(const char* name, const char* category) noexcept : event_(open_deferred(name, category)) {}
  DeferredSpan(const DeferredSpan&) = delete;
  DeferredSpan& operator=(const DeferredSpan&) = delete;
  /// Adds an integer argument (beyond kMaxArgs they are dropped).
  void arg(const char* key, std::int64_t value) noexcept {
    if (event_ && event_->num_args < kMaxArgs) event_->args[event_->num_args++] = Arg{key, nullptr, value};
  }

 private:
  Record* event_;
};

/// Names the calling thread in the timeline ("replica 0 (CPU:0)", "prefetch"): a metadata event of
/// every timeline this thread records into. Costs a string copy; call it once per thread.
void name_this_thread(std::string name) noexcept;

/// This process is worker `index` of `count` (MultiWorkerMirroredStrategy): the timeline's pid is the
/// index, and with more than one worker the file names carry it (`worker_path`). Call it before the
/// first strategy reads MIRRORED_TIMELINE; a timeline already being written keeps its file name.
void set_worker(int index, int count);

/// The file a timeline asked for at `path` goes to when this process is worker `index` of `count`:
/// `path` itself for one worker, else `path` with `.worker<index>` before the extension of its last
/// component (`trace.json` → `trace.worker1.json`, `trace` → `trace.worker1`).
std::string worker_path(const std::string& path, int index, int count);

}  // namespace mirrored::detail::timeline

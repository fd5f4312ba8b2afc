// The timeline's recorder: sessions (start/stop, MIRRORED_TIMELINE), per-thread ring buffers and the
// writer thread. The format is timeline_file.cpp's.
#include "util/timeline.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "mirrored/errors.hpp"
#include "mirrored/timeline.hpp"
#include "util/log.hpp"
#include "util/spin.hpp"
#include "util/tick_clock.hpp"
#include "util/timeline_file.hpp"

namespace mirrored::detail::timeline {

std::atomic<int> g_state{static_cast<int>(State::unknown)};
std::atomic<std::uint64_t> g_session{0};
std::atomic<bool> g_use_tsc{false};

namespace {

// Events one thread can hold before the writer takes them (about 1.2 MiB per thread). The writer is
// woken when a ring is half full, and otherwise every kWriterPeriod.
constexpr std::uint64_t kRingCapacity = 8192;
constexpr std::chrono::milliseconds kWriterPeriod{100};

// One thread's events of one session. Single producer (the owning thread, lock-free); the consumer is
// whoever holds the recorder's lock (the writer thread, `stop`, or the owner itself when the ring is
// full).
struct Ring {
  Ring(std::uint64_t session, int tid, std::string name) : session(session), tid(tid), name(std::move(name)) {}
  ~Ring() {
    for (std::uint64_t i = tail.load(std::memory_order_relaxed); i < head.load(std::memory_order_relaxed); ++i)
      delete records[i % kRingCapacity].text;
  }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  Record records[kRingCapacity];
  alignas(64) std::atomic<std::uint64_t> head{0};  // written by the owner
  // The owner has ended a deferred span of this session and not appended it yet (`stop` waits for
  // it). On the head's line: only the owner writes either.
  std::atomic<bool> deferred_sealed{false};
  alignas(64) std::atomic<std::uint64_t> tail{0};  // written by the consumer
  std::atomic<bool> owner_exited{false};
  const std::uint64_t session;
  const int tid;
  std::string name;  // under the recorder's lock
};

// The calling thread's state. A plain pointer, so that the hot path's thread_local has no guard;
// `SlotOwner` frees it when the thread exits.
struct ThreadSlot {
  std::shared_ptr<Ring> ring;
  std::uint64_t session = 0;           // the session `ring` belongs to
  std::string name;                    // set by name_this_thread
  Record deferred;                     // the open deferred span (open_deferred)
  std::uint64_t deferred_session = 0;  // its session; 0: none open
  std::int64_t deferred_end = 0;       // where the last deferred span ended (ticks); 0: none yet
  std::int64_t deferred_first = 0;     // the earliest beginning of an event recorded inside it
};
thread_local ThreadSlot* t_slot = nullptr;
thread_local bool t_exited = false;  // after SlotOwner's destructor: record nothing more

struct SlotOwner {
  void touch() noexcept {}
  ~SlotOwner() {
    t_exited = true;
    if (ThreadSlot* slot = std::exchange(t_slot, nullptr)) {
      if (slot->ring) slot->ring->owner_exited.store(true, std::memory_order_release);
      delete slot;
    }
  }
};
thread_local SlotOwner t_owner;

ThreadSlot* slot() {
  if (!t_slot) {
    t_owner.touch();  // constructs it, so that its destructor runs at thread exit
    t_slot = new ThreadSlot;
  }
  return t_slot;
}

int os_tid() noexcept { return static_cast<int>(::syscall(SYS_gettid)); }

std::string os_thread_name() {
  char buf[32] = {};
  if (pthread_getname_np(pthread_self(), buf, sizeof buf) != 0 || buf[0] == '\0') return "thread";
  return buf;
}

using tick_clock::Anchor;

Anchor take_anchor() noexcept { return tick_clock::take_anchor(g_use_tsc.load(std::memory_order_relaxed)); }

struct Session {
  std::uint64_t id = 0;
  std::string path;
  // Anchors in increasing order, the first taken when the session starts. Each drain first notes
  // how far each ring is filled, then adds an anchor: every tick it converts lies before the
  // newest anchor, so a tick is always interpolated within the same two anchors, whenever it is
  // converted, and events nest in the file exactly as they did in ticks.
  std::vector<Anchor> anchors;
  std::unique_ptr<TimelineFile> file;
  std::vector<std::shared_ptr<Ring>> rings;
  std::vector<std::pair<int, std::string>> exited_threads;  // (tid, name) of rings already removed
  bool stopping = false;
  bool writer_waiting = false;  // the writer has reached its first wait
  std::thread writer;
};

struct Recorder {
  std::mutex control;                      // serialises start and stop (stop joins the writer outside `mu`)
  std::mutex mu;                           // the session, its rings' consumer side, its file
  std::condition_variable wake;            // the writer's
  std::condition_variable writer_started;  // start's: the writer is waiting
  std::unique_ptr<Session> session;
  std::uint64_t next_id = 1;
  int worker_index = 0, worker_count = 1;  // under mu
  std::once_flag environment;
  bool atexit_registered = false;  // under control
};

Recorder& recorder() {
  static Recorder* r = new Recorder;  // never destroyed: threads may record while statics are destroyed
  return *r;
}

void discard_locked(Ring& r) noexcept {
  const std::uint64_t h = r.head.load(std::memory_order_acquire);
  for (std::uint64_t i = r.tail.load(std::memory_order_relaxed); i < h; ++i) {
    Record& e = r.records[i % kRingCapacity];
    delete std::exchange(e.text, nullptr);
  }
  r.tail.store(h, std::memory_order_release);
}

// Adds an anchor after the ones the session has (with the steady clock as the clock, ticks are
// nanoseconds and no anchor is needed).
void add_anchor_locked(Session& s) noexcept {
  if (!g_use_tsc.load(std::memory_order_relaxed)) return;
  const Anchor a = take_anchor();
  const Anchor& last = s.anchors.back();
  if (a.ticks > last.ticks && a.ns > last.ns) {
    try {
      s.anchors.push_back(a);
    } catch (...) {
      // Out of memory: the previous anchors extrapolate.
    }
  }
}

// Nanoseconds since the session's start of a tick taken during it.
std::int64_t to_ns(const Session& s, std::int64_t t) {
  const Anchor& first = s.anchors.front();
  if (!g_use_tsc.load(std::memory_order_relaxed)) return t - first.ns;
  if (s.anchors.size() < 2) return 0;  // add_anchor_locked found no later pair: no time has passed
  // The segment holding t (the first or last one outside the anchors).
  auto it = std::upper_bound(s.anchors.begin(), s.anchors.end(), t,
                             [](std::int64_t v, const Anchor& a) { return v < a.ticks; });
  std::size_t i = it == s.anchors.begin() ? 0 : static_cast<std::size_t>(it - s.anchors.begin()) - 1;
  if (i + 1 >= s.anchors.size()) i = s.anchors.size() - 2;
  const Anchor& a = s.anchors[i];
  const Anchor& b = s.anchors[i + 1];
  return tick_clock::to_ns(t, a, b) - first.ns;
}

// Converts and writes the events of `r` up to `head` (read before the newest anchor was taken).
void drain_locked(Session& s, Ring& r, std::uint64_t head) {
  for (std::uint64_t i = r.tail.load(std::memory_order_relaxed); i < head; ++i) {
    Record& e = r.records[i % kRingCapacity];
    s.file->event(e, r.tid, to_ns(s, e.begin), to_ns(s, e.end));
    delete std::exchange(e.text, nullptr);
  }
  r.tail.store(head, std::memory_order_release);
}

// Takes every ring's events; forgets the rings of threads that have exited once they are empty.
void drain_all_locked(Session& s) {
  // How far each ring is filled, and whether its owner has exited (read before the head: once the
  // owner has exited, this drain takes its last event); then the anchor.
  std::vector<std::pair<bool, std::uint64_t>> seen;
  seen.reserve(s.rings.size());
  for (const auto& ring : s.rings) {
    const bool exited = ring->owner_exited.load(std::memory_order_acquire);
    seen.emplace_back(exited, ring->head.load(std::memory_order_acquire));
  }
  add_anchor_locked(s);
  for (std::size_t i = 0, k = 0; i < s.rings.size(); ++k) {
    Ring& r = *s.rings[i];
    const bool exited = seen[k].first;
    drain_locked(s, r, seen[k].second);
    if (exited) {
      s.exited_threads.emplace_back(r.tid, r.name);
      s.rings.erase(s.rings.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
  s.file->flush();
}

void writer_loop(Session* s) {
  Recorder& rec = recorder();
  std::unique_lock lock(rec.mu);
  s->writer_waiting = true;
  rec.writer_started.notify_all();
  while (!s->stopping) {
    rec.wake.wait_for(lock, kWriterPeriod);
    try {
      drain_all_locked(*s);
    } catch (...) {
      // Out of memory while formatting: the events of this round are lost, the job goes on.
    }
  }
}

// The calling thread's ring of `session`, made on its first event; null when that session is over.
ThreadSlot* attach(std::uint64_t session) {
  if (t_exited) return nullptr;
  ThreadSlot* me = slot();
  Recorder& rec = recorder();
  std::lock_guard lock(rec.mu);
  if (!rec.session || rec.session->id != session) return nullptr;
  auto ring = std::make_shared<Ring>(session, os_tid(), me->name.empty() ? os_thread_name() : me->name);
  // The ring (about 150 KiB) is fresh memory: touch it now, once per thread and recording, so that
  // its page faults do not fall on the events that fill it.
  std::memset(static_cast<void*>(ring->records), 0, sizeof ring->records);
  rec.session->rings.push_back(ring);
  if (me->ring) me->ring->owner_exited.store(true, std::memory_order_release);  // an old session's
  me->ring = std::move(ring);
  me->session = session;
  return me;
}

// The owner found its ring full: the writer fell behind, so the owner writes its own events.
void drain_full(Ring& r) noexcept {
  Recorder& rec = recorder();
  std::lock_guard lock(rec.mu);
  try {
    if (rec.session && rec.session->id == r.session) {
      const std::uint64_t head = r.head.load(std::memory_order_acquire);
      add_anchor_locked(*rec.session);
      drain_locked(*rec.session, r, head);
      return;
    }
  } catch (...) {
  }
  discard_locked(r);
}

// Deferred spans sealed before the stop are appended by their threads after those have signalled
// others (a replica's run, once the caller has been told the replica is done): the caller may stop
// the timeline at once. Waits for them, but not past a bound: a thread that stalls that long loses
// its span, not the file. Spans still open (work still going on) are not waited for, as a `Scope`
// that has not ended is not.
constexpr std::chrono::seconds kDeferredSpanWait{1};

void wait_for_deferred_spans(Session& s) {
  std::vector<std::shared_ptr<Ring>> rings;
  {
    std::lock_guard lock(recorder().mu);
    rings = s.rings;
  }
  const auto deadline = std::chrono::steady_clock::now() + kDeferredSpanWait;
  for (const auto& ring : rings) {
    Backoff backoff;
    while (ring->deferred_sealed.load(std::memory_order_acquire) &&
           !ring->owner_exited.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < deadline)
      backoff.pause();
  }
}

void stop_at_exit() noexcept {
  try {
    mirrored::timeline::stop();
  } catch (const std::exception& e) {
    try {
      MIRRORED_LOG(warn, e.what());
    } catch (...) {
    }
  }
}

void start_session(const std::string& requested) {
  Recorder& rec = recorder();
  std::lock_guard control(rec.control);
  int index = 0, count = 1;
  {
    std::lock_guard lock(rec.mu);
    if (rec.session) {
      throw FailedPreconditionError(str_cat("timeline::start('", requested,
                                            "'): a timeline is already being recorded into '", rec.session->path,
                                            "'; call timeline::stop() first"));
    }
    index = rec.worker_index;
    count = rec.worker_count;
  }
  MIRRORED_ENFORCE(!requested.empty(), InvalidArgumentError, "timeline::start: the path is empty");
  auto s = std::make_unique<Session>();
  s->path = worker_path(requested, index, count);
  s->file = std::make_unique<TimelineFile>(s->path, index);
  s->file->process_name(count > 1 ? str_cat("mirrored worker ", index) : std::string("mirrored"));
  if (!rec.atexit_registered) {
    // Registered before the first timeline, so it runs after the destructors of statics made later
    // (their threads are gone by then) and writes whatever the process recorded.
    MIRRORED_ENFORCE(std::atexit(stop_at_exit) == 0, InternalError,
                     "timeline::start: cannot register the handler that completes the file at exit");
    rec.atexit_registered = true;
  }
  Session* raw = s.get();
  {
    std::unique_lock lock(rec.mu);
    raw->id = rec.next_id++;
    g_use_tsc.store(tick_clock::tsc_is_the_clock(), std::memory_order_relaxed);  // before the session is published
    raw->anchors.push_back(take_anchor());
    raw->writer = std::thread(writer_loop, raw);  // waits for `mu` before it looks at the session
    pthread_setname_np(raw->writer.native_handle(), "mirrored/tl");
    rec.session = std::move(s);
    g_session.store(raw->id, std::memory_order_release);
    g_state.store(static_cast<int>(State::on), std::memory_order_release);
    // Returns once the writer thread has started and gone to sleep, so that its start-up (a new
    // thread's first run) does not land on the first events. A writer that is not up within the
    // bound is not waited for: it starts on its own.
    rec.writer_started.wait_for(lock, std::chrono::seconds(10), [raw] { return raw->writer_waiting; });
  }
}

// From unknown to off, unless a timeline started meanwhile.
void settle_off() noexcept {
  int expected = static_cast<int>(State::unknown);
  g_state.compare_exchange_strong(expected, static_cast<int>(State::off), std::memory_order_relaxed);
}

// A program that calls start or stop itself has the last word: MIRRORED_TIMELINE is not read then.
void skip_environment() { std::call_once(recorder().environment, settle_off); }

void decide_once() noexcept {
  const char* env = std::getenv("MIRRORED_TIMELINE");
  if (env && *env) {
    try {
      start_session(env);
      return;
    } catch (const std::exception& e) {
      try {
        MIRRORED_LOG(warn, "MIRRORED_TIMELINE='", env, "' cannot be written (", e.what(),
                     "); running without a timeline");
      } catch (...) {
      }
    }
  }
  settle_off();
}

}  // namespace

bool decide_from_environment() noexcept {
  std::call_once(recorder().environment, decide_once);
  return g_state.load(std::memory_order_relaxed) == static_cast<int>(State::on);
}

std::int64_t now_ns() noexcept { return tick_clock::now_ns(); }

namespace {

// This thread's slot with a ring of `session` (made on the thread's first event of it); null when
// that session is over or no memory was left for the ring.
ThreadSlot* slot_for(std::uint64_t session) noexcept {
  ThreadSlot* me = t_slot;
  if (me && me->session == session) return me;
  try {
    return attach(session);
  } catch (...) {
    return nullptr;
  }
}

}  // namespace

void record(std::uint64_t session, Record& event) noexcept {
  ThreadSlot* me = slot_for(session);
  if (!me) {
    delete std::exchange(event.text, nullptr);
    return;
  }
  if (me->deferred_session != 0) me->deferred_first = std::min(me->deferred_first, event.begin);
  Ring& r = *me->ring;
  const std::uint64_t h = r.head.load(std::memory_order_relaxed);
  if (h - r.tail.load(std::memory_order_acquire) >= kRingCapacity) drain_full(r);
  Record& slot = r.records[h % kRingCapacity];
  // Field by field: only the arguments the event has (a whole Record is about 150 bytes).
  slot.name = event.name;
  slot.category = event.category;
  slot.begin = event.begin;
  slot.end = event.end;
  slot.text = event.text;
  slot.num_args = event.num_args;
  for (int i = 0; i < event.num_args; ++i) slot.args[i] = event.args[i];
  event.text = nullptr;  // the ring owns it now
  r.head.store(h + 1, std::memory_order_release);
  if (h + 1 - r.tail.load(std::memory_order_relaxed) == kRingCapacity / 2) recorder().wake.notify_one();
}

Record* open_deferred(const char* name, const char* category) noexcept {
  if (!enabled()) return nullptr;
  const std::uint64_t session = current_session();
  if (session == 0) return nullptr;
  // The ring is made now, not when the span is appended: `stop` finds a sealed span through it.
  ThreadSlot* me = slot_for(session);
  if (!me) return nullptr;
  if (me->deferred_session != 0) commit_deferred(-1);  // one left open (not expected): it ends here
  Record& d = me->deferred;
  d.name = name;
  d.category = category;
  d.text = nullptr;
  d.num_args = 0;
  me->deferred_session = session;
  me->deferred_first = std::numeric_limits<std::int64_t>::max();
  return &d;
}

bool deferred_open() noexcept { return t_slot && t_slot->deferred_session != 0; }

void seal_deferred() noexcept {
  ThreadSlot* me = t_slot;
  // Relaxed: whoever waits for this thread's signal, which comes next, sees it with that signal.
  if (me && me->deferred_session != 0 && me->deferred_session == me->session)
    me->ring->deferred_sealed.store(true, std::memory_order_relaxed);
}

void commit_deferred(std::int64_t begin) noexcept {
  ThreadSlot* me = t_slot;
  if (!me || me->deferred_session == 0) return;
  const std::int64_t end = now_ticks();
  if (begin < 0 || begin > end) begin = end;
  // It begins no later than the events recorded inside it (a replica may start its part before the
  // caller has stamped the hand-out), and no earlier than the thread's previous span ended (a
  // replica may be handed its next run before it has stamped the end of the last): spans of one
  // thread nest. The events inside began after the previous span ended, so both hold.
  begin = std::min(begin, me->deferred_first);
  me->deferred.begin = std::max(begin, std::min(me->deferred_end, end));
  me->deferred.end = me->deferred_end = end;
  const std::uint64_t session = std::exchange(me->deferred_session, 0);
  record(session, me->deferred);
  // The ring is still the span's unless its session ended without waiting for it (`stop`'s bound
  // passed) and a later one began on this thread; that ring's flag no longer matters.
  if (me->session == session) me->ring->deferred_sealed.store(false, std::memory_order_release);
}

void Scope::path(const std::string& value) {
  if (session_ == 0 || event_.text) return;
  event_.text = new std::string(value);
}

void name_this_thread(std::string name) noexcept {
  if (t_exited) return;
  try {
    ThreadSlot* me = slot();
    me->name = std::move(name);
    if (me->ring) {
      Recorder& rec = recorder();
      std::lock_guard lock(rec.mu);
      me->ring->name = me->name;
    }
  } catch (...) {
    // Out of memory: the thread keeps the name it had.
  }
}

void set_worker(int index, int count) {
  Recorder& rec = recorder();
  std::lock_guard lock(rec.mu);
  rec.worker_index = index;
  rec.worker_count = count;
}

std::string worker_path(const std::string& path, int index, int count) {
  if (count <= 1) return path;
  const std::size_t slash = path.rfind('/');
  const std::size_t name = slash == std::string::npos ? 0 : slash + 1;
  std::size_t dot = path.rfind('.');
  // No extension: no dot in the last component, or only a leading one (".trace").
  if (dot == std::string::npos || dot <= name) dot = path.size();
  return str_cat(path.substr(0, dot), ".worker", index, path.substr(dot));
}

}  // namespace mirrored::detail::timeline

namespace mirrored::timeline {

using detail::timeline::recorder;

void start(const std::string& path) {
  detail::timeline::skip_environment();
  detail::timeline::start_session(path);
}

void stop() {
  auto& rec = recorder();
  detail::timeline::skip_environment();
  std::lock_guard control(rec.control);
  detail::timeline::Session* s = nullptr;
  {
    std::lock_guard lock(rec.mu);
    if (!rec.session) return;
    s = rec.session.get();
    // From here no event begins; events that end from now on are left out.
    detail::timeline::g_session.store(0, std::memory_order_release);
    detail::timeline::g_state.store(static_cast<int>(detail::timeline::State::off), std::memory_order_release);
    s->stopping = true;
  }
  rec.wake.notify_all();
  s->writer.join();
  detail::timeline::wait_for_deferred_spans(*s);
  std::unique_ptr<detail::timeline::Session> done;
  {
    std::lock_guard lock(rec.mu);
    try {
      detail::timeline::drain_all_locked(*s);
      for (const auto& ring : s->rings) s->exited_threads.emplace_back(ring->tid, ring->name);
      for (const auto& [tid, name] : s->exited_threads) s->file->thread_name(tid, name);
    } catch (...) {
      // Out of memory: finish() below still closes the JSON of what was written.
    }
    done = std::move(rec.session);
  }
  done->file->finish();
}

bool active() noexcept {
  return detail::timeline::g_state.load(std::memory_order_relaxed) == static_cast<int>(detail::timeline::State::on);
}

std::string path() {
  auto& rec = recorder();
  std::lock_guard lock(rec.mu);
  return rec.session ? rec.session->path : std::string();
}

}  // namespace mirrored::timeline

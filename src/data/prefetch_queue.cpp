// The background producer behind Dataset::prefetch and the distributed iterator.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <stop_token>
#include <thread>
#include <vector>

#include "mirrored/data/detail/prefetch.hpp"
#include "util/spin.hpp"
#include "util/timeline.hpp"

namespace mirrored::data::detail {

namespace {
// How long a side spins before it blocks: the consumer waits for input it needs now; the
// producer waits for queue space, possibly for a whole training step, so it gives up sooner.
// Spinning catches a peer that is about to deliver without paying a sleep and a wake-up (tens
// of microseconds on a busy VM).
constexpr std::chrono::microseconds kConsumerSpin{100};
constexpr std::chrono::microseconds kProducerSpin{20};
}  // namespace

struct PrefetchQueue::State {
  State(std::function<Item()> produce, std::size_t capacity, std::stop_source own, ItemBytes bytes_of)
      : produce(std::move(produce)), capacity(capacity < 1 ? 1 : capacity), own(std::move(own)), bytes_of(bytes_of) {}

  // One element (or distributed step) made, as the timeline sees it.
  Item produce_traced(std::int64_t index) {
    mirrored::detail::timeline::Scope trace("prefetch", "input");
    Item item = produce();
    if (trace.active()) {
      trace.arg("element", index);
      if (item && bytes_of) {
        if (const std::int64_t bytes = bytes_of(item.get()); bytes >= 0) trace.arg("bytes", bytes);
      }
    }
    return item;
  }

  void loop() {
    mirrored::detail::timeline::name_this_thread("prefetch");
    try {
      // Make the next result first, then wait for room: the queue's `capacity` results are ready
      // ahead, and one more is being made while the consumer has not yet taken the oldest.
      for (std::int64_t index = 0;; ++index) {
        {
          // Not while paused: the pipeline is being saved from the consumer's thread.
          std::unique_lock<std::mutex> lock(mu);
          quiet.wait(lock, [&] { return stop || !paused; });
          if (stop) break;
          producing = true;
        }
        Item item = produce_traced(index);
        {
          std::lock_guard<std::mutex> lock(mu);
          producing = false;
          held = item;
        }
        quiet.notify_all();
        if (!item) break;
        mirrored::detail::spin_for(
            [&] { return size.load(std::memory_order_acquire) < capacity || stopping.load(std::memory_order_acquire); },
            kProducerSpin);
        std::unique_lock<std::mutex> lock(mu);
        not_full.wait(lock, [&] { return stop || items.size() < capacity; });
        if (stop) break;
        items.push_back(std::move(held));
        held = nullptr;
        size.store(items.size(), std::memory_order_release);
        not_empty.notify_one();
      }
    } catch (const PassCancelled&) {
      // The pass was cancelled (this queue is being destroyed, or the pass it belongs to is):
      // nobody will take another item, and there is no error to report.
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      producing = false;
      finished.store(true, std::memory_order_release);
    }
    not_empty.notify_all();
    quiet.notify_all();
  }

  // The pass it belongs to was cancelled: `own` is requested and the consumer released.
  void cancel_from_outer() {
    own.request_stop();
    {
      std::lock_guard<std::mutex> lock(mu);
      cancelled = true;
      cancelled_flag.store(true, std::memory_order_release);
    }
    not_empty.notify_all();
  }

  std::function<Item()> produce;
  const std::size_t capacity;
  std::stop_source own;  // the pass `produce` pulls from
  const ItemBytes bytes_of;
  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::condition_variable quiet;  // `producing` became false, or `paused` was cleared
  std::deque<Item> items;
  Item held;  // made and waiting for room in `items`
  bool stop = false, done = false, cancelled = false;
  bool paused = false, producing = false;  // `pause`: the producer keeps out of `produce`
  std::exception_ptr error;
  // Lock-free copies of items.size(), done, stop and cancelled for the spin phase (written under mu).
  std::atomic<std::size_t> size{0};
  std::atomic<bool> finished{false}, stopping{false}, cancelled_flag{false};
  std::optional<std::stop_callback<std::function<void()>>> on_outer;  // set after the thread starts
  std::thread thread;                                                 // started once everything above is initialised
};

PrefetchQueue::PrefetchQueue(std::function<Item()> produce, std::size_t capacity, std::stop_source own,
                             std::stop_token outer, ItemBytes bytes_of, std::vector<Item> ready)
    : state_(std::make_unique<State>(std::move(produce), capacity, std::move(own), bytes_of)) {
  State* s = state_.get();
  for (Item& item : ready) s->items.push_back(std::move(item));
  s->size.store(s->items.size(), std::memory_order_relaxed);
  s->thread = std::thread([s] { s->loop(); });
  // Runs at once when `outer` is already requested.
  if (outer.stop_possible())
    s->on_outer.emplace(std::move(outer), std::function<void()>([s] { s->cancel_from_outer(); }));
}

PrefetchQueue::~PrefetchQueue() {
  State& s = *state_;
  s.on_outer.reset();    // waits for a callback in progress; none can start after this
  s.own.request_stop();  // cursor loops of the pass unwind (PassCancelled)
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stop = true;
    s.stopping.store(true, std::memory_order_release);
  }
  s.not_full.notify_all();
  s.quiet.notify_all();
  s.thread.join();
}

std::vector<PrefetchQueue::Item> PrefetchQueue::pause() {
  State& s = *state_;
  std::unique_lock<std::mutex> lock(s.mu);
  s.paused = true;
  s.quiet.wait(lock, [&] { return !s.producing; });
  if (s.error) {
    s.paused = false;
    lock.unlock();
    s.quiet.notify_all();
    throw FailedPreconditionError(
        "save_state: the input pipeline failed ahead of the elements taken so far; its error is reported by the "
        "next call that takes an element, after which the pass is over");
  }
  std::vector<Item> out(s.items.begin(), s.items.end());
  if (s.held) out.push_back(s.held);
  return out;
}

void PrefetchQueue::resume() noexcept {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.paused = false;
  }
  s.quiet.notify_all();
}

PrefetchQueue::Item PrefetchQueue::next() {
  mirrored::detail::timeline::Scope trace("prefetch_wait", "input");  // the consumer's wait
  State& s = *state_;
  mirrored::detail::spin_for(
      [&] {
        return s.size.load(std::memory_order_acquire) > 0 || s.finished.load(std::memory_order_acquire) ||
               s.cancelled_flag.load(std::memory_order_acquire);
      },
      kConsumerSpin);
  std::unique_lock<std::mutex> lock(s.mu);
  s.not_empty.wait(lock, [&] { return !s.items.empty() || s.done || s.cancelled; });
  if (s.cancelled) throw PassCancelled{};
  if (s.items.empty()) {
    if (s.error) std::rethrow_exception(std::exchange(s.error, nullptr));
    return nullptr;
  }
  Item item = std::move(s.items.front());
  s.items.pop_front();
  s.size.store(s.items.size(), std::memory_order_release);
  const bool was_full = s.items.size() + 1 == s.capacity;
  lock.unlock();
  if (was_full) s.not_full.notify_one();
  return item;
}

}  // namespace mirrored::data::detail

// The background producer behind Dataset::prefetch and the distributed iterator.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "mirrored/data/detail/prefetch.hpp"
#include "util/spin.hpp"

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
  State(std::function<Item()> produce, std::size_t capacity)
      : produce(std::move(produce)), capacity(capacity < 1 ? 1 : capacity) {}

  void loop() {
    try {
      // Make the next result first, then wait for room: the queue's `capacity` results are ready
      // ahead, and one more is being made while the consumer has not yet taken the oldest.
      while (!stopping.load(std::memory_order_acquire)) {
        Item item = produce();
        if (!item) break;
        mirrored::detail::spin_for(
            [&] { return size.load(std::memory_order_acquire) < capacity || stopping.load(std::memory_order_acquire); },
            kProducerSpin);
        std::unique_lock<std::mutex> lock(mu);
        not_full.wait(lock, [&] { return stop || items.size() < capacity; });
        if (stop) break;
        items.push_back(std::move(item));
        size.store(items.size(), std::memory_order_release);
        not_empty.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      finished.store(true, std::memory_order_release);
    }
    not_empty.notify_all();
  }

  std::function<Item()> produce;
  const std::size_t capacity;
  std::mutex mu;
  std::condition_variable not_empty, not_full;
  std::deque<Item> items;
  bool stop = false, done = false;
  std::exception_ptr error;
  // Lock-free copies of items.size(), done and stop for the spin phase (written under mu).
  std::atomic<std::size_t> size{0};
  std::atomic<bool> finished{false}, stopping{false};
  std::thread thread;  // started last, once everything above is initialised
};

PrefetchQueue::PrefetchQueue(std::function<Item()> produce, std::size_t capacity)
    : state_(std::make_unique<State>(std::move(produce), capacity)) {
  State* s = state_.get();
  s->thread = std::thread([s] { s->loop(); });
}

PrefetchQueue::~PrefetchQueue() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stop = true;
    s.stopping.store(true, std::memory_order_release);
  }
  s.not_full.notify_all();
  s.thread.join();
}

PrefetchQueue::Item PrefetchQueue::next() {
  State& s = *state_;
  mirrored::detail::spin_for(
      [&] { return s.size.load(std::memory_order_acquire) > 0 || s.finished.load(std::memory_order_acquire); },
      kConsumerSpin);
  std::unique_lock<std::mutex> lock(s.mu);
  s.not_empty.wait(lock, [&] { return !s.items.empty() || s.done; });
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

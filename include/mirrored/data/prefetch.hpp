#pragma once
/// \file
/// Internal: a background producer with a bounded queue (`Prefetcher`), used by
/// `Dataset::prefetch` and by the distributed iterator to prepare the next step while the
/// current one runs.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "mirrored/data/node.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// A CPU hint for busy-wait loops (x86 `pause`: frees the core's resources for a sibling).
inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}

/// Busy-waits until `done()` or `budget` has passed (yielding now and then, so a peer that shares
/// the core can run); returns `done()`. Catches a peer that is about to deliver without paying a
/// sleep and a wake-up (tens of microseconds on a busy VM).
template <class Done>
bool spin_for(Done&& done, std::chrono::microseconds budget) {
  if (done()) return true;
  const auto deadline = std::chrono::steady_clock::now() + budget;
  do {
    for (int i = 0; i < 256; ++i) {
      cpu_relax();
      if (done()) return true;
    }
    std::this_thread::yield();
    if (done()) return true;
  } while (std::chrono::steady_clock::now() < deadline);
  return false;
}

/// Calls `produce()` on its own thread until it returns nullopt or throws, keeping at most
/// `capacity` results queued (plus the one being made). `next()` (one consumer thread) returns them in order, then
/// nullopt; an exception thrown by `produce` is rethrown by `next()`, with its type, after the results produced before
/// it (once; later calls return nullopt). The destructor stops the thread and joins it: it waits at most for the
/// `produce()` call in progress to return, never for queue space or for the consumer.
template <class T>
class Prefetcher {
 public:
  Prefetcher(std::function<std::optional<T>()> produce, std::size_t capacity)
      : produce_(std::move(produce)), capacity_(capacity < 1 ? 1 : capacity), thread_([this] { loop(); }) {}
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      stopping_.store(true, std::memory_order_release);
    }
    not_full_.notify_all();
    thread_.join();
  }
  Prefetcher(const Prefetcher&) = delete;
  Prefetcher& operator=(const Prefetcher&) = delete;

  /// The next result; nullopt after the last one. \throws what `produce` threw.
  std::optional<T> next() {
    spin_for([&] { return size_.load(std::memory_order_acquire) > 0 || finished_.load(std::memory_order_acquire); },
             kConsumerSpin);
    std::unique_lock<std::mutex> lock(mu_);
    not_empty_.wait(lock, [&] { return !items_.empty() || done_; });
    if (items_.empty()) {
      if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
      return std::nullopt;
    }
    T item = std::move(items_.front());
    items_.pop_front();
    size_.store(items_.size(), std::memory_order_release);
    const bool was_full = items_.size() + 1 == capacity_;
    lock.unlock();
    if (was_full) not_full_.notify_one();
    return item;
  }

 private:
  // How long a side yields before it blocks: the consumer waits for input it needs now; the
  // producer waits for queue space, possibly for a whole training step, so it gives up sooner.
  static constexpr std::chrono::microseconds kConsumerSpin{100};
  static constexpr std::chrono::microseconds kProducerSpin{20};

  void loop() {
    try {
      // Make the next result first, then wait for room: the queue's `capacity` results are ready
      // ahead, and one more is being made while the consumer has not yet taken the oldest.
      while (!stopping_.load(std::memory_order_acquire)) {
        std::optional<T> item = produce_();
        if (!item) break;
        spin_for(
            [&] {
              return size_.load(std::memory_order_acquire) < capacity_ || stopping_.load(std::memory_order_acquire);
            },
            kProducerSpin);
        std::unique_lock<std::mutex> lock(mu_);
        not_full_.wait(lock, [&] { return stop_ || items_.size() < capacity_; });
        if (stop_) break;
        items_.push_back(std::move(*item));
        size_.store(items_.size(), std::memory_order_release);
        not_empty_.notify_one();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      done_ = true;
      finished_.store(true, std::memory_order_release);
    }
    not_empty_.notify_all();
  }

  std::function<std::optional<T>()> produce_;
  std::size_t capacity_;
  std::mutex mu_;
  std::condition_variable not_empty_, not_full_;
  std::deque<T> items_;
  bool stop_ = false, done_ = false;
  std::exception_ptr error_;
  // Lock-free copies of items_.size(), done_ and stop_ for the spin phase (written under mu_).
  std::atomic<std::size_t> size_{0};
  std::atomic<bool> finished_{false}, stopping_{false};
  std::thread thread_;  // last: starts after everything above is initialised
};

/// `prefetch(buffer_size)`: a background thread keeps up to `buffer_size` elements of the input
/// ready and works on one more (`buffer_size == 0`: no thread, the input as is).
template <class E>
class PrefetchNode final : public Node<E> {
 public:
  PrefetchNode(NodePtr<E> input, int64_t buffer_size)
      : Node<E>(input->spec(), input->info()), input_(std::move(input)), buffer_size_(buffer_size) {
    MIRRORED_ENFORCE(buffer_size >= 0 || buffer_size == AUTOTUNE, InvalidArgumentError,
                     "prefetch: buffer_size must be >= 0 or AUTOTUNE (-1) (got ", buffer_size, ")");
    if (buffer_size_ == AUTOTUNE) buffer_size_ = 2;
  }

  std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const override {
    if (buffer_size_ == 0) return input_->open(ctx);
    struct PrefetchCursor final : Cursor<E> {
      Prefetcher<E> prefetcher;
      PrefetchCursor(std::shared_ptr<Cursor<E>> in, std::size_t n)
          : prefetcher([in = std::move(in)] { return in->next(); }, n) {}
      std::optional<E> next() override { return prefetcher.next(); }
    };
    std::shared_ptr<Cursor<E>> in = input_->open(ctx);
    return std::make_unique<PrefetchCursor>(std::move(in), static_cast<std::size_t>(buffer_size_));
  }

 private:
  NodePtr<E> input_;
  int64_t buffer_size_;
};

}  // namespace mirrored::data::detail

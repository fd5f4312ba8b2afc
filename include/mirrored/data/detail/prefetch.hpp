#pragma once
/// \file
/// Internal: a background producer with a bounded queue (`Prefetcher`), used by
/// `Dataset::prefetch` and by the distributed iterator to prepare the next step while the
/// current one runs.
/// Needed by `Dataset<E>::prefetch` and `DistributedIterator<E>`
/// (<mirrored/distributed_dataset.hpp>).

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/detail/node.hpp"
#include "mirrored/detail/nest.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data::detail {

/// The type-erased core of `Prefetcher` (compiled in src/data/prefetch_queue.cpp, so that user code
/// does not compile the threading machinery). Calls `produce()` on its own thread until it returns
/// null or throws, keeping at most `capacity` items queued (plus the one being made). `next()`
/// (one consumer thread) returns them in order, then null; an exception thrown by `produce` is
/// rethrown by `next()`, with its type, after the items produced before it (once; later calls
/// return null).
///
/// Cancellation: `own` is the stop source of the pass `produce` runs (the cursors it pulls from
/// were opened with its token). The destructor requests it, stops the thread and joins it; the
/// cursors' loops observe the request and unwind with `PassCancelled`, which the thread swallows,
/// so destruction does not wait for an element that never comes. `outer` is the token of the pass
/// this queue is itself part of (a `prefetch` inside another prefetched pipeline): when it is
/// requested, `own` is requested too, and a consumer waiting in `next()` throws `PassCancelled`.
///
/// `bytes_of(item)`, when given, is the size of an item's tensors for the timeline (negative: not
/// known); it is called only while a timeline is recorded.
///
/// Iterator state: `pause` stops the producer between two `produce` calls, so that the pipeline
/// `produce` reads can be saved from the consumer's thread; `ready` (items of a restored pass)
/// are queued ahead of what `produce` makes.
class PrefetchQueue {
 public:
  using Item = std::shared_ptr<void>;
  using ItemBytes = std::int64_t (*)(const void* item);
  PrefetchQueue(std::function<Item()> produce, std::size_t capacity, std::stop_source own = {},
                std::stop_token outer = {}, ItemBytes bytes_of = nullptr, std::vector<Item> ready = {});
  ~PrefetchQueue();
  PrefetchQueue(const PrefetchQueue&) = delete;
  PrefetchQueue& operator=(const PrefetchQueue&) = delete;

  /// The next item; null after the last one. \throws what `produce` threw; PassCancelled when
  /// `outer` was requested.
  Item next();
  /// Waits until the producer is outside `produce` (for one in progress to return) and keeps it
  /// there until `resume`; returns the items made and not yet taken, oldest first (including one
  /// made and waiting for room). Call from the consumer's thread.
  /// \throws FailedPreconditionError when `produce` failed and `next` has yet to report it (the
  /// producer is not paused then).
  std::vector<Item> pause();
  /// Lets a paused producer go on.
  void resume() noexcept;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

/// Bytes held by the tensors (and numbers) of `x` when it is a nest of them; -1 otherwise.
template <class X>
std::int64_t nest_bytes(const X& x) {
  if constexpr (!mirrored::detail::is_nest<X>()) {
    return -1;
  } else if constexpr (mirrored::is_tensor_v<X>) {
    return static_cast<std::int64_t>(mirrored::detail::TensorAccess::erase(x).bytes());
  } else if constexpr (mirrored::detail::is_scalar_leaf_v<X>) {
    return static_cast<std::int64_t>(sizeof(X));
  } else if constexpr (mirrored::detail::is_vector<X>::value) {
    std::int64_t total = 0;
    for (const auto& e : x) total += nest_bytes(e);
    return total;
  } else if constexpr (mirrored::detail::is_string_map<X>::value) {
    std::int64_t total = 0;
    for (const auto& entry : x) total += nest_bytes(entry.second);
    return total;
  } else {
    return std::apply([](const auto&... e) { return (std::int64_t{0} + ... + nest_bytes(e)); }, x);
  }
}

/// `PrefetchQueue` of `T` values: `produce()` returns nullopt at the end.
template <class T>
class Prefetcher {
 public:
  /// `own`, `outer`: as `PrefetchQueue`'s.
  Prefetcher(std::function<std::optional<T>()> produce, std::size_t capacity, std::stop_source own = {},
             std::stop_token outer = {}, std::vector<T> ready = {})
      : queue_(
            [produce = std::move(produce)]() -> PrefetchQueue::Item {
              std::optional<T> item = produce();
              if (!item) return nullptr;
              return std::make_shared<T>(std::move(*item));
            },
            capacity, std::move(own), std::move(outer),
            [](const void* item) { return nest_bytes(*static_cast<const T*>(item)); }, items_of(std::move(ready))) {}

  /// The next result; nullopt after the last one. \throws what `produce` threw.
  std::optional<T> next() {
    const PrefetchQueue::Item item = queue_.next();
    if (!item) return std::nullopt;
    return std::move(*static_cast<T*>(item.get()));
  }
  /// As `PrefetchQueue::pause`: the results made and not yet taken.
  std::vector<std::shared_ptr<const T>> pause() {
    std::vector<std::shared_ptr<const T>> out;
    for (PrefetchQueue::Item& item : queue_.pause()) out.push_back(std::static_pointer_cast<const T>(std::move(item)));
    return out;
  }
  void resume() noexcept { queue_.resume(); }

 private:
  static std::vector<PrefetchQueue::Item> items_of(std::vector<T> ready) {
    std::vector<PrefetchQueue::Item> out;
    out.reserve(ready.size());
    for (T& t : ready) out.push_back(std::make_shared<T>(std::move(t)));
    return out;
  }
  PrefetchQueue queue_;
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
    // The input runs on the prefetch thread, as a pass of its own that the thread can cancel.
    std::stop_source own;
    OpenContext inner = ctx;
    inner.stop = own.get_token();
    std::shared_ptr<Cursor<E>> in = input_->open(inner);
    return std::make_unique<PrefetchCursor>(std::move(in), static_cast<std::size_t>(buffer_size_), std::move(own),
                                            ctx.stop, std::vector<E>{});
  }
  /// State: the elements prefetched and not yet taken, then the input's (as of when they were
  /// made). The restored thread hands out those elements first: none is lost or repeated.
  std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const override {
    if (buffer_size_ == 0) return input_->restore(ctx, r);
    const uint64_t n = r.count(buffer_size_ + 1, 1, "prefetched elements");
    std::vector<E> ready;
    ready.reserve(static_cast<std::size_t>(n));
    for (uint64_t i = 0; i < n; ++i) ready.push_back(read_element<E>(r));
    std::stop_source own;
    OpenContext inner = ctx;
    inner.stop = own.get_token();
    std::shared_ptr<Cursor<E>> in = input_->restore(inner, r);
    return std::make_unique<PrefetchCursor>(std::move(in), static_cast<std::size_t>(buffer_size_), std::move(own),
                                            ctx.stop, std::move(ready));
  }
  std::string describe() const override { return ::mirrored::detail::str_cat("prefetch(", buffer_size_, ")"); }
  std::vector<const NodeBase*> inputs() const override { return {input_.get()}; }

 private:
  struct PrefetchCursor final : Cursor<E> {
    std::shared_ptr<Cursor<E>> in;  // run by the thread; read by `save` while it is paused
    Prefetcher<E> prefetcher;       // declared last: stopped (joined) before `in` goes
    PrefetchCursor(std::shared_ptr<Cursor<E>> i, std::size_t n, std::stop_source own, std::stop_token outer,
                   std::vector<E> ready)
        : in(std::move(i)),
          prefetcher([in = in] { return in->next(); }, n, std::move(own), std::move(outer), std::move(ready)) {}
    std::optional<E> next() override { return prefetcher.next(); }
    // The thread stays paused until the writer is done, so that what is saved below it is the
    // state the saved elements were made from.
    void save(StateWriter& w) override {
      const std::vector<std::shared_ptr<const E>> ready = prefetcher.pause();
      w.hold([this] { prefetcher.resume(); });
      w.u64(ready.size());
      for (const auto& e : ready) write_element(w, *e);
      in->save(w);
    }
  };

  NodePtr<E> input_;
  int64_t buffer_size_;
};

}  // namespace mirrored::data::detail

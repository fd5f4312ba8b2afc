#pragma once
/// \file
/// `mirrored::data::Dataset<E>`: a small, typed, lazy `tf.data`. A dataset is an immutable
/// description (cheap to copy: copies share it); nothing is read or computed until it is
/// iterated, and iteration streams one element at a time (only `batch`, `shuffle` and
/// `prefetch` hold a bounded number of elements). Every iteration is a new pass (epoch).

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "mirrored/data/detail/batch.hpp"
#include "mirrored/data/detail/node.hpp"
#include "mirrored/data/detail/prefetch.hpp"
#include "mirrored/data/detail/shuffle.hpp"
#include "mirrored/data/detail/sources.hpp"
#include "mirrored/data/detail/transforms.hpp"
#include "mirrored/data/element.hpp"
#include "mirrored/data/options.hpp"
#include "mirrored/data/tensor_spec.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::data {

/// A dataset of elements of type `E`: `Tensor<T>` or `std::tuple<Tensor<Ts>...>` (TF's
/// `tf.data.Dataset`). Build one with `Dataset<>::range`, `Dataset<>::from_tensor_slices` or a
/// file source (`fixed_length_record_dataset`, `text_line_dataset`), chain transformations, and
/// iterate it with a range-for, or hand it to `Strategy::experimental_distribute_dataset`.
/// Functions given to `map`/`filter` run while the dataset is iterated, possibly on a background
/// thread (`prefetch`, the distributed iterator); each iterator uses its own copy of them.
template <class E = Tensor<int64_t>>
class Dataset {
  static_assert(is_element_v<E>, "Dataset<E>: E must be Tensor<T> or std::tuple<Tensor<Ts>...>");

 public:
  using element_type = E;

  /// Wraps a graph node (for custom sources; the factories below are the usual way).
  /// \throws InvalidArgumentError for a null node.
  explicit Dataset(detail::NodePtr<E> node) : node_(std::move(node)) {
    MIRRORED_ENFORCE(node_ != nullptr, InvalidArgumentError, "Dataset: null node");
  }

  /// int64 scalars `0, 1, …, stop - 1`.
  static Dataset<Tensor<int64_t>> range(int64_t stop) { return range(0, stop, 1); }
  /// int64 scalars `start, start + step, …` up to (excluding) `stop`, like Python's `range`.
  /// \throws InvalidArgumentError when `step == 0`.
  static Dataset<Tensor<int64_t>> range(int64_t start, int64_t stop, int64_t step = 1) {
    return Dataset<Tensor<int64_t>>(std::make_shared<detail::RangeNode>(start, stop, step));
  }

  /// One element per row (axis-0 slice) of the tensors: `Dataset<Tensor<T>>` for one tensor,
  /// `Dataset<std::tuple<Tensor<Ts>...>>` for several (e.g. features and labels). The tensors are
  /// shared, not copied; each row is copied when it is read.
  /// \throws InvalidArgumentError for a rank-0 tensor or tensors whose first dimensions differ.
  template <class... Ts>
  static auto from_tensor_slices(const Tensor<Ts>&... t) {
    static_assert(sizeof...(Ts) >= 1, "from_tensor_slices needs at least one tensor");
    using Out = std::conditional_t<sizeof...(Ts) == 1, std::tuple_element_t<0, std::tuple<Tensor<Ts>...>>,
                                   std::tuple<Tensor<Ts>...>>;
    std::vector<::mirrored::detail::UntypedTensor> parts{::mirrored::detail::TensorAccess::erase(t)...};
    return Dataset<Out>(std::make_shared<detail::SlicesNode<Out>>(std::move(parts)));
  }

  /// Combines `batch_size` consecutive elements into one, component-wise, with a new first
  /// dimension. The last batch has fewer elements unless `drop_remainder` (then it is dropped).
  /// \throws InvalidArgumentError when `batch_size <= 0`; from the iterator, InvalidArgumentError
  /// when the elements of a batch have different shapes.
  Dataset batch(int64_t batch_size, bool drop_remainder = false) const {
    return Dataset(std::make_shared<detail::BatchNode<E>>(node_, batch_size, drop_remainder));
  }

  /// Applies `fn` to every element. `fn` takes the element (`const E&`) or, for a tuple, its
  /// components as separate arguments, and returns a `Tensor<U>` or a `std::tuple` of tensors.
  /// Exceptions thrown by `fn` propagate from the iterator with their type. The output's shapes
  /// are unknown to `element_spec()` (only dtypes are known).
  template <class Fn>
  auto map(Fn fn) const {
    using Node = detail::MapNode<E, Fn>;
    return Dataset<typename Node::Out>(std::make_shared<Node>(node_, std::move(fn)));
  }

  /// Keeps the elements for which `pred` (called like `map`'s function) returns true (a number
  /// or one-element tensor: non-zero).
  template <class Pred>
  Dataset filter(Pred pred) const {
    return Dataset(std::make_shared<detail::FilterNode<E, Pred>>(node_, std::move(pred)));
  }

  /// Randomly shuffles with a buffer of `buffer_size` elements (a buffer at least as large as
  /// the dataset gives a uniform permutation). Deterministic for a `seed`: a newly built dataset
  /// always yields the same sequence of epochs; each new iteration (epoch, also each repetition
  /// of a following `repeat`) is reshuffled (TF's `reshuffle_each_iteration=True`).
  /// \throws InvalidArgumentError when `buffer_size < 1`.
  Dataset shuffle(int64_t buffer_size, uint64_t seed) const {
    return Dataset(std::make_shared<detail::ShuffleNode<E>>(node_, buffer_size, seed));
  }

  /// The dataset `count` times over (`-1`: forever). \throws InvalidArgumentError when
  /// `count < -1`.
  Dataset repeat(int64_t count = -1) const { return Dataset(std::make_shared<detail::RepeatNode<E>>(node_, count)); }

  /// At most the first `n` elements (`-1`: all). \throws InvalidArgumentError when `n < -1`.
  Dataset take(int64_t n) const { return Dataset(std::make_shared<detail::TakeSkipNode<E>>(node_, n, true)); }

  /// All but the first `n` elements (`-1`: none). \throws InvalidArgumentError when `n < -1`.
  Dataset skip(int64_t n) const { return Dataset(std::make_shared<detail::TakeSkipNode<E>>(node_, n, false)); }

  /// Every `num_shards`-th element starting at `index`. `shard(SHARD_HINT, SHARD_HINT)` is a
  /// placeholder for the input worker's shard under `AutoShardPolicy::HINT`.
  /// \throws InvalidArgumentError unless `num_shards >= 1` and `0 <= index < num_shards`
  /// ("Index must be between 0 and 1 (currently index = 2)").
  Dataset shard(int64_t num_shards, int64_t index) const {
    return Dataset(std::make_shared<detail::ShardNode<E>>(node_, num_shards, index));
  }

  /// Runs the pipeline on a background thread that keeps up to `buffer_size` elements ready and
  /// works on one more (`0`: no thread; `AUTOTUNE`: 2). The thread stops when the iterator is
  /// destroyed.
  /// \throws InvalidArgumentError when `buffer_size < -1`.
  Dataset prefetch(int64_t buffer_size) const {
    return Dataset(std::make_shared<detail::PrefetchNode<E>>(node_, buffer_size));
  }

  /// The same elements with options `o` (replacing earlier ones).
  Dataset with_options(Options o) const { return Dataset(std::make_shared<detail::WithOptionsNode<E>>(node_, o)); }
  /// The options set by the last `with_options` (defaults if none).
  const Options& options() const noexcept { return node_->info().options; }

  /// Dtype and shape of each component of an element; -1 marks a dimension that is not known
  /// before iterating (e.g. the batch dimension without `drop_remainder`).
  ElementSpec<E> element_spec() const { return detail::make_element_spec<E>(node_->spec()); }

  /// Input iterator over the elements of one pass. Move-only; it owns the pass (and any
  /// background thread of a `prefetch`, which it stops when destroyed).
  ///
  /// Checkpointing: `save_state` returns the iterator's position as opaque bytes, and
  /// `restore_state` on an iterator of an equal dataset (built the same way, e.g. in a restarted
  /// process) continues from there: it yields exactly the elements the saved iterator would have
  /// yielded next, and later passes (`begin()` again, the repetitions of a `repeat`) reshuffle as
  /// they would have. The state holds positions (a range's next value, a file and the offset in
  /// it, take/skip/shard counts, repetitions left) and the elements a pass holds (a shuffle
  /// buffer, what a `prefetch` made and was not yet taken), never a replay of the pass; map and
  /// filter functions are assumed pure (their own state, if any, is not saved). Elements are
  /// stored in host byte order: restore on a machine of the same byte order.
  class Iterator {
   public:
    using value_type = E;
    using difference_type = std::ptrdiff_t;
    using iterator_concept = std::input_iterator_tag;

    /// An iterator at the end.
    Iterator() = default;
    /// Iterates `cursor` (what `begin()` does with a fresh pass).
    explicit Iterator(std::unique_ptr<detail::Cursor<E>> cursor) : cursor_(std::move(cursor)) {}
    /// Iterates `cursor`, a pass over `node` (what `begin()` does; `node` makes the iterator's
    /// state savable).
    Iterator(detail::NodePtr<E> node, std::unique_ptr<detail::Cursor<E>> cursor)
        : node_(std::move(node)), cursor_(std::move(cursor)) {}
    Iterator(Iterator&&) noexcept = default;
    Iterator& operator=(Iterator&&) noexcept = default;

    /// The next element, or nullopt after the last. \throws what the pipeline threw (a map
    /// function's exception, a file error), with its type.
    std::optional<E> next() {
      if (fetched_) {
        fetched_ = false;
        return std::exchange(current_, std::nullopt);
      }
      return pull();
    }
    /// The current element. \throws OutOfRangeError at the end.
    const E& operator*() const {
      fetch();
      MIRRORED_ENFORCE(current_.has_value(), OutOfRangeError, "Dataset iterator: End of sequence");
      return *current_;
    }
    /// Moves past the current element (fetching it first if nobody looked at it).
    /// \throws what the pipeline threw.
    Iterator& operator++() {
      fetch();
      fetched_ = false;
      current_.reset();
      return *this;
    }
    /// As prefix `++`.
    void operator++(int) { ++*this; }
    /// True at the end (fetches the next element to find out). \throws what the pipeline threw.
    friend bool operator==(const Iterator& it, std::default_sentinel_t) {
      it.fetch();
      return !it.current_.has_value();
    }

    /// This iterator's position (see the class comment): opaque bytes for `restore_state`. Any
    /// `prefetch` thread is paused while the state is taken. Not thread-safe with `next`.
    /// \throws FailedPreconditionError for an iterator not made by `begin()`, or when a prefetch
    /// thread has failed ahead of the elements taken (take them: the error is reported);
    /// UnimplementedError naming a custom node or cursor that cannot save its state.
    std::string save_state() const {
      MIRRORED_ENFORCE(node_ != nullptr, FailedPreconditionError,
                       "Dataset iterator save_state: the iterator was not made by Dataset::begin");
      const std::string pipeline = detail::describe_graph(*node_);
      detail::StateWriter pass;  // keeps the pass's threads paused until the state is complete
      if (cursor_) cursor_->save(pass);
      detail::StateWriter w;
      detail::write_state_header(w, detail::StateKind::dataset);
      w.str(pipeline);
      const std::vector<uint64_t> counters = detail::graph_counters(*node_);
      w.u64(counters.size());
      for (uint64_t c : counters) w.u64(c);
      w.boolean(cursor_ != nullptr);
      w.boolean(fetched_ && current_.has_value());  // looked at (`*it`) but not yet consumed
      if (fetched_ && current_) detail::write_element(w, *current_);
      w.str(pass.take());
      return w.take();
    }
    /// Replaces this iterator's pass by the one `state` (from `save_state` on an iterator of an
    /// equal dataset) describes, and sets the dataset's shuffle pass counters as they were (so
    /// restore into a freshly built dataset). A failure changes nothing.
    /// \throws FailedPreconditionError for an iterator not made by `begin()`; InvalidArgumentError
    /// for bytes that are no such state, are truncated or corrupt, or come from another pipeline
    /// (naming both); for a file source, what opening the file at the saved position throws.
    void restore_state(const std::string& state) {
      MIRRORED_ENFORCE(node_ != nullptr, FailedPreconditionError,
                       "Dataset iterator restore_state: the iterator was not made by Dataset::begin");
      detail::StateReader r(state, "Dataset iterator restore_state");
      detail::read_state_header(r, detail::StateKind::dataset);
      const std::string saved = r.str();
      detail::check_same_pipeline(r, saved, detail::describe_graph(*node_));
      std::vector<uint64_t> counters(static_cast<std::size_t>(r.count(-1, 8, "pass counters")));
      for (uint64_t& c : counters) c = r.u64();
      const bool active = r.boolean();
      std::optional<E> pending;
      if (r.boolean()) pending = detail::read_element<E>(r);
      const std::string pass = r.str();
      r.expect_end();
      detail::StateReader pr(pass, r.op());
      // The pass being replaced is paused (its threads could open passes, counting them) until
      // it is gone; one that has failed is simply gone.
      detail::StateWriter paused(true);
      try {
        if (cursor_) cursor_->save(paused);
      } catch (const Error&) {
        cursor_.reset();
        paused.forget();
      }
      const std::vector<uint64_t> before = detail::graph_counters(*node_);
      detail::set_graph_counters(*node_, counters, r);
      std::unique_ptr<detail::Cursor<E>> cursor;
      try {
        if (active) cursor = node_->restore(detail::OpenContext{}, pr);
        pr.expect_end();
      } catch (...) {
        detail::set_graph_counters(*node_, before, r);
        throw;
      }
      cursor_.reset();  // stops its (paused) threads
      paused.forget();
      cursor_ = std::move(cursor);
      fetched_ = pending.has_value();
      current_ = std::move(pending);
    }

   private:
    std::optional<E> pull() const {
      if (!cursor_) return std::nullopt;
      std::optional<E> e;
      try {
        e = cursor_->next();
      } catch (...) {
        cursor_.reset();  // a failed pass is over
        throw;
      }
      if (!e) cursor_.reset();
      return e;
    }
    void fetch() const {
      if (!fetched_) {
        current_ = pull();
        fetched_ = true;
      }
    }

    detail::NodePtr<E> node_;
    mutable std::unique_ptr<detail::Cursor<E>> cursor_;
    mutable std::optional<E> current_;
    mutable bool fetched_ = false;
  };

  /// A new pass over the data (a new epoch: a `shuffle` reshuffles). Starts the threads of any
  /// `prefetch`, which stop when the iterator is destroyed.
  Iterator begin() const { return Iterator(node_, node_->open(detail::OpenContext{})); }
  /// The end sentinel of every pass.
  std::default_sentinel_t end() const noexcept { return {}; }

  /// The graph node (for the distributed dataset and custom extensions).
  const detail::NodePtr<E>& node() const noexcept { return node_; }

 private:
  detail::NodePtr<E> node_;
};

/// `Dataset<>::range(stop)`.
inline Dataset<Tensor<int64_t>> range(int64_t stop) { return Dataset<>::range(stop); }
/// `Dataset<>::range(start, stop, step)`.
inline Dataset<Tensor<int64_t>> range(int64_t start, int64_t stop, int64_t step = 1) {
  return Dataset<>::range(start, stop, step);
}
/// `Dataset<>::from_tensor_slices(t...)`.
template <class... Ts>
auto from_tensor_slices(const Tensor<Ts>&... t) {
  return Dataset<>::from_tensor_slices(t...);
}

}  // namespace mirrored::data

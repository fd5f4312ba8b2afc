#pragma once
/// \file
/// Internal: the lazy dataset graph. A `Dataset<E>` is a handle on an immutable `Node<E>`; each
/// iteration opens a fresh `Cursor<E>` chain that streams elements one at a time. Custom sources
/// can derive from `Node` and be wrapped with `Dataset<E>(node)`.
/// Needed by `Dataset<E>` and every node and cursor of <mirrored/data/dataset.hpp>.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <stop_token>
#include <utility>
#include <vector>

#include "mirrored/data/element.hpp"
#include "mirrored/data/options.hpp"
#include "mirrored/data/tensor_spec.hpp"

namespace mirrored::data::detail {

/// Per-iteration context handed down the chain when an iterator is opened: which input worker
/// reads, which auto-shard rewrites apply (set by the distributed dataset, default: none), and the
/// pass's cancellation.
struct OpenContext {
  int num_workers = 1;
  int worker_index = 0;
  bool shard_files = false;  // FILE: file sources keep files i with i % num_workers == worker_index
  bool shard_hint = false;   // HINT: shard(SHARD_HINT, SHARD_HINT) becomes shard(num_workers, worker_index)
  /// Requested when the background thread running this chain is stopped (its iterator is being
  /// destroyed). Every cursor loop that may pull many elements checks it (`throw_if_cancelled`),
  /// so that a pipeline that never yields (a `filter` rejecting everything of an endless
  /// `repeat`) lets go at once. The default token is never requested.
  std::stop_token stop;
};

/// Thrown inside a cursor chain whose pass was cancelled, to unwind a long pull at once. Private to
/// the pipeline: the background thread running the chain swallows it (`PrefetchQueue`). Not a
/// `std::exception`, so that a map function catching `std::exception` cannot take it for an error.
struct PassCancelled {};

/// \throws PassCancelled when `stop` has been requested.
inline void throw_if_cancelled(const std::stop_token& stop) {
  if (stop.stop_requested()) throw PassCancelled{};
}

/// Static facts about a graph, propagated from the source to the last node.
struct GraphInfo {
  std::optional<int64_t> batch_size;     // size of the last `batch` (the global batch size)
  bool drop_remainder = false;           // that batch's drop_remainder
  std::optional<std::size_t> num_files;  // files read by the source; nullopt: not a file source
  Options options;                       // the last `with_options`
};

/// One pass over a dataset. `next()` returns the next element or nullopt at the end; it may
/// throw (a map function's exception, a file error, `PassCancelled`). After it returned nullopt or
/// threw, nobody calls it again (so a cursor that only forwards its input's end needs no state for
/// it). A cursor whose `next()` may loop over many input elements checks `OpenContext::stop` in
/// that loop.
template <class E>
class Cursor {
 public:
  virtual ~Cursor() = default;
  virtual std::optional<E> next() = 0;
};

/// A node of the dataset graph: immutable, shared by every `Dataset` copy and every iterator.
/// `open` may be called from any thread, also concurrently.
template <class E>
class Node {
 public:
  Node(std::vector<TensorSpec> spec, GraphInfo info) : spec_(std::move(spec)), info_(std::move(info)) {}
  virtual ~Node() = default;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// A fresh pass over the data (a new epoch).
  virtual std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const = 0;
  /// One spec per component.
  const std::vector<TensorSpec>& spec() const noexcept { return spec_; }
  const GraphInfo& info() const noexcept { return info_; }

 private:
  std::vector<TensorSpec> spec_;
  GraphInfo info_;
};

template <class E>
using NodePtr = std::shared_ptr<const Node<E>>;

}  // namespace mirrored::data::detail

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
#include <string>
#include <utility>
#include <vector>

#include "mirrored/data/detail/iterator_state.hpp"
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
///
/// Iterator state: `save` writes the cursor's position (and the elements it holds) so that the
/// node's `restore` can open a cursor that yields exactly what this one would yield next. It is
/// called on the thread that calls `next()`, or while that thread is paused (a `prefetch` pauses
/// its thread and keeps it paused until the writer is destroyed). A cursor that cannot save (a
/// custom one that does not override it) throws UnimplementedError naming its type.
template <class E>
class Cursor {
 public:
  virtual ~Cursor() = default;
  virtual std::optional<E> next() = 0;
  /// Writes this cursor's state (see above). \throws UnimplementedError unless overridden.
  virtual void save(StateWriter&) { throw_no_state("save_state", typeid(*this)); }
};

/// The type-independent part of a graph node: what iterator state needs to walk the graph.
class NodeBase {
 public:
  virtual ~NodeBase() = default;
  /// The node's kind and parameters, e.g. `shuffle(buffer_size=10, seed=3)`: two pipelines whose
  /// nodes describe themselves alike read the same positions alike, so a saved position may be
  /// restored into either. Map and filter functions are not described (they are assumed pure).
  /// \throws UnimplementedError unless overridden (a custom node without iterator state).
  virtual std::string describe() const { throw_no_state("save_state", typeid(*this)); }
  /// The nodes this one reads, in a fixed order.
  virtual std::vector<const NodeBase*> inputs() const { return {}; }
  /// Mutable per-node state that later passes depend on (a `shuffle`'s count of passes opened).
  virtual std::vector<uint64_t> counters() const { return {}; }
  /// Sets what `counters` returned (as many values).
  virtual void set_counters(const std::vector<uint64_t>&) const {}
};

/// The whole graph ending at `node`, e.g. `range(0, 10, 1).shuffle(buffer_size=4, seed=1).batch(2)`.
/// \throws UnimplementedError naming a node that cannot describe itself.
std::string describe_graph(const NodeBase& node);
/// The counters of every node of the graph, depth first.
std::vector<uint64_t> graph_counters(const NodeBase& node);
/// Sets them (as `graph_counters` returned them, e.g. from another, equal graph).
/// \throws InvalidArgumentError (naming `r.op()`) when there are not as many as the graph has.
void set_graph_counters(const NodeBase& node, const std::vector<uint64_t>& values, const StateReader& r);

/// A node of the dataset graph: immutable, shared by every `Dataset` copy and every iterator.
/// `open` may be called from any thread, also concurrently.
template <class E>
class Node : public NodeBase {
 public:
  Node(std::vector<TensorSpec> spec, GraphInfo info) : spec_(std::move(spec)), info_(std::move(info)) {}
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  /// A fresh pass over the data (a new epoch).
  virtual std::unique_ptr<Cursor<E>> open(const OpenContext& ctx) const = 0;
  /// A pass positioned where a cursor of an equal node (same `describe_graph`), opened with an
  /// equal `ctx`, was when it saved `r`'s state: it yields what that cursor would have yielded.
  /// 	hrows InvalidArgumentError for corrupt state; UnimplementedError unless overridden.
  virtual std::unique_ptr<Cursor<E>> restore(const OpenContext& ctx, StateReader& r) const {
    (void)ctx;
    (void)r;
    throw_no_state("restore_state", typeid(*this));
  }
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

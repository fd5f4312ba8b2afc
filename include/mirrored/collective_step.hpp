#pragma once
/// \file
/// `CollectiveStep`: one collective as a `CrossDeviceOps` implementation sees it from one replica.
/// This is the extension API for writing a cross-device backend: every replica's request (its
/// inputs, outputs and options), the packs to reduce them in, and a barrier with the collective's
/// deadline.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mirrored/communication_options.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored {

namespace detail {
class CollectiveGroup;  // the replicas' rendezvous (private)
struct OptimizerStep;   // <mirrored/detail/optimizer_step.hpp>
}  // namespace detail

/// The collective calls replicas make; every replica makes the same ones in the same order (the
/// library checks it). A `CollectiveRequest` is one of the replica calls: `all_reduce`,
/// `all_reduce_async`, `reduce_scatter`, `reduce_scatter_async`, `all_gather` or
/// `apply_gradients`; the others are rendezvous of the library's own.
enum class CollectiveKind {
  all_reduce,
  all_gather,
  merge_call,
  broadcast,
  batch_reduce,
  all_reduce_async,
  reduce_scatter,
  reduce_scatter_async,
  apply_gradients,     ///< an optimizer step: the gradients' reduction and the update in one
  agree_on_variables,  ///< the replicas compare an update's variables before it makes or moves anything
};

/// What one replica asks of one collective, as one value from where the call enters the library
/// down to the backend: what it posts for the other replicas to read. Every replica has posted its
/// request before a backend is called, and the buffers stay valid until the collective's last
/// `CollectiveStep::sync()`. The library checks that every replica asked for the same (kind, op,
/// axis, nest structure, dtypes, shapes, split, and the options that shape the collective: pack
/// size for an all-reduce, compression) before a backend is called, so a backend may trust replica
/// 0's request for all of them. Built with designated initialisers; members left out keep the
/// defaults below.
struct CollectiveRequest {
  CollectiveKind kind = CollectiveKind::all_reduce;
  /// All-reduce, reduce-scatter: the reduce op (an optimizer step's gradients are summed).
  ReduceOp op = ReduceOp::SUM;
  /// The replica's input tensors (an optimizer step: its gradients).
  const std::vector<detail::UntypedTensor>* inputs = nullptr;
  /// The output tensors it wants filled (an optimizer step: its parameter copies).
  const std::vector<detail::UntypedTensor>* outputs = nullptr;
  /// The nest the inputs came from (`detail::flatten`); null where the inputs are one tensor.
  const std::string* structure = nullptr;
  /// All-gather: the axis as the replica passed it.
  int axis = 0;
  /// The options the replica passed to the call, whole: every part of the library that honours
  /// one of them reads it here (the deadline was made from `timeout_seconds` where the call
  /// entered; `bytes_per_pack` packs an all-reduce; `compression` says how floats cross workers).
  CommunicationOptions options;
  /// Reduce-scatter: how the reduced input (one tensor, flattened) is cut, in elements, one piece
  /// per replica of every worker in global replica order; a replica's output holds its piece. The
  /// pieces add up to the input's size.
  const std::vector<int64_t>* split = nullptr;
  /// An optimizer step (`CrossDeviceOps::all_reduce_and_update`): the replica's gradients are
  /// `inputs`, and this says which copies they update and how.
  const detail::OptimizerStep* update = nullptr;
};

/// One collective seen from one replica. Every replica has posted its `CollectiveRequest` before
/// a backend is called, and its buffers stay valid until the collective's last `sync()`. A
/// backend may read any replica's inputs, and write any replica's outputs as long as replicas
/// never write the same bytes; after its last `sync()` it may touch only its own outputs.
class CollectiveStep {
 public:
  /// The tensors of each pack of a replica's inputs, as indices into `inputs(r)`, in order (see
  /// `plan_packs`).
  using PackPlan = std::vector<std::vector<std::size_t>>;

  /// A step of a group of replicas (every replica posted its request when it joined), bounded by
  /// the deadline the collective was given where it entered the library.
  CollectiveStep(detail::CollectiveGroup& group, int replica, Deadline deadline)
      : group_(&group), replica_(replica), deadline_(deadline) {}
  /// A step of a single replica (no other thread involved).
  CollectiveStep(const CollectiveRequest& solo, Deadline deadline) : solo_(&solo), deadline_(deadline) {}

  /// The calling replica.
  int replica() const noexcept { return replica_; }
  /// Number of replicas taking part.
  int num_replicas() const noexcept;
  /// What replica `r` asked for (its request, as it posted it).
  const CollectiveRequest& request(int r) const;
  /// What replica `r` posted.
  const std::vector<detail::UntypedTensor>& inputs(int r) const { return *request(r).inputs; }
  const std::vector<detail::UntypedTensor>& outputs(int r) const { return *request(r).outputs; }
  /// The kind of collective this is (every replica's is the same).
  CollectiveKind kind() const { return request(replica_).kind; }
  /// The options the calling replica passed (checked equal across replicas where they shape the
  /// collective).
  const CommunicationOptions& options() const { return request(replica_).options; }
  /// Waits until every replica reaches this point of the collective. \throws
  /// DeadlineExceededError past the collective's deadline; AbortedError when another replica failed.
  void sync();
  /// The collective's deadline: every wait of a backend (devices, peers) ends by it. It was set
  /// once, when the collective entered the library; a backend never re-arms it.
  const Deadline& deadline() const noexcept { return deadline_; }
  /// The timeout the deadline was made from, for messages only.
  double timeout_seconds() const noexcept { return deadline_.timeout_seconds(); }
  /// True once the run this collective belongs to was aborted (another replica failed): a
  /// backend that waits on its own (e.g. for a device) gives up then.
  bool aborted() const noexcept;
  /// The group of the step's replicas, or nullptr for a replica alone: it outlives the step (a
  /// wait that runs after the step has gone, e.g. a deferred NCCL completion, watches its abort).
  detail::CollectiveGroup* group() const noexcept { return group_; }
  /// `CommunicationOptions::bytes_per_pack` of this collective (what the replicas posted, checked
  /// equal for an all-reduce): inputs are reduced in packs of about this many bytes (0: one pack
  /// per run of same-dtype tensors). `plan_packs` plans them.
  int64_t bytes_per_pack() const { return options().bytes_per_pack; }
  /// The packs of the calling replica's inputs under `bytes_per_pack()`: each pack is a run of
  /// consecutive tensors of one dtype on one device, closed once it holds `bytes_per_pack()` bytes
  /// or more, so it may end past the limit by its last tensor (0: no limit, one pack per run).
  /// Tensors without elements stay in their pack. Dtypes and shapes are checked equal across
  /// replicas, so replicas that each hold their inputs on one device get the same plan. A backend
  /// that reduces pack by pack plans with this, so that its packs are the library's.
  PackPlan plan_packs() const;
  /// `CommunicationOptions::compression` of this collective (checked equal across replicas): how
  /// float values cross workers. Local backends ignore it.
  Compression compression() const { return options().compression; }
  /// Reduce-scatter: every replica's piece of the reduced input, in elements, in replica order
  /// (see `CollectiveRequest::split`; with one worker, index r is local replica r).
  const std::vector<int64_t>& split() const;
  /// Replica `r`'s optimizer step (`CrossDeviceOps::all_reduce_and_update`; null otherwise).
  const detail::OptimizerStep* update(int r) const { return request(r).update; }

 private:
  detail::CollectiveGroup* group_ = nullptr;
  const CollectiveRequest* solo_ = nullptr;
  int replica_ = 0;
  Deadline deadline_;
};

}  // namespace mirrored

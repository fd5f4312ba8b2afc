#pragma once
/// \file
/// `CollectiveStep`: one collective as a `CrossDeviceOps` implementation sees it from one replica.
/// This is the extension API for writing a cross-device backend: every replica's posted inputs
/// and outputs, and a barrier with the collective's deadline.

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

/// One collective seen from one replica. Every replica has posted its `Buffers` before a backend
/// is called, and they stay valid until the collective's last `sync()`. A backend may read any
/// replica's inputs, and write any replica's outputs as long as replicas never write the same
/// bytes; after its last `sync()` it may touch only its own outputs.
class CollectiveStep {
 public:
  /// What each replica posts: its input tensors, the output tensors it wants filled, and what it
  /// asked for. The library checks that every replica asked for the same (op, axis, pack size,
  /// compression, split, nest structure, dtypes, shapes) before a backend is called, so a backend
  /// may trust replica 0's description for all of them.
  struct Buffers {
    const std::vector<detail::UntypedTensor>* inputs;
    const std::vector<detail::UntypedTensor>* outputs;
    const std::string* structure = nullptr;  // the nest the inputs came from (detail::flatten)
    ReduceOp op = ReduceOp::SUM;             // all-reduce, reduce-scatter: the reduce op
    int axis = 0;                            // all-gather: the axis as the replica passed it
    int64_t bytes_per_pack = 0;              // all-reduce: CommunicationOptions::bytes_per_pack
    Compression compression = Compression::NONE;  // CommunicationOptions::compression (across workers)
    /// Reduce-scatter: how the reduced input (one tensor, flattened) is cut, in elements, one
    /// piece per replica of every worker in global replica order; a replica's output holds its
    /// piece. The pieces add up to the input's size.
    const std::vector<int64_t>* split = nullptr;
    /// An optimizer step (`CrossDeviceOps::all_reduce_and_update`): the replica's gradients are
    /// `inputs`, and this says which copies they update and how.
    const detail::OptimizerStep* update = nullptr;
  };

  /// A step of a group of replicas (every replica has posted `Buffers` when it joined), bounded
  /// by the deadline the collective was given where it entered the library.
  CollectiveStep(detail::CollectiveGroup& group, int replica, Deadline deadline)
      : group_(&group), replica_(replica), deadline_(deadline) {}
  /// A step of a single replica (no other thread involved).
  CollectiveStep(const Buffers& solo, Deadline deadline) : solo_(&solo), deadline_(deadline) {}

  /// The calling replica.
  int replica() const noexcept { return replica_; }
  /// Number of replicas taking part.
  int num_replicas() const noexcept;
  /// What replica `r` posted.
  const std::vector<detail::UntypedTensor>& inputs(int r) const { return *posted(r).inputs; }
  const std::vector<detail::UntypedTensor>& outputs(int r) const { return *posted(r).outputs; }
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
  /// equal): inputs are reduced in packs of about this many bytes (0: one pack per run of
  /// same-dtype tensors). Plan them with `detail::plan_packs`.
  int64_t bytes_per_pack() const { return posted(replica_).bytes_per_pack; }
  /// `CommunicationOptions::compression` of this collective (checked equal across replicas): how
  /// float values cross workers. Local backends ignore it.
  Compression compression() const { return posted(replica_).compression; }
  /// Reduce-scatter: every replica's piece of the reduced input, in elements, in replica order
  /// (see `Buffers::split`; with one worker, index r is local replica r).
  const std::vector<int64_t>& split() const;
  /// Replica `r`'s optimizer step (`CrossDeviceOps::all_reduce_and_update`; null otherwise).
  const detail::OptimizerStep* update(int r) const { return posted(r).update; }

 private:
  const Buffers& posted(int r) const;

  detail::CollectiveGroup* group_ = nullptr;
  const Buffers* solo_ = nullptr;
  int replica_ = 0;
  Deadline deadline_;
};

}  // namespace mirrored

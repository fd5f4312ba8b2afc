#pragma once
/// \file
/// Cross-device operations: how values from the replicas' devices are combined. A strategy owns
/// one `CrossDeviceOps`; replica-context collectives call it from every replica thread at once,
/// cross-replica reductions call it from the caller's thread.

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mirrored/detail/collective_group.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/device.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored {

namespace detail {

/// One collective seen from one replica: every replica's posted inputs and outputs, and a
/// barrier with the collective's deadline.
class CollectiveStep {
 public:
  /// What each replica posts: its input tensors, the output tensors it wants filled, and (for
  /// validation) a description of the nest they came from.
  struct Buffers {
    const std::vector<UntypedTensor>* inputs;
    const std::vector<UntypedTensor>* outputs;
    const std::string* structure = nullptr;
  };

  /// A step of a group of replicas (every replica has posted `Buffers` when it joined).
  CollectiveStep(CollectiveGroup& group, int replica, double timeout_seconds)
      : group_(&group), replica_(replica), timeout_s_(timeout_seconds) {}
  /// A step of a single replica (no other thread involved).
  CollectiveStep(const Buffers& solo, double timeout_seconds) : solo_(&solo), timeout_s_(timeout_seconds) {}

  int replica() const noexcept { return replica_; }
  int num_replicas() const noexcept { return group_ ? group_->size() : 1; }
  const std::vector<UntypedTensor>& inputs(int r) const { return *posted(r).inputs; }
  const std::vector<UntypedTensor>& outputs(int r) const { return *posted(r).outputs; }
  /// Waits until every replica reaches this point of the collective.
  void sync() {
    if (group_) group_->sync(replica_, timeout_s_);
  }
  double timeout_seconds() const noexcept { return timeout_s_; }
  /// True once the run this collective belongs to was aborted (another replica failed): a
  /// backend that waits on its own (e.g. for a device) gives up then.
  bool aborted() const noexcept { return group_ != nullptr && group_->aborted(); }
  /// `CommunicationOptions::bytes_per_pack` of this collective: inputs are reduced in packs of
  /// about this many bytes (0: one pack per run of same-dtype tensors); see `plan_packs`.
  int64_t bytes_per_pack() const noexcept { return bytes_per_pack_; }
  void set_bytes_per_pack(int64_t bytes) noexcept { bytes_per_pack_ = bytes; }

 private:
  const Buffers& posted(int r) const {
    return group_ ? *static_cast<const Buffers*>(group_->payload(r)) : *solo_;
  }
  CollectiveGroup* group_ = nullptr;
  const Buffers* solo_ = nullptr;
  int replica_ = 0;
  double timeout_s_;
  int64_t bytes_per_pack_ = 0;
};

}  // namespace detail

/// Interface of a cross-device reduction backend. Operations a backend does not support throw
/// UnimplementedError naming the backend and the operation.
class CrossDeviceOps {
 public:
  virtual ~CrossDeviceOps();
  /// The backend's name, e.g. "InProcessAllReduce".
  virtual std::string name() const = 0;

  /// Cross-replica context: reduces one tensor per replica (equal dtypes and shapes, validated by
  /// the caller) into `out`, summing in replica order; MEAN divides by the number of tensors.
  virtual void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                      const detail::UntypedTensor& out);

  /// Replica context, called by every replica thread: fills every replica's `outputs[i]` with
  /// the reduction of all replicas' `inputs[i]` (validated equal in dtype and shape), summing in
  /// replica order. Returns once this replica's outputs are final.
  virtual void all_reduce(ReduceOp op, detail::CollectiveStep& step);

  /// Replica context, called by every replica thread: fills this replica's `outputs[i]` with the
  /// concatenation along `axis` of every replica's `inputs[i]`, in replica order.
  virtual void all_gather(int axis, detail::CollectiveStep& step);

  /// Cross-replica context (`batch_reduce_to` onto destinations on the replicas' devices
  /// `devices`): sets `outputs[i][r]`, a new tensor on `devices[r]`, to the reduction of
  /// `inputs[i][0..N)` (validated equal in dtype and shape) and returns true; or returns false,
  /// having done nothing, when this backend has no path of its own for these tensors (the caller
  /// then reduces with `reduce` and copies). Waits at most `timeout_s` for the devices. The
  /// default returns false.
  virtual bool batch_all_reduce(ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& inputs,
                                const std::vector<Device>& devices,
                                std::vector<std::vector<detail::UntypedTensor>>& outputs, double timeout_s);

 protected:
  [[noreturn]] void unsupported(const char* op) const;
};

/// Reduces by copying every replica's value to one device, summing there in replica order, and
/// copying the result back out. Works for any mix of devices.
class ReductionToOneDevice : public CrossDeviceOps {
 public:
  /// `reduce_to_device`: where sums are formed (default: the first replica's device).
  /// \throws InvalidArgumentError for an unparsable device.
  explicit ReductionToOneDevice(std::optional<std::string> reduce_to_device = std::nullopt);
  std::string name() const override { return "ReductionToOneDevice"; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  void all_reduce(ReduceOp op, detail::CollectiveStep& step) override;
  void all_gather(int axis, detail::CollectiveStep& step) override;

 private:
  std::optional<Device> reduce_to_device_;
};

/// The default for replicas on host devices: the replica threads cooperate, each reducing its
/// own slice of every buffer across all replicas (in replica order) and writing that slice of the
/// result to every replica, so the whole all-reduce moves each byte once, near memory bandwidth.
/// \throws InvalidArgumentError (from `all_reduce`) when a replica's buffer is not in host memory.
class InProcessAllReduce : public CrossDeviceOps {
 public:
  std::string name() const override { return "InProcessAllReduce"; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  void all_reduce(ReduceOp op, detail::CollectiveStep& step) override;
  void all_gather(int axis, detail::CollectiveStep& step) override;
};

/// All-reduce with NVIDIA NCCL, one communicator per replica GPU (which must be distinct
/// physical GPUs), collectives on the replicas' streams. TF's `NcclAllReduce`: `num_packs` = k >= 1
/// concatenates each run of same-dtype tensors into one buffer reduced in k chunks; 0 reduces
/// tensor by tensor. MEAN uses `ncclAvg` where that is exact (a power-of-two number of replicas),
/// else a sum and a division. Host tensors in a nest (e.g. numbers) are reduced on the host.
/// Every collective waits for its completion with the step's deadline: past it, the communicators
/// are aborted and DeadlineExceededError is raised (the next collective creates new ones).
/// `reduce` into the host goes through one device (as TF's does). Without CUDA/NCCL in the build
/// its operations throw UnimplementedError.
/// \throws InvalidArgumentError (constructor) when `num_packs` < 0; (all_reduce) when two replicas
/// share a physical GPU.
class NcclAllReduce : public CrossDeviceOps {
 public:
  explicit NcclAllReduce(int num_packs = 1);
  ~NcclAllReduce() override;
  std::string name() const override { return "NcclAllReduce"; }
  int num_packs() const noexcept { return num_packs_; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  void all_reduce(ReduceOp op, detail::CollectiveStep& step) override;
  void all_gather(int axis, detail::CollectiveStep& step) override;
  /// One grouped NCCL all-reduce over every replica's GPU, issued from the calling thread, when
  /// every input and output is on its replica's GPU and those are distinct physical GPUs (packed
  /// per `num_packs`); false otherwise (and without NCCL in the build).
  bool batch_all_reduce(ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& inputs,
                        const std::vector<Device>& devices, std::vector<std::vector<detail::UntypedTensor>>& outputs,
                        double timeout_s) override;

  struct Impl;  // communicators (src/cuda/nccl_all_reduce.cpp)

 private:
  int num_packs_;
  std::unique_ptr<Impl> impl_;
};

/// TF's hierarchical copy all-reduce (made for DGX-1-like topologies): the replicas form two
/// halves; for each tensor, one main device per half sums its half (in replica order), the first
/// main adds the second's partial sum, and every replica copies the total from its half's main
/// (main devices rotate with the tensor index). Works on any devices, through their backends;
/// results equal the other implementations' bit for bit on integer-valued inputs (the order of
/// floating-point sums differs). `num_packs` is validated and kept for TF compatibility; tensors
/// are reduced one by one. \throws InvalidArgumentError (constructor) when `num_packs` < 0;
/// (reduce, all_reduce) unless the number of replicas is even and at least 2.
class HierarchicalCopyAllReduce : public CrossDeviceOps {
 public:
  explicit HierarchicalCopyAllReduce(int num_packs = 1);
  std::string name() const override { return "HierarchicalCopyAllReduce"; }
  int num_packs() const noexcept { return num_packs_; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  void all_reduce(ReduceOp op, detail::CollectiveStep& step) override;
  void all_gather(int axis, detail::CollectiveStep& step) override;

 private:
  int num_packs_;
};

namespace detail {
/// The contract's default choice for a set of replica devices.
std::shared_ptr<CrossDeviceOps> select_cross_device_ops(const std::vector<Device>& devices);
/// Concatenates `parts` (equal rank, equal dims except `axis`) along `axis` into `out`.
void concat_into(const std::vector<const UntypedTensor*>& parts, int axis, const UntypedTensor& out);
}  // namespace detail

}  // namespace mirrored

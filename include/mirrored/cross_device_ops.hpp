#pragma once
/// \file
/// Cross-device operations: how values from the replicas' devices are combined. A strategy owns
/// one `CrossDeviceOps`; replica-context collectives call it from every replica thread at once,
/// cross-replica reductions call it from the caller's thread.
///
/// Determinism: `InProcessAllReduce`, `ReductionToOneDevice` and (for a fixed number of replicas)
/// `HierarchicalCopyAllReduce` sum in a fixed order, so their results are bitwise identical from
/// run to run; the first two sum in replica order, so they also agree with each other bit for bit.
/// `NcclAllReduce` sums in the order of NCCL's ring or tree, which depends on the number of
/// ranks, the message size and NCCL's version: floating-point results may differ from the other
/// backends in the last bits (integer-valued inputs, and integer dtypes, give identical results).

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mirrored/collective_step.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/device.hpp"
#include "mirrored/reduce_op.hpp"

namespace mirrored {

/// Interface of a cross-device reduction backend. Operations a backend does not support throw
/// UnimplementedError naming the backend and the operation.
class CrossDeviceOps {
 public:
  virtual ~CrossDeviceOps();
  /// The backend's name, e.g. "InProcessAllReduce".
  virtual std::string name() const = 0;

  /// Cross-replica context: reduces one tensor per replica (equal dtypes and shapes, validated by
  /// the caller) into `out`; MEAN divides by the number of tensors.
  virtual void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                      const detail::UntypedTensor& out);

  /// Cross-replica context, on `parts` threads at once (the strategy's idle replica threads, for
  /// a large reduction): part `part` of `reduce(op, per_replica, out)`, so that together they
  /// make the same result. The default does the whole `reduce` in part 0 and nothing in the
  /// others; a backend that can split the work overrides it.
  virtual void reduce_part(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
                           const detail::UntypedTensor& out, int part, int parts);

  /// Replica context, called by every replica thread: fills every replica's `outputs[i]` with
  /// the reduction of all replicas' `inputs[i]` (validated equal in dtype and shape). Returns once
  /// this replica's outputs are final.
  virtual void all_reduce(ReduceOp op, CollectiveStep& step);

  /// Replica context, called by every replica thread: fills this replica's `outputs[i]` with the
  /// concatenation along `axis` of every replica's `inputs[i]`, in replica order. Every replica's
  /// output is allocated (on its input's device, with its final shape) before the call.
  virtual void all_gather(int axis, CollectiveStep& step);

  /// Replica context, called by every replica thread: fills this replica's `outputs[0]` with its
  /// piece of the reduction of every replica's `inputs[0]` (flattened; validated equal in dtype
  /// and shape): elements [begin, begin + split()[r]) where begin is the sum of the pieces of the
  /// replicas before it (`CollectiveStep::split`). Sums in replica order. The default sums each
  /// replica's own piece on its output's device (reading the other replicas' inputs in place where
  /// its kernels can, else through a staging copy), so every backend has it; a backend with a
  /// collective of its own (NCCL's reduce-scatter) overrides it.
  virtual void reduce_scatter(ReduceOp op, CollectiveStep& step);

  /// Replica context, called by every replica thread for an optimizer step (`step.update(r)`,
  /// <mirrored/detail/optimizer_step.hpp>; the gradients are `inputs`): sums every replica's
  /// gradients (SUM, in replica order) and applies the update to every replica's copies in one
  /// pass, the sum of each slice updating the parameters (and the slots: every copy, or each
  /// replica's own slice when they are sharded) while it is still in cache, and returns true; or
  /// returns false, having done nothing, when the backend has no such path for these tensors (the
  /// library then reduces and updates in separate passes, with the same result). Every replica
  /// gets the same answer from the same posts. The default returns false.
  virtual bool all_reduce_and_update(CollectiveStep& step);

  /// Cross-replica context (`batch_reduce_to` onto destinations on the replicas' devices
  /// `devices`): sets `outputs[i][r]`, a new tensor on `devices[r]`, to the reduction of
  /// `inputs[i][0..N)` (validated equal in dtype and shape) and returns true; or returns false,
  /// having done nothing, when this backend has no path of its own for these tensors (the caller
  /// then reduces with `reduce` and copies). Waits for the devices until `deadline` (the
  /// call's, made where it entered the library). The default returns false.
  virtual bool batch_all_reduce(ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& inputs,
                                const std::vector<Device>& devices,
                                std::vector<std::vector<detail::UntypedTensor>>& outputs, const Deadline& deadline);

  /// True when `all_reduce` stays correct with outputs that are the inputs themselves (every
  /// replica's `outputs(r)[i]` the same tensor as its `inputs(r)[i]`, or some of them): the library
  /// then reduces scratch values (packs, gradients nobody else holds) in place, saving the output
  /// allocation and its write-allocate traffic. The default is false.
  virtual bool reduces_in_place() const noexcept { return false; }

 protected:
  [[noreturn]] void unsupported(const char* op) const;
};

/// Reduces by copying every replica's value to one device, summing there in replica order, and
/// copying the result back out. Works for any mix of devices; bitwise reproducible.
class ReductionToOneDevice : public CrossDeviceOps {
 public:
  /// `reduce_to_device`: where sums are formed (default: the first replica's device).
  /// \throws InvalidArgumentError for an unparsable device.
  explicit ReductionToOneDevice(std::optional<std::string> reduce_to_device = std::nullopt);
  std::string name() const override { return "ReductionToOneDevice"; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  void all_reduce(ReduceOp op, CollectiveStep& step) override;
  void all_gather(int axis, CollectiveStep& step) override;

 private:
  std::optional<Device> reduce_to_device_;
};

/// The default for replicas on host devices: the replica threads cooperate, each reducing its
/// own slice of every buffer across all replicas (in replica order) and writing that slice of the
/// result to every replica, so the whole all-reduce moves each byte once, near memory bandwidth.
/// Sums in replica order: bitwise reproducible, and equal to `ReductionToOneDevice`'s.
/// \throws InvalidArgumentError (from `all_reduce`) when a replica's buffer is not in host memory.
class InProcessAllReduce : public CrossDeviceOps {
 public:
  std::string name() const override { return "InProcessAllReduce"; }
  /// True: each slice of every buffer is read by its one owner before that owner writes it.
  bool reduces_in_place() const noexcept override { return true; }
  void reduce(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica,
              const detail::UntypedTensor& out) override;
  /// Host memory: each part sums its cache-line-aligned share of the elements.
  void reduce_part(ReduceOp op, const std::vector<detail::UntypedTensor>& per_replica, const detail::UntypedTensor& out,
                   int part, int parts) override;
  void all_reduce(ReduceOp op, CollectiveStep& step) override;
  void all_gather(int axis, CollectiveStep& step) override;
  /// True when every replica's tensors are host memory: replica r sums its BALANCED slice of each
  /// gradient in blocks of 16 KiB and updates that slice of its parameters and slots while the sum
  /// is in cache, then copies the updated slice to every other replica's copies (bitwise the
  /// all-reduce followed by the update).
  bool all_reduce_and_update(CollectiveStep& step) override;
};

/// All-reduce with NVIDIA NCCL, one communicator per replica GPU (which must be distinct
/// physical GPUs), collectives on the replicas' streams. TF's `NcclAllReduce`: `num_packs` = k >= 1
/// concatenates each run of same-dtype tensors into one buffer reduced in k chunks; 0 reduces
/// tensor by tensor. MEAN uses `ncclAvg` where that is exact (a power-of-two number of replicas),
/// else a sum and a division. Host tensors in a nest (e.g. numbers) are reduced on the host.
/// The order of floating-point sums is NCCL's (ring or tree), not replica order.
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
  void all_reduce(ReduceOp op, CollectiveStep& step) override;
  void all_gather(int axis, CollectiveStep& step) override;
  /// One grouped NCCL call over every replica's GPU: `ncclReduceScatter` where every piece has the
  /// same size, else one `ncclReduce` per piece onto its replica's GPU.
  void reduce_scatter(ReduceOp op, CollectiveStep& step) override;
  /// A sharded optimizer step (`shard_optimizer_state`) whose every tensor is on its replica's GPU,
  /// those being distinct physical GPUs: per pack, a grouped NCCL reduce-scatter of the gradients,
  /// the fused update of this replica's slices and a grouped NCCL all-gather of the updated slices,
  /// ordered on the replica's stream without a host wait between them; one bounded wait for the
  /// whole step, after which the results are copied into the variables (a step that fails changes
  /// no parameter and no slot). False otherwise (unsharded steps, other devices, simulated GPUs,
  /// and without NCCL in the build): the library's separate passes.
  bool all_reduce_and_update(CollectiveStep& step) override;
  /// One grouped NCCL all-reduce over every replica's GPU, issued from the calling thread, when
  /// every input and output is on its replica's GPU and those are distinct physical GPUs (packed
  /// per `num_packs`); false otherwise (and without NCCL in the build).
  bool batch_all_reduce(ReduceOp op, const std::vector<std::vector<detail::UntypedTensor>>& inputs,
                        const std::vector<Device>& devices, std::vector<std::vector<detail::UntypedTensor>>& outputs,
                        const Deadline& deadline) override;

  struct Impl;  // communicators (src/collectives/nccl/nccl_all_reduce.cpp)

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
  void all_reduce(ReduceOp op, CollectiveStep& step) override;
  void all_gather(int axis, CollectiveStep& step) override;

 private:
  int num_packs_;
};

}  // namespace mirrored

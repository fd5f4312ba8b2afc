// NcclAllReduce with NCCL: collectives enqueued by each replica thread on its own stream (or,
// for batch_all_reduce, every rank's from the calling thread), packed per num_packs, on the
// communicators of nccl_comms.hpp; every wait is bounded by the collective's one deadline, and a
// failed or late collective aborts the communicators (the next one creates new ones).
//
// A single replica's values are copied, not sent through NCCL, unless MIRRORED_NCCL_SINGLE_RANK=1
// was set when the NcclAllReduce was made: a test-only switch that sends a single GPU replica
// through the real NCCL path (a one-rank communicator), so that a machine with one GPU exercises
// creation, the collectives, abort and re-creation, and the deadline.
#include <algorithm>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "collectives/deferred_completion.hpp"
#include "collectives/nccl/nccl_comms.hpp"
#include "collectives/nccl/nccl_ops.hpp"
#include "collectives/ops_selection.hpp"
#include "collectives/packing.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "device/placement.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

namespace detail {
bool nccl_compiled_in() noexcept { return true; }
}  // namespace detail

namespace {

using detail::CudaBackend;
using detail::str_cat;
using detail::UntypedTensor;
using detail::nccl::Comms;
using detail::nccl::create_comms;
using detail::nccl::enqueue_group;
using detail::nccl::Limits;
using Clock = std::chrono::steady_clock;
using detail::nccl::is_power_of_two;
using detail::nccl::nccl_type;
using detail::nccl::wait_for_completion;

// The host wait for rank `me`'s NCCL work (errors, the deadline, aborting the communicators on
// either): now, or, under a DeferredCompletion (an asynchronous collective's lane), once the lane
// has published the result, whose readers are ordered after the work on the device already.
void wait_or_defer_completion(const std::shared_ptr<Comms>& comms, int me, CudaBackend& be, const Limits& limits,
                              const char* what) {
  // The step is gone by then; its group (the strategy's) is not, and a failure of another replica
  // aborts it.
  const Limits later{limits.timeout_s, limits.deadline, nullptr, limits.step ? limits.step->group() : nullptr};
  const bool deferred = detail::DeferredCompletion::defer([comms, me, &be, later, what] {
    detail::CudaDeviceGuard guard(be.physical(), be.device());
    wait_for_completion(*comms, me, be, later, what);
  });
  if (!deferred) wait_for_completion(*comms, me, be, limits, what);
}

}  // namespace

namespace {

// Whether leaf `leaf` of every replica's inputs and outputs is on that replica's GPU, the check
// every NCCL call makes before choosing NCCL (every replica decides from the same posts, so all
// take the same path). `home` (one entry per replica) collects each replica's GPU index; a leaf
// on the host, on two GPUs of one replica, or on other GPUs than `home` already holds does not
// qualify (and leaves `home` as it was).
bool leaf_on_replica_gpus(const CollectiveStep& step, std::size_t leaf, std::vector<int>& home) {
  const int n = static_cast<int>(home.size());
  std::vector<int> idx(n, -1);
  for (int r = 0; r < n; ++r) {
    for (const UntypedTensor* t : {&step.inputs(r)[leaf], &step.outputs(r)[leaf]}) {
      const Device& d = t->device();
      if (d.is_host()) return false;
      if (idx[r] < 0) idx[r] = d.index();
      if (idx[r] != d.index()) return false;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (home[r] >= 0 && home[r] != idx[r]) return false;
  }
  for (int r = 0; r < n; ++r) home[r] = idx[r];
  return true;
}

std::vector<int> physical_of(const std::vector<int>& logical, const char* what) {
  std::vector<int> physical;
  std::set<int> seen;
  for (std::size_t r = 0; r < logical.size(); ++r) {
    const int p = detail::physical_gpu_of(Device(DeviceType::GPU, logical[r]));
    if (!seen.insert(p).second) {
      std::size_t other = 0;
      while (physical[other] != p) ++other;
      throw InvalidArgumentError(str_cat(
          "NcclAllReduce::", what, ": replicas ", other, " (GPU:", logical[other], ") and ", r, " (GPU:", logical[r],
          ") are logical GPUs of the same physical GPU ", p,
          "; NCCL cannot run two ranks on one GPU. Use ReductionToOneDevice (the default for logical GPUs that share "
          "a chip) or one replica per physical GPU"));
    }
    physical.push_back(p);
  }
  return physical;
}

// What a replica's collective does once it chose NCCL, the same for all_reduce, all_gather and
// reduce_scatter: the communicators of the replicas' GPUs (`home`, logical), acquired within the
// step's deadline, which then bounds the whole collective; and this replica's GPU made current
// until the collective ends. `Impl` is NcclAllReduce's.
struct NcclCall {
  template <class Impl>
  NcclCall(Impl& impl, CollectiveStep& step, const std::vector<int>& home, const char* what)
      : physical(physical_of(home, what)),
        started(Clock::now()),
        comms(impl.acquire(home, physical, step.timeout_seconds(), step.aborted(), what)),
        limits(Limits::until(step.deadline(), started, &step)),
        be(detail::cuda_backend(home[static_cast<std::size_t>(step.replica())])),
        guard(be.physical(), be.device()) {}

  std::vector<int> physical;
  Clock::time_point started;
  std::shared_ptr<Comms> comms;
  Limits limits;
  CudaBackend& be;
  detail::CudaDeviceGuard guard;
};

// One rank's part of a packed NCCL all-reduce: leaf k is `ins[k]` -> `outs[k]` (on the rank's
// GPU); a concatenated pack gets its own input and output buffers, filled before the NCCL calls
// and split after them, all in the rank's stream order.
class RankPacks {
 public:
  RankPacks(CudaBackend& be, const std::vector<detail::Pack>& packs, std::vector<const UntypedTensor*> ins,
            std::vector<const UntypedTensor*> outs)
      : be_(be), packs_(packs), ins_(std::move(ins)), outs_(std::move(outs)), bufs_(packs.size()) {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const auto& pack = packs_[p];
      const UntypedTensor& first = *ins_[pack.leaves.front()];
      if (!pack.concatenated()) {
        bufs_[p].in = first.data();
        bufs_[p].out = outs_[pack.leaves.front()]->data();
        continue;
      }
      bufs_[p].in_t = detail::make_untyped(first.dtype, {pack.numel}, be_.device());
      bufs_[p].out_t = detail::make_untyped(first.dtype, {pack.numel}, be_.device());
      bufs_[p].in = bufs_[p].in_t.data();
      bufs_[p].out = bufs_[p].out_t.data();
      std::size_t offset = 0;
      for (std::size_t k : pack.leaves) {
        be_.copy_within(static_cast<unsigned char*>(bufs_[p].in) + offset, ins_[k]->data(), ins_[k]->bytes());
        offset += ins_[k]->bytes();
      }
    }
  }

  CudaBackend& backend() const noexcept { return be_; }

  // The NCCL calls (inside the caller's group).
  ncclResult_t enqueue(ReduceOp op, int n, ncclComm_t comm) const {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const DType dtype = dtype_of(p);
      const std::size_t elem = dtype_size(dtype);
      const ncclRedOp_t redop = uses_avg(op, n, dtype) ? ncclAvg : ncclSum;
      for (const auto& [b, e] : packs_[p].chunks) {
        const ncclResult_t r =
            ncclAllReduce(static_cast<const unsigned char*>(bufs_[p].in) + b * elem,
                          static_cast<unsigned char*>(bufs_[p].out) + b * elem, static_cast<std::size_t>(e - b),
                          nccl_type(dtype), redop, comm, be_.stream_for_call());
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
    }
    return ncclSuccess;
  }

  // After the NCCL calls: MEAN without ncclAvg divides; concatenated packs are split.
  void finish(ReduceOp op, int n) const {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const auto& pack = packs_[p];
      const DType dtype = dtype_of(p);
      if (op == ReduceOp::MEAN && !uses_avg(op, n, dtype)) be_.divide(dtype, bufs_[p].out, pack.numel, n);
      if (!pack.concatenated()) continue;
      std::size_t offset = 0;
      for (std::size_t k : pack.leaves) {
        be_.copy_within(outs_[k]->data(), static_cast<const unsigned char*>(bufs_[p].out) + offset, outs_[k]->bytes());
        offset += outs_[k]->bytes();
      }
    }
  }

 private:
  struct Buffers {
    void* in = nullptr;
    void* out = nullptr;
    UntypedTensor in_t, out_t;  // owners when concatenated
  };
  DType dtype_of(std::size_t p) const { return ins_[packs_[p].leaves.front()]->dtype; }
  // ncclAvg pre-multiplies floats by 1/n, which is exact only for a power of two; integers keep
  // the sum-then-truncating-division of the other implementations.
  static bool uses_avg(ReduceOp op, int n, DType dtype) {
    return op == ReduceOp::MEAN && is_power_of_two(n) && dtype_is_floating(dtype);
  }

  CudaBackend& be_;
  const std::vector<detail::Pack>& packs_;
  std::vector<const UntypedTensor*> ins_, outs_;
  std::vector<Buffers> bufs_;
};

}  // namespace

namespace detail::nccl {

ncclResult_t enqueue_reduce_scatter(const void* in, void* out, const std::vector<int64_t>& split, int me, DType dtype,
                                    ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  const bool equal = std::all_of(split.begin(), split.end(), [&](int64_t c) { return c == split[0]; });
  if (equal) {
    return ncclReduceScatter(in, out, static_cast<std::size_t>(split[static_cast<std::size_t>(me)]), nccl_type(dtype),
                             op, comm, stream);
  }
  // Uneven pieces (rows that do not divide by the replicas): one reduction per piece onto its
  // rank, in the caller's group; each rank sends every piece and receives its own.
  const auto elem = static_cast<int64_t>(dtype_size(dtype));
  int64_t begin = 0;
  for (int root = 0; root < static_cast<int>(split.size()); ++root) {
    const auto count = static_cast<std::size_t>(split[static_cast<std::size_t>(root)]);
    const void* send = static_cast<const unsigned char*>(in) + begin * elem;
    begin += split[static_cast<std::size_t>(root)];
    if (count == 0) continue;
    // The receive buffer is read on the root only.
    void* recv = root == me ? out : const_cast<void*>(send);
    const ncclResult_t r = ncclReduce(send, recv, count, nccl_type(dtype), op, root, comm, stream);
    if (r != ncclSuccess && r != ncclInProgress) return r;
  }
  return ncclSuccess;
}

ncclResult_t enqueue_all_gather(const void* send, void* recv, const std::vector<int64_t>& split, int me, DType dtype,
                                ncclComm_t comm, cudaStream_t stream) {
  const bool equal = std::all_of(split.begin(), split.end(), [&](int64_t c) { return c == split[0]; });
  if (equal) {
    return ncclAllGather(send, recv, static_cast<std::size_t>(split[static_cast<std::size_t>(me)]), nccl_type(dtype),
                         comm, stream);
  }
  const auto elem = static_cast<int64_t>(dtype_size(dtype));
  int64_t begin = 0;
  for (int root = 0; root < static_cast<int>(split.size()); ++root) {
    const auto count = static_cast<std::size_t>(split[static_cast<std::size_t>(root)]);
    void* at = static_cast<unsigned char*>(recv) + begin * elem;
    begin += split[static_cast<std::size_t>(root)];
    if (count == 0) continue;
    // The send buffer is read on the root only.
    const ncclResult_t r = ncclBroadcast(root == me ? send : at, at, count, nccl_type(dtype), root, comm, stream);
    if (r != ncclSuccess && r != ncclInProgress) return r;
  }
  return ncclSuccess;
}

}  // namespace detail::nccl

NcclAllReduce::NcclAllReduce(int num_packs) : num_packs_(num_packs), impl_(std::make_unique<Impl>()) {
  MIRRORED_ENFORCE(num_packs >= 0, InvalidArgumentError, "NcclAllReduce: num_packs must be >= 0, got ", num_packs);
}

NcclAllReduce::~NcclAllReduce() = default;

void NcclAllReduce::reduce(ReduceOp op, const std::vector<UntypedTensor>& per_replica, const UntypedTensor& out) {
  // Into one destination, TF's NcclAllReduce reduces on one device too.
  ReductionToOneDevice().reduce(op, per_replica, out);
}

void NcclAllReduce::all_reduce(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const std::size_t leaves = step.inputs(me).size();
  if (n < impl_->min_ranks()) {
    for (std::size_t i = 0; i < leaves; ++i) {
      const auto& in = step.inputs(0)[i];
      const auto& out = step.outputs(0)[i];
      detail::copy_between(out.data(), out.device(), in.data(), in.device(), out.bytes());
    }
    return;
  }
  // Leaves whose every tensor is on its replica's GPU go through NCCL; the rest (numbers, host
  // tensors) through the host. Every replica classifies alike from the same posts.
  std::vector<int> home(n, -1);
  std::vector<std::size_t> on_gpus, elsewhere;
  for (std::size_t i = 0; i < leaves; ++i) {
    if (step.inputs(0)[i].numel == 0) continue;
    (leaf_on_replica_gpus(step, i, home) ? on_gpus : elsewhere).push_back(i);
  }
  if (!elsewhere.empty()) detail::all_reduce_via_first(op, step, elsewhere);
  if (on_gpus.empty()) return;

  NcclCall call(*impl_, step, home, "all_reduce");
  const std::shared_ptr<Comms>& comms = call.comms;
  const Limits& limits = call.limits;
  CudaBackend& be = call.be;
  std::vector<const UntypedTensor*> ins, outs;
  std::vector<detail::PackLeaf> described;
  for (std::size_t i : on_gpus) {
    ins.push_back(&step.inputs(me)[i]);
    outs.push_back(&step.outputs(me)[i]);
    described.push_back({step.inputs(me)[i].dtype, Device(DeviceType::GPU, home[me]), step.inputs(me)[i].numel});
  }
  const auto packs = detail::plan_packs(described, detail::nccl_pack_rule(num_packs_, step.bytes_per_pack()));
  RankPacks rank(be, packs, ins, outs);
  enqueue_group(*comms, {me}, limits, "all_reduce", [&](int, ncclComm_t comm) { return rank.enqueue(op, n, comm); });
  rank.finish(op, n);
  be.check(cudaEventRecord(comms->done[me], be.stream_for_call()), "cudaEventRecord");
  wait_or_defer_completion(comms, me, be, limits, "all_reduce");
}

bool NcclAllReduce::batch_all_reduce(ReduceOp op, const std::vector<std::vector<UntypedTensor>>& inputs,
                                     const std::vector<Device>& devices,
                                     std::vector<std::vector<UntypedTensor>>& outputs, const Deadline& deadline) {
  const int n = static_cast<int>(devices.size());
  if (n < impl_->min_ranks() || inputs.empty()) return false;
  // Only replicas on distinct physical GPUs with every input on its replica's GPU; anything else
  // (host replicas, logical GPUs of one chip, inputs elsewhere) takes the caller's host path.
  std::vector<int> logical, physical;
  std::set<int> seen;
  for (const Device& d : devices) {
    if (d.is_host()) return false;
    const int p = detail::physical_gpu_of(d);
    if (!seen.insert(p).second) return false;
    logical.push_back(d.index());
    physical.push_back(p);
  }
  for (const auto& per_replica : inputs)
    for (int r = 0; r < n; ++r)
      if (per_replica[static_cast<std::size_t>(r)].device() != devices[static_cast<std::size_t>(r)]) return false;
  if (!detail::nccl_can_run()) return false;  // simulated GPUs: the caller's host path

  std::vector<std::vector<UntypedTensor>> out(inputs.size());
  std::vector<std::size_t> leaves;  // non-empty values, reduced through NCCL
  std::vector<detail::PackLeaf> described;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    for (int r = 0; r < n; ++r) {
      const auto& in = inputs[i][static_cast<std::size_t>(r)];
      out[i].push_back(detail::make_untyped(in.dtype, in.shape, devices[static_cast<std::size_t>(r)]));
    }
    if (inputs[i][0].numel == 0) continue;
    leaves.push_back(i);
    described.push_back({inputs[i][0].dtype, devices[0], inputs[i][0].numel});
  }
  if (!leaves.empty()) {
    const auto started = Clock::now();
    std::shared_ptr<Comms> comms =
        impl_->acquire(logical, physical, deadline.timeout_seconds(), false, "batch_all_reduce");
    const Limits limits = Limits::until(deadline, started);  // one deadline for the whole collective
    const auto packs = detail::plan_packs(described, detail::nccl_pack_rule(num_packs_, 0));
    std::vector<std::unique_ptr<RankPacks>> ranks;
    for (int r = 0; r < n; ++r) {
      CudaBackend& be = detail::cuda_backend(logical[static_cast<std::size_t>(r)]);
      detail::CudaDeviceGuard guard(be.physical(), be.device());
      std::vector<const UntypedTensor*> ins, outs;
      for (std::size_t i : leaves) {
        ins.push_back(&inputs[i][static_cast<std::size_t>(r)]);
        outs.push_back(&out[i][static_cast<std::size_t>(r)]);
      }
      ranks.push_back(std::make_unique<RankPacks>(be, packs, ins, outs));
    }
    std::vector<int> all(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
    enqueue_group(*comms, all, limits, "batch_all_reduce",
                  [&](int r, ncclComm_t comm) { return ranks[static_cast<std::size_t>(r)]->enqueue(op, n, comm); });
    for (int r = 0; r < n; ++r) {
      CudaBackend& be = ranks[static_cast<std::size_t>(r)]->backend();
      detail::CudaDeviceGuard guard(be.physical(), be.device());
      ranks[static_cast<std::size_t>(r)]->finish(op, n);
      be.check(cudaEventRecord(comms->done[static_cast<std::size_t>(r)], be.stream_for_call()), "cudaEventRecord");
    }
    for (int r = 0; r < n; ++r)
      wait_for_completion(*comms, r, ranks[static_cast<std::size_t>(r)]->backend(), limits, "batch_all_reduce");
  }
  outputs = std::move(out);
  return true;
}

void NcclAllReduce::all_gather(int axis, CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const auto& outs = step.outputs(me);
  // One tensor's gather through NCCL: its parts, and where each replica's rows go in the output.
  struct Gather {
    const UntypedTensor* out;
    std::vector<const UntypedTensor*> parts;
    int64_t outer = 1, out_row = 0;
    std::vector<int64_t> row, offset;  // elements per outer index, and where they go in an output row
    bool equal = true;
    std::vector<UntypedTensor> staged;  // broadcast targets when parts interleave in the output
  };
  std::vector<Gather> gathers;
  std::vector<int> home;
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::vector<const UntypedTensor*> parts;
    for (int r = 0; r < n; ++r) parts.push_back(&step.inputs(r)[i]);
    // NCCL when every replica's input and output are on that replica's GPU (all outputs exist
    // before the call).
    std::vector<int> h(n, -1);
    const bool nccl =
        n >= impl_->min_ranks() && outs[i].numel > 0 && leaf_on_replica_gpus(step, i, h) && (home.empty() || h == home);
    if (!nccl) {
      detail::concat_into(parts, axis, outs[i]);
      continue;
    }
    home = h;
    Gather g;
    g.out = &outs[i];
    g.parts = std::move(parts);
    int64_t inner = 1;
    for (int d = 0; d < axis; ++d) g.outer *= outs[i].shape[d];
    for (std::size_t d = axis + 1; d < outs[i].shape.size(); ++d) inner *= outs[i].shape[d];
    g.row.resize(n);
    g.offset.resize(n);
    for (int r = 0; r < n; ++r) {
      g.row[r] = g.parts[r]->shape[axis] * inner;
      g.offset[r] = g.out_row;
      g.out_row += g.row[r];
      g.equal = g.equal && g.row[r] == g.row[0];
    }
    gathers.push_back(std::move(g));
  }
  if (gathers.empty()) return;
  // Every tensor goes out in one NCCL group, with one completion wait, whatever their number.
  NcclCall call(*impl_, step, home, "all_gather");
  const std::shared_ptr<Comms>& comms = call.comms;
  const Limits& limits = call.limits;
  CudaBackend& be = call.be;
  const cudaStream_t stream = be.stream_for_call();
  for (Gather& g : gathers) {
    if (g.outer == 1 && g.equal) continue;
    g.staged.resize(n);
    for (int root = 0; root < n; ++root) {
      if (g.outer > 1 && g.row[root] > 0)
        g.staged[root] = detail::make_untyped(g.out->dtype, {g.outer * g.row[root]}, be.device());
    }
  }
  enqueue_group(*comms, {me}, limits, "all_gather", [&](int, ncclComm_t comm) {
    for (const Gather& g : gathers) {
      const DType dtype = g.out->dtype;
      const std::size_t elem = dtype_size(dtype);
      if (g.outer == 1 && g.equal) {
        const ncclResult_t r = ncclAllGather(g.parts[me]->data(), g.out->data(), static_cast<std::size_t>(g.row[me]),
                                             nccl_type(dtype), comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
        continue;
      }
      for (int root = 0; root < n; ++root) {
        if (g.row[root] == 0) continue;
        void* recv =
            g.outer == 1 ? static_cast<unsigned char*>(g.out->data()) + g.offset[root] * elem : g.staged[root].data();
        const void* send = root == me ? g.parts[me]->data() : recv;
        const ncclResult_t r = ncclBroadcast(send, recv, static_cast<std::size_t>(g.outer * g.row[root]),
                                             nccl_type(dtype), root, comm, stream);
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
    }
    return ncclSuccess;
  });
  for (const Gather& g : gathers) {
    if (g.outer <= 1) continue;
    // Interleave the broadcast parts into the output rows.
    const std::size_t elem = dtype_size(g.out->dtype);
    for (int root = 0; root < n; ++root) {
      if (g.row[root] == 0) continue;
      be.check(
          cudaMemcpy2DAsync(static_cast<unsigned char*>(g.out->data()) + g.offset[root] * elem,
                            static_cast<std::size_t>(g.out_row) * elem, g.staged[root].data(),
                            static_cast<std::size_t>(g.row[root]) * elem, static_cast<std::size_t>(g.row[root]) * elem,
                            static_cast<std::size_t>(g.outer), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpy2DAsync");
    }
  }
  be.check(cudaEventRecord(comms->done[me], stream), "cudaEventRecord");
  wait_or_defer_completion(comms, me, be, limits, "all_gather");
}

void NcclAllReduce::reduce_scatter(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const UntypedTensor& in = step.inputs(me)[0];
  const UntypedTensor& out = step.outputs(me)[0];
  // NCCL when every replica's input and output are on that replica's GPU; else the generic sum of
  // each piece.
  std::vector<int> home(n, -1);
  if (n < impl_->min_ranks() || in.numel == 0 || !leaf_on_replica_gpus(step, 0, home)) {
    CrossDeviceOps::reduce_scatter(op, step);
    return;
  }
  const std::vector<int64_t>& split = step.split();
  NcclCall call(*impl_, step, home, "reduce_scatter");
  const std::shared_ptr<Comms>& comms = call.comms;
  const Limits& limits = call.limits;
  CudaBackend& be = call.be;
  const cudaStream_t stream = be.stream_for_call();
  const DType dtype = in.dtype;
  // ncclAvg as the all-reduce uses it: exact only for a power of two of floats.
  const bool avg = op == ReduceOp::MEAN && is_power_of_two(n) && dtype_is_floating(dtype);
  enqueue_group(*comms, {me}, limits, "reduce_scatter", [&](int, ncclComm_t comm) {
    return detail::nccl::enqueue_reduce_scatter(in.data(), out.data(), split, me, dtype, avg ? ncclAvg : ncclSum, comm,
                                                stream);
  });
  if (op == ReduceOp::MEAN && !avg && out.numel > 0) be.divide(dtype, out.data(), out.numel, n);
  be.check(cudaEventRecord(comms->done[me], stream), "cudaEventRecord");
  wait_or_defer_completion(comms, me, be, limits, "reduce_scatter");
}

}  // namespace mirrored

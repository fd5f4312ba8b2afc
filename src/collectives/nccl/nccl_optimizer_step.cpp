// NcclAllReduce's optimizer step with sharded state (CrossDeviceOps::all_reduce_and_update): per
// pack of variables, in the order of the replica's stream and without a host wait between them,
//
//   pack            the gradients copied into the shard-major layout (optimizer_layout.hpp)
//   reduce-scatter  one NCCL group: this rank receives the sum of its slices
//   update          the backend's fused optimizer kernel on copies of this rank's slices of the
//                   parameters and of its slices of the slots
//   all-gather      one NCCL group: every rank's updated slices, into the layout
//
// then the step counter, one event and one bounded wait for the whole step, and only then the
// commit: every pack's gathered slices copied into the parameters and the updated slots back
// (a step that fails changes nothing; the copies cost a pass over the parameters, which the
// generic path's unpacking makes too, and keep one transient copy of the parameters and of this
// rank's slots until the wait). The reduce-scatter and
// the all-gather are two groups, not one: NCCL orders nothing inside a group, and the update
// must come between them. Stream order does it, as for every kernel; the host only enqueues.
// The layout and the update are the device-generic step's (CollectivePlan::apply_sharded), so on
// integer-valued gradients the weights are bitwise those of the unsharded step.
#include <array>
#include <set>
#include <vector>

#include "collectives/nccl/nccl_ops.hpp"
#include "collectives/optimizer_layout.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "device/placement.hpp"
#include "mirrored/detail/optimizer_step.hpp"

namespace mirrored {
namespace {

// The logical GPU every tensor of `s` lives on, or -1 when they are not all on one GPU.
int only_gpu_of(const detail::OptimizerStep& s) {
  int gpu = -1;
  bool one = true;
  auto see = [&](const detail::UntypedTensor& t) {
    if (!t.storage) return;
    const Device& d = t.device();
    if (d.is_host() || (gpu >= 0 && d.index() != gpu)) {
      one = false;
      return;
    }
    gpu = d.index();
  };
  for (std::size_t v = 0; v < s.params.size(); ++v) {
    see(s.grads[v]);
    see(s.params[v]);
    for (const detail::UntypedTensor& slot : s.slots[v]) see(slot);
  }
  see(s.step_in);
  see(s.step_out);
  return one ? gpu : -1;
}

}  // namespace

bool NcclAllReduce::all_reduce_and_update(CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const detail::OptimizerStep& mine = *step.update(me);
  // Unsharded steps reduce with one all-reduce and update every copy without another wait: the
  // library's separate passes are as good there.
  if (!mine.sharded || n < impl_->min_ranks() || !detail::nccl_can_run()) return false;
  // Every replica decides from the same posts: each one's tensors all on its own GPU, and those
  // GPUs distinct physical GPUs (else the separate passes, whose collectives say what is wrong).
  std::vector<int> home(static_cast<std::size_t>(n), -1), physical;
  std::set<int> seen;
  for (int r = 0; r < n; ++r) {
    const int gpu = only_gpu_of(*step.update(r));
    if (gpu < 0) return false;
    const int p = detail::physical_gpu_of(Device(DeviceType::GPU, gpu));
    if (!seen.insert(p).second) return false;
    home[static_cast<std::size_t>(r)] = gpu;
    physical.push_back(p);
  }
  const auto started = std::chrono::steady_clock::now();
  std::shared_ptr<detail::nccl::Comms> comms =
      impl_->acquire(home, physical, step.timeout_seconds(), step.aborted(), "apply_gradients");
  // One deadline for the whole step.
  const detail::nccl::Limits limits = detail::nccl::Limits::until(step.deadline(), started, &step);
  detail::CudaBackend& be = detail::cuda_backend(home[static_cast<std::size_t>(me)]);
  detail::CudaDeviceGuard guard(be.physical(), be.device());
  const cudaStream_t stream = be.stream_for_call();
  const Device device = be.device();
  const DType dtype = mine.dtype;
  const auto* step_in = static_cast<const int64_t*>(mine.step_in.data());
  // Each pack's results, written into the variables only once the whole step has completed: a
  // step that fails (a deadline, an aborted communicator, an error of any call) changes no
  // parameter and no slot, although kernels enqueued behind an aborted collective may still run
  // on these buffers.
  struct Staged {
    const detail::Pack* pack;
    detail::ShardedPack layout;
    detail::UntypedTensor gathered{};          // every shard's updated slices
    std::vector<detail::SlotTensors> slots{};  // this replica's updated slots
  };
  const std::vector<detail::Pack> packs = detail::optimizer_packs(mine);
  std::vector<Staged> staged;
  staged.reserve(packs.size());
  for (const detail::Pack& pack : packs) {
    Staged& st = staged.emplace_back(Staged{.pack = &pack, .layout = detail::sharded_pack(mine, pack, n)});
    const detail::ShardedPack& layout = st.layout;
    std::vector<const detail::UntypedTensor*> grads, params;
    for (std::size_t v : pack.leaves) {
      grads.push_back(&mine.grads[v]);
      params.push_back(&mine.params[v]);
      detail::SlotTensors copies;
      for (std::size_t k = 0; k < copies.size(); ++k) {
        const detail::UntypedTensor& slot = mine.slots[v][k];
        if (!slot.storage) continue;
        copies[k] = detail::make_untyped(slot.dtype, slot.shape, device);
        detail::copy_between(copies[k].data(), device, slot.data(), slot.device(), slot.bytes());
      }
      st.slots.push_back(std::move(copies));
    }
    // Every buffer here is allocated for this stream and freed into its cache in stream order, so
    // a later allocation reuses it only after the NCCL calls and kernels that use it.
    const detail::UntypedTensor whole = detail::pack_shard_major(layout, grads, -1, dtype, device);
    const detail::UntypedTensor slice =
        detail::make_untyped(dtype, {layout.split()[static_cast<std::size_t>(me)]}, device);
    detail::nccl::enqueue_group(*comms, {me}, limits, "apply_gradients (reduce-scatter)", [&](int, ncclComm_t comm) {
      return detail::nccl::enqueue_reduce_scatter(whole.data(), slice.data(), layout.split(), me, dtype, ncclSum, comm,
                                                  stream);
    });
    // This replica's slices of the parameters, updated where the all-gather sends them from.
    const detail::UntypedTensor updated = detail::pack_shard_major(layout, params, me, dtype, device);
    const std::vector<detail::UpdateSegment> segments =
        detail::shard_update_segments(layout, mine, pack.leaves, me, slice, {&updated, &st.slots});
    if (!segments.empty())
      be.apply_optimizer(dtype, mine.update, segments.data(), static_cast<int>(segments.size()), step_in, nullptr);
    st.gathered = detail::make_untyped(dtype, {layout.numel()}, device);
    detail::nccl::enqueue_group(*comms, {me}, limits, "apply_gradients (all-gather)", [&](int, ncclComm_t comm) {
      return detail::nccl::enqueue_all_gather(updated.data(), st.gathered.data(), layout.split(), me, dtype, comm,
                                              stream);
    });
  }
  be.apply_optimizer(dtype, mine.update, nullptr, 0, step_in, static_cast<int64_t*>(mine.step_out.data()));
  be.check(cudaEventRecord(comms->done[static_cast<std::size_t>(me)], stream), "cudaEventRecord");
  detail::nccl::wait_for_completion(*comms, me, be, limits, "apply_gradients");
  // Complete: every pack's slices into the parameters (this replica's own too) and the updated
  // slots back, in stream order (whoever reads them next is ordered after, or synchronizes).
  for (const Staged& st : staged) {
    std::vector<const detail::UntypedTensor*> params;
    for (std::size_t v : st.pack->leaves) params.push_back(&mine.params[v]);
    detail::unpack_shard_major(st.layout, st.gathered, -1, params);
    for (std::size_t k = 0; k < st.pack->leaves.size(); ++k) {
      const std::size_t v = st.pack->leaves[k];
      for (std::size_t j = 0; j < st.slots[k].size(); ++j) {
        const detail::UntypedTensor& copy = st.slots[k][j];
        if (copy.storage)
          detail::copy_between(mine.slots[v][j].data(), mine.slots[v][j].device(), copy.data(), device, copy.bytes());
      }
    }
  }
  return true;
}

}  // namespace mirrored

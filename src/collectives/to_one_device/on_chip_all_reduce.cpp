// ReductionToOneDevice's all-reduce for logical GPUs that share one physical GPU: all their
// memory is one address space, so a single kernel on replica 0's stream reads every replica's
// input and writes every replica's output (N reads and N writes of the buffer: the least any
// all-reduce with N outputs can move). No host synchronisation: the streams are ordered with
// events.
//
//   every replica: record "ready" on its stream (its inputs are computed, its outputs allocated)
//   sync
//   replica 0:     its stream waits for every "ready"; fused kernel per tensor; record "done"
//                  (host tensors of the nest, e.g. numbers: summed on the host right here)
//   sync
//   replica r > 0: its stream waits for "done"
//
// An input freed after the collective is reused by its owner's stream only after "done", and an
// output is used by its owner's stream only after "done", so the caching allocators' stream
// ordering stays intact. If replica 0 fails after its stream was given kernels, the other
// replicas leave without waiting for "done" and free their buffers. So replica 0, before it lets
// them go (they are still in the last sync, or wait in CollectiveGroup::leave_failed until it has
// left), marks their buffers as used by its stream (record_stream_use: their allocators hold them
// back until its stream is past that point) and waits for its stream. (Marking them on success
// too would be safe but costly: their streams already wait for "done", and held-back blocks make
// a host that runs ahead allocate fresh memory every step.)
#include "collectives/to_one_device/on_chip_all_reduce.hpp"

#include <cstring>
#include <vector>

#include "device/gpu_platform.hpp"
#include "device/on_chip_gpu.hpp"
#include "device/placement.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {
namespace {

// Replica 0's part after the first sync: enqueue the reduction on its stream.
void reduce_on_first(ReduceOp op, CollectiveStep& step, const std::vector<OnChipGpu>& gpu,
                     const std::vector<char>& host_leaf) {
  const int n = step.num_replicas();
  const OnChipGpu& g0 = gpu[0];
  DeviceBackend& b0 = g0.backend();
  for (int r = 1; r < n; ++r) b0.wait_event(gpu[r].ready_event());
  std::vector<const void*> in(n);
  std::vector<void*> out(n);
  auto& host = backend_for(cpu0);
  for (std::size_t i = 0; i < host_leaf.size(); ++i) {
    const UntypedTensor& first = step.outputs(0)[i];
    if (first.numel == 0) continue;
    for (int r = 0; r < n; ++r) {
      in[r] = step.inputs(r)[i].data();
      out[r] = step.outputs(r)[i].data();
    }
    if (host_leaf[i]) {
      host.sum_n_mean(first.dtype, in.data(), n, out[0], first.numel, op == ReduceOp::MEAN ? n : 0);
      for (int r = 1; r < n; ++r) std::memcpy(out[r], out[0], first.bytes());
      continue;
    }
    g0.all_reduce_fused(first.dtype, in.data(), out.data(), n, first.numel, op == ReduceOp::MEAN ? n : 0);
  }
  b0.record_event(g0.done_event());
}

}  // namespace

bool on_chip_all_reduce(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  // Without GPUs (most CPU strategies) nothing qualifies: no need to look at every tensor. The GPU
  // platform is asked (made on first use) whatever the number of replicas.
  const int physical_gpus = physical_gpu_count();
  if (n < 2 || physical_gpus == 0) return false;
  const std::size_t leaves = step.inputs(0).size();
  // Qualifies when every GPU tensor is on one chip, each replica's GPU tensors on one logical
  // device, and every tensor of a host leaf on the host. All replicas see the same posts, so all
  // decide alike.
  std::vector<int> home(n, -1);
  std::vector<char> host_leaf(leaves, 0);
  int chip = -1;
  for (std::size_t i = 0; i < leaves; ++i) {
    int host = 0, gpu = 0;
    for (int r = 0; r < n; ++r) {
      for (const UntypedTensor* t : {&step.inputs(r)[i], &step.outputs(r)[i]}) {
        const Device& d = t->device();
        if (d.is_host()) {
          ++host;
          continue;
        }
        ++gpu;
        if (home[r] < 0) home[r] = d.index();
        if (home[r] != d.index()) return false;
        const int physical = physical_gpu_of(d);
        if (chip < 0) chip = physical;
        if (chip != physical) return false;
      }
    }
    if (host && gpu) return false;
    host_leaf[i] = host > 0;
  }
  if (chip < 0) return false;  // nothing on a GPU: the host path is as good
  for (int r = 0; r < n; ++r)
    if (home[r] < 0) return false;

  const int me = step.replica();
  std::vector<OnChipGpu> gpu;
  gpu.reserve(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) gpu.emplace_back(Device(DeviceType::GPU, home[r]));
  if (n > gpu[0].max_fused_replicas()) return false;
  gpu[me].backend().record_event(gpu[me].ready_event());
  step.sync();
  if (me == 0) {
    try {
      reduce_on_first(op, step, gpu, host_leaf);
      step.sync();
    } catch (...) {
      // The others free their buffers once this replica has failed: keep those buffers from
      // being reused under the kernels already on this stream, and let the kernels finish (best
      // effort: the original error is the one to report).
      try {
        for (int r = 1; r < n; ++r) {
          for (std::size_t i = 0; i < leaves; ++i) {
            if (host_leaf[i]) continue;
            gpu[r].backend().record_stream_use(step.inputs(r)[i].data(), gpu[0].backend());
            gpu[r].backend().record_stream_use(step.outputs(r)[i].data(), gpu[0].backend());
          }
        }
        // Keeping flags: a division by zero found on this stream is still raised by the
        // replica's next synchronize instead of being swallowed here.
        gpu[0].backend().wait_keeping_flags(Deadline::after(default_synchronize_timeout_s()));
      } catch (...) {
      }
      throw;
    }
  } else {
    step.sync();
    gpu[me].backend().wait_event(gpu[0].done_event());
  }
  return true;
}

}  // namespace mirrored::detail

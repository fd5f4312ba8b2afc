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
// ordering stays intact.
#include <cstring>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "cuda/kernels.hpp"
#include "gpu/logical_gpus.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail {

bool on_chip_all_reduce(ReduceOp op, CollectiveStep& step) {
  const int n = step.num_replicas();
  if (n < 2 || n > cuda_kernels::kMaxFusedReplicas) return false;
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
        const int physical = logical_gpu_location(d.index()).first;
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
  std::vector<CudaBackend*> be(n);
  for (int r = 0; r < n; ++r) be[r] = &cuda_backend(home[r]);
  {
    CudaDeviceGuard guard(chip, be[me]->device());
    be[me]->check(cudaEventRecord(be[me]->ready_event(), be[me]->stream()), "cudaEventRecord");
  }
  step.sync();
  if (me == 0) {
    CudaBackend& b0 = *be[0];
    CudaDeviceGuard guard(chip, b0.device());
    for (int r = 1; r < n; ++r)
      b0.check(cudaStreamWaitEvent(b0.stream(), be[r]->ready_event(), 0), "cudaStreamWaitEvent");
    std::vector<const void*> in(n);
    std::vector<void*> out(n);
    auto& host = backend_for(cpu0);
    for (std::size_t i = 0; i < leaves; ++i) {
      const UntypedTensor& first = step.outputs(0)[i];
      if (first.numel == 0) continue;
      for (int r = 0; r < n; ++r) {
        in[r] = step.inputs(r)[i].data();
        out[r] = step.outputs(r)[i].data();
      }
      if (host_leaf[i]) {
        host.sum_n(first.dtype, in.data(), n, out[0], first.numel);
        if (op == ReduceOp::MEAN) host.divide(first.dtype, out[0], first.numel, n);
        for (int r = 1; r < n; ++r) std::memcpy(out[r], out[0], first.bytes());
        continue;
      }
      b0.check(cuda_kernels::all_reduce_fused(first.dtype, in.data(), out.data(), n, first.numel,
                                              op == ReduceOp::MEAN ? n : 0, b0.stream()),
               "all-reduce kernel launch");
    }
    b0.check(cudaEventRecord(b0.done_event(), b0.stream()), "cudaEventRecord");
  }
  step.sync();
  if (me != 0) {
    CudaDeviceGuard guard(chip, be[me]->device());
    be[me]->check(cudaStreamWaitEvent(be[me]->stream(), be[0]->done_event(), 0), "cudaStreamWaitEvent");
  }
  return true;
}

}  // namespace mirrored::detail

// NcclAllReduce in builds without NCCL: constructible (so programs written for GPUs still
// compile and link), but its operations throw UnimplementedError. The NCCL implementation is
// src/collectives/nccl/nccl_all_reduce.cpp.
#include <string>

#include "collectives/ops_selection.hpp"
#include "mirrored/config.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {
namespace {
[[noreturn]] void no_nccl(const char* op) {
#if MIRRORED_HAVE_CUDA
  const char* why = "this CUDA build of mirrored was made without NCCL (libnccl was not found at configure time)";
#else
  const char* why =
      "this build of mirrored has no CUDA support (configure with MIRRORED_ENABLE_CUDA=ON on a machine with the CUDA "
      "toolkit and NCCL)";
#endif
  throw UnimplementedError(std::string("NcclAllReduce::") + op + ": " + why);
}
}  // namespace

struct NcclAllReduce::Impl {};

NcclAllReduce::NcclAllReduce(int num_packs) : num_packs_(num_packs) {
  MIRRORED_ENFORCE(num_packs >= 0, InvalidArgumentError, "NcclAllReduce: num_packs must be >= 0, got ", num_packs);
}
NcclAllReduce::~NcclAllReduce() = default;

void NcclAllReduce::reduce(ReduceOp, const std::vector<detail::UntypedTensor>&, const detail::UntypedTensor&) {
  no_nccl("reduce");
}
void NcclAllReduce::all_reduce(ReduceOp, CollectiveStep&) { no_nccl("all_reduce"); }
void NcclAllReduce::all_gather(int, CollectiveStep&) { no_nccl("all_gather"); }
void NcclAllReduce::reduce_scatter(ReduceOp, CollectiveStep&) { no_nccl("reduce_scatter"); }
bool NcclAllReduce::all_reduce_and_update(CollectiveStep&) {
  return false;  // the separate passes, whose collectives say why they cannot run
}
bool NcclAllReduce::batch_all_reduce(ReduceOp, const std::vector<std::vector<detail::UntypedTensor>>&,
                                     const std::vector<Device>&, std::vector<std::vector<detail::UntypedTensor>>&,
                                     const Deadline&) {
  return false;  // `reduce` then says why it cannot run
}

namespace detail {
bool nccl_compiled_in() noexcept { return false; }
}  // namespace detail

}  // namespace mirrored

// InProcessAllReduce's optimizer step: the gradients' sum and the update in one pass over memory.
// Replica r owns its BALANCED slice of every variable (the slice a sharded optimizer keeps its
// slots for); it sums the N gradients of a block of that slice into a scratch block, updates the
// block of its own parameters (and slots) from it while it is in cache, and copies the updated
// block to every other replica's copies. Each gradient byte is read once, each parameter and slot
// byte of one copy read once, and every copy written once: the floor of an optimizer step.
#include <algorithm>
#include <cstring>
#include <vector>

#include "collectives/collective_helpers.hpp"
#include "collectives/in_process/blocks.hpp"
#include "collectives/stream_copy.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/balanced_split.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/optimizer_step.hpp"

namespace mirrored {
namespace {

bool all_host(const detail::OptimizerStep& s) {
  auto host = [](const detail::UntypedTensor& t) { return !t.storage || t.device().is_host(); };
  for (std::size_t v = 0; v < s.params.size(); ++v) {
    if (!host(s.grads[v]) || !host(s.params[v])) return false;
    for (const detail::UntypedTensor& slot : s.slots[v])
      if (!host(slot)) return false;
  }
  return host(s.step_in) && host(s.step_out);
}

}  // namespace

bool InProcessAllReduce::all_reduce_and_update(CollectiveStep& step) {
  using detail::kStreamMinBytes;
  using detail::in_process::kBlockBytes;
  const int n = step.num_replicas();
  const int me = step.replica();
  for (int r = 0; r < n; ++r) {
    if (!all_host(*step.update(r))) return false;
  }
  const detail::OptimizerStep& mine = *step.update(me);
  auto& host = detail::backend_for(cpu0);
  const std::size_t elem = dtype_size(mine.dtype);
  const int64_t block = static_cast<int64_t>(kBlockBytes / elem);
  alignas(64) unsigned char sum[kBlockBytes];
  std::vector<const void*> ptrs(static_cast<std::size_t>(n));
  int64_t total = 0;
  for (const auto& p : mine.params) total += p.numel;
  const bool streaming = static_cast<std::size_t>(total) * elem >= kStreamMinBytes;
  auto copy = [&](void* dst, const void* src, std::size_t bytes) {
    if (streaming)
      detail::stream_copy(dst, src, bytes);
    else
      std::memcpy(dst, src, bytes);
  };
  const auto* step_in = static_cast<const int64_t*>(mine.step_in.data());
  for (std::size_t v = 0; v < mine.params.size(); ++v) {
    const auto piece = detail::balanced_piece(mine.params[v].numel, n, me);
    for (int64_t b = piece.begin; b < piece.begin + piece.count; b += block) {
      const int64_t len = std::min(block, piece.begin + piece.count - b);
      const std::size_t bytes = static_cast<std::size_t>(len) * elem;
      for (int r = 0; r < n; ++r) ptrs[static_cast<std::size_t>(r)] = detail::element_at(step.update(r)->grads[v], b);
      host.sum_n(mine.dtype, ptrs.data(), n, sum, len);
      // Sharded slots hold this replica's slice only, from its first element.
      const int64_t slot_at = mine.sharded ? b - piece.begin : b;
      detail::UpdateSegment seg;
      seg.param = detail::element_at(mine.params[v], b);
      seg.grad = sum;
      seg.count = len;
      for (std::size_t k = 0; k < mine.slots[v].size(); ++k)
        if (mine.slots[v][k].storage) seg.slot[k] = detail::element_at(mine.slots[v][k], slot_at);
      host.apply_optimizer(mine.dtype, mine.update, &seg, 1, step_in, nullptr);
      for (int r = 0; r < n; ++r) {
        if (r == me) continue;
        const detail::OptimizerStep& other = *step.update(r);
        copy(detail::element_at(other.params[v], b), seg.param, bytes);
        if (mine.sharded) continue;
        for (std::size_t k = 0; k < other.slots[v].size(); ++k)
          if (seg.slot[k]) copy(detail::element_at(other.slots[v][k], b), seg.slot[k], bytes);
      }
    }
  }
  if (streaming) detail::stream_fence();  // before the collective tells the others it is done
  host.apply_optimizer(mine.dtype, mine.update, nullptr, 0, step_in, static_cast<int64_t*>(mine.step_out.data()));
  return true;
}

}  // namespace mirrored

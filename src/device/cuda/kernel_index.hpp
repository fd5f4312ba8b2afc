#pragma once
// Private: the index and partition arithmetic of the CUDA backend's kernels (kernels.cu) and of
// their launches (cuda_backend_kernels.cpp): grid sizes, the grid-stride loop, sum_axis's source
// offsets, the fused all-reduce's vector/tail split, sum_n's chains of kMaxSumInputs and the fused
// optimizer's segment table. The kernels and launchers call these functions (there is no second
// copy), and tests/tensor/test_kernel_index.cpp checks them on the host at the edges (0, 1, 31-33
// elements, sizes past 2^31 and 2^32, packs of 48 and 49 tensors, chains of 32 and 33 inputs), so
// the arithmetic is tested on every CI run, with or without a GPU. No CUDA header: this compiles as
// plain C++ as well as under nvcc.

#include <cstdint>

// The kernels call these on the device, the launchers and the tests on the host.
#include "mirrored/detail/host_device.hpp"
#include "mirrored/detail/optimizer_formulas.hpp"

namespace mirrored::detail::cuda_kernels {

/// Threads of every block.
inline constexpr int kThreads = 256;
/// Blocks of a launch at most: the grid-stride loop covers the elements past kThreads * kMaxBlocks.
inline constexpr int64_t kMaxBlocks = 65535;
/// Inputs one sum_n launch takes (more are summed in a chain of launches, sum_chain_link).
inline constexpr int kMaxSumInputs = 32;
/// Segments one fused optimizer launch takes (detail::kMaxUpdateSegments).
inline constexpr int kMaxOptimizerSegments = 48;

/// The blocks of a launch over `n` elements: ceil(n / kThreads), at least 1 (a launch of no blocks
/// is an error, and the optimizer's launch over no elements still advances the step) and at most
/// kMaxBlocks. Computed in 64 bits: n may be past 2^31 and 2^32.
constexpr MIRRORED_HOST_DEVICE unsigned grid_blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b));
}

/// One thread's walk of a grid-stride loop: it touches first, first + stride, ... below n.
struct GridStride {
  int64_t first;   ///< block * block_dim + thread
  int64_t stride;  ///< grid_dim * block_dim: every thread of the grid once per round
};

/// The walk of thread `thread` of block `block` in a grid of `grid_dim` blocks of `block_dim`
/// threads (blockIdx.x, blockDim.x, threadIdx.x, gridDim.x). Widened before the product: 32-bit
/// products would wrap for grids of more than 2^32 threads.
constexpr MIRRORED_HOST_DEVICE GridStride grid_stride(unsigned block, unsigned block_dim, unsigned thread,
                                                      unsigned grid_dim) {
  return {static_cast<int64_t>(block) * block_dim + thread, static_cast<int64_t>(grid_dim) * block_dim};
}

/// The loop of every element-wise kernel: `f(i)` for each index of `g`'s walk below `n`, in
/// increasing order, with a 64-bit index (an `int` would wrap past 2^31).
template <class F>
MIRRORED_HOST_DEVICE inline void for_each_index(GridStride g, int64_t n, F&& f) {
  for (int64_t i = g.first; i < n; i += g.stride) f(i);
}

/// sum_axis over `[outer, length, inner]`: output element `idx` (of outer * inner) sums the inputs
/// at sum_axis_source(idx) + l * inner for l in [0, length).
constexpr MIRRORED_HOST_DEVICE int64_t sum_axis_source(int64_t idx, int64_t length, int64_t inner) {
  return idx / inner * length * inner + idx % inner;
}

/// The fused all-reduce's split of `n` elements: `vectors` loads of `lanes` elements (16 bytes),
/// then the scalar tail [tail_begin, n).
struct VectorSplit {
  int64_t vectors;
  int64_t tail_begin;
};

constexpr MIRRORED_HOST_DEVICE VectorSplit vector_split(int64_t n, int lanes) { return {n / lanes, n / lanes * lanes}; }

/// One launch of a sum of `k` inputs: inputs [first, first + count) are added, in order, to the
/// running sum read from scratch (`accumulate`) or started by the first of them; the result goes
/// to scratch, or to the output once every input has been read (`last`: the output may alias an
/// input).
struct SumChainLink {
  int first;
  int count;
  bool accumulate;
  bool last;
};

/// The launches of a sum of `k` inputs: ceil(k / kMaxSumInputs) (0 for k <= 0).
constexpr MIRRORED_HOST_DEVICE int sum_chain_launches(int k) {
  return k <= 0 ? 0 : (k + kMaxSumInputs - 1) / kMaxSumInputs;
}

/// Launch `j` (0 <= j < sum_chain_launches(k)) of a sum of `k` inputs.
constexpr MIRRORED_HOST_DEVICE SumChainLink sum_chain_link(int k, int j) {
  const int first = j * kMaxSumInputs;
  const int left = k - first;
  return {first, left < kMaxSumInputs ? left : kMaxSumInputs, j > 0, j == sum_chain_launches(k) - 1};
}

/// The segments of one fused optimizer update, passed by value as the launch's argument (no copy
/// to the device, no host synchronisation). Segment j covers elements [offset[j], offset[j+1]) of
/// the launch; a segment may be empty.
struct OptimizerSegments {
  void* param[kMaxOptimizerSegments];
  const void* grad[kMaxOptimizerSegments];
  void* slot[kMaxOptimizerSlots][kMaxOptimizerSegments];  ///< slot k of segment j: slot[k][j]
  int64_t offset[kMaxOptimizerSegments + 1];
  int count;
};
// A kernel's arguments take at most 4 KiB on every architecture the backend builds for.
static_assert(sizeof(OptimizerSegments) <= 4096, "the optimizer's segments must fit a launch's arguments");

/// Appends a segment of `numel` elements to `s` (value-initialised for the first): false, with `s`
/// unchanged, when the launch already holds kMaxOptimizerSegments (the 49th tensor of a pack goes
/// to a launch of its own, which detail::plan_packs's max_leaves arranges).
/// `slots` holds kMaxOptimizerSlots pointers (nullptr past the kind's slots).
constexpr MIRRORED_HOST_DEVICE bool add_segment(OptimizerSegments& s, void* param, const void* grad, void* const* slots,
                                                int64_t numel) {
  if (s.count < 0 || s.count >= kMaxOptimizerSegments) return false;
  const int j = s.count;
  s.param[j] = param;
  s.grad[j] = grad;
  for (int k = 0; k < kMaxOptimizerSlots; ++k) s.slot[k][j] = slots[k];
  s.offset[j + 1] = s.offset[j] + numel;
  s.count = j + 1;
  return true;
}

/// The segment holding element `i` (0 <= i < offset[count], count >= 1): the last j with
/// offset[j] <= i, found by bisection, so an empty segment (offset[j] == offset[j + 1]) is never
/// chosen.
constexpr MIRRORED_HOST_DEVICE int segment_of(const int64_t* offset, int count, int64_t i) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (offset[mid] <= i)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

}  // namespace mirrored::detail::cuda_kernels

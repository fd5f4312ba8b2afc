// The CUDA kernels' index and partition arithmetic (src/device/cuda/kernel_index.hpp), on the host:
// the kernels and their launchers call these same functions, so their edges are checked here in
// every build, with or without CUDA or a GPU: 0, 1, 31, 32, 33 elements, a block's and the largest
// grid's edges, sizes past 2^31 and 2^32 (arithmetic only, nothing is allocated), optimizer packs
// of 1, 47, 48 and 49 tensors, and sum_n chains of 32 and 33 inputs.
#include <gtest/gtest.h>

#include <climits>
#include <cstdint>
#include <ostream>
#include <vector>

#include "device/cuda/kernel_index.hpp"
#include "mirrored/detail/device_backend.hpp"

namespace mirrored::detail::kernel_index_test {

using namespace cuda_kernels;

constexpr int64_t kTwo31 = int64_t{1} << 31;
constexpr int64_t kTwo32 = int64_t{1} << 32;
// The largest grid: 65535 blocks of 256 threads, the stride of every launch over more than
// 16776960 elements.
constexpr int64_t kFullStride = 16776960;
static_assert(kFullStride == kMaxBlocks * kThreads);

// What one thread's grid-stride walk touched.
struct Walk {
  int64_t count = 0;
  int64_t first = -1;
  int64_t last = -1;
  bool strided = true;  // every step was exactly one stride, in increasing order
};

// Runs the kernels' loop (for_each_index) for thread `thread` of block `block` of the grid a launch
// over `n` elements gets.
Walk walk(int64_t n, unsigned block, unsigned thread) {
  const GridStride g = grid_stride(block, kThreads, thread, grid_blocks(n));
  Walk w;
  for_each_index(g, n, [&](int64_t i) {
    if (w.count == 0)
      w.first = i;
    else if (i != w.last + g.stride)
      w.strided = false;
    w.last = i;
    ++w.count;
  });
  return w;
}

// The walk of global thread `t` (block t / 256, thread t % 256).
Walk walk_of_thread(int64_t n, int64_t t) {
  return walk(n, static_cast<unsigned>(t / kThreads), static_cast<unsigned>(t % kThreads));
}

// How often each index below n is touched by the whole grid of a launch over n elements (n small
// enough to count them all).
std::vector<int> hits(int64_t n) {
  std::vector<int> h(static_cast<std::size_t>(n), 0);
  const unsigned grid = grid_blocks(n);
  bool out_of_range = false;
  for (unsigned b = 0; b < grid; ++b)
    for (unsigned t = 0; t < kThreads; ++t)
      for_each_index(grid_stride(b, kThreads, t, grid), n, [&](int64_t i) {
        if (i < 0 || i >= n)
          out_of_range = true;
        else
          ++h[static_cast<std::size_t>(i)];
      });
  EXPECT_FALSE(out_of_range) << "n = " << n;
  return h;
}

TEST(KernelIndex, GridBlocksAtTheEdges) {
  EXPECT_EQ(grid_blocks(0), 1u);  // a launch needs a block: the optimizer's empty launch still advances the step
  EXPECT_EQ(grid_blocks(-1), 1u);
  EXPECT_EQ(grid_blocks(1), 1u);
  EXPECT_EQ(grid_blocks(31), 1u);
  EXPECT_EQ(grid_blocks(32), 1u);
  EXPECT_EQ(grid_blocks(33), 1u);
  EXPECT_EQ(grid_blocks(255), 1u);
  EXPECT_EQ(grid_blocks(256), 1u);
  EXPECT_EQ(grid_blocks(257), 2u);
  EXPECT_EQ(grid_blocks(kFullStride - 256), 65534u);
  EXPECT_EQ(grid_blocks(kFullStride - 255), 65535u);
  EXPECT_EQ(grid_blocks(kFullStride), 65535u);
  EXPECT_EQ(grid_blocks(kFullStride + 1), 65535u);
  EXPECT_EQ(grid_blocks(kTwo31 - 1), 65535u);
  EXPECT_EQ(grid_blocks(kTwo31 + 1), 65535u);
  EXPECT_EQ(grid_blocks(kTwo32 + 1), 65535u);
  EXPECT_EQ(grid_blocks(INT64_MAX - kThreads), 65535u);  // (n + 255) stays below INT64_MAX
}

TEST(KernelIndex, GridStrideIsWidenedBeforeTheProduct) {
  EXPECT_EQ(grid_stride(0, 256, 0, 1).first, 0);
  EXPECT_EQ(grid_stride(0, 256, 0, 1).stride, 256);
  EXPECT_EQ(grid_stride(1, 256, 0, 2).first, 256);
  EXPECT_EQ(grid_stride(65534, 256, 255, 65535).first, kFullStride - 1);
  EXPECT_EQ(grid_stride(65534, 256, 255, 65535).stride, kFullStride);
  // Products a 32-bit multiplication would wrap (the first index to 5, the stride to 0).
  EXPECT_EQ(grid_stride(1u << 22, 1024, 5, 1u << 22).first, kTwo32 + 5);
  EXPECT_EQ(grid_stride(0, 1024, 0, 1u << 22).stride, kTwo32);
  EXPECT_EQ(grid_stride(UINT_MAX, 1024, 1023, UINT_MAX).first, int64_t{UINT_MAX} * 1024 + 1023);
}

TEST(KernelIndex, EveryIndexIsTouchedExactlyOnceAtSmallSizes) {
  for (int64_t n : {0, 1, 31, 32, 33, 255, 256, 257, 513}) {
    const std::vector<int> h = hits(n);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(h[static_cast<std::size_t>(i)], 1) << "n = " << n << ", index " << i;
  }
}

TEST(KernelIndex, OneThreadPerElementBelowAFullGrid) {
  for (int64_t n : {1, 31, 32, 33}) {
    for (unsigned t = 0; t < kThreads; ++t) {
      const Walk w = walk(n, 0, t);
      if (t < n) {
        EXPECT_EQ(w.count, 1) << "n = " << n << ", thread " << t;
        EXPECT_EQ(w.first, static_cast<int64_t>(t));
      } else {
        EXPECT_EQ(w.count, 0) << "n = " << n << ", thread " << t;
      }
    }
  }
  EXPECT_EQ(walk(0, 0, 0).count, 0);
}

TEST(KernelIndex, EveryIndexIsTouchedExactlyOncePastAFullGrid) {
  // One element past the largest grid: thread 0 comes round once more, for the last index.
  const int64_t n = kFullStride + 1;
  const std::vector<int> h = hits(n);
  int64_t wrong = 0;
  for (int x : h) wrong += x != 1;
  EXPECT_EQ(wrong, 0);
  const Walk w0 = walk_of_thread(n, 0);
  EXPECT_EQ(w0.count, 2);
  EXPECT_EQ(w0.last, kFullStride);
  EXPECT_EQ(walk_of_thread(n, 1).count, 1);
  EXPECT_EQ(walk_of_thread(n, kFullStride - 1).last, kFullStride - 1);
}

// Sizes past 2^31 and 2^32, nothing allocated: the walks of the threads at the edges, and the sum
// of every thread's count (by the closed form the walks are checked against) is n.
TEST(KernelIndex, WalksPastTwoToThe31) {
  const int64_t n = kTwo31 + 1;  // 128 full rounds of the grid, then 32769 elements
  ASSERT_EQ(grid_stride(0, kThreads, 0, grid_blocks(n)).stride, kFullStride);
  const Walk first = walk_of_thread(n, 0);
  EXPECT_EQ(first.count, 129);
  EXPECT_EQ(first.first, 0);
  EXPECT_EQ(first.last, 2147450880);  // 128 * 16776960
  EXPECT_TRUE(first.strided);
  // The thread of index 2^31, which a 32-bit index would have wrapped to -2^31.
  const Walk top = walk_of_thread(n, 32768);
  EXPECT_EQ(top.count, 129);
  EXPECT_EQ(top.last, kTwo31);
  EXPECT_TRUE(top.strided);
  const Walk after = walk_of_thread(n, 32769);
  EXPECT_EQ(after.count, 128);
  EXPECT_EQ(after.last, 2130706689);  // 127 * 16776960 + 32769
  const Walk last = walk_of_thread(n, kFullStride - 1);
  EXPECT_EQ(last.count, 128);
  EXPECT_EQ(last.first, kFullStride - 1);
  EXPECT_EQ(last.last, 2147450879);  // 127 * 16776960 + 16776959
  EXPECT_TRUE(last.strided);
  // n = 2^31, one element fewer: index 2^31 - 1 is thread 32767's last, and thread 32768 stops a
  // round earlier.
  EXPECT_EQ(walk_of_thread(kTwo31, 32768).count, 128);
  EXPECT_EQ(walk_of_thread(kTwo31, 32767).last, kTwo31 - 1);
}

TEST(KernelIndex, WalksPastTwoToThe32) {
  const int64_t n = kTwo32 + 1;  // 256 full rounds, then 65537 elements
  const Walk first = walk_of_thread(n, 0);
  EXPECT_EQ(first.count, 257);
  EXPECT_EQ(first.last, 4294901760);          // 256 * 16776960
  const Walk top = walk_of_thread(n, 65536);  // index 2^32: 0 in 32 bits
  EXPECT_EQ(top.count, 257);
  EXPECT_EQ(top.first, 65536);
  EXPECT_EQ(top.last, kTwo32);
  EXPECT_TRUE(top.strided);
  const Walk after = walk_of_thread(n, 65537);
  EXPECT_EQ(after.count, 256);
  EXPECT_EQ(after.last, 4278190337);  // 255 * 16776960 + 65537
  const Walk last = walk_of_thread(n, kFullStride - 1);
  EXPECT_EQ(last.count, 256);
  EXPECT_EQ(last.last, 4294901759);  // 255 * 16776960 + 16776959
  EXPECT_TRUE(last.strided);
}

TEST(KernelIndex, TheGridCoversSizesPastTwoToThe32ExactlyOnce) {
  for (int64_t n : {kTwo31 - 1, kTwo31, kTwo31 + 1, kTwo32 - 1, kTwo32, kTwo32 + 1}) {
    // Thread t touches t, t + S, ... below n: (n - 1 - t) / S + 1 indices when t < n. Checked
    // against the loop itself at the first, middle and last threads, then summed over the grid.
    const GridStride g0 = grid_stride(0, kThreads, 0, grid_blocks(n));
    ASSERT_EQ(g0.stride, kFullStride);
    auto count = [&](int64_t t) { return t < n ? (n - 1 - t) / kFullStride + 1 : 0; };
    for (int64_t t : {int64_t{0}, n % kFullStride - 1, n % kFullStride, kFullStride - 1}) {
      if (t < 0) continue;
      EXPECT_EQ(walk_of_thread(n, t).count, count(t)) << "n = " << n << ", thread " << t;
    }
    int64_t total = 0;
    for (int64_t t = 0; t < kFullStride; ++t) total += count(t);
    EXPECT_EQ(total, n);
  }
}

TEST(KernelIndex, SumAxisSource) {
  // [3, 5, 7] summed along the middle axis.
  EXPECT_EQ(sum_axis_source(0, 5, 7), 0);
  EXPECT_EQ(sum_axis_source(6, 5, 7), 6);
  EXPECT_EQ(sum_axis_source(7, 5, 7), 35);
  EXPECT_EQ(sum_axis_source(20, 5, 7), 76);  // outer 2, inner 6: 2 * 35 + 6
  // The last input read, sum_axis_source(last) + (length - 1) * inner, is the input's last element.
  EXPECT_EQ(sum_axis_source(20, 5, 7) + 4 * 7, 3 * 5 * 7 - 1);
  // inner 1 (the last axis): output o starts at o * length.
  EXPECT_EQ(sum_axis_source(0, 33, 1), 0);
  EXPECT_EQ(sum_axis_source(31, 33, 1), 1023);
  EXPECT_EQ(sum_axis_source(32, 33, 1), 1056);
  // outer 1: the sources are the inner indices themselves.
  EXPECT_EQ(sum_axis_source(32, 1000, 33), 32);
  // Past 2^32: [2, 2^31 + 1, 3] holds 12884901894 elements.
  const int64_t length = kTwo31 + 1;
  EXPECT_EQ(sum_axis_source(3, length, 3), 6442450947);  // 1 * (2^31 + 1) * 3
  EXPECT_EQ(sum_axis_source(5, length, 3), 6442450949);
  EXPECT_EQ(sum_axis_source(5, length, 3) + (length - 1) * 3, 2 * length * 3 - 1);
  // [2^32 + 1, 2, 1]: the last output reads from 2^33.
  EXPECT_EQ(sum_axis_source(kTwo32, 2, 1), 2 * kTwo32);
}

TEST(KernelIndex, VectorSplitOfTheFusedAllReduce) {
  struct Row {
    int64_t n;
    int lanes;
    int64_t vectors, tail_begin;
  };
  // Lanes of 16 bytes: 2 (float64, int64), 4 (float32, int32), 8 (float16, bfloat16), 16 (uint8).
  const Row rows[] = {
      {0, 4, 0, 0},
      {1, 4, 0, 0},
      {31, 4, 7, 28},
      {32, 4, 8, 32},
      {33, 4, 8, 32},
      {0, 2, 0, 0},
      {1, 2, 0, 0},
      {31, 2, 15, 30},
      {32, 2, 16, 32},
      {33, 2, 16, 32},
      {1, 8, 0, 0},
      {31, 8, 3, 24},
      {32, 8, 4, 32},
      {33, 8, 4, 32},
      {1, 16, 0, 0},
      {15, 16, 0, 0},
      {31, 16, 1, 16},
      {32, 16, 2, 32},
      {33, 16, 2, 32},
      {kTwo31 + 3, 4, 1 << 29, kTwo31},
      {kTwo31 - 1, 2, (kTwo31 - 2) / 2, kTwo31 - 2},
      {kTwo32 + 1, 16, 1 << 28, kTwo32},
      {kTwo32 + 15, 16, 1 << 28, kTwo32},
      {kTwo32 + 16, 16, (1 << 28) + 1, kTwo32 + 16},
  };
  for (const Row& r : rows) {
    const VectorSplit s = vector_split(r.n, r.lanes);
    EXPECT_EQ(s.vectors, r.vectors) << "n = " << r.n << ", lanes " << r.lanes;
    EXPECT_EQ(s.tail_begin, r.tail_begin) << "n = " << r.n << ", lanes " << r.lanes;
    EXPECT_LT(r.n - s.tail_begin, r.lanes);  // the scalar tail is shorter than one vector
  }
}

// One launch as the backend makes it (cuda_backend_kernels.cpp), as a record.
struct Link {
  int first, count;
  bool accumulate, last;
  bool operator==(const Link&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Link& l) {
  return os << "{" << l.first << ", " << l.count << ", " << l.accumulate << ", " << l.last << "}";
}
std::vector<Link> chain(int k) {
  std::vector<Link> links;
  for (int j = 0; j < sum_chain_launches(k); ++j) {
    const SumChainLink l = sum_chain_link(k, j);
    links.push_back({l.first, l.count, l.accumulate, l.last});
  }
  return links;
}

TEST(KernelIndex, SumChainsOf32And33Inputs) {
  EXPECT_EQ(sum_chain_launches(0), 0);
  EXPECT_EQ(chain(1), (std::vector<Link>{{0, 1, false, true}}));
  EXPECT_EQ(chain(2), (std::vector<Link>{{0, 2, false, true}}));
  EXPECT_EQ(chain(31), (std::vector<Link>{{0, 31, false, true}}));
  EXPECT_EQ(chain(32), (std::vector<Link>{{0, 32, false, true}}));
  EXPECT_EQ(chain(33), (std::vector<Link>{{0, 32, false, false}, {32, 1, true, true}}));
  EXPECT_EQ(chain(63), (std::vector<Link>{{0, 32, false, false}, {32, 31, true, true}}));
  EXPECT_EQ(chain(64), (std::vector<Link>{{0, 32, false, false}, {32, 32, true, true}}));
  EXPECT_EQ(chain(65), (std::vector<Link>{{0, 32, false, false}, {32, 32, true, false}, {64, 1, true, true}}));
}

// The chain's data flow, run on the host as the kernels run it: every input read once, in order,
// each launch at most kMaxSumInputs inputs, the output (here aliasing input 0) written once, by
// the last launch, after every input was read.
TEST(KernelIndex, SumChainsReadEveryInputOnceInOrder) {
  for (int k = 1; k <= 200; ++k) {
    std::vector<int64_t> in(static_cast<std::size_t>(k));
    for (int j = 0; j < k; ++j) in[static_cast<std::size_t>(j)] = int64_t{1} << (j % 40);
    int64_t want = 0;
    for (int64_t x : in) want += x;
    int64_t* out = &in[0];
    int64_t scratch = -1;
    int next = 0, out_writes = 0;
    for (const Link& l : chain(k)) {
      ASSERT_EQ(l.first, next) << "k = " << k;
      ASSERT_GE(l.count, 1);
      ASSERT_LE(l.count, kMaxSumInputs);
      int64_t s = l.accumulate ? scratch : in[static_cast<std::size_t>(l.first)];
      for (int j = l.accumulate ? 0 : 1; j < l.count; ++j) s += in[static_cast<std::size_t>(l.first + j)];
      next = l.first + l.count;
      if (l.last) {
        ASSERT_EQ(next, k) << "the output is written before input " << next << " of " << k << " was read";
        *out = s;
        ++out_writes;
      } else {
        scratch = s;
      }
    }
    EXPECT_EQ(next, k);
    EXPECT_EQ(out_writes, 1) << "k = " << k;
    EXPECT_EQ(*out, want) << "k = " << k;
  }
}

static_assert(kMaxOptimizerSegments == kMaxUpdateSegments, "one launch takes what one apply_optimizer call passes");

// A pack of `numel.size()` tensors put into launches as the backend does: add_segment until it
// refuses, then a new launch. Pointers are fake: only the arithmetic is under test.
std::vector<OptimizerSegments> pack(const std::vector<int64_t>& numel) {
  std::vector<OptimizerSegments> launches(1, OptimizerSegments{});
  for (std::size_t j = 0; j < numel.size(); ++j) {
    void* p = reinterpret_cast<void*>(0x1000 * (j + 1));
    void* const slots[kMaxOptimizerSlots] = {p, p, p};
    if (!add_segment(launches.back(), p, p, slots, numel[j])) {
      launches.push_back(OptimizerSegments{});
      EXPECT_TRUE(add_segment(launches.back(), p, p, slots, numel[j]));
    }
  }
  return launches;
}

// Each segment's first and last element map to it; its neighbours' do not.
void expect_segments_found(const OptimizerSegments& s) {
  for (int j = 0; j < s.count; ++j) {
    if (s.offset[j] == s.offset[j + 1]) continue;  // empty: no element to find
    EXPECT_EQ(segment_of(s.offset, s.count, s.offset[j]), j) << "first element of segment " << j;
    EXPECT_EQ(segment_of(s.offset, s.count, s.offset[j + 1] - 1), j) << "last element of segment " << j;
  }
}

TEST(KernelIndex, OptimizerPacksOf1And47And48Tensors) {
  for (int tensors : {1, 47, 48}) {
    std::vector<int64_t> numel;
    for (int j = 0; j < tensors; ++j) numel.push_back(j % 3 == 1 ? 0 : 31 + j % 3);  // 31, 0, 33, 31, ...
    const std::vector<OptimizerSegments> launches = pack(numel);
    ASSERT_EQ(launches.size(), 1u) << tensors << " tensors";
    const OptimizerSegments& s = launches[0];
    EXPECT_EQ(s.count, tensors);
    EXPECT_EQ(s.offset[0], 0);
    int64_t total = 0;
    for (int j = 0; j < tensors; ++j) {
      EXPECT_EQ(s.offset[j], total);
      EXPECT_EQ(s.param[j], reinterpret_cast<void*>(0x1000 * (j + 1)));
      for (int k = 0; k < kMaxOptimizerSlots; ++k) EXPECT_EQ(s.slot[k][j], s.param[j]) << "slot " << k;
      total += numel[static_cast<std::size_t>(j)];
    }
    EXPECT_EQ(s.offset[tensors], total);
    expect_segments_found(s);
  }
  // 48 tensors of 32 elements.
  EXPECT_EQ(pack(std::vector<int64_t>(48, 32))[0].offset[48], 48 * 32);
}

TEST(KernelIndex, AFortyNinthTensorGoesToASecondLaunch) {
  const std::vector<int64_t> numel(49, 33);
  OptimizerSegments full{};
  void* const no_slots[kMaxOptimizerSlots] = {};
  for (int j = 0; j < 48; ++j) ASSERT_TRUE(add_segment(full, nullptr, nullptr, no_slots, 33));
  const OptimizerSegments before = full;
  void* p = &full;
  void* const slots[kMaxOptimizerSlots] = {p, p, p};
  EXPECT_FALSE(add_segment(full, p, p, slots, 33));
  // Refused with nothing changed.
  EXPECT_EQ(full.count, 48);
  EXPECT_EQ(full.offset[48], before.offset[48]);
  EXPECT_EQ(full.param[47], before.param[47]);
  const std::vector<OptimizerSegments> launches = pack(numel);
  ASSERT_EQ(launches.size(), 2u);
  EXPECT_EQ(launches[0].count, 48);
  EXPECT_EQ(launches[0].offset[48], 48 * 33);
  EXPECT_EQ(launches[1].count, 1);
  EXPECT_EQ(launches[1].offset[0], 0);
  EXPECT_EQ(launches[1].offset[1], 33);
  EXPECT_EQ(launches[1].param[0], reinterpret_cast<void*>(0x1000 * 49));
  EXPECT_EQ(segment_of(launches[1].offset, 1, 32), 0);
}

TEST(KernelIndex, AnEmptyPackIsOneBlockThatOnlyAdvancesTheStep) {
  const OptimizerSegments s{};
  EXPECT_EQ(s.count, 0);
  EXPECT_EQ(s.offset[s.count], 0);
  EXPECT_EQ(grid_blocks(s.offset[s.count]), 1u);
  EXPECT_EQ(walk(0, 0, 0).count, 0);
}

TEST(KernelIndex, EmptySegmentsAreNeverChosen) {
  // Segments of 0, 1, 0, 0, 2, 0 elements: elements 0, 1, 2 lie in segments 1, 4, 4.
  const std::vector<OptimizerSegments> launches = pack({0, 1, 0, 0, 2, 0});
  const OptimizerSegments& s = launches[0];
  EXPECT_EQ(segment_of(s.offset, s.count, 0), 1);
  EXPECT_EQ(segment_of(s.offset, s.count, 1), 4);
  EXPECT_EQ(segment_of(s.offset, s.count, 2), 4);
  expect_segments_found(s);
}

TEST(KernelIndex, OptimizerPacksPastTwoToThe32) {
  // 48 tensors of 2^27 + 1 elements: 6442450992 in one launch.
  const std::vector<OptimizerSegments> launches = pack(std::vector<int64_t>(48, (int64_t{1} << 27) + 1));
  ASSERT_EQ(launches.size(), 1u);
  const OptimizerSegments& s = launches[0];
  EXPECT_EQ(s.offset[48], 6442450992);
  EXPECT_EQ(s.offset[16], 2147483664);  // past 2^31
  EXPECT_EQ(segment_of(s.offset, 48, kTwo31), 15);
  EXPECT_EQ(kTwo31 - s.offset[15], 134217713);
  EXPECT_EQ(segment_of(s.offset, 48, kTwo32), 31);
  EXPECT_EQ(kTwo32 - s.offset[31], 134217697);  // the element within tensor 31
  EXPECT_EQ(segment_of(s.offset, 48, 6442450991), 47);
  expect_segments_found(s);
  // One tensor of 2^32 + 1 elements: every element is in it.
  const OptimizerSegments one = pack({kTwo32 + 1})[0];
  EXPECT_EQ(segment_of(one.offset, 1, kTwo32), 0);
  EXPECT_EQ(grid_blocks(one.offset[1]), 65535u);
}

}  // namespace mirrored::detail::kernel_index_test

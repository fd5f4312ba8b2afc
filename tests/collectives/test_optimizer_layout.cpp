// The shard-major layout of a sharded optimizer step (collectives/optimizer_layout.hpp), which the
// device-generic step and NCCL's fused one share: every shard's piece of every variable, where it
// lies in the variable and in the layout, the reduce-scatter's cut and when it is even, at the
// edges (variables smaller than the shards, empty ones, one shard, sizes past 2^31 and 2^32:
// arithmetic only, nothing allocated).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "collectives/optimizer_layout.hpp"

namespace mirrored::detail {
namespace optimizer_layout_test {  // named: the unity build puts these beside other tests

// Checks what every layout must satisfy, against a layout built here element by element.
void expect_consistent(const std::vector<int64_t>& numel, int64_t shards) {
  const ShardedPack layout(numel, shards);
  int64_t at = 0, total = 0;
  for (const int64_t n : numel) total += n;
  EXPECT_EQ(layout.numel(), total);
  ASSERT_EQ(static_cast<int64_t>(layout.split().size()), shards);
  for (int64_t q = 0; q < shards; ++q) {
    EXPECT_EQ(layout.shard_begin(q), at) << "shard " << q;
    int64_t in_shard = 0;
    for (std::size_t k = 0; k < numel.size(); ++k) {
      const auto p = layout.piece(q, k);
      // BALANCED: floor(n / shards), one more for the first n % shards shards.
      const int64_t floor = numel[k] / shards, extra = numel[k] % shards;
      EXPECT_EQ(p.count, floor + (q < extra ? 1 : 0)) << "shard " << q << ", variable " << k;
      EXPECT_EQ(p.in_variable, q * floor + (q < extra ? q : extra)) << "shard " << q << ", variable " << k;
      EXPECT_EQ(p.in_layout, at + in_shard) << "shard " << q << ", variable " << k;
      in_shard += p.count;
    }
    EXPECT_EQ(layout.split()[static_cast<std::size_t>(q)], in_shard) << "shard " << q;
    at += in_shard;
  }
  EXPECT_EQ(at, total);
}

TEST(ShardedPack, PiecesTileEveryVariableAndTheLayout) {
  for (const int64_t shards : {1, 2, 3, 4, 8}) {
    expect_consistent({7 * 3, 5, 1, 130, 12}, shards);
    expect_consistent({1}, shards);
    expect_consistent({0, 3, 0}, shards);
    expect_consistent({31, 32, 33}, shards);
  }
}

TEST(ShardedPack, SmallVariablesLeaveLaterShardsEmpty) {
  const ShardedPack layout({1, 2}, 4);
  EXPECT_EQ(layout.split(), (std::vector<int64_t>{2, 1, 0, 0}));
  EXPECT_FALSE(layout.equal_split());
  EXPECT_EQ(layout.shard_begin(2), 3);
  EXPECT_EQ(layout.shard_begin(3), 3);
  EXPECT_EQ(layout.piece(1, 1).in_variable, 1);
  EXPECT_EQ(layout.piece(1, 1).in_layout, 2);
  EXPECT_EQ(layout.piece(3, 0).count, 0);
}

TEST(ShardedPack, EvenCutOnlyWhenEveryVariableDivides) {
  EXPECT_TRUE(ShardedPack({8, 4}, 4).equal_split());
  EXPECT_TRUE(ShardedPack({0}, 3).equal_split());
  EXPECT_TRUE(ShardedPack({7}, 1).equal_split());
  // The BALANCED rule gives every remainder to the first shards: remainders never even out.
  const ShardedPack odd({5, 3}, 2);
  EXPECT_EQ(odd.split(), (std::vector<int64_t>{5, 3}));
  EXPECT_FALSE(odd.equal_split());
  EXPECT_FALSE(ShardedPack({8, 1}, 4).equal_split());
}

TEST(ShardedPack, SizesPastTwoToThe31And32KeepTheirOffsets) {
  const int64_t big = (int64_t{1} << 32) + 5;
  const int64_t mid = (int64_t{1} << 31) + 1;
  expect_consistent({big, mid, 3}, 3);
  expect_consistent({big}, 8);
  const ShardedPack layout({big, mid}, 2);
  EXPECT_EQ(layout.split()[0], (big + 1) / 2 + (mid + 1) / 2);
  EXPECT_EQ(layout.shard_begin(1), (big + 1) / 2 + (mid + 1) / 2);
  EXPECT_EQ(layout.piece(1, 1).in_layout, layout.shard_begin(1) + big / 2);
  EXPECT_EQ(layout.piece(1, 1).in_variable, (mid + 1) / 2);
}

}  // namespace optimizer_layout_test
}  // namespace mirrored::detail

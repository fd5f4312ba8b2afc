// The default choice of cross-device ops and the NCCL / hierarchical plans, over described
// machines (no GPU needed); plus what the CPU-only parts of NcclAllReduce and
// HierarchicalCopyAllReduce do on host replicas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "collectives/ops_selection.hpp"
#include "collectives/packing.hpp"

#include "harness.hpp"

namespace mirrored {
namespace {

using detail::choose_cross_device_ops;
using detail::CrossDeviceOpsChoice;
using detail::ReplicaPlacement;
using ::testing::HasSubstr;
using testing::message_of;

ReplicaPlacement cpu() { return {DeviceType::CPU, -1}; }
ReplicaPlacement gpu(int physical) { return {DeviceType::GPU, physical}; }

TEST(OpsSelection, AllCpuReplicasGetTheInProcessAllReduce) {
  for (bool nccl : {false, true}) {
    EXPECT_EQ(choose_cross_device_ops({cpu()}, nccl), CrossDeviceOpsChoice::in_process_all_reduce);
    EXPECT_EQ(choose_cross_device_ops({cpu(), cpu(), cpu()}, nccl), CrossDeviceOpsChoice::in_process_all_reduce);
  }
}

TEST(OpsSelection, DistinctPhysicalGpusWithNcclGetNccl) {
  EXPECT_EQ(choose_cross_device_ops({gpu(0)}, true), CrossDeviceOpsChoice::nccl_all_reduce);
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(1)}, true), CrossDeviceOpsChoice::nccl_all_reduce);
  EXPECT_EQ(choose_cross_device_ops({gpu(3), gpu(1), gpu(0), gpu(2)}, true), CrossDeviceOpsChoice::nccl_all_reduce);
}

TEST(OpsSelection, WithoutNcclGpusReduceToOneDevice) {
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(1)}, false), CrossDeviceOpsChoice::reduction_to_one_device);
  EXPECT_EQ(choose_cross_device_ops({gpu(0)}, false), CrossDeviceOpsChoice::reduction_to_one_device);
}

TEST(OpsSelection, LogicalGpusSharingAChipReduceToOneDevice) {
  // Two logical GPUs on physical GPU 0: NCCL refuses two ranks on one GPU.
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(0)}, true), CrossDeviceOpsChoice::reduction_to_one_device);
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(0), gpu(0), gpu(0)}, true),
            CrossDeviceOpsChoice::reduction_to_one_device);
  // Any two sharing is enough.
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(1), gpu(1)}, true), CrossDeviceOpsChoice::reduction_to_one_device);
}

TEST(OpsSelection, MixedCpuAndGpuReduceToOneDevice) {
  EXPECT_EQ(choose_cross_device_ops({cpu(), gpu(0)}, true), CrossDeviceOpsChoice::reduction_to_one_device);
  EXPECT_EQ(choose_cross_device_ops({gpu(0), gpu(1), cpu()}, true), CrossDeviceOpsChoice::reduction_to_one_device);
}

TEST(OpsSelection, NamesAreTheClassNames) {
  EXPECT_STREQ(detail::cross_device_ops_choice_name(CrossDeviceOpsChoice::nccl_all_reduce),
               NcclAllReduce().name().c_str());
  EXPECT_STREQ(detail::cross_device_ops_choice_name(CrossDeviceOpsChoice::in_process_all_reduce), "InProcessAllReduce");
  EXPECT_STREQ(detail::cross_device_ops_choice_name(CrossDeviceOpsChoice::reduction_to_one_device),
               "ReductionToOneDevice");
}

TEST(OpsSelection, StrategiesOnHostDevicesUseTheRule) {
  MirroredStrategy s({"CPU:0", "CPU:1"});
  EXPECT_EQ(s.extended().cross_device_ops().name(), "InProcessAllReduce");
}

// ---------------------------------------------------------------------------------------------

// NcclAllReduce's packing: the one planner under NCCL's rule (num_packs chunks, no empty leaves).
detail::PackRule nccl_rule(int num_packs, int64_t bytes_per_pack = 0) {
  return detail::nccl_pack_rule(num_packs, bytes_per_pack);
}

std::vector<detail::PackLeaf> leaves_of(const std::vector<std::pair<DType, int64_t>>& l, Device d = cpu0) {
  std::vector<detail::PackLeaf> out;
  for (const auto& [dtype, numel] : l) out.push_back({dtype, d, numel});
  return out;
}

TEST(Packs, ZeroPacksIsOneCallPerTensor) {
  const auto packs =
      detail::plan_packs(leaves_of({{DType::float32, 10}, {DType::float32, 0}, {DType::int64, 3}}), nccl_rule(0));
  ASSERT_EQ(packs.size(), 2u);
  EXPECT_EQ(packs[0].leaves, (std::vector<std::size_t>{0}));
  EXPECT_EQ(packs[1].leaves, (std::vector<std::size_t>{2}));
  EXPECT_FALSE(packs[0].concatenated());
  EXPECT_EQ(packs[1].chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 3}}));
}

TEST(Packs, OnePackConcatenatesRunsOfOneDtype) {
  const auto leaves = leaves_of({{DType::float32, 4}, {DType::float32, 6}, {DType::float64, 2}, {DType::float32, 1}});
  const auto packs = detail::plan_packs(leaves, nccl_rule(1));
  ASSERT_EQ(packs.size(), 3u);
  EXPECT_EQ(packs[0].leaves, (std::vector<std::size_t>{0, 1}));
  EXPECT_TRUE(packs[0].concatenated());
  EXPECT_EQ(packs[0].numel, 10);
  EXPECT_EQ(packs[0].chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 10}}));
  EXPECT_EQ(packs[1].leaves, (std::vector<std::size_t>{2}));
  EXPECT_EQ(packs[2].leaves, (std::vector<std::size_t>{3}));
}

TEST(Packs, SeveralPacksSplitEvenlyAndDropEmptyChunks) {
  const auto packs = detail::plan_packs(leaves_of({{DType::float32, 7}, {DType::float32, 3}}), nccl_rule(3));
  ASSERT_EQ(packs.size(), 1u);
  EXPECT_EQ(packs[0].chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 4}, {4, 7}, {7, 10}}));
  const auto tiny = detail::plan_packs(leaves_of({{DType::int32, 2}}), nccl_rule(5));
  EXPECT_EQ(tiny[0].chunks, (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 2}}));
  EXPECT_TRUE(detail::plan_packs(leaves_of({{DType::int32, 0}}), nccl_rule(2)).empty());
  EXPECT_TRUE(detail::plan_packs({}, nccl_rule(1)).empty());
}

// bytes_per_pack closes packs on every path, NCCL's included: a pack is full once it holds the
// limit (the rule GradientBuckets shares), and is never split.
TEST(Packs, BytesPerPackClosesAPackOnceItHoldsTheLimit) {
  // 4-byte floats, 16-byte packs: the first leaf fills one exactly, so the next starts anew.
  const auto leaves = leaves_of(
      {{DType::float32, 4}, {DType::float32, 1}, {DType::float32, 2}, {DType::float32, 5}, {DType::float32, 1}});
  const auto packs = detail::plan_packs(leaves, nccl_rule(1, 16));
  ASSERT_EQ(packs.size(), 3u);
  EXPECT_EQ(packs[0].leaves, (std::vector<std::size_t>{0}));
  EXPECT_EQ(packs[1].leaves, (std::vector<std::size_t>{1, 2, 3}));  // 4 + 8 bytes, then 20 more: 32 > 16
  EXPECT_EQ(packs[2].leaves, (std::vector<std::size_t>{4}));
  EXPECT_EQ(packs[1].numel, 8);
  EXPECT_TRUE(detail::pack_is_full(16, 16));
  EXPECT_FALSE(detail::pack_is_full(15, 16));
  EXPECT_FALSE(detail::pack_is_full(1 << 30, 0));
  // Devices part packs as dtypes do.
  std::vector<detail::PackLeaf> mixed{{DType::float32, cpu0, 1}, {DType::float32, Device(DeviceType::CPU, 1), 1}};
  EXPECT_EQ(detail::plan_packs(mixed, nccl_rule(1)).size(), 2u);
  EXPECT_THAT(message_of<InvalidArgumentError>([] { detail::plan_packs({}, nccl_rule(1, -1)); }),
              HasSubstr("bytes_per_pack must be >= 0"));
}

TEST(Packs, ChunksCoverEveryElementOnce) {
  for (int k = 1; k <= 9; ++k) {
    for (int64_t n : {1, 2, 5, 100, 1001}) {
      const auto packs =
          detail::plan_packs(leaves_of({{DType::float32, n}, {DType::float32, n / 2 + 1}}), nccl_rule(k));
      ASSERT_EQ(packs.size(), 1u);
      int64_t at = 0;
      for (const auto& [b, e] : packs[0].chunks) {
        EXPECT_EQ(b, at);
        EXPECT_GT(e, b);
        at = e;
      }
      EXPECT_EQ(at, packs[0].numel);
      EXPECT_LE(static_cast<int>(packs[0].chunks.size()), k);
    }
  }
}

TEST(Packs, NegativePacksAreInvalid) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { NcclAllReduce ops(-1); }), HasSubstr("num_packs must be >= 0"));
  detail::PackRule rule;
  rule.chunks = 0;
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { detail::plan_packs({}, rule); }),
              HasSubstr("chunks must be >= 1"));
}

// ---------------------------------------------------------------------------------------------

TEST(HierarchicalRoles, MainsRotateAndHalvesPair) {
  const auto a = detail::hierarchical_roles(4, 0);
  EXPECT_EQ(a.first_main, 0);
  EXPECT_EQ(a.second_main, 2);
  EXPECT_EQ(a.first_begin, 0);
  EXPECT_EQ(a.second_begin, 2);
  EXPECT_EQ(a.main_of(1), 0);
  EXPECT_EQ(a.main_of(3), 2);
  const auto b = detail::hierarchical_roles(4, 3);  // main 3 is in the second half
  EXPECT_EQ(b.first_main, 3);
  EXPECT_EQ(b.second_main, 1);
  EXPECT_EQ(b.first_begin, 2);
  EXPECT_EQ(b.second_begin, 0);
  EXPECT_EQ(b.main_of(0), 1);
  EXPECT_EQ(b.main_of(2), 3);
  const auto c = detail::hierarchical_roles(2, 5);
  EXPECT_EQ(c.first_main, 1);
  EXPECT_EQ(c.second_main, 0);
  for (int n : {2, 4, 6, 8}) {
    for (std::size_t i = 0; i < 10; ++i) {
      const auto h = detail::hierarchical_roles(n, i);
      EXPECT_EQ(h.main_of(h.first_main), h.first_main);
      EXPECT_EQ(h.main_of(h.second_main), h.second_main);
      EXPECT_NE(h.first_begin, h.second_begin);
    }
  }
}

TEST(HierarchicalRoles, OddOrSingleReplicaCountsAreRejected) {
  for (int n : {0, 1, 3, 5}) {
    EXPECT_THAT(message_of<InvalidArgumentError>([n] { detail::hierarchical_roles(n, 0); }),
                HasSubstr("works only for an even number (>= 2) of devices"))
        << n;
  }
}

TEST(HierarchicalCopyAllReduce, SaysWhichReplicaCountsItSupports) {
  MirroredStrategy three(testing::cpus(3), std::make_shared<HierarchicalCopyAllReduce>());
  EXPECT_EQ(three.extended().cross_device_ops().name(), "HierarchicalCopyAllReduce");
  EXPECT_THAT(
      message_of<InvalidArgumentError>([&] { three.run([] { return get_replica_context()->all_reduce("sum", 1); }); }),
      HasSubstr("this strategy has 3 replicas"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                auto v = three.experimental_distribute_values_from_function([](const ValueContext&) { return 1.0f; });
                three.reduce(ReduceOp::SUM, v, std::nullopt);
              }),
              HasSubstr("even number"));
  MirroredStrategy one({"CPU:0"}, std::make_shared<HierarchicalCopyAllReduce>(0));
  EXPECT_THAT(
      message_of<InvalidArgumentError>([&] { one.run([] { return get_replica_context()->all_reduce("sum", 1); }); }),
      HasSubstr("this strategy has 1 replica "));
  // all_gather does not need the halves.
  auto g = three.run([] {
    return get_replica_context()->all_gather(Tensor<int32_t>{get_replica_context()->replica_id_in_sync_group()}, 0);
  });
  EXPECT_EQ(g[2].to_vector(), (std::vector<int32_t>{0, 1, 2}));
  EXPECT_THAT(message_of<InvalidArgumentError>([] { HierarchicalCopyAllReduce(-1); }),
              HasSubstr("num_packs must be >= 0"));
  EXPECT_EQ(HierarchicalCopyAllReduce(3).num_packs(), 3);
}

TEST(HierarchicalCopyAllReduce, SumsHalvesThenAddsThem) {
  // Values whose sum depends on the association: each half is summed first, then the halves
  // (replica order alone would give ((x0 + x1) + x2) + x3 = 1).
  MirroredStrategy s(testing::cpus(4), std::make_shared<HierarchicalCopyAllReduce>());
  const float x[4] = {1e8f, 1.0f, -1e8f, 1.0f};
  auto out = s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    std::vector<Tensor<float>> v(3, Tensor<float>{x[r]});
    return get_replica_context()->all_reduce(ReduceOp::SUM, v);
  });
  const float grouped = (x[0] + x[1]) + (x[2] + x[3]);
  const float sequential = ((x[0] + x[1]) + x[2]) + x[3];
  ASSERT_NE(grouped, sequential);
  for (int r = 0; r < 4; ++r)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(out[r][i].item(), grouped) << "replica " << r << " tensor " << i;
}

// ---------------------------------------------------------------------------------------------

TEST(NcclAllReduce, ConstructionAndBuildSupport) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { NcclAllReduce(-2); }), HasSubstr("num_packs must be >= 0, got -2"));
  EXPECT_EQ(NcclAllReduce().num_packs(), 1);
  EXPECT_EQ(NcclAllReduce(0).name(), "NcclAllReduce");
  MirroredStrategy s({"CPU:0", "CPU:1"}, std::make_shared<NcclAllReduce>());
  auto step = [&] { return s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 2.5f); }); };
  if (detail::nccl_compiled_in()) {
    // Host tensors take the host path (NCCL itself only ever sees GPU buffers).
    EXPECT_EQ(step()[1], 5.0f);
  } else {
    const std::string msg = message_of<UnimplementedError>([&] { step(); });
    EXPECT_THAT(msg, HasSubstr("NcclAllReduce::all_reduce"));
    EXPECT_THAT(msg, HasSubstr("CUDA"));
    auto v = s.experimental_distribute_values_from_function([](const ValueContext&) { return 1.0f; });
    EXPECT_THROW(s.reduce(ReduceOp::SUM, v, std::nullopt), UnimplementedError);
  }
}

}  // namespace
}  // namespace mirrored

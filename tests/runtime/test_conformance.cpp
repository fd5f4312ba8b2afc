// The conformance scenarios (conformance.hpp) on host replicas: every cross-device ops gives the
// default one's results bit for bit. The GPU tests (tests/gpu, tests/gpu_logical) compare GPU runs
// of the same scenarios with these CPU runs.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "collectives/ops_selection.hpp"

#include "conformance.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using conformance::expect_same;
using testing::cpus;

TEST(Conformance, TensorOpsAgreeAcrossHostDevices) {
  expect_same(conformance::tensor_ops("CPU:0"), conformance::tensor_ops("/job:localhost/device:CPU:3"), "CPU:3");
}

class ConformanceOps : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  // Every explicit ops this replica count supports (the default is the reference).
  std::vector<std::pair<std::string, std::shared_ptr<CrossDeviceOps>>> alternatives() const {
    std::vector<std::pair<std::string, std::shared_ptr<CrossDeviceOps>>> out;
    out.emplace_back("ReductionToOneDevice", std::make_shared<ReductionToOneDevice>());
    out.emplace_back("ReductionToOneDevice(CPU:0)", std::make_shared<ReductionToOneDevice>("CPU:0"));
    if (n() % 2 == 0) out.emplace_back("HierarchicalCopyAllReduce", std::make_shared<HierarchicalCopyAllReduce>());
    // In a build with NCCL, host tensors take NcclAllReduce's host path.
    if (detail::nccl_compiled_in()) out.emplace_back("NcclAllReduce", std::make_shared<NcclAllReduce>());
    return out;
  }
};

TEST_P(ConformanceOps, Collectives) {
  const auto reference = conformance::collectives(cpus(n()));
  for (const auto& [name, ops] : alternatives()) expect_same(reference, conformance::collectives(cpus(n()), ops), name);
}

TEST_P(ConformanceOps, ReduceGatherAndMergeCall) {
  const auto reference = conformance::reduce_and_gather(cpus(n()));
  for (const auto& [name, ops] : alternatives())
    expect_same(reference, conformance::reduce_and_gather(cpus(n()), ops), name);
}

TEST_P(ConformanceOps, Variables) {
  const auto reference = conformance::variables(cpus(n()));
  for (const auto& [name, ops] : alternatives()) expect_same(reference, conformance::variables(cpus(n()), ops), name);
}

TEST_P(ConformanceOps, OrderedSumsOfTheDefaultPaths) {
  expect_same(conformance::ordered_sums(cpus(n())),
              conformance::ordered_sums(cpus(n()), std::make_shared<ReductionToOneDevice>()), "ReductionToOneDevice");
}

// The input scenario's record on host replicas holds exactly the data: each step's slices, in
// replica order, are the batch's rows, and the replica function saw them (2x+1).
TEST_P(ConformanceOps, DistributedInputRecordsTheData) {
  const auto rec = conformance::distributed_input(cpus(n()));
  std::map<std::string, const conformance::Entry*> by_name;
  for (const auto& e : rec) by_name[e.name] = &e;
  using conformance::kInputWidth;
  for (int epoch = 0; epoch < 2; ++epoch) {
    int64_t row = 0;
    for (int step = 0; step < 3; ++step) {
      const std::string tag = "epoch " + std::to_string(epoch) + " step " + std::to_string(step);
      for (int r = 0; r < n(); ++r) {
        const auto* slice = by_name[tag + " slice " + std::to_string(r)];
        const auto* doubled = by_name[tag + " 2x+1 " + std::to_string(r)];
        ASSERT_TRUE(slice && doubled) << tag << " replica " << r;
        ASSERT_EQ(slice->shape.size(), 2u);
        EXPECT_EQ(slice->shape[1], kInputWidth);
        std::vector<float> got(slice->bytes.size() / sizeof(float)), twice(got.size());
        ASSERT_EQ(doubled->bytes.size(), slice->bytes.size());
        if (!got.empty()) {  // the last, partial batch leaves some replicas an empty slice
          std::memcpy(got.data(), slice->bytes.data(), slice->bytes.size());
          std::memcpy(twice.data(), doubled->bytes.data(), doubled->bytes.size());
        }
        for (std::size_t k = 0; k < got.size(); ++k) {
          const auto flat = static_cast<std::size_t>(row * kInputWidth) + k;
          ASSERT_EQ(got[k], static_cast<float>(flat % 4093)) << tag << " replica " << r << " element " << k;
          ASSERT_EQ(twice[k], 2.0f * got[k] + 1.0f) << tag << " replica " << r << " element " << k;
        }
        row += slice->shape[0];
      }
    }
    EXPECT_EQ(row, conformance::kInputRows) << "epoch " << epoch;
  }
  EXPECT_EQ(rec.size(), static_cast<std::size_t>(2 * 3 * 2 * n() + 3 * n()));
}

INSTANTIATE_TEST_SUITE_P(Replicas, ConformanceOps, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

// The conformance scenarios (conformance.hpp) on host replicas: every cross-device ops gives the
// default one's results bit for bit. The GPU tests (tests/gpu, tests/gpu_logical) compare GPU runs
// of the same scenarios with these CPU runs.
#include <gtest/gtest.h>

#include <mirrored/detail/ops_selection.hpp>

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

INSTANTIATE_TEST_SUITE_P(Replicas, ConformanceOps, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

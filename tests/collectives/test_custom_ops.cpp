// A CrossDeviceOps written outside the library, through the public extension API
// (<mirrored/collective_step.hpp>): what every replica has posted when the backend is called.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <string>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;

// Gathers like the library's backends, but first records whether every replica's output already
// existed, with its final shape, when the backend was called.
class CheckingGather final : public CrossDeviceOps {
 public:
  std::string name() const override { return "CheckingGather"; }
  void all_gather(int axis, CollectiveStep& step) override {
    const int n = step.num_replicas();
    int64_t expected_rows = 0;
    for (int r = 0; r < n; ++r) expected_rows += step.inputs(r)[0].shape[axis];
    for (int r = 0; r < n; ++r) {
      const auto& outs = step.outputs(r);
      if (outs.size() != 1 || outs[0].shape.empty() || outs[0].shape[axis] != expected_rows)
        missing_outputs.fetch_add(1);
    }
    // Fill this replica's own output (rank-1 tensors: concatenation is a copy per part).
    const auto& out = step.outputs(step.replica())[0];
    auto* dst = static_cast<unsigned char*>(out.data());
    for (int r = 0; r < n; ++r) {
      const auto& in = step.inputs(r)[0];
      std::memcpy(dst, in.data(), in.bytes());
      dst += in.bytes();
    }
  }
  std::atomic<int> missing_outputs{0};
};

TEST(CustomCrossDeviceOps, AllGatherSeesEveryReplicasOutputBeforeItIsCalled) {
  for (int n : {2, 3, 4}) {
    auto ops = std::make_shared<CheckingGather>();
    MirroredStrategy s(cpus(n), ops);
    for (int round = 0; round < 20; ++round) {
      auto out = s.run([] {
        const int r = get_replica_context()->replica_id_in_sync_group();
        // Replica r contributes r + 1 elements, all equal to r.
        return get_replica_context()->all_gather(Tensor<float>::full({r + 1}, float(r)), 0);
      });
      std::vector<float> want;
      for (int r = 0; r < n; ++r) want.insert(want.end(), r + 1, float(r));
      for (int r = 0; r < n; ++r) EXPECT_EQ(out[r].to_vector(), want) << "n=" << n << " replica " << r;
    }
    EXPECT_EQ(ops->missing_outputs.load(), 0) << "n=" << n;
  }
}

}  // namespace
}  // namespace mirrored

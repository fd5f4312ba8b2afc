// A CrossDeviceOps written outside the library, through the public extension API
// (<mirrored/collective_step.hpp>): what every replica has posted when the backend is called, and
// the packs it plans through the step.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

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

// Sums pack by pack, planned through the public CollectiveStep::plan_packs (as a backend of one's
// own would), and records every replica's plan: each replica writes its own outputs, reading every
// replica's inputs.
class PackwiseSum final : public CrossDeviceOps {
 public:
  std::string name() const override { return "PackwiseSum"; }
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    const CollectiveStep::PackPlan plan = step.plan_packs();
    {
      std::lock_guard lock(mu);
      plans.push_back(plan);
      bytes_per_pack.push_back(step.bytes_per_pack());
    }
    const int me = step.replica();
    for (const auto& pack : plan) {
      for (std::size_t i : pack) {
        const auto& out = step.outputs(me)[i];
        if (out.dtype == DType::float64)
          sum<double>(step, i, op);
        else
          sum<float>(step, i, op);
      }
    }
  }
  std::mutex mu;
  std::vector<CollectiveStep::PackPlan> plans;  // one per replica per collective
  std::vector<int64_t> bytes_per_pack;

 private:
  template <class T>
  static void sum(CollectiveStep& step, std::size_t i, ReduceOp op) {
    const auto& out = step.outputs(step.replica())[i];
    auto* dst = static_cast<T*>(out.data());
    for (int64_t k = 0; k < out.numel; ++k) {
      T total = 0;
      for (int r = 0; r < step.num_replicas(); ++r) total += static_cast<const T*>(step.inputs(r)[i].data())[k];
      dst[k] = op == ReduceOp::MEAN ? total / static_cast<T>(step.num_replicas()) : total;
    }
  }
};

TEST(CustomCrossDeviceOps, PlansPacksThroughTheStep) {
  constexpr int n = 3;
  auto ops = std::make_shared<PackwiseSum>();
  MirroredStrategy s(cpus(n), ops);
  // float tensors of 1, 2, 3 and 1 elements, then a double: with 8-byte packs the first pack
  // closes once it holds 12 bytes, the second at 12, and the double starts a pack of its own.
  for (const int64_t pack_bytes : {int64_t{8}, int64_t{0}}) {
    ops->plans.clear();
    ops->bytes_per_pack.clear();
    auto out = s.run([&] {
      const float r = float(get_replica_context()->replica_id_in_sync_group());
      CommunicationOptions o;
      o.bytes_per_pack = pack_bytes;
      return get_replica_context()->all_reduce(
          ReduceOp::SUM,
          std::make_tuple(Tensor<float>::full({1}, r), Tensor<float>::full({2}, r + 1), Tensor<float>::full({3}, r + 2),
                          Tensor<float>::full({1}, r + 3), Tensor<double>::full({1}, r + 4)),
          o);
    });
    const CollectiveStep::PackPlan want =
        pack_bytes == 8 ? CollectiveStep::PackPlan{{0, 1}, {2}, {3}, {4}} : CollectiveStep::PackPlan{{0, 1, 2, 3}, {4}};
    ASSERT_EQ(ops->plans.size(), std::size_t{n}) << "bytes_per_pack " << pack_bytes;
    for (const auto& plan : ops->plans) EXPECT_EQ(plan, want) << "bytes_per_pack " << pack_bytes;
    for (int64_t b : ops->bytes_per_pack) EXPECT_EQ(b, pack_bytes);
    // 0 + 1 + 2 = 3, plus n times the offset of each tensor.
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(std::get<0>(out[r]).to_vector(), std::vector<float>(1, 3.0f));
      EXPECT_EQ(std::get<1>(out[r]).to_vector(), std::vector<float>(2, 6.0f));
      EXPECT_EQ(std::get<2>(out[r]).to_vector(), std::vector<float>(3, 9.0f));
      EXPECT_EQ(std::get<3>(out[r]).to_vector(), std::vector<float>(1, 12.0f));
      EXPECT_EQ(std::get<4>(out[r]).to_vector(), std::vector<double>(1, 15.0));
    }
  }
}

}  // namespace
}  // namespace mirrored

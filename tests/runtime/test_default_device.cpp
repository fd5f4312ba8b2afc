// A tensor made without a device inside `run` is on the calling replica's device, as TF runs the
// replica function under its device's scope; outside `run` (and in a merge_fn, which is
// cross-replica context) it is on CPU:0.
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;

TEST(DefaultDevice, ATensorMadeInsideRunIsOnTheReplicasDevice) {
  MirroredStrategy s(cpus(3));
  std::mutex mu;
  std::vector<std::string> seen(3);
  s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    const std::vector<Device> made{Tensor<float>::full({2}, 1).device(),
                                   Tensor<float>::zeros({1}).device(),
                                   Tensor<float>::scalar(2).device(),
                                   Tensor<float>{1, 2}.device(),
                                   Tensor<float>::from_vector({1}, {1}).device(),
                                   Tensor<int64_t>::empty({3}).device()};
    std::string all;
    for (const Device& d : made) all += d.to_string() + " ";
    std::lock_guard lock(mu);
    seen[static_cast<std::size_t>(r)] = all;
  });
  for (int r = 0; r < 3; ++r) {
    const std::string d = Device(DeviceType::CPU, r).to_string() + " ";
    EXPECT_EQ(seen[static_cast<std::size_t>(r)], d + d + d + d + d + d) << "replica " << r;
  }
}

// The newcomer's step: a replica's input plus a tensor made in the step.
TEST(DefaultDevice, AReplicasInputCombinesWithATensorMadeInTheStep) {
  MirroredStrategy s(cpus(2));
  auto inputs = s.experimental_distribute_values_from_function(
      [](const ValueContext& ctx) { return Tensor<float>::full({2}, float(ctx.replica_id_in_sync_group + 1)); });
  auto out = s.run([](const Tensor<float>& x) { return x + Tensor<float>::full({2}, 10); }, inputs);
  const auto parts = s.experimental_local_results(out);
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].to_vector(), (std::vector<float>{11, 11}));
  EXPECT_EQ(parts[1].to_vector(), (std::vector<float>{12, 12}));
  EXPECT_EQ(parts[1].device(), Device(DeviceType::CPU, 1));
}

TEST(DefaultDevice, OutsideRunAndInAMergeFnItIsCpu0) {
  EXPECT_EQ(Tensor<float>::zeros({1}).device(), cpu0);
  MirroredStrategy s(cpus(2));
  {
    auto scope = s.scope();
    EXPECT_EQ(Tensor<float>::zeros({1}).device(), cpu0);
  }
  std::mutex mu;
  std::vector<Device> in_merge;
  s.run([&] {
    get_replica_context()->merge_call([&](Strategy&) {
      std::lock_guard lock(mu);
      in_merge.push_back(Tensor<float>::zeros({1}).device());
    });
  });
  EXPECT_EQ(in_merge, std::vector<Device>{cpu0});
  // An explicit device is kept inside run.
  s.run([] { EXPECT_EQ(Tensor<float>::zeros({1}, cpu0).device(), cpu0); });
}

}  // namespace
}  // namespace mirrored

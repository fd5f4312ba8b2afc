#pragma once
// The parameters the collective tests share: a replica count and the CPU cross-device ops.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>

#include <mirrored/mirrored.hpp>

#include "harness.hpp"

namespace mirrored::testing {

enum class Ops { InProcess, ToOneDevice };

/// A test parameterised by (replicas, ops): `make()` builds the strategy on `n()` CPU replicas.
class ReplicasAndOps : public ::testing::TestWithParam<std::tuple<int, Ops>> {
 public:  // helpers outside a fixture take it as an argument
  int n() const { return std::get<0>(GetParam()); }
  std::unique_ptr<MirroredStrategy> make() const {
    std::shared_ptr<CrossDeviceOps> ops;
    if (std::get<1>(GetParam()) == Ops::ToOneDevice)
      ops = std::make_shared<ReductionToOneDevice>();
    else
      ops = std::make_shared<InProcessAllReduce>();
    return std::make_unique<MirroredStrategy>(cpus(n()), ops);
  }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

/// "3replicas_InProcess": the names of the instantiations.
inline std::string replicas_and_ops_name(const ::testing::TestParamInfo<std::tuple<int, Ops>>& info) {
  return std::to_string(std::get<0>(info.param)) + "replicas_" +
         (std::get<1>(info.param) == Ops::InProcess ? "InProcess" : "ToOneDevice");
}

}  // namespace mirrored::testing

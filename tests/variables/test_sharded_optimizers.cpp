// Sharded optimizer state (shard_optimizer_state, docs/api.md §13) and the update inside the reduction:
// on CPU replicas the weights and slots are bitwise those of the unsharded optimizer for SGD,
// momentum, Nesterov, Adam and AdamW, N = 1, 2, 3, 4, 8, sizes not divisible by N, through the
// fused in-process pass (InProcessAllReduce) and the generic one (ReductionToOneDevice:
// reduce-scatter, update, all-gather); each replica holds about 1/N of every slot; slots read
// and checkpoint as whole values, across sharded and unsharded and another N.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <mirrored/variable_checkpoint.hpp>

#include "harness.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace sharded_test {  // named: the unity build puts these beside test_fused_optimizers.cpp's

using testing::cpus;
using ::testing::HasSubstr;
using testing::Kind;
using testing::kind_name;
using testing::message_of;
using testing::same_bits;
using testing::slot_names;

enum class Ops { InProcess, ToOneDevice };

template <class T>
std::unique_ptr<optimizers::Optimizer<T>> make(Kind k, bool sharded) {
  return testing::make_optimizer<T>(k, sharded);
}

// Shapes whose sizes divide by none of the replica counts (and one smaller than most of them).
const std::vector<Shape> kShapes{{7, 3}, {5}, {1}, {130}, {2, 2, 3}};

// Replica r's gradient of variable k at `step`: values that round when summed.
template <class T>
Tensor<T> gradient(const Shape& shape, int k, int r, int step) {
  std::vector<T> v(static_cast<std::size_t>(detail::shape_numel(shape, sizeof(T))));
  uint32_t seed = 2654435761u * static_cast<uint32_t>(step + 1) + 40503u * static_cast<uint32_t>(k) +
                  97u * static_cast<uint32_t>(r);
  for (auto& x : v) {
    seed = seed * 1664525u + 1013904223u;
    x = static_cast<T>(static_cast<double>(seed >> 8) / 16777216.0 * 2.0 - 0.9);
  }
  return Tensor<T>::from_vector(v, shape);
}

// Everything one training run ends with, on the host: every copy of every weight and the whole
// slots, as bytes.
struct Result {
  std::vector<std::vector<float>> weights;  // per variable and replica copy, concatenated
  std::vector<std::vector<float>> slots;    // per variable and slot name
  int64_t iterations = 0;
};

Result train(Kind kind, bool sharded, int n, Ops ops, int steps, bool skip_aggregation = false) {
  std::shared_ptr<CrossDeviceOps> cross = ops == Ops::InProcess
                                              ? std::shared_ptr<CrossDeviceOps>(std::make_shared<InProcessAllReduce>())
                                              : std::make_shared<ReductionToOneDevice>();
  MirroredStrategy s(cpus(n), cross);
  std::vector<Variable<float>> vars;
  {
    auto scope = s.scope();
    for (std::size_t k = 0; k < kShapes.size(); ++k)
      vars.emplace_back(gradient<float>(kShapes[k], static_cast<int>(k), 99, 0) * 3.0f);
  }
  auto opt = make<float>(kind, sharded);
  for (int step = 0; step < steps; ++step) {
    s.run([&] {
      auto* ctx = get_replica_context();
      const int r = ctx->replica_id_in_sync_group();
      optimizers::GradsAndVars<float> gv;
      for (std::size_t k = 0; k < vars.size(); ++k) {
        Tensor<float> g = gradient<float>(kShapes[k], static_cast<int>(k), r, step);
        // Already reduced: the caller's own all-reduce (the same sums in the same order).
        if (skip_aggregation) g = ctx->all_reduce(ReduceOp::SUM, g);
        gv.emplace_back(g, vars[k]);
      }
      opt->apply_gradients(gv, skip_aggregation);
    });
  }
  Result out;
  for (const auto& v : vars) {
    std::vector<float> all;
    for (const auto& c : v.components()) {
      const auto host = c.to_vector();
      all.insert(all.end(), host.begin(), host.end());
    }
    out.weights.push_back(all);
    for (const auto& name : slot_names(kind)) out.slots.push_back(opt->get_slot(v, name).value().to_vector());
  }
  out.iterations = opt->iterations();
  return out;
}

class ShardedOptimizer : public ::testing::TestWithParam<std::tuple<Kind, int, Ops>> {
 protected:
  Kind kind() const { return std::get<0>(GetParam()); }
  int n() const { return std::get<1>(GetParam()); }
  Ops ops() const { return std::get<2>(GetParam()); }
};

// The acceptance: 1000 steps (fewer under the sanitizers, which are 10-50x slower).
TEST_P(ShardedOptimizer, WeightsAndSlotsAreBitwiseThoseOfTheUnshardedOptimizer) {
  const int steps = testing::kSanitized ? 60 : 1000;
  const Result plain = train(kind(), false, n(), ops(), steps);
  const Result sharded = train(kind(), true, n(), ops(), steps);
  EXPECT_TRUE(same_bits(plain.weights, sharded.weights));
  EXPECT_TRUE(same_bits(plain.slots, sharded.slots));
  EXPECT_EQ(plain.iterations, steps);
  EXPECT_EQ(sharded.iterations, steps);
  // Every copy of a weight is the same.
  for (std::size_t k = 0; k < kShapes.size(); ++k) {
    const auto& all = sharded.weights[k];
    const std::size_t len = all.size() / static_cast<std::size_t>(n());
    for (int r = 1; r < n(); ++r)
      EXPECT_EQ(0, std::memcmp(all.data(), all.data() + r * len, len * sizeof(float))) << "variable " << k;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, ShardedOptimizer,
    ::testing::Combine(::testing::Values(Kind::sgd, Kind::momentum, Kind::nesterov, Kind::adam, Kind::adamw,
                                         Kind::rmsprop_centered_momentum, Kind::adagrad),
                       ::testing::Values(1, 2, 3, 4, 8), ::testing::Values(Ops::InProcess, Ops::ToOneDevice)),
    [](const auto& info) {
      return std::string(kind_name(std::get<0>(info.param))) + "_" + std::to_string(std::get<1>(info.param)) +
             "replicas_" + (std::get<2>(info.param) == Ops::InProcess ? "InProcess" : "ToOneDevice");
    });

// The fused pass (in process) and the generic one (reduce-scatter or all-reduce, then the
// update) give the same bits, and so does skipping the aggregation after an all-reduce of one's own.
class OptimizerPaths : public ::testing::TestWithParam<std::tuple<Kind, int>> {};

TEST_P(OptimizerPaths, EveryPathGivesTheSameBits) {
  const auto [kind, n] = GetParam();
  const int steps = testing::kSanitized ? 10 : 50;
  const Result fused = train(kind, false, n, Ops::InProcess, steps);
  for (const bool sharded : {false, true}) {
    const Result generic = train(kind, sharded, n, Ops::ToOneDevice, steps);
    EXPECT_TRUE(same_bits(fused.weights, generic.weights)) << "sharded " << sharded;
    EXPECT_TRUE(same_bits(fused.slots, generic.slots)) << "sharded " << sharded;
    const Result skipped = train(kind, sharded, n, Ops::InProcess, steps, true);
    EXPECT_TRUE(same_bits(fused.weights, skipped.weights)) << "skip_gradients_aggregation, sharded " << sharded;
    EXPECT_TRUE(same_bits(fused.slots, skipped.slots)) << "skip_gradients_aggregation, sharded " << sharded;
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerPaths,
                         ::testing::Combine(::testing::Values(Kind::sgd, Kind::momentum, Kind::nesterov, Kind::adam,
                                                              Kind::adamw, Kind::rmsprop_centered_momentum,
                                                              Kind::adagrad),
                                            ::testing::Values(1, 2, 3, 4, 8)),
                         [](const auto& info) {
                           return std::string(kind_name(std::get<0>(info.param))) + "_" +
                                  std::to_string(std::get<1>(info.param)) + "replicas";
                         });

// Adam on 4 replicas: each holds the BALANCED slice of m and v (and the 8-byte step counter).
TEST(ShardedOptimizerState, EachReplicaHoldsItsSliceOfEverySlot) {
  constexpr int kN = 4;
  const std::vector<int64_t> sizes{1000003, 10, 1};
  auto bytes_with = [&](bool sharded) {
    MirroredStrategy s(cpus(kN));
    std::vector<Variable<float>> vars;
    {
      auto scope = s.scope();
      for (int64_t n : sizes) vars.emplace_back(Tensor<float>::zeros({n}));
    }
    optimizers::Adam<float> opt(optimizers::AdamOptions{.shard_optimizer_state = sharded});
    s.run([&] {
      optimizers::GradsAndVars<float> gv;
      for (const auto& v : vars) gv.emplace_back(Tensor<float>::full(v.shape(), 1.0f), v);
      opt.apply_gradients(gv);
    });
    return opt.state_bytes_per_replica();
  };
  const std::vector<int64_t> full = bytes_with(false);
  const std::vector<int64_t> sliced = bytes_with(true);
  ASSERT_EQ(full.size(), std::size_t{kN});
  ASSERT_EQ(sliced.size(), std::size_t{kN});
  for (int r = 0; r < kN; ++r) {
    int64_t want = 8;  // the step counter
    for (int64_t n : sizes) want += 2 * 4 * detail::balanced_piece(n, kN, r).count;
    EXPECT_EQ(full[static_cast<std::size_t>(r)], 8 + 2 * 4 * (1000003 + 10 + 1)) << "replica " << r;
    EXPECT_EQ(sliced[static_cast<std::size_t>(r)], want) << "replica " << r;
    EXPECT_LE(static_cast<double>(sliced[static_cast<std::size_t>(r)]), 0.26 * static_cast<double>(full[0]));
  }
}

TEST(ShardedOptimizerState, SlotsAreShardedVariablesReadWholeInCrossReplicaContext) {
  MirroredStrategy s(cpus(3));
  std::optional<Variable<float>> w;
  {
    auto scope = s.scope();
    w.emplace(Tensor<float>::zeros({5}));
  }
  optimizers::SGD<float> opt(
      optimizers::SGDOptions{.learning_rate = 1, .momentum = 0.5, .shard_optimizer_state = true});
  s.run([&] { opt.apply_gradients({{Tensor<float>::from_vector({1, 2, 3, 4, 5}, {5}), *w}}); });
  Variable<float> m = opt.get_slot(*w, "momentum");
  EXPECT_TRUE(m.is_sharded());
  EXPECT_FALSE(m.is_mirrored());
  EXPECT_EQ(m.shape(), (Shape{5}));
  // velocity = -lr * (3 * g): the sum over 3 replicas.
  EXPECT_EQ(m.value().to_vector(), (std::vector<float>{-3, -6, -9, -12, -15}));
  std::vector<Shape> slices;
  for (const auto& c : m.components()) slices.push_back(c.shape());
  EXPECT_EQ(slices, (std::vector<Shape>{{2}, {2}, {1}}));
  std::ostringstream printed;
  printed << m;
  EXPECT_THAT(printed.str(), HasSubstr("ShardedVariable:{\n  0: <Variable 'Variable/momentum:0' shape=(2,)"));
  // Written whole in cross-replica context: cut into the slices.
  m.assign(Tensor<float>::from_vector({10, 20, 30, 40, 50}, {5}));
  EXPECT_EQ(m.components()[2].to_vector(), (std::vector<float>{50}));
  EXPECT_EQ(m.value().to_vector(), (std::vector<float>{10, 20, 30, 40, 50}));
  // Inside run each replica has a slice only: reading or writing the whole is refused.
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { s.run([&] { (void)m.value(); }); }),
              HasSubstr("is sharded across the replicas (each holds a slice); read it whole in cross-replica context"));
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { s.run([&] { m.assign(Tensor<float>::zeros({5})); }); }),
              HasSubstr("write it whole in cross-replica context"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                m.assign(PerReplica<Tensor<float>>(std::vector<Tensor<float>>(3, Tensor<float>::zeros({5}))));
              }),
              HasSubstr("a sharded variable takes one whole value"));
}

// Checkpoints hold whole slots: written sharded on 4 replicas, restored unsharded on 3 and sharded
// on 2, training goes on with the same bits as the run that was never interrupted.
TEST(ShardedOptimizerState, CheckpointsRestoreAcrossShardingAndReplicaCounts) {
  const auto dir = std::filesystem::temp_directory_path() / ("mirrored_sharded_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ckpt.safetensors").string();
  const Shape shape{11};
  // SGD with momentum: the update does not depend on the step count, which is not checkpointed here.
  auto step_all = [&](MirroredStrategy& s, optimizers::SGD<float>& opt, Variable<float>& w, int from, int to) {
    for (int step = from; step < to; ++step) {
      s.run([&] {
        // The same global gradient whatever the replica count: replica 0 contributes it all.
        const int r = get_replica_context()->replica_id_in_sync_group();
        opt.apply_gradients({{r == 0 ? gradient<float>(shape, 0, 0, step) : Tensor<float>::zeros(shape), w}});
      });
    }
  };
  auto make_opt = [](bool sharded) {
    return optimizers::SGD<float>(
        optimizers::SGDOptions{.learning_rate = 0.1, .momentum = 0.9, .shard_optimizer_state = sharded});
  };
  // Uninterrupted: 6 steps on 4 replicas, sharded.
  std::vector<float> want;
  {
    MirroredStrategy s(cpus(4));
    auto scope = s.scope();
    Variable<float> w(gradient<float>(shape, 1, 1, 1));
    auto opt = make_opt(true);
    step_all(s, opt, w, 0, 6);
    want = w.value().to_vector();
  }
  // 3 steps on 4 replicas sharded, saved.
  {
    MirroredStrategy s(cpus(4));
    auto scope = s.scope();
    Variable<float> w(gradient<float>(shape, 1, 1, 1));
    auto opt = make_opt(true);
    step_all(s, opt, w, 0, 3);
    checkpoint::save(path, {{"w", w}, {"w/momentum", opt.get_slot(w, "momentum")}});
  }
  for (const auto& [n, sharded] : std::vector<std::pair<int, bool>>{{3, false}, {2, true}, {1, true}}) {
    MirroredStrategy s(cpus(n));
    auto scope = s.scope();
    Variable<float> w(Tensor<float>::zeros(shape));
    auto opt = make_opt(sharded);
    opt.build({w});
    checkpoint::restore(path, {{"w", w}, {"w/momentum", opt.get_slot(w, "momentum")}});
    EXPECT_EQ(opt.get_slot(w, "momentum").is_sharded(), sharded && n > 0);
    step_all(s, opt, w, 3, 6);
    EXPECT_EQ(w.value().to_vector(), want) << n << " replicas, sharded " << sharded;
  }
  std::filesystem::remove_all(dir);
}

TEST(ShardedOptimizerState, ReplicasThatDisagreeAreRejectedBeforeAnyUpdate) {
  MirroredStrategy s(cpus(2));
  std::optional<Variable<float>> a, b;
  {
    auto scope = s.scope();
    a.emplace(Tensor<float>::zeros({4}));
    b.emplace(Tensor<float>::zeros({3}));
  }
  optimizers::Adam<float> opt(optimizers::AdamOptions{.shard_optimizer_state = true});
  {
    auto scope = s.scope();
    opt.build({*a, *b});  // slots made before: the step itself is what disagrees
  }
  const auto msg = message_of<InvalidArgumentError>([&] {
    s.run([&] {
      if (get_replica_context()->replica_id_in_sync_group() == 0)
        opt.apply_gradients({{Tensor<float>::zeros({4}), *a}});
      else
        opt.apply_gradients({{Tensor<float>::zeros({4}), *a}, {Tensor<float>::zeros({3}), *b}});
    });
  });
  EXPECT_THAT(msg, HasSubstr("apply_gradients: replica 0 passed 1 gradients but replica 1 passed 2"));
  EXPECT_EQ(a->value().to_vector(), std::vector<float>(4, 0.0f));
}

}  // namespace sharded_test
}  // namespace mirrored

// RMSprop and Adagrad against Keras 3's formulas: steps whose arithmetic is exact in float (so the
// expectations are exact), many steps against a double reference (within float rounding), their
// slots (names, order, initial values) and their options' checks. The fused, packed, sharded and
// checkpointed paths are covered with every kind in the fused, sharded and manager tests.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "harness.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace {

using ::testing::HasSubstr;
using testing::message_of;

float slot_of(const optimizers::Optimizer<float>& opt, const Variable<float>& w, const std::string& name) {
  return opt.get_slot(w, name).value().item();
}

// rho 0.75 makes velocity = g²/4, a perfect square for these gradients.
TEST(RMSprop, TwoExactStepsWithoutMomentum) {
  Variable<float> w(Tensor<float>{3});
  optimizers::RMSprop<> opt({.learning_rate = 0.5, .rho = 0.75, .epsilon = 0});
  opt.apply_gradients({{Tensor<float>{2}, w}});
  // velocity = 0.75·0 + 0.25·4 = 1; increment = 0.5·2 / √1 = 1.
  EXPECT_EQ(w.value().item(), 2.0f);
  EXPECT_EQ(slot_of(opt, w, "velocity"), 1.0f);
  opt.apply_gradients({{Tensor<float>{1}, w}});
  // velocity = 0.75·1 + 0.25·1 = 1; increment = 0.5·1 / 1 = 0.5.
  EXPECT_EQ(w.value().item(), 1.5f);
  EXPECT_EQ(slot_of(opt, w, "velocity"), 1.0f);
  EXPECT_THROW(opt.get_slot(w, "momentum"), NotFoundError);
}

TEST(RMSprop, MomentumAccumulatesTheIncrements) {
  Variable<float> w(Tensor<float>{3});
  optimizers::RMSprop<> opt({.learning_rate = 0.5, .rho = 0.75, .momentum = 0.5, .epsilon = 0});
  opt.apply_gradients({{Tensor<float>{2}, w}});
  EXPECT_EQ(slot_of(opt, w, "momentum"), 1.0f);  // 0.5·0 + 1
  EXPECT_EQ(w.value().item(), 2.0f);
  opt.apply_gradients({{Tensor<float>{1}, w}});
  EXPECT_EQ(slot_of(opt, w, "momentum"), 1.0f);  // 0.5·1 + 0.5
  EXPECT_EQ(w.value().item(), 1.0f);
}

// rho 0.5: velocity = g²/2 and average_gradient = g/2, so the denominator is g²/4.
TEST(RMSprop, CenteredDividesByTheGradientsDeviation) {
  Variable<float> w(Tensor<float>{3, 3});
  optimizers::RMSprop<> opt({.learning_rate = 0.5, .rho = 0.5, .momentum = 0.5, .epsilon = 0, .centered = true});
  opt.apply_gradients({{Tensor<float>{2, -4}, w}});
  // velocity = 2, 8; average_gradient = 1, -2; denominator = 1, 4; increment = 1, -1.
  EXPECT_EQ(opt.get_slot(w, "velocity").value().to_vector(), (std::vector<float>{2, 8}));
  EXPECT_EQ(opt.get_slot(w, "average_gradient").value().to_vector(), (std::vector<float>{1, -2}));
  EXPECT_EQ(opt.get_slot(w, "momentum").value().to_vector(), (std::vector<float>{1, -1}));
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{2, 4}));
}

TEST(RMSprop, KeepsKerasSlotsInKerasOrder) {
  for (const auto& [momentum, centered, names] : std::vector<std::tuple<double, bool, std::vector<std::string>>>{
           {0.0, false, {"velocity"}},
           {0.9, false, {"velocity", "momentum"}},
           {0.0, true, {"velocity", "average_gradient"}},
           {0.9, true, {"velocity", "momentum", "average_gradient"}}}) {
    Variable<float> w(Tensor<float>{1, 2}, VariableOptions{.name = "w"});
    optimizers::RMSprop<> opt({.momentum = momentum, .centered = centered});
    opt.build({w});
    for (const auto& name : names) {
      EXPECT_EQ(opt.get_slot(w, name).name(), "w/" + name);
      EXPECT_EQ(opt.get_slot(w, name).value().to_vector(), (std::vector<float>{0, 0})) << name;
    }
    EXPECT_EQ(opt.state_bytes_per_replica(), (std::vector<int64_t>{static_cast<int64_t>(names.size()) * 8 + 8}));
  }
}

TEST(Adagrad, TheAccumulatorStartsAtItsInitialValue) {
  Variable<float> w(Tensor<float>{1, 2, 3});
  optimizers::Adagrad<> opt;  // Keras' default initial_accumulator_value, 0.1
  opt.build({w});
  EXPECT_EQ(opt.get_slot(w, "accumulator").value().to_vector(), (std::vector<float>{0.1f, 0.1f, 0.1f}));
  EXPECT_EQ(opt.options().learning_rate, 0.001);
  EXPECT_EQ(opt.options().epsilon, 1e-7);
}

TEST(Adagrad, TwoExactSteps) {
  Variable<float> w(Tensor<float>{10});
  optimizers::Adagrad<> opt({.learning_rate = 1.25, .initial_accumulator_value = 0, .epsilon = 0});
  opt.apply_gradients({{Tensor<float>{3}, w}});
  // accumulator = 9; w = 10 − 1.25·3 / 3.
  EXPECT_EQ(slot_of(opt, w, "accumulator"), 9.0f);
  EXPECT_EQ(w.value().item(), 8.75f);
  opt.apply_gradients({{Tensor<float>{4}, w}});
  // accumulator = 25; w = 8.75 − 1.25·4 / 5.
  EXPECT_EQ(slot_of(opt, w, "accumulator"), 25.0f);
  EXPECT_EQ(w.value().item(), 7.75f);
  EXPECT_EQ(opt.iterations(), 2);
}

// Keras' formulas in double, one element at a time.
struct DoubleReference {
  testing::Kind kind;
  double w, velocity = 0, momentum = 0, average = 0, accumulator = 0.1;

  void apply(double g) {
    constexpr double lr = 0.01, rho = 0.9, mu = 0.9, eps = 1e-7;
    if (kind == testing::Kind::adagrad) {
      constexpr double adagrad_lr = 0.1;
      accumulator += g * g;
      w -= adagrad_lr * g / std::sqrt(accumulator + eps);
      return;
    }
    velocity = rho * velocity + (1 - rho) * g * g;
    average = rho * average + (1 - rho) * g;
    momentum = mu * momentum + lr * g / std::sqrt(velocity - average * average + eps);
    w -= momentum;
  }
};

// 200 steps of the float optimizers (the tests' hyperparameters, optimizer_kinds.hpp) stay within
// float rounding of the double reference: a few units in the last place of a weight per step.
TEST(KerasOptimizers, FloatStaysWithinRoundingOfADoubleReference) {
  for (const testing::Kind kind : testing::kSlotRichKinds) {
    constexpr int kN = 64;
    std::vector<float> start(kN);
    for (int i = 0; i < kN; ++i) start[static_cast<std::size_t>(i)] = static_cast<float>(i % 9 - 4) / 4;
    Variable<float> w(Tensor<float>::from_vector(start, {kN}));
    auto opt = testing::make_optimizer<float>(kind, false);
    std::vector<DoubleReference> ref;
    for (float x : start) ref.push_back({kind, x});
    for (int step = 1; step <= 200; ++step) {
      std::vector<float> g(kN);
      for (int i = 0; i < kN; ++i)
        g[static_cast<std::size_t>(i)] = static_cast<float>((i * 7 + step * 13) % 17 - 8) / 8;
      opt->apply_gradients({{Tensor<float>::from_vector(g, {kN}), w}});
      for (int i = 0; i < kN; ++i) ref[static_cast<std::size_t>(i)].apply(g[static_cast<std::size_t>(i)]);
    }
    const auto got = w.value().to_vector();
    double worst = 0;
    for (int i = 0; i < kN; ++i) {
      const double want = ref[static_cast<std::size_t>(i)].w;
      worst = std::max(worst, std::abs(got[static_cast<std::size_t>(i)] - want) / std::max(1.0, std::abs(want)));
    }
    // 200 steps of at most a few float ulps (6e-8 relative) each.
    EXPECT_LT(worst, 200 * 4 * 6e-8) << testing::kind_name(kind);
    EXPECT_GT(worst, 0.0) << testing::kind_name(kind) << ": float and double cannot agree exactly here";
  }
}

TEST(KerasOptimizers, BadOptionsAreNamed) {
  EXPECT_EQ(message_of<InvalidArgumentError>([] { optimizers::RMSprop<>({.rho = 1.0}); }),
            "RMSprop: rho must be in [0, 1), got 1");
  EXPECT_EQ(message_of<InvalidArgumentError>([] { optimizers::RMSprop<>({.learning_rate = -1}); }),
            "RMSprop: learning_rate must be >= 0, got -1");
  EXPECT_EQ(message_of<InvalidArgumentError>([] { optimizers::RMSprop<>({.momentum = -0.5}); }),
            "RMSprop: momentum must be >= 0, got -0.5");
  EXPECT_EQ(message_of<InvalidArgumentError>([] { optimizers::Adagrad<>({.initial_accumulator_value = -1}); }),
            "Adagrad: initial_accumulator_value must be >= 0, got -1");
  EXPECT_THAT(message_of<InvalidArgumentError>([] { optimizers::Adagrad<>({.epsilon = -1}); }),
              HasSubstr("Adagrad: epsilon must be >= 0"));
}

// The kind is what every replica agrees on: RMSprop on one replica and Adagrad on another is
// refused before anything is updated.
TEST(KerasOptimizers, ReplicasWithDifferentKindsAreRefused) {
  MirroredStrategy s(testing::cpus(2));
  Variable<float> w = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{1, 2});
  }();
  optimizers::RMSprop<> rmsprop;
  optimizers::Adagrad<> adagrad;
  rmsprop.build({w});
  adagrad.build({w});
  EXPECT_THROW(s.run([&] {
    const bool first = get_replica_context()->replica_id_in_sync_group() == 0;
    optimizers::Optimizer<float>& opt = first ? static_cast<optimizers::Optimizer<float>&>(rmsprop) : adagrad;
    opt.apply_gradients({{Tensor<float>{1, 1}, w}});
  }),
               InvalidArgumentError);
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{1, 2}));
}

}  // namespace
}  // namespace mirrored

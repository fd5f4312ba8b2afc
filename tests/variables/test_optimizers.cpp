// Optimizers and compute_average_loss: exact updates, distributed aggregation, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "harness.hpp"
#include "mirrored/detail/optimizer_formulas.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

std::vector<float> vec(const Variable<float>& v) { return v.value().to_vector(); }

TEST(SGD, PlainVariableWithoutMomentum) {
  Variable<float> w(Tensor<float>{1, 2});
  optimizers::SGD<> opt({.learning_rate = 0.5});
  opt.apply_gradients({{Tensor<float>{1, -2}, w}});
  EXPECT_EQ(vec(w), (std::vector<float>{0.5f, 3.0f}));
  EXPECT_EQ(opt.iterations(), 1);
  EXPECT_THROW((void)opt.get_slot(w, "momentum"), NotFoundError);
}

TEST(SGD, MomentumAndNesterovFollowKeras) {
  for (bool nesterov : {false, true}) {
    Variable<float> w(Tensor<float>{10});
    optimizers::SGD<> opt({.learning_rate = 1.0, .momentum = 0.5, .nesterov = nesterov});
    float v = 0, x = 10;
    for (float g : {2.0f, 4.0f, -8.0f}) {
      opt.apply_gradients({{Tensor<float>{g}, w}});
      v = 0.5f * v - g;
      x += nesterov ? 0.5f * v - g : v;
      EXPECT_EQ(vec(w)[0], x) << "nesterov=" << nesterov;
    }
    EXPECT_EQ(opt.get_slot(w, "momentum").value().item(), v);
  }
}

TEST(Adam, MatchesTheKerasFormula) {
  Variable<float> w(Tensor<float>{1, -1});
  optimizers::Adam<> opt({.learning_rate = 0.1});
  float m[2] = {0, 0}, v[2] = {0, 0}, x[2] = {1, -1};
  const float grads[3][2] = {{1, 2}, {-3, 0.5f}, {2, 2}};
  for (int t = 1; t <= 3; ++t) {
    opt.apply_gradients({{Tensor<float>{grads[t - 1][0], grads[t - 1][1]}, w}});
    // Keras' step size, in float: the betas and their powers rounded to float first.
    const float b1_power = static_cast<float>(std::pow(double(0.9f), t));
    const float b2_power = static_cast<float>(std::pow(double(0.999f), t));
    const float lr = 0.1f * std::sqrt(1.0f - b2_power) / (1.0f - b1_power);
    for (int i = 0; i < 2; ++i) {
      const float g = grads[t - 1][i];
      // The one-minus-betas are formed in double, then rounded to float, as Keras does.
      m[i] += (g - m[i]) * static_cast<float>(1 - 0.9);
      v[i] += (g * g - v[i]) * static_cast<float>(1 - 0.999);
      x[i] -= lr * m[i] / (std::sqrt(v[i]) + 1e-7f);
    }
    EXPECT_EQ(vec(w), (std::vector<float>{x[0], x[1]})) << "step " << t;
  }
  EXPECT_EQ(opt.get_slot(w, "m").value().to_vector(), (std::vector<float>{m[0], m[1]}));
  EXPECT_EQ(opt.iterations(), 3);
}

// Adam's bias-corrected step size as Keras 3 computes it for a float variable (in float): the values
// TensorFlow 2.21 gave at these steps for Keras' defaults and learning rate 0.001. The exact step
// size (in double) is about 6e-6 larger in the first hundreds of steps: 3.1622777e-4 at step 1.
TEST(Adam, StepSizeIsKerasInTheVariablesType) {
  using detail::adam_step_size;
  EXPECT_EQ(adam_step_size<float>(0.001, 0.9, 0.999, 1), 0.00031622566f);
  EXPECT_EQ(adam_step_size<float>(0.001, 0.9, 0.999, 10), 0.00015318804f);
  EXPECT_EQ(adam_step_size<float>(0.001, 0.9, 0.999, 100), 0.000308564f);
  EXPECT_EQ(adam_step_size<float>(0.001, 0.9, 0.999, 469), 0.00061197666f);
  EXPECT_EQ(adam_step_size<float>(0.001, 0.9, 0.999, 4690), 0.0009954066f);
  // In double, Keras' float64 formula.
  for (double t : {1.0, 10.0, 469.0})
    EXPECT_EQ(adam_step_size<double>(0.001, 0.9, 0.999, t),
              0.001 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t)));
}

TEST(Optimizers, InvalidHyperparameters) {
  EXPECT_THROW(optimizers::SGD<>({.learning_rate = -1}), InvalidArgumentError);
  EXPECT_THROW(optimizers::SGD<>({.momentum = 1.5}), InvalidArgumentError);
  EXPECT_THROW(optimizers::Adam<>({.beta_1 = 1.0}), InvalidArgumentError);
}

class DistributedOptimizerTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

TEST_P(DistributedOptimizerTest, GradientsAreSummedAndEveryCopyGetsTheSameUpdate) {
  for (bool packed : {true, false}) {
    MirroredStrategy s(cpus(n()));
    std::vector<Variable<float>> vars;
    {
      auto scope = s.scope();
      vars.emplace_back(Tensor<float>{100, 200}, VariableOptions{.name = "kernel"});
      vars.emplace_back(Tensor<float>{50}, VariableOptions{.name = "bias"});
    }
    optimizers::SGD<> opt({.learning_rate = 1.0, .momentum = 0.5});
    opt.pack_gradients = packed;
    for (int step = 0; step < 2; ++step) {
      s.run([&] {
        const float g = float(id() + 1);
        opt.apply_gradients({{Tensor<float>{g, 2 * g}, vars[0]}, {Tensor<float>{-g}, vars[1]}});
      });
    }
    // Summed gradient k = n(n+1)/2 per unit; two momentum steps: v1 = -k, v2 = -1.5k; w -= 2.5k.
    const float k = float(n() * (n() + 1) / 2);
    for (const auto& c : vars[0].components())
      EXPECT_EQ(c.to_vector(), (std::vector<float>{100 - 2.5f * k, 200 - 5 * k}));
    for (const auto& c : vars[1].components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{50 + 2.5f * k}));
    Variable<float> slot = opt.get_slot(vars[0], "momentum");
    EXPECT_TRUE(slot.is_mirrored());
    EXPECT_EQ(slot.num_components(), static_cast<std::size_t>(n()));
    EXPECT_EQ(opt.iterations(), 2);
  }
}

TEST_P(DistributedOptimizerTest, SlotsCanBeBuiltInTheScope) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> w(Tensor<float>{1, 1});
  optimizers::Adam<> opt;
  opt.build({w});
  EXPECT_TRUE(opt.get_slot(w, "v").is_mirrored());
  EXPECT_EQ(opt.get_slot(w, "v").name(), "Variable/v");
}

TEST_P(DistributedOptimizerTest, MisuseIsReported) {
  MirroredStrategy s(cpus(n()));
  Variable<float> w = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{1, 1});
  }();
  optimizers::SGD<> opt;
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                opt.apply_gradients({{Tensor<float>{1, 1}, w}});
              }),
              HasSubstr("must be called inside its run"));
  EXPECT_EQ(message_of<InvalidArgumentError>([&] {
              opt.apply_gradients({{Tensor<float>{1}, w}});
            }),
            "apply_gradients: gradient of shape (1,) for variable 'Variable' of shape (2,)");
  Variable<float> plain(Tensor<float>{1, 1}, VariableOptions{.name = "plain"});
  // A variable of no strategy beside the strategy's: it was made outside the scope.
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                opt.apply_gradients({{Tensor<float>{1, 1}, w}, {Tensor<float>{1, 1}, plain}});
              }),
              HasSubstr("apply_gradients: variable 'plain' was made outside the scope of"));
}

TEST_P(DistributedOptimizerTest, ComputeAverageLossDividesByTheGlobalBatch) {
  MirroredStrategy s(cpus(n()));
  auto losses = s.run([] {
    Tensor<float> per_example = Tensor<float>{1, 2, 3, 4} + float(id());
    return std::make_pair(nn::compute_average_loss(per_example).item(),
                          nn::compute_average_loss(per_example, 8).item());
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(losses[r].first, (10.0f + 4 * r) / float(4 * n()));
    EXPECT_EQ(losses[r].second, (10.0f + 4 * r) / 8);
  }
  EXPECT_THROW(nn::compute_average_loss(Tensor<float>::scalar(1)), InvalidArgumentError);
  EXPECT_THROW(nn::compute_average_loss(Tensor<float>{1}, 0), InvalidArgumentError);
}

INSTANTIATE_TEST_SUITE_P(Replicas, DistributedOptimizerTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

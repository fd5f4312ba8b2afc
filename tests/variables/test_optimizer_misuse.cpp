// Optimizer misuse that would otherwise race or silently desynchronise the mirrored copies: a
// variable made outside the strategy's scope updated inside run (one copy that every replica
// updates at once), and replicas naming different variables, or the same ones in another order,
// plain, sharded and through a GradientAccumulator. Each is an error naming apply_gradients and
// the variables, on every replica, before anything changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

int replica_id() { return get_replica_context()->replica_id_in_sync_group(); }

TEST(OptimizerMisuse, AVariableMadeOutsideTheScopeIsRefusedInsideRun) {
  MirroredStrategy s(cpus(2));
  Variable<float> w(Tensor<float>{1, 2}, VariableOptions{.name = "w1"});
  optimizers::SGD<> opt({.learning_rate = 1.0});
  // Every run refuses it the same way (before, each replica updated the one copy at once).
  for (int attempt = 0; attempt < 5; ++attempt) {
    EXPECT_EQ(message_of<FailedPreconditionError>([&] {
                s.run([&] { opt.apply_gradients({{Tensor<float>{1, 1}, w}}); });
              }),
              "apply_gradients inside run of " + s.name() +
                  ": variable 'w1' was made outside the strategy's scope, so it has one copy that every replica "
                  "would update at once; make it inside strategy.scope()");
  }
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{1, 2}));
}

TEST(OptimizerMisuse, MixedWithVariablesOfTheScopeTheMessageNamesTheOneMadeOutside) {
  MirroredStrategy s(cpus(2));
  Variable<float> w(Tensor<float>{1}, VariableOptions{.name = "w1"});
  Variable<float> b = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{2}, VariableOptions{.name = "b1"});
  }();
  optimizers::SGD<> opt;
  const std::string expected = "apply_gradients: variable 'w1' was made outside the scope of " + s.name() +
                               ", which made 'b1'; make every variable the optimizer updates inside strategy.scope()";
  EXPECT_EQ(message_of<FailedPreconditionError>([&] {
              s.run([&] { opt.apply_gradients({{Tensor<float>{1}, w}, {Tensor<float>{1}, b}}); });
            }),
            expected);
  EXPECT_EQ(message_of<FailedPreconditionError>([&] {
              s.run([&] { opt.apply_gradients({{Tensor<float>{1}, b}, {Tensor<float>{1}, w}}); });
            }),
            expected);
  EXPECT_EQ(w.value().item(), 1.0f);
  EXPECT_EQ(b.value().item(), 2.0f);
}

Variable<float> in_scope(Strategy& s, Tensor<float> value, const std::string& name) {
  auto scope = s.scope();
  return Variable<float>(std::move(value), VariableOptions{.name = name});
}

struct Model {
  explicit Model(int n)
      : s(cpus(n)),
        a(in_scope(s, Tensor<float>{1, 2}, "a")),
        b(in_scope(s, Tensor<float>{3, 4}, "b")),
        c(in_scope(s, Tensor<float>{5, 6}, "c")) {}
  std::vector<std::vector<float>> copies() const {
    std::vector<std::vector<float>> out;
    for (const auto* v : {&a, &b, &c})
      for (const auto& t : v->components()) out.push_back(t.to_vector());
    return out;
  }
  MirroredStrategy s;
  Variable<float> a, b, c;
};

// Replica 0 passes (a, b), replica 1 (b, a): the error it gets.
std::string swapped_order_error(Model& m, optimizers::Optimizer<float>& opt) {
  const Tensor<float> g{1, 1};
  return message_of<InvalidArgumentError>([&] {
    m.s.run([&] {
      if (replica_id() == 0)
        opt.apply_gradients({{g, m.a}, {g, m.b}});
      else
        opt.apply_gradients({{g, m.b}, {g, m.a}});
    });
  });
}

class Disagreement : public ::testing::TestWithParam<bool> {
 protected:
  std::unique_ptr<optimizers::Optimizer<float>> make() const {
    return std::make_unique<optimizers::Adam<float>>(
        optimizers::AdamOptions{.learning_rate = 0.5, .shard_optimizer_state = GetParam()});
  }
};

TEST_P(Disagreement, AnotherOrderOnTheFirstStepIsRefusedBeforeAnySlotIsMade) {
  Model m(2);
  auto opt = make();
  const auto before = m.copies();
  EXPECT_EQ(swapped_order_error(m, *opt),
            "apply_gradients: every replica must pass the same variables in the same order: replica 0 passed "
            "['a', 'b'] but replica 1 passed ['b', 'a'] (they differ at position 0)");
  EXPECT_EQ(m.copies(), before);
  EXPECT_EQ(opt->iterations(), 0);
  EXPECT_THROW(opt->get_slot(m.a, "m"), NotFoundError);
}

TEST_P(Disagreement, OtherVariablesOfTheSameShapeAreRefused) {
  Model m(2);
  auto opt = make();
  const auto before = m.copies();
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                m.s.run([&] { opt->apply_gradients({{Tensor<float>{1, 1}, replica_id() == 0 ? m.a : m.c}}); });
              }),
              HasSubstr("replica 0 passed ['a'] but replica 1 passed ['c']"));
  EXPECT_EQ(m.copies(), before);
}

// Once every variable has its slots the fused step's own rendezvous compares them.
TEST_P(Disagreement, AnotherOrderAfterAGoodStepIsRefusedAndChangesNothing) {
  Model m(2);
  auto opt = make();
  const Tensor<float> g{1, 1};
  m.s.run([&] { opt->apply_gradients({{g, m.a}, {g, m.b}}); });
  EXPECT_EQ(opt->iterations(), 1);
  const auto before = m.copies();
  EXPECT_EQ(swapped_order_error(m, *opt),
            "apply_gradients: every replica must pass the same variables in the same order: replica 0 passed 'a' at "
            "position 0 but replica 1 passed 'b'");
  EXPECT_EQ(m.copies(), before);
  EXPECT_EQ(opt->iterations(), 1);
}

TEST_P(Disagreement, ThroughAGradientAccumulatorTheOrderIsCheckedToo) {
  Model m(2);
  auto opt = make();
  optimizers::GradientAccumulator<float> acc;
  const auto before = m.copies();
  const Tensor<float> g{1, 1};
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                m.s.run([&] {
                  if (replica_id() == 0)
                    acc.accumulate({{g, m.a}, {g, m.b}});
                  else
                    acc.accumulate({{g, m.b}, {g, m.a}});
                  acc.apply_gradients(*opt);
                });
              }),
              HasSubstr("every replica must pass the same variables in the same order"));
  EXPECT_EQ(m.copies(), before);
}

INSTANTIATE_TEST_SUITE_P(Sharding, Disagreement, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Sharded" : "Plain"; });

// An optimizer of one's own (no fused update) is checked on every step.
class PerVariableSgd : public optimizers::Optimizer<float> {
 protected:
  std::vector<std::string> slot_names() const override { return {}; }
  void update(float* w, const float* g, std::vector<float*>&, int64_t n, int64_t) override {
    for (int64_t i = 0; i < n; ++i) w[i] -= g[i];
  }
};

TEST(OptimizerMisuse, AnOptimizerOfOnesOwnIsCheckedOnEveryStep) {
  Model m(2);
  PerVariableSgd opt;
  const Tensor<float> g{1, 1};
  m.s.run([&] { opt.apply_gradients({{g, m.a}, {g, m.b}}); });
  const auto before = m.copies();
  EXPECT_THAT(swapped_order_error(m, opt), HasSubstr("replica 0 passed ['a', 'b'] but replica 1 passed ['b', 'a']"));
  EXPECT_EQ(m.copies(), before);
}

}  // namespace
}  // namespace mirrored

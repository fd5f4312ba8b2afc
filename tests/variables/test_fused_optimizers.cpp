// The fused optimizer updates (one DeviceBackend::apply_optimizer pass per pack) against a plain
// element-by-element reference of Keras' formulas, and against the per-variable update they
// replace, bit for bit on the host for 1000 steps; packing, copy-on-write, replicas, and
// skip_gradients_aggregation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::Kind;
using testing::kind_name;
using testing::message_of;
using testing::slot_names;

constexpr double kLr = 0.01, kMomentum = 0.9, kBeta1 = 0.9, kBeta2 = 0.999, kEpsilon = 1e-7, kDecay = 0.004, kRho = 0.9,
                 kInitialAccumulator = 0.1;

bool has_momentum(Kind k) { return k == Kind::rmsprop_momentum || k == Kind::rmsprop_centered_momentum; }
bool centered(Kind k) { return k == Kind::rmsprop_centered || k == Kind::rmsprop_centered_momentum; }

// The plain reference: one element at a time, each formula written out as Keras states it.
template <class T>
struct Reference {
  Kind kind;
  std::vector<std::vector<T>> w, s0, s1, s2;
  int64_t step = 0;

  void add(std::vector<T> weights) {
    const std::size_t n = weights.size();
    w.push_back(std::move(weights));
    s0.emplace_back(n, kind == Kind::adagrad ? static_cast<T>(kInitialAccumulator) : T{0});
    s1.emplace_back(n, T{0});
    s2.emplace_back(n, T{0});
  }
  const std::vector<T>& slot(std::size_t s, std::size_t k) const { return s == 0 ? s0[k] : s == 1 ? s1[k] : s2[k]; }

  void apply(const std::vector<std::vector<T>>& g) {
    ++step;
    const double t = static_cast<double>(step);
    // Keras' step size, in T: the betas and their powers rounded to T first.
    const T b1_power = static_cast<T>(std::pow(static_cast<double>(static_cast<T>(kBeta1)), t));
    const T b2_power = static_cast<T>(std::pow(static_cast<double>(static_cast<T>(kBeta2)), t));
    const T alpha = static_cast<T>(kLr) * std::sqrt(T(1) - b2_power) / (T(1) - b1_power);
    const T lr = static_cast<T>(kLr), mu = static_cast<T>(kMomentum), b1 = static_cast<T>(1 - kBeta1),
            b2 = static_cast<T>(1 - kBeta2), eps = static_cast<T>(kEpsilon), wd = static_cast<T>(kDecay),
            rho = static_cast<T>(kRho), one_minus_rho = static_cast<T>(1 - kRho);
    for (std::size_t k = 0; k < w.size(); ++k) {
      for (std::size_t i = 0; i < w[k].size(); ++i) {
        T& x = w[k][i];
        const T gi = g[k][i];
        switch (kind) {
          case Kind::sgd: x = x - lr * gi; break;
          case Kind::momentum:
            s0[k][i] = mu * s0[k][i] - lr * gi;
            x = x + s0[k][i];
            break;
          case Kind::nesterov:
            s0[k][i] = mu * s0[k][i] - lr * gi;
            x = x + (mu * s0[k][i] - lr * gi);
            break;
          case Kind::adam:
          case Kind::adamw:
            if (kind == Kind::adamw) x = x - x * wd * lr;
            s0[k][i] = s0[k][i] + (gi - s0[k][i]) * b1;
            s1[k][i] = s1[k][i] + (gi * gi - s1[k][i]) * b2;
            x = x - alpha * s0[k][i] / (std::sqrt(s1[k][i]) + eps);
            break;
          case Kind::rmsprop:
          case Kind::rmsprop_momentum:
          case Kind::rmsprop_centered:
          case Kind::rmsprop_centered_momentum: {
            // Slots in Keras' order: velocity, momentum (with momentum), average_gradient (centered).
            T& velocity = s0[k][i];
            T& momentum = has_momentum(kind) ? s1[k][i] : s2[k][i];
            T& average = has_momentum(kind) ? s2[k][i] : s1[k][i];
            velocity = rho * velocity + one_minus_rho * (gi * gi);
            T denominator = velocity + eps;
            if (centered(kind)) {
              average = rho * average + one_minus_rho * gi;
              denominator = velocity - average * average + eps;
            }
            const T increment = lr * gi / std::sqrt(denominator);
            if (has_momentum(kind)) {
              momentum = mu * momentum + increment;
              x = x - momentum;
            } else {
              x = x - increment;
            }
            break;
          }
          case Kind::adagrad:
            s0[k][i] = s0[k][i] + gi * gi;
            x = x - lr * gi / std::sqrt(s0[k][i] + eps);
            break;
        }
      }
    }
  }
};

template <class Base>
using Fused = Base;

// The same optimizer without the backend operation: the per-variable update on host copies.
template <class Base>
class Unfused : public Base {
 public:
  using Base::Base;

 protected:
  std::optional<detail::OptimizerUpdate> fused_update() const override { return std::nullopt; }
};

// The optimizer of `k` with the reference's hyperparameters, as `Wrap<the built-in class>`.
template <class T, template <class> class Wrap = Fused>
std::unique_ptr<optimizers::Optimizer<T>> make(Kind k) {
  switch (k) {
    case Kind::sgd: return std::make_unique<Wrap<optimizers::SGD<T>>>(optimizers::SGDOptions{.learning_rate = kLr});
    case Kind::momentum:
      return std::make_unique<Wrap<optimizers::SGD<T>>>(
          optimizers::SGDOptions{.learning_rate = kLr, .momentum = kMomentum});
    case Kind::nesterov:
      return std::make_unique<Wrap<optimizers::SGD<T>>>(
          optimizers::SGDOptions{.learning_rate = kLr, .momentum = kMomentum, .nesterov = true});
    case Kind::adam:
      return std::make_unique<Wrap<optimizers::Adam<T>>>(
          optimizers::AdamOptions{.learning_rate = kLr, .beta_1 = kBeta1, .beta_2 = kBeta2, .epsilon = kEpsilon});
    case Kind::adamw:
      return std::make_unique<Wrap<optimizers::AdamW<T>>>(optimizers::AdamWOptions{
          .learning_rate = kLr, .weight_decay = kDecay, .beta_1 = kBeta1, .beta_2 = kBeta2, .epsilon = kEpsilon});
    case Kind::rmsprop:
    case Kind::rmsprop_momentum:
    case Kind::rmsprop_centered:
    case Kind::rmsprop_centered_momentum:
      return std::make_unique<Wrap<optimizers::RMSprop<T>>>(
          optimizers::RMSpropOptions{.learning_rate = kLr,
                                     .rho = kRho,
                                     .momentum = has_momentum(k) ? kMomentum : 0.0,
                                     .epsilon = kEpsilon,
                                     .centered = centered(k)});
    case Kind::adagrad:
      return std::make_unique<Wrap<optimizers::Adagrad<T>>>(optimizers::AdagradOptions{
          .learning_rate = kLr, .initial_accumulator_value = kInitialAccumulator, .epsilon = kEpsilon});
  }
  return nullptr;
}

template <class T>
std::unique_ptr<optimizers::Optimizer<T>> make_unfused(Kind k) {
  return make<T, Unfused>(k);
}

// Sizes around the vector widths, and one long enough for the vector loops to dominate.
const std::vector<int64_t> kSizes = {1, 3, 4, 7, 8, 17, 33, 1000, 4099};

template <class T>
std::vector<T> initial(int64_t n, int k) {
  std::vector<T> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<std::size_t>(i)] = static_cast<T>((i * 5 + k) % 11 - 5) / 4;
  return out;
}

// Exact, varied gradients: multiples of 1/8 in [-1, 1].
template <class T>
std::vector<T> gradient(int64_t n, int k, int step, T scale = 1) {
  std::vector<T> out(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i)] = scale * static_cast<T>((i * 7 + k * 3 + step * 13) % 17 - 8) / 8;
  return out;
}

template <class T>
Reference<T> reference_for(Kind kind) {
  Reference<T> ref{kind, {}, {}, {}, {}, 0};
  for (std::size_t k = 0; k < kSizes.size(); ++k) ref.add(initial<T>(kSizes[k], static_cast<int>(k)));
  return ref;
}

template <class T>
std::vector<Variable<T>> variables_for() {
  std::vector<Variable<T>> vars;
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    vars.emplace_back(Tensor<T>::from_vector(initial<T>(kSizes[k], static_cast<int>(k)), {kSizes[k]}),
                      VariableOptions{.name = "w" + std::to_string(k)});
  }
  return vars;
}

template <class T>
optimizers::GradsAndVars<T> grads_for(const std::vector<Variable<T>>& vars, int step, T scale = 1) {
  optimizers::GradsAndVars<T> gv;
  for (std::size_t k = 0; k < vars.size(); ++k)
    gv.emplace_back(Tensor<T>::from_vector(gradient<T>(kSizes[k], static_cast<int>(k), step, scale), {kSizes[k]}),
                    vars[k]);
  return gv;
}

template <class T>
void expect_matches(Kind kind, const optimizers::Optimizer<T>& opt, const std::vector<Variable<T>>& vars,
                    const Reference<T>& ref, const std::string& where) {
  const auto names = slot_names(kind);
  for (std::size_t k = 0; k < vars.size(); ++k) {
    for (const auto& c : vars[k].components()) ASSERT_EQ(c.to_vector(), ref.w[k]) << where << ", variable " << k;
    for (std::size_t s = 0; s < names.size(); ++s) {
      const auto& expected = ref.slot(s, k);
      for (const auto& c : opt.get_slot(vars[k], names[s]).components())
        ASSERT_EQ(c.to_vector(), expected) << where << ", slot " << names[s] << " of variable " << k;
    }
  }
  EXPECT_EQ(opt.iterations(), ref.step) << where;
}

template <class T>
void thousand_steps_match_the_reference(Kind kind) {
  auto vars = variables_for<T>();
  auto opt = make<T>(kind);
  auto ref = reference_for<T>(kind);
  for (int step = 1; step <= 1000; ++step) {
    opt->apply_gradients(grads_for(vars, step));
    std::vector<std::vector<T>> g;
    for (std::size_t k = 0; k < kSizes.size(); ++k) g.push_back(gradient<T>(kSizes[k], static_cast<int>(k), step));
    ref.apply(g);
    if (step == 1 || step % 250 == 0)
      expect_matches(kind, *opt, vars, ref, kind_name(kind) + " step " + std::to_string(step));
  }
}

class FusedOptimizer : public ::testing::TestWithParam<Kind> {};

TEST_P(FusedOptimizer, ThousandStepsEqualThePlainReferenceBitwiseFloat) {
  thousand_steps_match_the_reference<float>(GetParam());
}

TEST_P(FusedOptimizer, ThousandStepsEqualThePlainReferenceBitwiseDouble) {
  thousand_steps_match_the_reference<double>(GetParam());
}

// The fused pass gives what the per-variable update gave before it (the host's results stay
// bitwise what they were).
TEST_P(FusedOptimizer, EqualsThePerVariableUpdateBitwise) {
  const Kind kind = GetParam();
  auto fused_vars = variables_for<float>();
  auto plain_vars = variables_for<float>();
  auto fused = make<float>(kind);
  auto plain = make_unfused<float>(kind);
  for (int step = 1; step <= 1000; ++step) {
    fused->apply_gradients(grads_for(fused_vars, step));
    plain->apply_gradients(grads_for(plain_vars, step));
  }
  for (std::size_t k = 0; k < kSizes.size(); ++k) {
    ASSERT_EQ(fused_vars[k].value().to_vector(), plain_vars[k].value().to_vector()) << "variable " << k;
    for (const auto& name : slot_names(kind))
      ASSERT_EQ(fused->get_slot(fused_vars[k], name).value().to_vector(),
                plain->get_slot(plain_vars[k], name).value().to_vector())
          << "slot " << name << " of variable " << k;
  }
  EXPECT_EQ(fused->iterations(), 1000);
  EXPECT_EQ(plain->iterations(), 1000);
}

// Packs end at a byte budget and at kMaxUpdateSegments segments; every pack sees the same step.
TEST_P(FusedOptimizer, ManyPacksGiveTheSameResult) {
  const Kind kind = GetParam();
  for (int64_t bytes_per_pack : {int64_t{0}, int64_t{8}, int64_t{100}}) {
    constexpr int kVars = 2 * detail::kMaxUpdateSegments + 5;
    std::vector<Variable<float>> vars;
    Reference<float> ref{kind, {}, {}, {}, {}, 0};
    for (int k = 0; k < kVars; ++k) {
      vars.emplace_back(Tensor<float>::from_vector(initial<float>(3, k), {3}));
      ref.add(initial<float>(3, k));
    }
    auto opt = make<float>(kind);
    opt->communication.bytes_per_pack = bytes_per_pack;
    for (int step = 1; step <= 20; ++step) {
      optimizers::GradsAndVars<float> gv;
      std::vector<std::vector<float>> g;
      for (int k = 0; k < kVars; ++k) {
        g.push_back(gradient<float>(3, k, step));
        gv.emplace_back(Tensor<float>::from_vector(g.back(), {3}), vars[static_cast<std::size_t>(k)]);
      }
      opt->apply_gradients(gv);
      ref.apply(g);
    }
    for (int k = 0; k < kVars; ++k)
      ASSERT_EQ(vars[static_cast<std::size_t>(k)].value().to_vector(), ref.w[static_cast<std::size_t>(k)])
          << kind_name(kind) << ", bytes_per_pack " << bytes_per_pack << ", variable " << k;
    EXPECT_EQ(opt->iterations(), 20);
  }
}

INSTANTIATE_TEST_SUITE_P(Kinds, FusedOptimizer, ::testing::ValuesIn(testing::kAllKinds),
                         [](const auto& info) { return kind_name(info.param); });

TEST(FusedOptimizerCopies, AValueReadBeforeTheUpdateKeepsItsValue) {
  Variable<float> w(Tensor<float>{1, 2, 3});
  optimizers::SGD<> opt({.learning_rate = 1.0});
  const Tensor<float> before = w.value();
  opt.apply_gradients({{Tensor<float>{1, 1, 1}, w}});
  EXPECT_EQ(before.to_vector(), (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{0, 1, 2}));
}

TEST(FusedOptimizerCopies, AVariableListedTwiceIsRefused) {
  Variable<float> w(Tensor<float>{1, 2}, VariableOptions{.name = "kernel"});
  Variable<float> b(Tensor<float>{0}, VariableOptions{.name = "bias"});
  optimizers::Adam<> opt;
  EXPECT_EQ(message_of<InvalidArgumentError>([&] {
              opt.apply_gradients({{Tensor<float>{1, 1}, w}, {Tensor<float>{1}, b}, {Tensor<float>{2, 2}, w}});
            }),
            "apply_gradients: variable 'kernel' is listed twice (at 0 and 2); sum its gradients into one entry");
  // Nothing was applied.
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{1, 2}));
  EXPECT_EQ(opt.iterations(), 0);
}

TEST(FusedOptimizerCopies, AdamWRefusesANegativeWeightDecay) {
  EXPECT_THAT(message_of<InvalidArgumentError>([] { optimizers::AdamW<>({.weight_decay = -1}); }),
              HasSubstr("AdamW: learning_rate, weight_decay and epsilon must be >= 0, got 0.001, -1 and"));
  EXPECT_THROW(optimizers::AdamW<>({.beta_2 = 1.0}), InvalidArgumentError);
}

// Keras' AdamW: the decay uses the learning rate before bias correction, and comes first.
TEST(FusedOptimizerCopies, AdamWDecaysBeforeTheAdamStep) {
  Variable<float> w(Tensor<float>{2});
  optimizers::AdamW<> opt({.learning_rate = 0.5, .weight_decay = 0.25, .beta_1 = 0.5, .beta_2 = 0.75, .epsilon = 0});
  opt.apply_gradients({{Tensor<float>{4}, w}});
  // decayed = 2 - 2 * 0.25 * 0.5 = 1.75; m = 2, v = 4; alpha = 0.5 * sqrt(0.25) / 0.5 = 0.5;
  // w = 1.75 - 0.5 * 2 / 2 = 1.25.
  EXPECT_EQ(w.value().item(), 1.25f);
  EXPECT_EQ(opt.get_slot(w, "m").value().item(), 2.0f);
  EXPECT_EQ(opt.get_slot(w, "v").value().item(), 4.0f);
}

class FusedDistributed : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

// Every replica updates its own copy with the summed gradient: all copies equal the reference.
TEST_P(FusedDistributed, EveryCopyEqualsTheReferenceWithSummedGradients) {
  for (Kind kind : {Kind::nesterov, Kind::adamw, Kind::rmsprop_centered_momentum, Kind::adagrad}) {
    MirroredStrategy s(cpus(n()));
    std::vector<Variable<float>> vars;
    {
      auto scope = s.scope();
      vars = variables_for<float>();
    }
    auto opt = make<float>(kind);
    auto ref = reference_for<float>(kind);
    const float total = static_cast<float>(n() * (n() + 1) / 2);
    for (int step = 1; step <= 100; ++step) {
      s.run([&] { opt->apply_gradients(grads_for(vars, step, static_cast<float>(id() + 1))); });
      std::vector<std::vector<float>> g;
      for (std::size_t k = 0; k < kSizes.size(); ++k)
        g.push_back(gradient<float>(kSizes[k], static_cast<int>(k), step, total));
      ref.apply(g);
    }
    expect_matches(kind, *opt, vars, ref, kind_name(kind) + " on " + std::to_string(n()) + " replicas");
  }
}

// skip_gradients_aggregation (Keras' name): the gradients are applied as given.
TEST_P(FusedDistributed, SkipGradientsAggregationAppliesTheGradientsAsGiven) {
  MirroredStrategy s(cpus(n()));
  Variable<float> w = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{100, 200});
  }();
  optimizers::SGD<> opt({.learning_rate = 1.0});
  // Not reduced: each copy moves by its own replica's gradient.
  s.run([&] {
    const float g = static_cast<float>(id() + 1);
    opt.apply_gradients({{Tensor<float>{g, 2 * g}, w}}, /*skip_gradients_aggregation=*/true);
  });
  for (int r = 0; r < n(); ++r)
    EXPECT_EQ(w.components()[static_cast<std::size_t>(r)].to_vector(),
              (std::vector<float>{100.0f - float(r + 1), 200.0f - 2 * float(r + 1)}))
        << "replica " << r;
  // Reduced by the caller: the same as apply_gradients reducing them itself.
  Variable<float> a = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{100, 200});
  }();
  Variable<float> b = [&] {
    auto scope = s.scope();
    return Variable<float>(Tensor<float>{100, 200});
  }();
  optimizers::Adam<> opt_a, opt_b;
  for (int step = 0; step < 3; ++step) {
    s.run([&] {
      const float g = static_cast<float>(id() + 1);
      Tensor<float> grad{g, -g};
      opt_a.apply_gradients({{grad, a}});
      Tensor<float> reduced = get_replica_context()->all_reduce(ReduceOp::SUM, grad);
      opt_b.apply_gradients({{reduced, b}}, /*skip_gradients_aggregation=*/true);
    });
  }
  for (int r = 0; r < n(); ++r)
    EXPECT_EQ(a.components()[static_cast<std::size_t>(r)].to_vector(),
              b.components()[static_cast<std::size_t>(r)].to_vector())
        << "replica " << r;
  EXPECT_EQ(opt_b.iterations(), 3);
}

INSTANTIATE_TEST_SUITE_P(Replicas, FusedDistributed, ::testing::Values(1, 2, 4));

TEST(FusedOptimizerBackend, TheNewStepCannotOverwriteTheStepItReads) {
  // A GPU's blocks read the step while one of them writes the new one: the two must differ, on
  // every backend alike.
  detail::OptimizerUpdate u;
  u.kind = detail::OptimizerKind::sgd;
  u.learning_rate = 0.1;
  int64_t step = 3;
  auto& backend = detail::backend_for(Device(DeviceType::CPU, 0));
  EXPECT_THAT(
      message_of<InvalidArgumentError>([&] { backend.apply_optimizer(DType::float32, u, nullptr, 0, &step, &step); }),
      HasSubstr("step_out must not be step_in"));
  EXPECT_EQ(step, 3);
  int64_t next = 0;
  backend.apply_optimizer(DType::float32, u, nullptr, 0, &step, &next);
  EXPECT_EQ(next, 4);
}

}  // namespace
}  // namespace mirrored

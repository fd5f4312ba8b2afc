// optimizers::GradientAccumulator (docs/api.md §16): with SUM and integer-valued gradients, k accumulated
// micro-batches applied once are bitwise one apply_gradients of the whole batch's gradient, for
// SGD, momentum and Adam, sharded and not, on 1, 2 and 4 CPU replicas, within one run and across
// runs; MEAN divides by k; the sums are bitwise those of adding the tensors by hand in accumulate
// order (values that round); and the errors: cross-replica context, a different list of
// variables, shapes, no micro-batch, replicas that disagree on k -- each failing before anything
// changes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness.hpp"
#include "variables/optimizer_kinds.hpp"

namespace mirrored {
namespace accumulator_test {  // named: the unity build puts these beside the other optimizer tests

using optimizers::GradientAccumulator;
using testing::cpus;
using ::testing::HasSubstr;
using testing::Kind;
using testing::kind_name;
using testing::message_of;
using testing::same_bits;
using testing::slot_names;

std::unique_ptr<optimizers::Optimizer<float>> make(Kind k, bool sharded) {
  return testing::make_optimizer<float>(k, sharded, {.learning_rate = 0.25, .momentum = 0.5});
}

// Sizes that none of the replica counts divides (the sharded update cuts them unevenly).
const std::vector<Shape> kShapes{{7, 3}, {5}, {1}, {2, 2, 3}};

// Micro-batch j's gradient of variable v on replica r at `step`: integers in [-8, 8] when
// `integer`, else values that round when summed.
std::vector<float> values(const Shape& shape, int v, int r, int step, int j, bool integer) {
  std::vector<float> out(static_cast<std::size_t>(detail::shape_numel(shape, sizeof(float))));
  uint32_t seed = 2654435761u * static_cast<uint32_t>(step + 1) + 40503u * static_cast<uint32_t>(v) +
                  97u * static_cast<uint32_t>(r) + 7919u * static_cast<uint32_t>(j);
  for (auto& x : out) {
    seed = seed * 1664525u + 1013904223u;
    x = integer ? static_cast<float>(static_cast<int>((seed >> 8) % 17u) - 8)
                : static_cast<float>(static_cast<double>(seed >> 8) / 16777216.0 * 2.0 - 0.9);
  }
  return out;
}

Tensor<float> gradient(const Shape& shape, int v, int r, int step, int j, bool integer = true) {
  return Tensor<float>::from_vector(values(shape, v, r, step, j, integer), shape);
}

// Everything a run ends with, on the host: every copy of every weight and every whole slot.
struct Result {
  std::vector<std::vector<float>> weights;
  std::vector<std::vector<float>> slots;
  int64_t iterations = 0;
};

Result collect(const std::vector<Variable<float>>& vars, const optimizers::Optimizer<float>& opt, Kind kind) {
  Result out;
  for (const auto& v : vars) {
    std::vector<float> all;
    for (const auto& c : v.components()) {
      const auto host = c.to_vector();
      all.insert(all.end(), host.begin(), host.end());
    }
    out.weights.push_back(all);
    for (const auto& name : slot_names(kind)) out.slots.push_back(opt.get_slot(v, name).value().to_vector());
  }
  out.iterations = opt.iterations();
  return out;
}

std::vector<Variable<float>> make_vars(MirroredStrategy& s) {
  std::vector<Variable<float>> vars;
  auto scope = s.scope();
  for (std::size_t v = 0; v < kShapes.size(); ++v)
    vars.emplace_back(gradient(kShapes[v], static_cast<int>(v), 99, 0, 0),
                      VariableOptions{.name = "w" + std::to_string(v)});
  return vars;
}

enum class Mode {
  whole_batch,  // one apply_gradients of each replica's gradient summed (or averaged) by hand
  within_run,   // the accumulator: k micro-batches and the apply inside one run
  across_runs,  // the accumulator outside run: one run per micro-batch, then one run applies
};

struct Config {
  Kind kind;
  bool sharded;
  int n;
  int k;
  ReduceOp op = ReduceOp::SUM;
  bool integer = true;
};

// `steps` optimizer steps of `setup` in `mode`; micro-batch j's gradients are values(..., j).
Result train(const Config& setup, Mode mode, int steps = 3) {
  MirroredStrategy s(cpus(setup.n));
  const std::vector<Variable<float>> vars = make_vars(s);
  auto opt = make(setup.kind, setup.sharded);
  GradientAccumulator<float> acc(setup.op);
  auto micro_batch = [&](int step, int j) {
    const int r = get_replica_context()->replica_id_in_sync_group();
    optimizers::GradsAndVars<float> gv;
    for (std::size_t v = 0; v < vars.size(); ++v)
      gv.emplace_back(gradient(kShapes[v], static_cast<int>(v), r, step, j, setup.integer), vars[v]);
    acc.accumulate(gv);
  };
  for (int step = 0; step < steps; ++step) {
    switch (mode) {
      case Mode::whole_batch:
        s.run([&] {
          const int r = get_replica_context()->replica_id_in_sync_group();
          optimizers::GradsAndVars<float> gv;
          for (std::size_t v = 0; v < vars.size(); ++v) {
            // Summed on the host in micro-batch order (exact for integers in any order).
            std::vector<float> sum = values(kShapes[v], static_cast<int>(v), r, step, 0, setup.integer);
            for (int j = 1; j < setup.k; ++j) {
              const auto more = values(kShapes[v], static_cast<int>(v), r, step, j, setup.integer);
              for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += more[i];
            }
            if (setup.op == ReduceOp::MEAN)
              for (auto& x : sum) x /= static_cast<float>(setup.k);
            gv.emplace_back(Tensor<float>::from_vector(sum, kShapes[v]), vars[v]);
          }
          opt->apply_gradients(gv);
        });
        break;
      case Mode::within_run:
        s.run([&] {
          for (int j = 0; j < setup.k; ++j) micro_batch(step, j);
          acc.apply_gradients(*opt);
        });
        break;
      case Mode::across_runs:
        for (int j = 0; j < setup.k; ++j) s.run([&] { micro_batch(step, j); });
        s.run([&] { acc.apply_gradients(*opt); });
        break;
    }
  }
  return collect(vars, *opt, setup.kind);
}

class Accumulation : public ::testing::TestWithParam<std::tuple<Kind, bool, int>> {};

// The acceptance: SUM of k integer-valued micro-batches, applied once, is bitwise one step of
// the whole batch's gradient (their sum), with every copy of every weight and every slot equal.
TEST_P(Accumulation, SumOfIntegerMicroBatchesIsBitwiseOneWholeBatchStep) {
  const auto [kind, sharded, n] = GetParam();
  for (const int k : {1, 2, 3, 4}) {
    const Config setup{kind, sharded, n, k};
    const Result whole = train(setup, Mode::whole_batch);
    ASSERT_EQ(whole.iterations, 3);
    for (const Mode mode : {Mode::within_run, Mode::across_runs}) {
      const Result accumulated = train(setup, mode);
      EXPECT_TRUE(same_bits(whole.weights, accumulated.weights)) << "k " << k << ", mode " << static_cast<int>(mode);
      EXPECT_TRUE(same_bits(whole.slots, accumulated.slots)) << "k " << k << ", mode " << static_cast<int>(mode);
      EXPECT_EQ(accumulated.iterations, 3) << "one optimizer step per accumulation cycle";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, Accumulation,
                         ::testing::Combine(::testing::Values(Kind::sgd, Kind::momentum, Kind::adam), ::testing::Bool(),
                                            ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return kind_name(std::get<0>(info.param)) + (std::get<1>(info.param) ? "_sharded_" : "_") +
                                  std::to_string(std::get<2>(info.param)) + "replicas";
                         });

// The sharded and unsharded accumulated steps give the same weights, too (docs/api.md §13's promise kept).
TEST(GradientAccumulator, ShardedAndUnshardedAccumulationGiveTheSameWeights) {
  const Result plain = train({Kind::adam, false, 4, 3}, Mode::within_run);
  const Result sharded = train({Kind::adam, true, 4, 3}, Mode::within_run);
  EXPECT_TRUE(same_bits(plain.weights, sharded.weights));
  EXPECT_TRUE(same_bits(plain.slots, sharded.slots));
}

// MEAN (the default) divides the sums by k: with k a power of two, exact against the averaged
// whole-batch gradient.
TEST(GradientAccumulator, MeanDividesBySteps) {
  for (const int n : {1, 2, 4}) {
    const Config setup{Kind::adam, false, n, 4, ReduceOp::MEAN};
    const Result whole = train(setup, Mode::whole_batch);
    const Result accumulated = train(setup, Mode::within_run);
    EXPECT_TRUE(same_bits(whole.weights, accumulated.weights)) << n << " replicas";
    EXPECT_TRUE(same_bits(whole.slots, accumulated.slots)) << n << " replicas";
  }
  EXPECT_EQ(GradientAccumulator<float>().op(), ReduceOp::MEAN);
}

// Values that round: the accumulator's sums are bitwise ((g0 + g1) + g2) added by hand with
// Tensor's operator+, then applied with one apply_gradients.
TEST(GradientAccumulator, EqualsAccumulationByHand) {
  for (const int n : {1, 2, 4}) {
    for (const bool sharded : {false, true}) {
      constexpr int kK = 3;
      auto run_with = [&](bool by_hand) {
        MirroredStrategy s(cpus(n));
        const std::vector<Variable<float>> vars = make_vars(s);
        auto opt = make(Kind::adam, sharded);
        GradientAccumulator<float> acc(ReduceOp::SUM);
        for (int step = 0; step < 3; ++step) {
          s.run([&] {
            const int r = get_replica_context()->replica_id_in_sync_group();
            std::vector<Tensor<float>> sums(vars.size());
            for (int j = 0; j < kK; ++j) {
              optimizers::GradsAndVars<float> gv;
              for (std::size_t v = 0; v < vars.size(); ++v) {
                Tensor<float> g = gradient(kShapes[v], static_cast<int>(v), r, step, j, false);
                sums[v] = j == 0 ? g : sums[v] + g;
                gv.emplace_back(g, vars[v]);
              }
              if (!by_hand) acc.accumulate(gv);
            }
            if (by_hand) {
              optimizers::GradsAndVars<float> gv;
              for (std::size_t v = 0; v < vars.size(); ++v) gv.emplace_back(sums[v], vars[v]);
              opt->apply_gradients(gv);
            } else {
              acc.apply_gradients(*opt);
            }
          });
        }
        return collect(vars, *opt, Kind::adam);
      };
      const Result hand = run_with(true);
      const Result accumulated = run_with(false);
      EXPECT_TRUE(same_bits(hand.weights, accumulated.weights)) << n << " replicas, sharded " << sharded;
      EXPECT_TRUE(same_bits(hand.slots, accumulated.slots)) << n << " replicas, sharded " << sharded;
    }
  }
}

// Outside any strategy a plain variable accumulates in the default replica context.
TEST(GradientAccumulator, PlainVariables) {
  Variable<float> w(Tensor<float>{1, 2, 3});
  optimizers::SGD<float> opt({.learning_rate = 0.5});
  GradientAccumulator<float> acc(ReduceOp::SUM);
  acc.accumulate({{Tensor<float>{1, 0, 2}, w}});
  acc.accumulate({{Tensor<float>{3, 2, 2}, w}});
  EXPECT_EQ(acc.micro_batches(), 2);
  acc.apply_gradients(opt);
  EXPECT_EQ(acc.micro_batches(), 0);
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{-1, 1, 1}));  // w - 0.5 * (4, 2, 4)
  EXPECT_EQ(opt.iterations(), 1);
}

// ----- errors: each names the op, the replica and both sides, and changes nothing.

struct Fixture {
  MirroredStrategy s{cpus(2)};
  std::vector<Variable<float>> vars = make_vars(s);
  optimizers::SGD<float> opt{optimizers::SGDOptions{.learning_rate = 0.25}};
  GradientAccumulator<float> acc{ReduceOp::SUM};

  optimizers::GradsAndVars<float> grads(int r, int j, std::vector<std::size_t> order = {0, 1, 2, 3}) const {
    optimizers::GradsAndVars<float> gv;
    for (std::size_t v : order) gv.emplace_back(gradient(kShapes[v], static_cast<int>(v), r, 0, j), vars[v]);
    return gv;
  }
  std::vector<std::vector<float>> weights() const {
    std::vector<std::vector<float>> out;
    for (const auto& v : vars)
      for (const auto& c : v.components()) out.push_back(c.to_vector());
    return out;
  }
};

TEST(GradientAccumulatorErrors, CrossReplicaContextIsRejected) {
  Fixture f;
  auto scope = f.s.scope();
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { f.acc.accumulate(f.grads(0, 0)); }),
              HasSubstr("GradientAccumulator::accumulate must be called inside Strategy::run"));
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { f.acc.apply_gradients(f.opt); }),
              HasSubstr("GradientAccumulator::apply_gradients must be called inside Strategy::run"));
  EXPECT_EQ(f.acc.micro_batches(), 0);
}

TEST(GradientAccumulatorErrors, DifferentVariablesBetweenMicroBatches) {
  Fixture f;
  const auto before = f.weights();
  std::vector<std::optional<testing::Seen>> seen(2);
  std::vector<int64_t> counts(2);
  EXPECT_THROW(f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    f.acc.accumulate(f.grads(r, 0));
    // Another order, then one variable fewer: both rejected, the first micro-batch kept.
    testing::recording(seen[r], [&] { f.acc.accumulate(f.grads(r, 1, {1, 0, 2, 3})); });
  }),
               InvalidArgumentError);
  ASSERT_TRUE(seen[0] || seen[1]);
  const auto& what = (seen[0] ? seen[0] : seen[1])->what;
  EXPECT_THAT(what, HasSubstr("micro-batch 2 passes variable 'w1' at position 0 but the cycle's first micro-batch "
                              "passed 'w0' there"));
  EXPECT_THAT(what, HasSubstr("GradientAccumulator::accumulate on replica "));

  std::string fewer;
  f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    counts[r] = f.acc.micro_batches();
    try {
      f.acc.accumulate(f.grads(r, 1, {0, 1, 2}));
    } catch (const InvalidArgumentError& e) {
      if (r == 1) fewer = e.what();
    }
    f.acc.accumulate(f.grads(r, 1));  // the right list still goes in after the failed ones
    f.acc.apply_gradients(f.opt);
  });
  EXPECT_EQ(counts, (std::vector<int64_t>{1, 1}));  // the failed micro-batch was not counted
  EXPECT_THAT(fewer, HasSubstr("on replica 1: micro-batch 2 passes 3 gradients but the cycle's first micro-batch "
                               "passed 4"));
  EXPECT_NE(f.weights(), before);
  EXPECT_EQ(f.opt.iterations(), 1);
}

TEST(GradientAccumulatorErrors, ShapeMismatchAndDuplicatesChangeNothing) {
  Fixture f;
  std::vector<std::string> shape(2), twice(2);
  std::vector<int64_t> counts(2);
  f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    auto bad = f.grads(r, 0);
    bad[2].first = Tensor<float>{1, 2};  // w2 has shape (1,)
    try {
      f.acc.accumulate(bad);
    } catch (const InvalidArgumentError& e) {
      shape[r] = e.what();
    }
    auto dup = f.grads(r, 0);
    dup[3] = {dup[0].first, f.vars[0]};
    try {
      f.acc.accumulate(dup);
    } catch (const InvalidArgumentError& e) {
      twice[r] = e.what();
    }
    counts[r] = f.acc.micro_batches();
  });
  EXPECT_EQ(shape[1],
            "GradientAccumulator::accumulate on replica 1: gradient of shape (2,) for variable 'w2' of "
            "shape (1,)");
  EXPECT_THAT(twice[0], HasSubstr("variable 'w0' is listed twice (at 0 and 3)"));
  EXPECT_EQ(counts, (std::vector<int64_t>{0, 0}));
}

TEST(GradientAccumulatorErrors, ApplyWithoutMicroBatches) {
  Fixture f;
  const auto before = f.weights();
  std::vector<std::string> what(2);
  EXPECT_THROW(f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    try {
      f.acc.apply_gradients(f.opt);
    } catch (const FailedPreconditionError& e) {
      what[r] = e.what();
      throw;
    }
  }),
               FailedPreconditionError);
  EXPECT_EQ(what[0],
            "GradientAccumulator::apply_gradients on replica 0: no micro-batch was accumulated since the "
            "last apply");
  EXPECT_EQ(what[1],
            "GradientAccumulator::apply_gradients on replica 1: no micro-batch was accumulated since the "
            "last apply");
  EXPECT_EQ(f.weights(), before);
  EXPECT_EQ(f.opt.iterations(), 0);
}

// Replica 0 accumulates 2 micro-batches, replica 1 only 1: every replica rejects the apply before
// any gradient moves, and keeps its sums (a corrected retry applies them).
TEST(GradientAccumulatorErrors, ReplicasThatDisagreeOnKAreRejectedBeforeAnythingMoves) {
  Fixture f;
  const auto before = f.weights();
  std::vector<std::string> what(2);
  EXPECT_THROW(f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    f.acc.accumulate(f.grads(r, 0));
    if (r == 0) f.acc.accumulate(f.grads(r, 1));
    try {
      f.acc.apply_gradients(f.opt);
    } catch (const InvalidArgumentError& e) {
      what[r] = e.what();
      throw;
    }
  }),
               InvalidArgumentError);
  const std::string expected =
      "GradientAccumulator::apply_gradients: replica 0 accumulated 2 micro-batches but replica 1 accumulated 1";
  EXPECT_EQ(what[0], expected);
  EXPECT_EQ(what[1], expected);
  EXPECT_EQ(f.weights(), before);
  EXPECT_EQ(f.opt.iterations(), 0);

  // The retry: replica 1 adds its second micro-batch; the step equals the hand-summed one.
  f.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    if (r == 1) f.acc.accumulate(f.grads(r, 1));
    f.acc.apply_gradients(f.opt);
  });
  Fixture hand;
  hand.s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    optimizers::GradsAndVars<float> gv = hand.grads(r, 0);
    const auto more = hand.grads(r, 1);
    for (std::size_t v = 0; v < gv.size(); ++v) gv[v].first = gv[v].first + more[v].first;
    hand.opt.apply_gradients(gv);
  });
  EXPECT_EQ(f.weights(), hand.weights());
}

TEST(GradientAccumulatorErrors, VariablesOfAnotherStrategy) {
  Fixture f;
  MirroredStrategy other(cpus(2));
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                other.run([&] {
                  const int r = get_replica_context()->replica_id_in_sync_group();
                  f.acc.accumulate(f.grads(r, 0));
                });
              }),
              HasSubstr("Mixing different"));
}

}  // namespace accumulator_test
}  // namespace mirrored

// The digits training loop: replica counts change only the order of sums, so 1, 2 and 4
// replicas train to the same weights; and it learns.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include "digits/train.hpp"

namespace {

const digits::Split& data() {
  static const digits::Split split = digits::split_digits(digits::load_digits(digits::default_digits_path()), 0.2, 7);
  return split;
}

std::vector<std::vector<float>> train_weights(int replicas, const std::string& optimizer, double* accuracy = nullptr,
                                              bool sharded = false, int accumulate = 1) {
  std::vector<std::string> devices;
  for (int r = 0; r < replicas; ++r) devices.push_back("CPU:" + std::to_string(r));
  mirrored::MirroredStrategy s(devices);
  digits::TrainConfig cfg;
  cfg.epochs = 3;
  cfg.global_batch = 30;  // 1438 / 30 leaves a partial final batch of 28 rows
  cfg.optimizer = optimizer;
  cfg.seed = 7;
  cfg.shard_optimizer_state = sharded;
  cfg.accumulate = accumulate;
  const auto result = digits::train(s, data(), cfg);
  if (accuracy) *accuracy = result.test_accuracy;
  std::vector<std::vector<float>> out;
  for (const auto& v : result.variables) {
    // Every replica's copy is the same.
    const auto copies = v.components();
    for (const auto& c : copies) EXPECT_EQ(c.to_vector(), copies[0].to_vector()) << v.name();
    out.push_back(copies[0].to_vector());
  }
  return out;
}

// |a - b| <= 1e-5 * max(|a|, |b|), with a floor of 1e-5 * (largest magnitude of the tensor) for
// entries near zero, where a relative bound means nothing.
void expect_close(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b,
                  const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t t = 0; t < a.size(); ++t) {
    float scale = 0;
    for (float x : a[t]) scale = std::max(scale, std::abs(x));
    for (std::size_t i = 0; i < a[t].size(); ++i) {
      const float tol = 1e-5f * std::max({std::abs(a[t][i]), std::abs(b[t][i]), scale});
      ASSERT_LE(std::abs(a[t][i] - b[t][i]), tol) << what << ": tensor " << t << " element " << i;
    }
  }
}

TEST(TrainDigits, OneTwoAndFourReplicasTrainToTheSameWeights) {
  for (const char* opt : {"sgd", "adam"}) {
    const auto one = train_weights(1, opt);
    expect_close(one, train_weights(2, opt), opt);
    expect_close(one, train_weights(4, opt), opt);
  }
}

// --shard-optimizer-state: each replica keeps its slice of the slots, and the weights are the same
// bits as without it.
TEST(TrainDigits, ShardedOptimizerStateTrainsToTheSameBits) {
  for (const char* opt : {"sgd", "adam"})
    for (int replicas : {2, 3})
      EXPECT_EQ(train_weights(replicas, opt), train_weights(replicas, opt, nullptr, true)) << opt;
}

// Gradient accumulation (TrainConfig::accumulate, train_digits --accumulate). Exact: one replica
// accumulating K micro-batches trains the same bits as K replicas without accumulation -- the
// micro-batches are the replicas' slices (both cut by the BALANCED rule), each gradient is computed
// on the same rows, and the accumulator sums them in the order the all-reduce does (replica
// order). Several replicas that accumulate add the replicas' sums of micro-batches, another order
// of the same float sums, so against the unaccumulated run they are close, not equal (as replica
// counts are); sharding the optimizer state changes no bit.
TEST(TrainDigits, AccumulatingOnOneReplicaIsBitwiseThatManyReplicas) {
  for (const char* opt : {"sgd", "adam"}) {
    EXPECT_EQ(train_weights(1, opt, nullptr, false, 2), train_weights(2, opt)) << opt;
    EXPECT_EQ(train_weights(1, opt, nullptr, false, 3), train_weights(3, opt)) << opt;
  }
}

TEST(TrainDigits, AccumulatingOnSeveralReplicasTrainsToTheSameWeights) {
  for (const char* opt : {"sgd", "adam"}) {
    const auto plain = train_weights(2, opt);
    const auto accumulated = train_weights(2, opt, nullptr, false, 2);
    expect_close(plain, accumulated, opt);
    EXPECT_NE(plain, accumulated) << opt << ": the sums' order differs, so some bits should";
    EXPECT_EQ(accumulated, train_weights(2, opt, nullptr, true, 2)) << opt << ": sharded";
  }
}

TEST(TrainDigits, AccumulateMustDivideTheGlobalBatch) {
  mirrored::MirroredStrategy s({"CPU:0", "CPU:1"});
  digits::TrainConfig cfg;
  cfg.epochs = 1;
  cfg.global_batch = 30;
  for (const int k : {0, 4}) {
    cfg.accumulate = k;
    try {
      digits::train(s, data(), cfg);
      FAIL() << "accumulate " << k << " was accepted";
    } catch (const mirrored::InvalidArgumentError& e) {
      EXPECT_EQ(std::string(e.what()),
                "accumulate must be a positive divisor of the global batch 30, got " + std::to_string(k));
    }
  }
}

TEST(TrainDigits, LearnsTheHeldOutSet) {
  mirrored::MirroredStrategy s({"CPU:0", "CPU:1"});
  digits::TrainConfig cfg;
  cfg.epochs = 20;
  const auto result = digits::train(s, data(), cfg);
  EXPECT_GE(result.test_accuracy, 0.95);
}

TEST(TrainDigits, StopsAtTheFirstStepWhoseLossIsNotFinite) {
  // A step size of 1e30 blows the weights up at once; the loss is NaN or infinite within a few steps.
  mirrored::MirroredStrategy s({"CPU:0", "CPU:1"});
  digits::TrainConfig cfg;
  cfg.epochs = 3;
  cfg.learning_rate = 1e30;
  int64_t reported = 0;
  try {
    digits::train(s, data(), cfg, [&](const digits::EpochReport& r) {
      ++reported;
      EXPECT_TRUE(std::isfinite(r.mean_loss)) << "epoch " << r.epoch << " step " << r.step;
    });
    FAIL() << "training went on with a non-finite loss";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(std::string(e.what()), ::testing::AllOf(::testing::HasSubstr("training stopped: the loss became"),
                                                        ::testing::HasSubstr("epoch 1, step")));
  }
  EXPECT_LT(reported, 45) << "stopped only after the first epoch";  // 1438 / 32 = 45 steps per epoch
}

}  // namespace

// The Fashion-MNIST training loop (examples/fashion/train.hpp) in this process, on the first
// examples of the installed data set: it learns, replica counts, sharded optimizer state and
// gradient accumulation agree, and a diverging run stops.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>

#include <mirrored/mirrored.hpp>
#include <mirrored/variable_checkpoint.hpp>

#include "cluster/process_harness.hpp"

#include "fashion/cnn.hpp"
#include "fashion/train.hpp"
#include "fashion_test_data.hpp"

namespace fashion {
namespace {

using testing::fashion_subset;

mirrored::Tensor<int64_t> all_rows(int64_t n) {
  std::vector<int64_t> rows(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) rows[static_cast<std::size_t>(i)] = i;
  return mirrored::Tensor<int64_t>::from_vector(std::move(rows), {n});
}

// What a training gives, read while its strategy lives (its variables cannot outlive it).
struct Trained {
  std::vector<std::vector<float>> weights;  // in param_names() order
  std::vector<EpochMetrics> epochs;
  int64_t examples = 0;
};

Trained train_on(const std::vector<std::string>& devices, const FashionMnist& data, const TrainConfig& cfg) {
  mirrored::MirroredStrategy strategy(devices);
  const TrainResult r = train(strategy, data, cfg);
  Trained out{{}, r.epochs, r.examples};
  for (const auto& v : r.variables) out.weights.push_back(v.value().to_vector());
  return out;
}

// The check: one epoch of 2,000 examples on two replicas lowers the test loss well below
// the initial weights' (about ln 10) and classifies most test images right.
TEST(FashionTrain, OneEpochOnTwoReplicasLowersTheLoss) {
  FASHION_REQUIRE_DATA();
  const FashionMnist& data = fashion_subset(2000, 500);
  TrainConfig cfg;
  cfg.epochs = 1;
  const auto [x, y] = gather_examples(data.test, all_rows(data.test.size()));
  CnnWorkspace<float> ws;
  const double initial = cnn_evaluate<float>(init_cnn<float>(cfg.seed), x, y, ws).loss_sum / 500.0;
  EXPECT_NEAR(initial, std::log(10.0), 0.3);
  const Trained r = train_on({"CPU:0", "CPU:1"}, data, cfg);
  ASSERT_EQ(r.epochs.size(), 1u);
  const EpochMetrics& m = r.epochs[0];
  EXPECT_LT(m.loss, initial);             // the mean over the epoch's 16 steps
  EXPECT_LT(m.test_loss, 0.7 * initial);  // after them
  EXPECT_GT(m.test_accuracy, 0.45);       // 10 classes: 0.1 by chance
  EXPECT_EQ(r.examples, 2000);
  // Every step's loss, in order: the epoch's loss is their mean, and training lowered it.
  ASSERT_EQ(m.step_losses.size(), 16u);
  EXPECT_EQ(m.first_step, 1);
  double sum = 0;
  for (double l : m.step_losses) sum += l;
  EXPECT_NEAR(sum / 16, m.loss, 1e-12);
  EXPECT_GT(m.step_losses.front(), m.step_losses.back());
  // The trained weights are what cnn_evaluate sees: the test metrics agree.
  std::vector<mirrored::Tensor<float>> trained;
  const auto shapes = param_shapes();
  for (std::size_t p = 0; p < shapes.size(); ++p)
    trained.push_back(mirrored::Tensor<float>::from_vector(r.weights[p], shapes[p]));
  const CnnEval e = cnn_evaluate<float>(trained, x, y, ws);
  EXPECT_NEAR(e.loss_sum / 500.0, m.test_loss, 1e-6);
  EXPECT_EQ(static_cast<double>(e.correct) / 500.0, m.test_accuracy);
}

// The same global batches of 128 on one replica, on two, on one accumulating two micro-batches:
// only the order of the sums differs (the gradients are scaled by the global batch, the L2 term by
// the replicas). Sharded Adam slots give the same bits as whole ones, and so do gradients reduced in
// buckets during the backward pass (GradientBuckets) rather than by Adam's fused step after it.
TEST(FashionTrain, ReplicaCountsAccumulationAndShardingAgree) {
  FASHION_REQUIRE_DATA();
  const FashionMnist& data = fashion_subset(512, 64);
  TrainConfig two;
  two.epochs = 1;
  TrainConfig one = two;
  one.batch_per_replica = 128;
  TrainConfig accumulating = one;
  accumulating.accumulate = 2;
  TrainConfig sharded = two;
  sharded.shard_optimizer_state = true;
  ASSERT_EQ(two.bucket_bytes, -1);  // one worker: Adam's fused reduction
  TrainConfig bucketed = two;
  bucketed.bucket_bytes = kDefaultBucketBytes;
  const Trained t2 = train_on({"CPU:0", "CPU:1"}, data, two);
  const Trained tb = train_on({"CPU:0", "CPU:1"}, data, bucketed);
  EXPECT_EQ(tb.weights, t2.weights);
  ASSERT_EQ(tb.epochs.size(), 1u);
  EXPECT_EQ(tb.epochs[0].loss, t2.epochs[0].loss);
  const Trained t1 = train_on({"CPU:0"}, data, one);
  const Trained ta = train_on({"CPU:0"}, data, accumulating);
  const Trained ts = train_on({"CPU:0", "CPU:1"}, data, sharded);
  const auto &w2 = t2.weights, &w1 = t1.weights, &wa = ta.weights, &ws = ts.weights;
  // Adam's update does not see a gradient's scale; the loss does: the cross-entropy over the
  // global batch and the L2 term over the replicas add up to the same mean loss.
  for (const Trained* t : {&t1, &ta, &ts}) {
    ASSERT_EQ(t->epochs.size(), 1u);
    EXPECT_NEAR(t->epochs[0].loss, t2.epochs[0].loss, 1e-5);
    EXPECT_NEAR(t->epochs[0].accuracy, t2.epochs[0].accuracy, 2.0 / 512);
  }
  const auto init = init_cnn<float>(two.seed);
  const auto names = param_names();
  for (std::size_t p = 0; p < w2.size(); ++p) {
    EXPECT_EQ(ws[p], w2[p]) << names[p];
    const auto before = init[p].to_vector();
    double moved = 0;
    for (std::size_t i = 0; i < w2[p].size(); ++i) {
      moved = std::max(moved, double(std::fabs(w2[p][i] - before[i])));
      ASSERT_NEAR(w1[p][i], w2[p][i], 1e-4) << names[p] << "[" << i << "]";
      ASSERT_NEAR(wa[p][i], w2[p][i], 1e-4) << names[p] << "[" << i << "]";
    }
    EXPECT_GT(moved, 1e-3) << names[p] << " did not train";  // 4 Adam steps of 0.001
  }
}

// --initial-weights: the weights of a safetensors file (as bench/e2e_fashion.py writes from
// TensorFlow's initialisation) instead of the seed's: bitwise the seed's training when the file
// holds that seed's weights; a file lacking one is NotFoundError naming it.
TEST(FashionTrain, StartsFromTheWeightsOfAFile) {
  FASHION_REQUIRE_DATA();
  mirrored::testing::TempDir dir;
  const std::string path = dir.path() + "/init.safetensors";
  mirrored::checkpoint::VariableMap file;
  std::vector<mirrored::Variable<float>> plain;
  const auto init = init_cnn<float>(5);
  for (int p = 0; p < kNumParams; ++p) plain.emplace_back(init[p], mirrored::VariableOptions{.name = param_names()[p]});
  for (auto& v : plain) file.emplace(v.name(), v);
  mirrored::checkpoint::save(path, file);
  TrainConfig seeded;
  seeded.epochs = 1;
  seeded.shuffle = false;
  seeded.seed = 5;
  TrainConfig from_file = seeded;
  from_file.seed = 0;
  from_file.initial_weights = path;
  const FashionMnist& data = fashion_subset(256, 64);
  EXPECT_EQ(train_on({"CPU:0", "CPU:1"}, data, from_file).weights, train_on({"CPU:0", "CPU:1"}, data, seeded).weights);
  file.erase("dense/bias");
  mirrored::checkpoint::save(path, file);
  try {
    train_on({"CPU:0"}, data, from_file);
    FAIL() << "a file without dense/bias accepted";
  } catch (const mirrored::NotFoundError& e) {
    EXPECT_THAT(e.what(),
                ::testing::AllOf(::testing::HasSubstr("init.safetensors"), ::testing::HasSubstr("dense/bias")));
  }
}

TEST(FashionTrain, StopsAtTheFirstStepWhoseLossIsNotFinite) {
  FASHION_REQUIRE_DATA();
  TrainConfig cfg;
  cfg.epochs = 3;
  cfg.learning_rate = 1e30;
  try {
    train_on({"CPU:0", "CPU:1"}, fashion_subset(512, 64), cfg);
    FAIL() << "a diverging run went on";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::MatchesRegex(".*training stopped: the loss became (NaN|infinite) at epoch 1, "
                                                  "step [0-9] of 4 .*"));
  }
}

TEST(FashionTrain, RefusesAnAccumulationThatDoesNotDivideTheBatch) {
  FASHION_REQUIRE_DATA();
  TrainConfig cfg;
  cfg.accumulate = 3;
  try {
    train_on({"CPU:0"}, fashion_subset(512, 64), cfg);
    FAIL() << "accumulate 3 of 64 accepted";
  } catch (const mirrored::InvalidArgumentError& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("accumulate must be a positive divisor of the batch per replica (64), "
                                               "got 3"));
  }
}

}  // namespace
}  // namespace fashion

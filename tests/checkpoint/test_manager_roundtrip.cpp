// CheckpointManager round trips: SGD with momentum, Adam, RMSprop (all three slots) and Adagrad
// (a slot that starts at 0.1), sharded and not, on 1, 2 and 4 CPU
// replicas. A model restored into a fresh one (whose optimizer has no slots yet) or into one that
// has trained already is bitwise the saved one -- every copy of the weights, the slots and the
// step counter -- and stays bitwise equal to the original through further identical steps.
// Also: max_to_keep and the index, the metadata, iterator states, the file names, and a restore
// of the weights alone (expect_partial).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/manager_test_util.hpp"

namespace mirrored {
namespace manager_roundtrip_test {

using namespace manager_testing;  // NOLINT: the manager test helpers
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class ManagerRoundTrip : public ManagerTest, public ::testing::WithParamInterface<std::tuple<Opt, bool, int>> {};

TEST_P(ManagerRoundTrip, RestoresBitwiseAndTrainsOnIdentically) {
  const auto [kind, sharded, n] = GetParam();
  Model a(n, kind, sharded);
  checkpoint::CheckpointManager ma(a.strategy, dir_);
  a.track(ma);
  ma.set_metadata("epoch", "2");
  a.train(0, 3);
  EXPECT_EQ(ma.save(3), file("ckpt-3.safetensors"));
  const State saved = state_of(a);
  ASSERT_EQ(saved.iterations, std::vector<int64_t>(static_cast<std::size_t>(n), 3));
  a.train(3, 2);
  const State trained_on = state_of(a);

  // A fresh model of other initial values; its optimizer has made no slots yet.
  Model b(n, kind, sharded, /*init_seed=*/7);
  checkpoint::CheckpointManager mb(b.strategy, dir_);
  b.track(mb);
  EXPECT_EQ(mb.latest_checkpoint(), file("ckpt-3.safetensors"));
  EXPECT_EQ(mb.metadata("epoch"), std::nullopt);
  EXPECT_EQ(mb.restore_or_initialize(), 3);
  EXPECT_EQ(b.opt->iterations(), 3);
  EXPECT_TRUE(state_of(b) == saved);
  EXPECT_EQ(mb.metadata("epoch"), "2");
  for (const auto& v : b.vars) EXPECT_EQ(b.opt->get_slot(v, opt_slots(kind).front()).is_sharded(), sharded);
  b.train(3, 2);
  EXPECT_TRUE(state_of(b) == trained_on);

  // A model that has trained already (its slots exist) is overwritten too.
  Model c(n, kind, sharded, /*init_seed=*/11);
  c.train(0, 1);
  checkpoint::CheckpointManager mc(c.strategy, dir_);
  c.track(mc);
  EXPECT_EQ(mc.restore_or_initialize(), 3);
  EXPECT_TRUE(state_of(c) == saved);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, ManagerRoundTrip,
                         ::testing::Combine(::testing::Values(Opt::momentum, Opt::adam, Opt::rmsprop_centered_momentum,
                                                              Opt::adagrad),
                                            ::testing::Bool(), ::testing::Values(1, 2, 4)),
                         [](const auto& info) {
                           return opt_name(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) ? "_sharded_" : "_plain_") +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST_F(ManagerTest, ShardedStateRestoresIntoUnshardedOnAnotherReplicaCount) {
  Model a(2, Opt::adam, /*sharded=*/true);
  checkpoint::CheckpointManager ma(a.strategy, dir_);
  a.track(ma);
  a.train(0, 2);
  ma.save(2);
  Model b(4, Opt::adam, /*sharded=*/false, 5);
  checkpoint::CheckpointManager mb(b.strategy, dir_);
  b.track(mb);
  ASSERT_EQ(mb.restore_or_initialize(), 2);
  EXPECT_TRUE(state_of(b, /*whole_slots=*/true) == state_of(a, /*whole_slots=*/true));
  // Every copy of the four replicas holds the value.
  for (const auto& v : b.vars) {
    const auto copies = v.components();
    for (const auto& c : copies) EXPECT_EQ(bits(c), bits(copies[0]));
  }
}

TEST_F(ManagerTest, TheFileHoldsTheDocumentedNames) {
  Model a(2, Opt::momentum, false);
  checkpoint::CheckpointManager m(a.strategy, dir_);
  a.track(m);
  FakeIterator it{.position = 5, .replicas = 2};
  track_fake(m, "train_iterator", it);
  m.set_metadata("seed", "1234");
  a.train(0, 1);
  const std::string path = m.save(1);
  const checkpoint::Checkpoint ckpt = checkpoint::load(path);
  EXPECT_THAT(ckpt.names(), ElementsAre("conv/kernel", "dense/bias", "dense/kernel", "optimizer/conv/kernel/momentum",
                                        "optimizer/dense/bias/momentum", "optimizer/dense/kernel/momentum",
                                        "optimizer/iterations", "optimizer/scale/momentum", "scale",
                                        "train_iterator/num_workers", "train_iterator/worker_0"));
  EXPECT_EQ(ckpt.metadata().at("seed"), "1234");
  EXPECT_EQ(ckpt.metadata().at("mirrored.manager.step"), "1");
  EXPECT_EQ(ckpt.get<int64_t>("optimizer/iterations").item(), 1);
  EXPECT_EQ(ckpt.get<int64_t>("train_iterator/num_workers").item(), 1);
  EXPECT_EQ(ckpt.get<uint8_t>("train_iterator/worker_0").shape(), Shape{16});
}

TEST_F(ManagerTest, AnOptimizerThatNeverStepedSavesAZeroCounterAndRestoresIt) {
  Model a(2, Opt::adam, false);
  checkpoint::CheckpointManager m(a.strategy, dir_);
  a.track(m);
  m.save(0);  // no slots yet: only the weights and iterations = 0
  Model b(2, Opt::adam, false, 3);
  checkpoint::CheckpointManager mb(b.strategy, dir_);
  b.track(mb);
  ASSERT_EQ(mb.restore_or_initialize(), 0);
  EXPECT_EQ(b.opt->iterations(), 0);
  for (std::size_t k = 0; k < a.vars.size(); ++k) EXPECT_EQ(all_copies(b.vars[k]), all_copies(a.vars[k]));
  EXPECT_THROW(b.opt->get_slot(b.vars[0], "m"), NotFoundError);  // it made none: the file has none
}

TEST_F(ManagerTest, MaxToKeepKeepsTheNewestAndTheIndexListsThem) {
  Variable<float> w(Tensor<float>{1.0f, 2.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_, /*max_to_keep=*/2);
  m.track("w", w);
  EXPECT_EQ(m.latest_checkpoint(), std::nullopt);
  for (int step = 1; step <= 4; ++step) {
    w.assign(Tensor<float>{static_cast<float>(step), 0.0f});
    m.save(step * 10);
  }
  EXPECT_THAT(listing_but_spares(dir_), ElementsAre("checkpoint", "ckpt-30.safetensors", "ckpt-40.safetensors"));
  EXPECT_EQ(read_file(file("checkpoint")),
            "model_checkpoint_path: \"ckpt-40.safetensors\"\n"
            "all_model_checkpoint_paths: \"ckpt-30.safetensors\"\n"
            "all_model_checkpoint_paths: \"ckpt-40.safetensors\"\n");
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-40.safetensors"));
  // Saving an older step again makes it the newest (the order of saves, as TF's manager keeps it).
  m.save(30);
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-30.safetensors"));
  w.assign(Tensor<float>{0.0f, 0.0f});
  EXPECT_EQ(m.restore_or_initialize(), 30);
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{4.0f, 0.0f}));
}

TEST_F(ManagerTest, WithoutAnIndexTheHighestStepIsTheLatest) {
  Variable<float> w(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  m.save(5);
  m.save(12);
  fs::remove(file("checkpoint"));
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-12.safetensors"));
  write_file(file("checkpoint"), "model_checkpoint_path: \"../../etc/passwd\"\n");  // corrupt: scanned instead
  EXPECT_EQ(m.latest_checkpoint(), file("ckpt-12.safetensors"));
  // The next save rewrites the index from the directory's files.
  m.save(13);
  EXPECT_EQ(read_file(file("checkpoint")),
            "model_checkpoint_path: \"ckpt-13.safetensors\"\n"
            "all_model_checkpoint_paths: \"ckpt-5.safetensors\"\n"
            "all_model_checkpoint_paths: \"ckpt-12.safetensors\"\n"
            "all_model_checkpoint_paths: \"ckpt-13.safetensors\"\n");
}

TEST_F(ManagerTest, IteratorStatesAndMetadataRestore) {
  Variable<float> w(Tensor<float>{1.0f});
  FakeIterator it{.position = 7, .replicas = 1};
  checkpoint::CheckpointManager m(get_strategy(), dir_, 5, {.sync_directory = true});
  m.track("w", w);
  track_fake(m, "it", it);
  m.set_metadata("epoch", "3");
  m.set_metadata("rng", "42");
  m.save(1);
  it.position = 9;
  m.set_metadata("epoch", "4");
  m.set_metadata("other", "x");
  EXPECT_EQ(m.restore_or_initialize(), 1);
  EXPECT_EQ(it.position, 7);
  EXPECT_EQ(m.metadata("epoch"), "3");
  EXPECT_EQ(m.metadata("rng"), "42");
  EXPECT_EQ(m.metadata("other"), std::nullopt);  // the checkpoint's metadata, as saved
}

TEST_F(ManagerTest, AMissingOrEmptyDirectoryInitialises) {
  Variable<float> w(Tensor<float>{1.0f, 2.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  EXPECT_EQ(m.latest_checkpoint(), std::nullopt);
  EXPECT_EQ(m.restore_or_initialize(), std::nullopt);
  EXPECT_FALSE(fs::exists(dir_));  // restoring creates nothing
  fs::create_directory(dir_);
  EXPECT_EQ(m.restore_or_initialize(), std::nullopt);
  EXPECT_EQ(w.value().to_vector(), (std::vector<float>{1.0f, 2.0f}));
  EXPECT_TRUE(listing(dir_).empty());
}

/// A checkpoint of weights, Adam's slots and step counter, and an iterator, saved at step 2 by a
/// model trained for two steps, which the caller keeps (to compare with).
std::unique_ptr<Model> save_full_checkpoint(const std::string& dir) {
  auto model = std::make_unique<Model>(2, Opt::adam, false);
  FakeIterator it{.position = 7, .replicas = 2};
  checkpoint::CheckpointManager m(model->strategy, dir);
  model->track(m);
  track_fake(m, "train_iterator", it);
  model->train(0, 2);
  m.save(2);
  return model;
}

/// Every name in the checkpoint of `save_full_checkpoint` but the weights, in file order.
const std::vector<std::string> kNotWeights{
    "optimizer/conv/kernel/m",  "optimizer/conv/kernel/v",    "optimizer/dense/bias/m", "optimizer/dense/bias/v",
    "optimizer/dense/kernel/m", "optimizer/dense/kernel/v",   "optimizer/iterations",   "optimizer/scale/m",
    "optimizer/scale/v",        "train_iterator/num_workers", "train_iterator/worker_0"};

TEST_F(ManagerTest, ExpectPartialRestoresTheWeightsAloneAndListsWhatItLeft) {
  const auto saved = save_full_checkpoint(dir_);
  // Evaluation: the weights only, no optimizer, no iterator.
  Model eval(2, Opt::adam, false, 5);
  checkpoint::CheckpointManager m(eval.strategy, dir_);
  for (std::size_t k = 0; k < eval.vars.size(); ++k) m.track(kNames[k], eval.vars[k]);
  EXPECT_TRUE(m.unrestored().empty());
  EXPECT_EQ(m.restore_or_initialize({.expect_partial = true}), 2);
  for (std::size_t k = 0; k < eval.vars.size(); ++k) EXPECT_EQ(all_copies(eval.vars[k]), all_copies(saved->vars[k]));
  EXPECT_EQ(m.unrestored(), kNotWeights);
  EXPECT_EQ(eval.opt->iterations(), 0);  // untracked, untouched
}

TEST_F(ManagerTest, WithoutExpectPartialWhatWouldNotBeRestoredIsAnErrorListingIt) {
  save_full_checkpoint(dir_);
  Model eval(2, Opt::adam, false, 5);
  checkpoint::CheckpointManager m(eval.strategy, dir_);
  for (std::size_t k = 0; k < eval.vars.size(); ++k) m.track(kNames[k], eval.vars[k]);
  std::vector<std::vector<uint32_t>> before;
  for (const auto& v : eval.vars) before.push_back(all_copies(v));
  std::string list;
  for (const auto& name : kNotWeights) list += (list.empty() ? "'" : ", '") + name + "'";
  EXPECT_THAT(
      error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
      AllOf(HasSubstr(file("ckpt-2.safetensors")),
            HasSubstr("has 11 tensor(s) that nothing tracked here stores, which would not be restored: " + list + " ("),
            HasSubstr("RestoreOptions{.expect_partial = true}")));
  for (std::size_t k = 0; k < eval.vars.size(); ++k) EXPECT_EQ(all_copies(eval.vars[k]), before[k]);
  EXPECT_TRUE(m.unrestored().empty());
  // A full restore afterwards leaves nothing unrestored.
  Model full(2, Opt::adam, false, 5);
  FakeIterator it{.replicas = 2};
  checkpoint::CheckpointManager all(full.strategy, dir_);
  full.track(all);
  track_fake(all, "train_iterator", it);
  EXPECT_EQ(all.restore_or_initialize({.expect_partial = true}), 2);
  EXPECT_TRUE(all.unrestored().empty());
  EXPECT_EQ(it.position, 7);
}

}  // namespace manager_roundtrip_test
}  // namespace mirrored

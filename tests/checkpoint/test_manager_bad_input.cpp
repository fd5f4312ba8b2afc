// CheckpointManager on bad input: each case is a typed error naming the file and what is wrong,
// and nothing tracked changes -- a corrupt newest checkpoint (or, by option, a fall back to the
// newest valid one with a warning), a checkpoint of another model (a missing or extra name,
// another shape or dtype), an iterator saved with another replica or worker count, optimizer
// slots of an untracked variable, reserved metadata keys, a path that is not a directory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "checkpoint/manager_test_util.hpp"
#include "variables/checkpoint_header.hpp"

namespace mirrored {
namespace manager_bad_input_test {

using namespace manager_testing;  // NOLINT: the manager test helpers
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

/// Collects the library's warnings while alive.
class Warnings {
 public:
  Warnings() {
    set_log_sink([this](LogLevel level, std::string_view message) {
      if (level != LogLevel::warn) return;
      std::lock_guard lock(mu_);
      lines_.emplace_back(message);
    });
  }
  ~Warnings() { set_log_sink({}); }
  std::string all() {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& l : lines_) out += l + "\n";
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

/// Two variables and an Adam optimizer on two CPU replicas, saved at steps 1 and 2.
class ManagerBadInput : public ManagerTest {
 protected:
  void SetUp() override {
    ManagerTest::SetUp();
    model_ = std::make_unique<Model>(2, Opt::adam, false);
    checkpoint::CheckpointManager m(model_->strategy, dir_);
    model_->track(m);
    model_->train(0, 1);
    m.save(1);
    saved_1_ = state_of(*model_);
    model_->train(1, 1);
    m.save(2);
  }
  /// A fresh model (no slots) whose state must not change when a restore fails.
  struct Fresh {
    Fresh() : model(2, Opt::adam, false, 9) {}
    Model model;
    std::vector<std::vector<uint32_t>> weights() const {
      std::vector<std::vector<uint32_t>> out;
      for (const auto& v : model.vars) out.push_back(all_copies(v));
      return out;
    }
  };
  void expect_unchanged(const Fresh& f, const std::vector<std::vector<uint32_t>>& before) {
    EXPECT_EQ(f.weights(), before);
    EXPECT_EQ(f.model.opt->iterations(), 0);
    EXPECT_THROW(f.model.opt->get_slot(f.model.vars[0], "m"), NotFoundError);
  }
  void corrupt(const std::string& path) {
    std::string bytes = read_file(path);
    bytes[bytes.size() - 3] ^= 0x10;  // a data byte: the checksum catches it
    write_file(path, bytes);
  }

  std::unique_ptr<Model> model_;
  State saved_1_;
};

TEST_F(ManagerBadInput, ACorruptNewestCheckpointIsAnErrorNamingIt) {
  corrupt(file("ckpt-2.safetensors"));
  Fresh f;
  const auto before = f.weights();
  checkpoint::CheckpointManager m(f.model.strategy, dir_);
  f.model.track(m);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("checksum mismatch")));
  expect_unchanged(f, before);
}

TEST_F(ManagerBadInput, AnOptionFallsBackToTheNewestValidCheckpointWithAWarning) {
  corrupt(file("ckpt-2.safetensors"));
  Fresh f;
  checkpoint::CheckpointManager m(f.model.strategy, dir_, 5, {.fall_back_to_valid_checkpoint = true});
  f.model.track(m);
  Warnings warnings;
  EXPECT_EQ(m.restore_or_initialize(), 1);
  EXPECT_TRUE(state_of(f.model) == saved_1_);
  EXPECT_THAT(warnings.all(), AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("checksum mismatch"),
                                    HasSubstr("restoring '" + file("ckpt-1.safetensors") + "'")));
}

TEST_F(ManagerBadInput, WithEveryCheckpointCorruptTheFallBackIsAnError) {
  corrupt(file("ckpt-1.safetensors"));
  corrupt(file("ckpt-2.safetensors"));
  Fresh f;
  const auto before = f.weights();
  checkpoint::CheckpointManager m(f.model.strategy, dir_, 5, {.fall_back_to_valid_checkpoint = true});
  f.model.track(m);
  Warnings warnings;
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr("no valid checkpoint"), HasSubstr(file("ckpt-2.safetensors"))));
  EXPECT_THAT(warnings.all(), HasSubstr(file("ckpt-1.safetensors")));
  expect_unchanged(f, before);
}

TEST_F(ManagerBadInput, AMissingNameIsNotFoundNamingFileAndTensor) {
  Fresh f;
  const auto before = f.weights();
  Variable<float> extra(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(f.model.strategy, dir_);
  f.model.track(m);
  m.track("extra", extra);
  EXPECT_THAT(error_of<NotFoundError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("no tensor named 'extra'")));
  expect_unchanged(f, before);
  EXPECT_EQ(extra.value().item(), 1.0f);
}

TEST_F(ManagerBadInput, AnExtraNameIsAnErrorListingIt) {
  Fresh f;
  const auto before = f.weights();
  checkpoint::CheckpointManager m(f.model.strategy, dir_);
  for (std::size_t k = 1; k < f.model.vars.size(); ++k) m.track(kNames[k], f.model.vars[k]);  // not dense/kernel
  m.track("optimizer", *f.model.opt);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("nothing tracked here stores"),
                    HasSubstr("'dense/kernel'"), HasSubstr("'optimizer/dense/kernel/m'")));
  expect_unchanged(f, before);
}

TEST_F(ManagerBadInput, AnotherShapeOrDtypeIsAnErrorNamingBoth) {
  {
    Variable<float> other(Tensor<float>::zeros({3, 7}));  // saved as {7, 3}
    checkpoint::CheckpointManager m(get_strategy(), dir_);
    m.track("dense/kernel", other);
    EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
                AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("'dense/kernel'"),
                      HasSubstr("the file has (7, 3), expected (3, 7)")));

    EXPECT_EQ(other.value().to_vector(), std::vector<float>(21, 0.0f));
  }
  {
    Variable<double> other(Tensor<double>::zeros({5}));  // saved as float32
    checkpoint::CheckpointManager m(get_strategy(), dir_);
    m.track("dense/bias", other);
    EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
                AllOf(HasSubstr(file("ckpt-2.safetensors")), HasSubstr("'dense/bias'"), HasSubstr("float32"),
                      HasSubstr("float64")));
  }
}

TEST_F(ManagerBadInput, ASlotOfAnotherShapeLeavesAFreshOptimizerWithoutSlots) {
  // The optimizer's slots are checked like variables (before the optimizer makes any).
  std::string bytes;
  auto tensors = checkpoint::load(file("ckpt-2.safetensors")).tensors();
  tensors["optimizer/scale/v"] = checkpoint::untyped(Tensor<float>::zeros({2}));
  checkpoint::internal::save_tensors_with(file("ckpt-3.safetensors"), tensors, {}, {{"mirrored.manager.step", "3"}});
  fs::remove(file("checkpoint"));  // the highest step is the newest
  Fresh f;
  const auto before = f.weights();
  checkpoint::CheckpointManager m(f.model.strategy, dir_);
  f.model.track(m);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-3.safetensors")), HasSubstr("'optimizer/scale/v'"),
                    HasSubstr("the file has (2,), expected (1,)")));

  expect_unchanged(f, before);
}

TEST_F(ManagerTest, AnIteratorOfAnotherReplicaCountIsRefusedAndNothingChanges) {
  Variable<float> w(Tensor<float>{1.0f});
  FakeIterator first{.position = 3, .replicas = 2}, second{.position = 4, .replicas = 2};
  {
    checkpoint::CheckpointManager m(get_strategy(), dir_);
    m.track("w", w);
    track_fake(m, "a_first", first);
    track_fake(m, "b_second", second);
    m.save(1);
  }
  w.assign(Tensor<float>{5.0f});
  FakeIterator first_now{.position = 30, .replicas = 2}, second_now{.position = 40, .replicas = 4};
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  track_fake(m, "a_first", first_now);
  track_fake(m, "b_second", second_now);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-1.safetensors")), HasSubstr("iterator 'b_second'"),
                    HasSubstr("saved with 2 replicas, this iterator has 4")));
  // The first iterator was restored before the second refused: it is put back.
  EXPECT_EQ(first_now.position, 30);
  EXPECT_EQ(second_now.position, 40);
  EXPECT_EQ(w.value().item(), 5.0f);
}

TEST_F(ManagerTest, AnIteratorOfAnotherWorkerCountIsAnErrorNamingBoth) {
  Variable<float> w(Tensor<float>{1.0f});
  FakeIterator it{.position = 3};
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  track_fake(m, "it", it);
  const std::string path = m.save(1);
  // The same checkpoint as two workers would have written it.
  auto tensors = checkpoint::load(path).tensors();
  tensors["it/num_workers"] = checkpoint::untyped(Tensor<int64_t>::scalar(2));
  tensors["it/worker_1"] = tensors.at("it/worker_0");
  checkpoint::internal::save_tensors_with(path, tensors, {}, {{"mirrored.manager.step", "1"}});
  w.assign(Tensor<float>{5.0f});
  it.position = 8;
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(path), HasSubstr("iterator 'it' was saved by 2 worker(s), this run has 1")));
  EXPECT_EQ(it.position, 8);
  EXPECT_EQ(w.value().item(), 5.0f);
}

TEST_F(ManagerTest, SlotsOfAnUntrackedVariableAreAnErrorAtSave) {
  Model a(2, Opt::momentum, false);
  a.train(0, 1);
  checkpoint::CheckpointManager m(a.strategy, dir_);
  m.track("dense/kernel", a.vars[0]);
  m.track("optimizer", *a.opt);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.save(1); }),
              AllOf(HasSubstr("optimizer 'optimizer'"), HasSubstr("does not track"), HasSubstr("/momentum'")));
  EXPECT_FALSE(fs::exists(dir_));
}

TEST_F(ManagerTest, ACheckpointWithoutTheManagersStepIsRefused) {
  fs::create_directories(dir_);
  checkpoint::save_tensors(file("ckpt-4.safetensors"), {{"w", checkpoint::untyped(Tensor<float>{2.0f})}});
  Variable<float> w(Tensor<float>{1.0f});
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.restore_or_initialize(); }),
              AllOf(HasSubstr(file("ckpt-4.safetensors")), HasSubstr("mirrored.manager.step")));
  EXPECT_EQ(w.value().item(), 1.0f);
}

TEST_F(ManagerTest, MisuseIsATypedError) {
  Variable<float> w(Tensor<float>{1.0f});
  EXPECT_THROW(checkpoint::CheckpointManager(get_strategy(), dir_, 0), InvalidArgumentError);
  EXPECT_THROW(checkpoint::CheckpointManager(get_strategy(), ""), InvalidArgumentError);
  checkpoint::CheckpointManager m(get_strategy(), dir_);
  m.track("w", w);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.track("w", w); }), HasSubstr("already tracked"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.track("w2", w); }), HasSubstr("already tracked as 'w'"));
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.set_metadata("mirrored.step", "1"); }), HasSubstr("reserved"));
  EXPECT_THROW(m.set_metadata("", "1"), InvalidArgumentError);
  EXPECT_THROW(m.save(-1), InvalidArgumentError);
  // Two tracked objects storing one tensor name.
  Variable<float> clash(Tensor<float>{1.0f});
  FakeIterator it;
  m.track("it/num_workers", clash);
  track_fake(m, "it", it);
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { m.save(1); }), HasSubstr("'it/num_workers'"));
  // Not a directory.
  fs::create_directories(root_);
  write_file(root_ + "/plain_file", "x");
  checkpoint::CheckpointManager on_file(get_strategy(), root_ + "/plain_file");
  EXPECT_THAT(error_of<InvalidArgumentError>([&] { (void)on_file.latest_checkpoint(); }),
              AllOf(HasSubstr(root_ + "/plain_file"), HasSubstr("not a directory")));
  // Inside run.
  MirroredStrategy s(cpus(2));
  checkpoint::CheckpointManager in_run(s, dir_);
  std::vector<std::string> seen(2);
  s.run([&] {
    const int r = get_replica_context()->replica_id_in_sync_group();
    seen[static_cast<std::size_t>(r)] = mirrored::testing::message_of<FailedPreconditionError>([&] { in_run.save(1); });
  });
  EXPECT_THAT(seen[1], HasSubstr("inside run"));
}

}  // namespace manager_bad_input_test
}  // namespace mirrored

// Saving and restoring variables: round trips through every replica's copy; failures change nothing.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>

#include <mirrored/variable_checkpoint.hpp>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("mirrored_varckpt_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

class VariableCheckpointTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
};

TEST_P(VariableCheckpointTest, RoundTripUpdatesEveryReplicasCopy) {
  const std::string path = temp_path("roundtrip_" + std::to_string(n()));
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> w(Tensor<float>::from_vector({1, 2, 3, 4}, {2, 2}), {.name = "w"});
  Variable<int64_t> step(int64_t{41}, {.name = "step"});
  Variable<double> total(
      0.0,
      {.name = "total", .synchronization = VariableSynchronization::ON_READ, .aggregation = VariableAggregation::SUM});
  total.assign(12.0);  // stored as 12/N per copy; reads back as 12
  checkpoint::save(path, {{"w", w}, {"step", step}, {"total", total}});
  w.assign(Tensor<float>::zeros({2, 2}));
  step.assign(int64_t{0});
  total.assign(0.0);
  checkpoint::restore(path, {{"w", w}, {"step", step}, {"total", total}});
  for (const auto& c : w.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{1, 2, 3, 4}));
  for (const auto& c : step.components()) EXPECT_EQ(c.item(), 41);
  EXPECT_EQ(total.value().item(), 12.0);
  std::remove(path.c_str());
}

TEST_P(VariableCheckpointTest, FailedRestoreChangesNothing) {
  const std::string path = temp_path("fail_" + std::to_string(n()));
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> a(Tensor<float>{1, 2}, {.name = "a"});
  Variable<float> b(Tensor<float>{3}, {.name = "b"});
  checkpoint::save(path, {{"a", a}, {"b", b}});
  a.assign(Tensor<float>{7, 7});
  b.assign(Tensor<float>{7});
  Variable<float> wrong_shape(Tensor<float>{0, 0, 0}, {.name = "b3"});
  Variable<double> wrong_dtype(Tensor<double>{0}, {.name = "bd"});
  // "a" would be restorable, but "b" is not: nothing may change.
  EXPECT_THAT(message_of<InvalidArgumentError>([&] {
                checkpoint::restore(path, {{"a", a}, {"b", wrong_shape}});
              }),
              HasSubstr("b"));
  EXPECT_THROW(checkpoint::restore(path, {{"a", a}, {"b", wrong_dtype}}), InvalidArgumentError);
  EXPECT_THAT(message_of<NotFoundError>([&] {
                checkpoint::restore(path, {{"a", a}, {"missing", b}});
              }),
              HasSubstr("missing"));
  for (const auto& c : a.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{7, 7}));
  // A corrupted file is rejected, also without changes.
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-1, std::ios::end);
    f.put('\x55');
  }
  EXPECT_THROW(checkpoint::restore(path, {{"a", a}}), InvalidArgumentError);
  for (const auto& c : a.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{7, 7}));
  std::remove(path.c_str());
}

// Regression: restore wrote `a`, then threw on `b` (another strategy's).
TEST_P(VariableCheckpointTest, RestoreOfVariablesOfTwoStrategiesChangesNothing) {
  const std::string path = temp_path("two_strategies_" + std::to_string(n()));
  MirroredStrategy sa(cpus(n()));
  MirroredStrategy sb(cpus(n()));
  Variable<float> a = [&] {
    auto scope = sa.scope();
    return Variable<float>(Tensor<float>{1, 2}, {.name = "a"});
  }();
  Variable<float> b = [&] {
    auto scope = sb.scope();
    return Variable<float>(Tensor<float>{3}, {.name = "b"});
  }();
  checkpoint::save(path, {{"a", a}, {"b", b}});
  {
    auto scope = sa.scope();
    a.assign(Tensor<float>{7, 7});
    EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                  checkpoint::restore(path, {{"a", a}, {"b", b}});
                }),
                HasSubstr("Mixing different tf.distribute.Strategy objects: variable 'b'"));
  }
  for (const auto& c : a.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{7, 7}));
  for (const auto& c : b.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{3}));
  // Outside any scope both are writable, and the same restore succeeds.
  checkpoint::restore(path, {{"a", a}, {"b", b}});
  for (const auto& c : a.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{1, 2}));
  std::remove(path.c_str());
}

// A variable whose strategy is gone (it once kept a raw address of the strategy) can be neither
// saved nor restored, and a restore that includes it changes nothing else.
TEST_P(VariableCheckpointTest, VariablesOfADestroyedStrategyCannotBeSavedOrRestored) {
  const std::string path = temp_path("destroyed_" + std::to_string(n()));
  MirroredStrategy live(cpus(n()));
  Variable<float> a = [&] {
    auto scope = live.scope();
    return Variable<float>(Tensor<float>{1, 2}, {.name = "a"});
  }();
  std::optional<Variable<float>> orphan;
  {
    MirroredStrategy gone(cpus(n()));
    auto scope = gone.scope();
    orphan.emplace(Tensor<float>{3}, VariableOptions{.name = "z"});
    checkpoint::save(path, {{"a", a}, {"z", *orphan}});
  }
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                checkpoint::save(temp_path("never"), {{"z", *orphan}});
              }),
              HasSubstr("has been destroyed"));
  a.assign(Tensor<float>{7, 7});
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                checkpoint::restore(path, {{"a", a}, {"z", *orphan}});
              }),
              HasSubstr("Variable 'z'.assign"));
  for (const auto& c : a.components()) EXPECT_EQ(c.to_vector(), (std::vector<float>{7, 7}));
  std::remove(path.c_str());
}

TEST_P(VariableCheckpointTest, SaveAndRestoreAreCrossReplicaOnly) {
  MirroredStrategy s(cpus(n()));
  Variable<float> v = [&] {
    auto scope = s.scope();
    return Variable<float>(1.0f);
  }();
  auto msgs = s.run([&] {
    return message_of<FailedPreconditionError>([&] { checkpoint::save(temp_path("never"), {{"v", v}}); });
  });
  EXPECT_THAT(msgs[0], HasSubstr("inside run"));
}

INSTANTIATE_TEST_SUITE_P(Replicas, VariableCheckpointTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

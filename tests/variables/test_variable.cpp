// Variables: creation, naming, printing, and TF's read/write rules in both contexts, 1–4 replicas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <sstream>
#include <string>
#include <utility>

#include "collectives/packing.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

std::string printed(const Variable<float>& v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

class VariableTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
  std::vector<float> copies(const Variable<float>& v) const {
    std::vector<float> out;
    for (const auto& c : v.components()) out.push_back(c.item());
    return out;
  }
  std::vector<float> all(float x) const { return std::vector<float>(n(), x); }
};

TEST(Variable, SeedScopeSamplePrintsLikeTf) {
  MirroredStrategy s({"CPU:0", "CPU:1"});
  Variable<float> mirrored_variable = [&] {
    auto scope = s.scope();
    return Variable<float>(1.0f);
  }();
  EXPECT_EQ(printed(mirrored_variable),
            "MirroredVariable:{\n"
            "  0: <Variable 'Variable:0' shape=() dtype=float32, value=1.0>,\n"
            "  1: <Variable 'Variable/replica_1:0' shape=() dtype=float32, value=1.0>\n"
            "}");
  Variable<float> regular_variable(1.0f);
  EXPECT_EQ(printed(regular_variable), "<Variable 'Variable:0' shape=() dtype=float32, value=1.0>");
  EXPECT_FALSE(regular_variable.is_mirrored());
  EXPECT_EQ(regular_variable.strategy(), nullptr);
}

TEST_P(VariableTest, CreatedInScopeHasOneCopyPerReplicaDevice) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> v(Tensor<float>{1, 2}, {.name = "w"});
  EXPECT_TRUE(v.is_mirrored());
  EXPECT_FALSE(v.is_sync_on_read());
  EXPECT_TRUE(v.trainable());
  EXPECT_EQ(v.shape(), Shape{2});
  EXPECT_EQ(v.name(), "w");
  ASSERT_EQ(v.num_components(), static_cast<std::size_t>(n()));
  const auto comps = v.components();
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(comps[r].device(), Device(DeviceType::CPU, r));
    EXPECT_EQ(comps[r].to_vector(), (std::vector<float>{1, 2}));
  }
  EXPECT_TRUE(s.extended().variable_created_in_scope(v));
  Variable<float> copy = v;  // a handle: same variable
  copy.assign(Tensor<float>{5, 6});
  EXPECT_EQ(v.value().to_vector(), (std::vector<float>{5, 6}));
}

TEST_P(VariableTest, OnReadMakesSyncOnReadAndNotTrainable) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> v(
      0.0f,
      {.name = "count", .synchronization = VariableSynchronization::ON_READ, .aggregation = VariableAggregation::SUM});
  EXPECT_TRUE(v.is_sync_on_read());
  EXPECT_FALSE(v.trainable());
  EXPECT_THAT(printed(v),
              HasSubstr("SyncOnReadVariable:{\n  0: <Variable 'count:0' shape=() dtype=float32, value=0.0>"));
  Variable<float> t(0.0f, {.trainable = true, .synchronization = VariableSynchronization::ON_READ});
  EXPECT_TRUE(t.trainable());
}

TEST_P(VariableTest, CreatedInsideRunOnceFromReplicaZerosValue) {
  MirroredStrategy s(cpus(n()));
  auto vars = s.run([] { return Variable<float>(float(10 + id())); });
  for (int r = 1; r < n(); ++r) EXPECT_TRUE(vars[r] == vars[0]);
  EXPECT_TRUE(vars[0].is_mirrored());
  EXPECT_EQ(copies(vars[0]), all(10.0f));
  EXPECT_TRUE(s.extended().variable_created_in_scope(vars[0]));
}

TEST_P(VariableTest, SeedVariableCreatedInAFunction) {
  MirroredStrategy s(cpus(n()));
  std::vector<Variable<float>> x;
  auto create_variable = [&]() -> Variable<float> {
    if (x.empty()) x.emplace_back(1.0f);
    return x[0];
  };
  {
    auto scope = s.scope();
    (void)create_variable();
    (void)create_variable();
  }
  ASSERT_EQ(x.size(), 1u);
  EXPECT_TRUE(x[0].is_mirrored());
  EXPECT_EQ(copies(x[0]), all(1.0f));
}

TEST_P(VariableTest, ReplicaWritesFollowTheAggregation) {
  MirroredStrategy s(cpus(n()));
  const float ids = float(n() * (n() - 1) / 2);
  auto make = [&](VariableAggregation a) {
    auto scope = s.scope();
    return Variable<float>(100.0f, {.aggregation = a});
  };
  Variable<float> none = make(VariableAggregation::NONE), sum = make(VariableAggregation::SUM),
                  mean = make(VariableAggregation::MEAN), first = make(VariableAggregation::ONLY_FIRST_REPLICA),
                  add = make(VariableAggregation::SUM);
  auto results = s.run([&] {
    const float mine = float(2 * id());
    return std::vector<float>{none.assign(mine).item(),      sum.assign(mine).item(),     mean.assign(mine).item(),
                              first.assign(mine + 7).item(), add.assign_add(mine).item(), none.value().item()};
  });
  std::vector<float> local;
  for (int r = 0; r < n(); ++r) local.push_back(float(2 * r));
  EXPECT_EQ(copies(none), local);  // NONE: each replica wrote only its own copy
  EXPECT_EQ(copies(sum), all(2 * ids));
  EXPECT_EQ(copies(mean), all(2 * ids / n()));
  EXPECT_EQ(copies(first), all(7.0f));
  EXPECT_EQ(copies(add), all(100 + 2 * ids));
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(results[r][0], float(2 * r));
    EXPECT_EQ(results[r][1], 2 * ids);
    EXPECT_EQ(results[r][4], 100 + 2 * ids);
    EXPECT_EQ(results[r][5], float(2 * r));  // replica reads see the local copy
  }
}

TEST_P(VariableTest, CrossReplicaWritesApplyToEveryCopy) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  Variable<float> v(1.0f);
  EXPECT_EQ(v.assign(4.0f).item(), 4.0f);
  EXPECT_EQ(copies(v), all(4.0f));
  v.assign_sub(Tensor<float>::scalar(1));
  EXPECT_EQ(copies(v), all(3.0f));
  auto per = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor<float>::scalar(float(c.replica_id_in_sync_group)); });
  v.assign_add(per);
  std::vector<float> expected;
  for (int r = 0; r < n(); ++r) expected.push_back(3.0f + r);
  EXPECT_EQ(copies(v), expected);
  EXPECT_EQ(v.value().item(), 3.0f);  // cross-replica reads of a mirrored variable: the first copy
  Tensor<float> snapshot = v.read_value();
  v.assign(0.0f);
  EXPECT_EQ(snapshot.item(), 3.0f);  // reads are snapshots
}

TEST_P(VariableTest, SyncOnReadRules) {
  MirroredStrategy s(cpus(n()));
  auto make = [&](VariableAggregation a) {
    auto scope = s.scope();
    return Variable<float>(0.0f, {.synchronization = VariableSynchronization::ON_READ, .aggregation = a});
  };
  Variable<float> sum = make(VariableAggregation::SUM), mean = make(VariableAggregation::MEAN),
                  first = make(VariableAggregation::ONLY_FIRST_REPLICA), none = make(VariableAggregation::NONE);
  auto local_reads = s.run([&] {
    const float mine = float(2 * id() + 2);
    for (auto* v : {&sum, &mean, &first, &none}) v->assign(mine);
    return sum.value().item();
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(local_reads[r], float(2 * r + 2));
  const float total = float(n() * (n() + 1));
  EXPECT_EQ(sum.value().item(), total);
  EXPECT_EQ(mean.value().item(), total / n());
  EXPECT_EQ(first.value().item(), 2.0f);
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)none.value(); }), HasSubstr("aggregation NONE"));
  // Cross-replica assign of a SUM variable stores v/N per copy, so that reading gives v back.
  sum.assign(float(4 * n()));
  EXPECT_EQ(copies(sum), all(4.0f));
  EXPECT_EQ(sum.value().item(), float(4 * n()));
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { sum.assign_add(1.0f); }),
            "SyncOnReadVariable 'Variable' does not support `assign_add` in cross-replica context when aggregation is "
            "set to `tf.VariableAggregation.SUM`.");
  EXPECT_THROW(sum.assign_sub(1.0f), InvalidArgumentError);
  mean.assign_add(1.0f);
  EXPECT_EQ(mean.value().item(), total / n() + 1);
}

TEST_P(VariableTest, CreationAndWriteErrors) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  EXPECT_THAT(message_of<InvalidArgumentError>(
                  [&] { Variable<float> v(1.0f, {.name = "bad", .synchronization = VariableSynchronization::NONE}); }),
              HasSubstr("`NONE` variable synchronization mode is not supported with tf.distribute strategy. Please "
                        "change the `synchronization` for variable: bad"));
  EXPECT_THAT(message_of<InvalidArgumentError>(
                  [&] { Variable<int32_t> v(1, {.name = "steps", .aggregation = VariableAggregation::MEAN}); }),
              HasSubstr("'steps' of dtype int32 cannot use aggregation MEAN"));
  Variable<float> v(Tensor<float>{1, 2}, {.name = "w"});
  EXPECT_EQ(message_of<InvalidArgumentError>([&] {
              v.assign(Tensor<float>{1, 2, 3});
            }),
            "Variable 'w'.assign: value of shape (3,) does not match the variable's shape (2,)");
  std::string in_run = s.run([&] {
    auto per = PerReplica<Tensor<float>>(std::vector<Tensor<float>>(n(), Tensor<float>{1, 1}));
    return message_of<InvalidArgumentError>([&] { v.assign(per); });
  })[0];
  EXPECT_THAT(in_run, HasSubstr("only be written to a distributed variable in cross-replica context"));
}

TEST_P(VariableTest, WritingAVariableOfAnotherStrategyIsMixing) {
  MirroredStrategy a(cpus(n()));
  MirroredStrategy b(cpus(n()));
  Variable<float> v = [&] {
    auto scope = a.scope();
    return Variable<float>(1.0f);
  }();
  auto msgs = b.run([&] { return message_of<FailedPreconditionError>([&] { v.assign(2.0f); }); });
  EXPECT_THAT(msgs[0], HasSubstr("Mixing different tf.distribute.Strategy objects"));
  auto scope = b.scope();
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { v.assign_add(2.0f); }),
              HasSubstr("Mixing different tf.distribute.Strategy objects"));
  EXPECT_FALSE(b.extended().variable_created_in_scope(v));
  EXPECT_EQ(copies(v), all(1.0f));
}

// Regression: a variable kept its strategy's raw address; a new strategy at
// the same address took it for its own (assign segfaulted or silently wrote).
TEST_P(VariableTest, AVariableWhoseStrategyIsDestroyedFailsOnUseEvenIfTheAddressIsReused) {
  std::optional<MirroredStrategy> slot;
  slot.emplace(cpus(n()));
  const Strategy* first = &*slot;
  const std::uint64_t first_id = slot->id();
  Variable<float> v = [&] {
    auto scope = slot->scope();
    return Variable<float>(1.0f, {.name = "orphan", .aggregation = VariableAggregation::SUM});
  }();
  EXPECT_TRUE(slot->extended().variable_created_in_scope(v));
  slot.reset();
  slot.emplace(cpus(n()));  // same storage, so the same address
  ASSERT_EQ(&*slot, first);
  EXPECT_NE(slot->id(), first_id);
  EXPECT_FALSE(slot->extended().variable_created_in_scope(v));

  auto in_run = slot->run([&] {
    return std::make_pair(message_of<FailedPreconditionError>([&] { v.assign(2.0f); }),
                          message_of<FailedPreconditionError>([&] { (void)v.value(); }));
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_THAT(in_run[r].first, HasSubstr("Variable 'orphan'.assign: the variable belongs to MirroredStrategy #" +
                                           std::to_string(first_id) + ", which has been destroyed"));
    EXPECT_THAT(in_run[r].second, HasSubstr("Variable 'orphan'.value"));
  }
  EXPECT_THAT(message_of<FailedPreconditionError>([&] { slot->extended().update(v, [](Variable<float>&) {}); }),
              HasSubstr("has been destroyed"));
  {
    auto scope = slot->scope();
    EXPECT_THROW(v.assign_add(1.0f), FailedPreconditionError);
  }
  slot.reset();
  EXPECT_THROW((void)v.read_value(), FailedPreconditionError);
  EXPECT_THROW(v.assign_sub(1.0f), FailedPreconditionError);
  optimizers::SGD<float> sgd({.learning_rate = 0.1});
  EXPECT_THAT(message_of<FailedPreconditionError>([&] {
                sgd.apply_gradients({{Tensor<float>::scalar(1.0f), v}});
              }),
              HasSubstr("apply_gradients"));
  // The copies themselves stay readable, unchanged.
  EXPECT_EQ(copies(v), all(1.0f));
  // Plain variables have no strategy to lose.
  Variable<float> plain(5.0f);
  plain.assign_add(1.0f);
  EXPECT_EQ(plain.value().item(), 6.0f);
}

TEST_P(VariableTest, UpdateCallsFnOnEachCopyBypassingAggregation) {
  MirroredStrategy s(cpus(n()));
  Variable<float> v = [&] {
    auto scope = s.scope();
    return Variable<float>(1.0f, {.aggregation = VariableAggregation::SUM});
  }();
  auto deltas = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor<float>::scalar(float(c.replica_id_in_sync_group)); });
  auto names = s.extended().update(
      v,
      [](Variable<float>& copy, const Tensor<float>& d, float scale) {
        copy.assign_add(d * scale);
        std::ostringstream os;
        os << copy;
        return os.str();
      },
      deltas, 10.0f);
  std::vector<float> expected;
  for (int r = 0; r < n(); ++r) expected.push_back(1.0f + 10.0f * r);
  EXPECT_EQ(copies(v), expected);
  EXPECT_THAT(names[n() - 1], HasSubstr(detail::component_name("Variable", n() - 1)));
  MirroredStrategy other(cpus(n()));
  EXPECT_THROW(other.extended().update(v, [](Variable<float>&) {}), FailedPreconditionError);
  auto in_run = s.run(
      [&] { return message_of<FailedPreconditionError>([&] { s.extended().update(v, [](Variable<float>&) {}); }); });
  EXPECT_THAT(in_run[0], HasSubstr("Method requires being in cross-replica context"));
}

TEST_P(VariableTest, ReduceToAndBatchReduceToLandOnTheVariablesDevices) {
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  std::vector<Variable<float>> vars;
  std::vector<std::pair<PerReplica<Tensor<float>>, Variable<float>>> pairs;
  for (int i = 0; i < 5; ++i) {
    vars.emplace_back(Tensor<float>::zeros({i + 1}));
    pairs.emplace_back(s.experimental_distribute_values_from_function([&](const ValueContext& c) {
      return Tensor<float>::full({i + 1}, float(c.replica_id_in_sync_group + i));
    }),
                       vars.back());
  }
  const float ids = float(n() * (n() - 1) / 2);
  for (int64_t pack_bytes : {0, 1, 8, 1 << 20}) {
    CommunicationOptions o;
    o.bytes_per_pack = pack_bytes;
    auto out = s.extended().batch_reduce_to(ReduceOp::SUM, pairs, o);
    ASSERT_EQ(out.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      ASSERT_EQ(out[i].size(), static_cast<std::size_t>(n()));
      for (int r = 0; r < n(); ++r) {
        EXPECT_EQ(out[i][r].device(), Device(DeviceType::CPU, r));
        EXPECT_EQ(out[i][r].to_vector(), std::vector<float>(i + 1, ids + float(n() * i))) << pack_bytes;
      }
    }
  }
  Mirrored<Tensor<float>> mean = s.extended().reduce_to(ReduceOp::MEAN, pairs[0].first, vars[0]);
  EXPECT_EQ(mean[0].item(), ids / n());
  Tensor<float> on_one = s.extended().reduce_to(ReduceOp::SUM, pairs[1].first, Device(DeviceType::CPU, 3));
  EXPECT_EQ(on_one.device(), Device(DeviceType::CPU, 3));
  EXPECT_EQ(on_one.to_vector(), std::vector<float>(2, ids + n()));
}

// A cross-device ops double with a batch all-reduce of its own (as NcclAllReduce has for GPUs):
// it marks its outputs with 42 so that the test sees whose results batch_reduce_to returned.
class BatchClaimingOps : public ReductionToOneDevice {
 public:
  bool claim = true;
  int calls = 0;
  std::vector<Device> devices_seen;
  double timeout_seen = 0;
  bool batch_all_reduce(ReduceOp, const std::vector<std::vector<detail::UntypedTensor>>& inputs,
                        const std::vector<Device>& devices, std::vector<std::vector<detail::UntypedTensor>>& outputs,
                        const Deadline& deadline) override {
    ++calls;
    devices_seen = devices;
    timeout_seen = deadline.timeout_seconds();
    if (!claim) return false;
    outputs.assign(inputs.size(), {});
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      for (const Device& d : devices) {
        auto t = Tensor<float>::full(inputs[i][0].shape, 42.0f, d);
        outputs[i].push_back(detail::TensorAccess::erase(t));
      }
    }
    return true;
  }
};

TEST_P(VariableTest, BatchReduceToOntoTheReplicasUsesTheOpsOwnBatchAllReduce) {
  auto ops = std::make_shared<BatchClaimingOps>();
  MirroredStrategy s(cpus(n()), ops);
  auto scope = s.scope();
  Variable<float> var(Tensor<float>::zeros({3}));
  auto value = s.experimental_distribute_values_from_function(
      [](const ValueContext& c) { return Tensor<float>::full({3}, float(c.replica_id_in_sync_group + 1)); });
  CommunicationOptions o;
  o.timeout_seconds = 7;
  auto out = s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{value, var}, {value, var}}, o);
  EXPECT_EQ(ops->calls, 1);
  EXPECT_EQ(ops->devices_seen, s.extended().worker_devices());
  EXPECT_EQ(ops->timeout_seen, 7.0);
  ASSERT_EQ(out.size(), 2u);
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[1][r].device(), Device(DeviceType::CPU, r));
    EXPECT_EQ(out[1][r].to_vector(), std::vector<float>(3, 42.0f));
  }
  // Declining hands the work back to the reduce-and-copy path, with the strategy's deadline.
  ops->claim = false;
  out = s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{value, var}}, {});
  EXPECT_EQ(ops->calls, 2);
  EXPECT_EQ(ops->timeout_seen, s.extended().collective_timeout_seconds());
  const float sum = float(n() * (n() + 1) / 2);
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[0][r].to_vector(), std::vector<float>(3, sum));
  // Onto one device (not the replicas'), the ops' batch all-reduce is not asked.
  Tensor<float> on_one = s.extended().reduce_to(ReduceOp::SUM, value, Device(DeviceType::CPU, 3));
  EXPECT_EQ(ops->calls, 2);
  EXPECT_EQ(on_one.to_vector(), std::vector<float>(3, sum));
}

INSTANTIATE_TEST_SUITE_P(Replicas, VariableTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

TEST(Packing, GreedyGroupBySize) {
  auto leaves = [](std::vector<int64_t> sizes, std::vector<DType> dtypes = {}) {
    std::vector<detail::UntypedTensor> out;
    for (std::size_t i = 0; i < sizes.size(); ++i)
      out.push_back(detail::make_untyped(dtypes.empty() ? DType::float32 : dtypes[i], {sizes[i]}, cpu0));
    return out;
  };
  using Plan = std::vector<std::vector<std::size_t>>;
  // 0: everything of one dtype in one pack.
  EXPECT_EQ(detail::plan_packs(leaves({1, 2, 3}), 0), (Plan{{0, 1, 2}}));
  // A pack closes once it holds the limit (bytes: 4 per element), as a GradientBuckets bucket does.
  EXPECT_EQ(detail::plan_packs(leaves({1, 2, 3, 1}), 8), (Plan{{0, 1}, {2}, {3}}));
  EXPECT_EQ(detail::plan_packs(leaves({1, 1, 1, 1}), 8), (Plan{{0, 1}, {2, 3}}));
  EXPECT_EQ(detail::plan_packs(leaves({1, 1, 1}), 9), (Plan{{0, 1, 2}}));
  EXPECT_EQ(detail::plan_packs(leaves({10, 10}), 1), (Plan{{0}, {1}}));
  // A dtype change starts a new pack.
  EXPECT_EQ(detail::plan_packs(leaves({1, 1, 1}, {DType::float32, DType::float64, DType::float64}), 0),
            (Plan{{0}, {1, 2}}));
  EXPECT_TRUE(detail::plan_packs({}, 0).empty());
}

}  // namespace
}  // namespace mirrored

// Strategy::reduce: ops, axis, nests, result types and errors, for 1–4 replicas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>

#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

class ReduceTest : public ::testing::TestWithParam<int> {
 protected:
  int n() const { return GetParam(); }
  // 0 + 1 + … + (n-1)
  int id_sum() const { return n() * (n() - 1) / 2; }
  template <class Fn>
  auto per_replica(MirroredStrategy& s, Fn fn) {
    return s.experimental_distribute_values_from_function(
        [&](const ValueContext& c) { return fn(c.replica_id_in_sync_group); });
  }
};

TEST_P(ReduceTest, SumAndMeanOfScalars) {
  MirroredStrategy s(cpus(n()));
  auto ids = s.run([] { return get_replica_context()->replica_id_in_sync_group(); });
  EXPECT_EQ(s.reduce(ReduceOp::SUM, ids, std::nullopt), id_sum());
  EXPECT_EQ(s.reduce("sum", ids, std::nullopt), id_sum());
  EXPECT_EQ(s.reduce<double>(ReduceOp::MEAN, ids, std::nullopt), double(id_sum()) / n());
  auto halves = per_replica(s, [](int r) { return 2.0 * r + 1.0; });
  EXPECT_EQ(s.reduce("Mean", halves, std::nullopt), double(n()));  // mean of 1, 3, 5, … = n
}

TEST_P(ReduceTest, TensorsAcrossReplicasLandOnTheHost) {
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int r) {
    return Tensor<float>({float(r), float(2 * r), 4.0f}).to(Device(DeviceType::CPU, r));
  });
  Tensor<float> sum = s.reduce(ReduceOp::SUM, v, std::nullopt);
  EXPECT_EQ(sum.shape(), Shape{3});
  EXPECT_EQ(sum.to_vector(), (std::vector<float>{float(id_sum()), float(2 * id_sum()), 4.0f * n()}));
  EXPECT_EQ(sum.device(), cpu0);
  Tensor<float> mean = s.reduce(ReduceOp::MEAN, v, std::nullopt);
  EXPECT_EQ(mean.to_vector()[2], 4.0f);
}

// A reduction of more than 1 MiB is split over the idle replica threads: the same sums, exact,
// for an odd size; inside merge_fn (a run holds the replica threads) the caller does it alone.
TEST_P(ReduceTest, LargeReductionsAreExactWhetherSplitOrNot) {
  MirroredStrategy s(cpus(n()));
  constexpr int64_t kCount = (int64_t{1} << 20) / 4 * 3 + 37;  // about 3 MiB of floats
  auto v = per_replica(s, [](int r) {
    Tensor<float> t = Tensor<float>::empty({kCount});
    for (int64_t i = 0; i < kCount; ++i) t.data()[i] = float((i % 977) + 2 * r);
    return t;
  });
  auto check = [&](const Tensor<float>& sum, const Tensor<float>& mean) {
    int64_t wrong = 0;
    for (int64_t i = 0; i < kCount; ++i) {
      const float want = float(n() * (i % 977) + 2 * id_sum());
      wrong += sum.data()[i] != want || mean.data()[i] != want / float(n());
    }
    return wrong;
  };
  EXPECT_EQ(check(s.reduce(ReduceOp::SUM, v, std::nullopt), s.reduce(ReduceOp::MEAN, v, std::nullopt)), 0);
  auto inside = s.run([&] {
    return get_replica_context()->merge_call([&](Strategy& st) {
      return check(st.reduce(ReduceOp::SUM, v, std::nullopt), st.reduce(ReduceOp::MEAN, v, std::nullopt));
    });
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(inside[r], 0) << "replica " << r;
}

// A gather of more than 1 MiB copies the parts on the idle replica threads (written around the
// cache past 8 MiB): every part lands whole in its place, uneven sizes and an empty part
// included; along another axis, or inside merge_fn, the caller copies.
TEST_P(ReduceTest, LargeGathersPutEveryPartInItsPlace) {
  MirroredStrategy s(cpus(n()));
  auto rows_of = [](int r) { return int64_t{r == 1 ? 0 : (r + 1) * 300001}; };  // replica 1: no rows
  auto v = per_replica(s, [&](int r) {
    Tensor<int32_t> t = Tensor<int32_t>::empty({rows_of(r), 3});
    for (int64_t i = 0; i < t.numel(); ++i) t.data()[i] = static_cast<int32_t>(1000 * r + i % 997);
    return t;
  });
  auto check = [&](const Tensor<int32_t>& all) {
    int64_t wrong = 0, at = 0;
    for (int r = 0; r < n(); ++r) {
      for (int64_t i = 0; i < rows_of(r) * 3; ++i)
        wrong += all.data()[at + i] != static_cast<int32_t>(1000 * r + i % 997);
      at += rows_of(r) * 3;
    }
    return wrong + (all.numel() == at ? 0 : 1);
  };
  EXPECT_EQ(check(s.gather(v, 0)), 0);
  auto inside =
      s.run([&] { return get_replica_context()->merge_call([&](Strategy& st) { return check(st.gather(v, 0)); }); });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(inside[r], 0) << "replica " << r;
}

TEST_P(ReduceTest, AlongAxisZeroWithUnevenAndEmptyBatches) {
  MirroredStrategy s(cpus(n()));
  // Replica r holds r rows (replica 0 holds an empty batch) of [r, 10].
  auto v = per_replica(s, [](int r) {
    std::vector<float> rows;
    for (int i = 0; i < r; ++i) rows.insert(rows.end(), {float(r), 10.0f});
    return Tensor<float>::from_vector(rows, {r, 2});
  });
  int64_t rows = 0;
  float first = 0;
  for (int r = 0; r < n(); ++r) {
    rows += r;
    first += float(r * r);
  }
  Tensor<float> sum = s.reduce(ReduceOp::SUM, v, 0);
  EXPECT_EQ(sum.shape(), Shape{2});
  EXPECT_EQ(sum.to_vector(), (std::vector<float>{first, 10.0f * rows}));
  Tensor<float> mean = s.reduce(ReduceOp::MEAN, v, 0);  // divides by all rows over all replicas
  if (rows) {
    EXPECT_EQ(mean.to_vector(), (std::vector<float>{first / rows, 10.0f}));
  }
  Tensor<float> by_minus_two = s.reduce(ReduceOp::SUM, v, -2);
  EXPECT_EQ(by_minus_two.to_vector(), sum.to_vector());
}

TEST_P(ReduceTest, PartialBatchMeanUsesTheTotalCount) {
  MirroredStrategy s(cpus(n()));
  // A global batch of 0..(2n-2) split as [0,1], [2,3], …, last replica one element short.
  auto v = per_replica(s, [&](int r) {
    std::vector<float> part{float(2 * r)};
    if (r != n() - 1) part.push_back(float(2 * r + 1));
    return Tensor<float>::from_vector(part, {int64_t(part.size())});
  });
  const int count = 2 * n() - 1;
  const float total = float(count * (count - 1) / 2);
  EXPECT_EQ(s.reduce(ReduceOp::SUM, v, 0).item(), total);
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, v, 0).item(), total / count);
  if (n() > 1) {
    EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, std::nullopt); }),
                HasSubstr("replica 0 has (2,) and replica " + std::to_string(n() - 1) + " has (1,)"));
  }
}

TEST_P(ReduceTest, AlongInnerAxisOfRankTwo) {
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int r) { return Tensor<int32_t>::from_vector({1, 2, 3, 4, 5, 6}, {2, 3}) * (r + 1); });
  Tensor<int32_t> sum = s.reduce(ReduceOp::SUM, v, 1);
  const int factor = n() * (n() + 1) / 2;
  EXPECT_EQ(sum.shape(), Shape{2});
  EXPECT_EQ(sum.to_vector(), (std::vector<int32_t>{6 * factor, 15 * factor}));
  Tensor<double> mean = s.reduce<double>(ReduceOp::MEAN, v, 1);
  EXPECT_EQ(mean.to_vector(), (std::vector<double>{2.0 * factor / n(), 5.0 * factor / n()}));
}

TEST_P(ReduceTest, AxisOutOfRange) {
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int) { return Tensor<float>{1, 2}; });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, 1); }),
            "`axis` = 1 out of range for `value` with rank 1");
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, -2); }),
            "`axis` = -2 out of range for `value` with rank 1");
  auto scalars = per_replica(s, [](int) { return 1.0f; });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, scalars, 0); }),
            "`axis` = 0 out of range for `value` with rank 0");
}

TEST_P(ReduceTest, IntegerMeanNeedsAFloatingResultType) {
  MirroredStrategy s(cpus(n()));
  auto ints = per_replica(s, [](int r) { return Tensor<int64_t>{r, 1}; });
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::MEAN, ints, std::nullopt); }),
              HasSubstr("reduce<double>"));
  EXPECT_THROW((void)s.reduce<int32_t>(ReduceOp::MEAN, ints, std::nullopt), InvalidArgumentError);
  Tensor<double> mean = s.reduce<double>(ReduceOp::MEAN, ints, std::nullopt);
  EXPECT_EQ(mean.to_vector(), (std::vector<double>{double(id_sum()) / n(), 1.0}));
  Tensor<float> as_float = s.reduce<float>(ReduceOp::MEAN, ints, 0);
  EXPECT_EQ(as_float.item(), float(id_sum() + n()) / (2 * n()));
  // R also converts SUM results.
  auto floats = per_replica(s, [](int r) { return Tensor<float>{float(r)}; });
  Tensor<double> sum = s.reduce<double>(ReduceOp::SUM, floats, std::nullopt);
  EXPECT_EQ(sum.to_vector(), (std::vector<double>{double(id_sum())}));
}

TEST_P(ReduceTest, NestsAreReducedLeafWise) {
  MirroredStrategy s(cpus(n()));
  using Nest = std::tuple<std::vector<Tensor<float>>, std::map<std::string, int>, double>;
  auto v = per_replica(s, [](int r) {
    return Nest{{Tensor<float>{float(r)}, Tensor<float>{1, 2}}, {{"a", r}, {"b", 1}}, 0.5 * r};
  });
  Nest sum = s.reduce(ReduceOp::SUM, v, std::nullopt);
  EXPECT_EQ(std::get<0>(sum)[0].to_vector(), (std::vector<float>{float(id_sum())}));
  EXPECT_EQ(std::get<0>(sum)[1].to_vector(), (std::vector<float>{float(n()), 2.0f * n()}));
  EXPECT_EQ(std::get<1>(sum), (std::map<std::string, int>{{"a", id_sum()}, {"b", n()}}));
  EXPECT_EQ(std::get<2>(sum), 0.5 * id_sum());
  auto mean = s.reduce<double>(ReduceOp::MEAN, v, std::nullopt);
  static_assert(
      std::is_same_v<decltype(mean), std::tuple<std::vector<Tensor<double>>, std::map<std::string, double>, double>>);
  EXPECT_EQ(std::get<1>(mean).at("b"), 1.0);
}

TEST_P(ReduceTest, NestStructuresMustMatch) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas to differ";
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int r) { return std::vector<float>(r == 1 ? 3 : 2, 1.0f); });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, std::nullopt); }),
            "reduce: replica 0 passed a vector of 2 elements but replica 1 passed a vector of 3 elements (nests must "
            "have the same structure on every replica)");
  auto m = per_replica(s, [](int r) { return std::map<std::string, int>{{r == 1 ? "x" : "y", 1}}; });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, m, std::nullopt); }),
            "reduce: replica 0 passed keys {\"y\"} but replica 1 passed keys {\"x\"} (nests must have the same "
            "structure on every replica)");
}

// Regression: map keys were joined with ",", so {"a,b", "c"} and {"a", "b,c"} had
// the same structure and were summed key by key.
TEST_P(ReduceTest, MapKeysWithCommasDoNotCollide) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas to differ";
  MirroredStrategy s(cpus(n()));
  auto m = per_replica(s, [](int r) {
    return r == 1 ? std::map<std::string, float>{{"a", 10}, {"b,c", 20}}
                  : std::map<std::string, float>{{"a,b", 1}, {"c", 2}};
  });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, m, std::nullopt); }),
            "reduce: replica 0 passed keys {\"a,b\", \"c\"} but replica 1 passed keys {\"a\", \"b,c\"} (nests must "
            "have the same structure on every replica)");
  // Nested deeper, the message says where.
  auto deep = per_replica(s, [](int r) {
    return std::map<std::string, std::map<std::string, float>>{{"layer", {{r == 1 ? "b,c" : "a,b", 1.0f}}}};
  });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, deep, std::nullopt); }),
            "reduce: replica 0 passed keys {\"a,b\"} but replica 1 passed keys {\"b,c\"} at [\"layer\"] (nests must "
            "have the same structure on every replica)");
}

TEST_P(ReduceTest, AxisOutOfRangeOnOneReplicaNamesIt) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas to differ";
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int r) { return r == 1 ? Tensor<float>{1, 2} : Tensor<float>::zeros({2, 2}); });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, 1); }),
            "`axis` = 1 out of range for `value` with rank 1 (replica 1's value)");
}

TEST_P(ReduceTest, ReduceToAndBatchReduceToNameBothShapes) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas to differ";
  MirroredStrategy s(cpus(n()));
  auto scope = s.scope();
  auto good = per_replica(s, [](int) { return Tensor<float>{1, 2}; });
  auto bad = per_replica(s, [](int r) { return r == 1 ? Tensor<float>{1, 2, 3} : Tensor<float>{1, 2}; });
  Variable<float> var(Tensor<float>::zeros({2}));
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.extended().reduce_to(ReduceOp::SUM, bad, cpu0); }),
            "reduce_to: replica 0 passed shape (2,) but replica 1 passed shape (3,)");
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.extended().reduce_to(ReduceOp::SUM, bad, var); }),
            "batch_reduce_to: replica 0 passed shape (2,) but replica 1 passed shape (3,)");
  EXPECT_EQ(message_of<InvalidArgumentError>([&] {
              (void)s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{good, var}, {bad, var}});
            }),
            "batch_reduce_to: replica 0 passed shape (2,) but replica 1 passed shape (3,) (value 1)");
  auto ok = s.extended().batch_reduce_to<float>(ReduceOp::SUM, {{good, var}});
  EXPECT_EQ(ok[0][0].to_vector(), (std::vector<float>{float(n()), 2.0f * n()}));
}

TEST_P(ReduceTest, NonDistributedValues) {
  MirroredStrategy s(cpus(n()));
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, 5.0, std::nullopt), 5.0);
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, Tensor<float>{2, 4}, std::nullopt).to_vector(), (std::vector<float>{2, 4}));
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, Tensor<float>{2, 4}, 0).item(), 3.0f);
  if (n() > 1) {
    EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, 5.0, std::nullopt); }),
              "A non-DistributedValues value 5.0 cannot be reduced with the given reduce op ReduceOp.SUM.");
  } else {
    EXPECT_EQ(s.reduce(ReduceOp::SUM, 5.0, std::nullopt), 5.0);
  }
}

TEST_P(ReduceTest, MirroredValuesAreReducedLikePerReplica) {
  MirroredStrategy s(cpus(n()));
  Mirrored<Tensor<float>> m(std::vector<Tensor<float>>(n(), Tensor<float>{3}));
  EXPECT_EQ(s.reduce(ReduceOp::SUM, m, std::nullopt).item(), 3.0f * n());
  EXPECT_EQ(s.reduce(ReduceOp::MEAN, m, std::nullopt).item(), 3.0f);
}

TEST_P(ReduceTest, ValueFromAStrategyOfAnotherSizeIsRejected) {
  MirroredStrategy s(cpus(n()));
  PerReplica<int> v(std::vector<int>(n() + 1, 1));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, std::nullopt); }),
              HasSubstr("components"));
  EXPECT_THAT(message_of<InvalidArgumentError>([&] { (void)s.reduce(ReduceOp::SUM, v, std::nullopt); }),
              HasSubstr(std::to_string(n()) + " replicas"));
}

TEST_P(ReduceTest, InvalidOpName) {
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int) { return 1; });
  EXPECT_EQ(message_of<InvalidArgumentError>([&] { (void)s.reduce("MAX", v, std::nullopt); }),
            "'MAX' is not a valid ReduceOp");
}

TEST_P(ReduceTest, ResultsAreBitwiseReproducible) {
  MirroredStrategy s(cpus(n()));
  auto v = per_replica(s, [](int r) {
    std::vector<float> x(1000);
    for (int i = 0; i < 1000; ++i) x[i] = 0.1f * float(i + 1) / float(r + 3);
    return Tensor<float>::from_vector(x, {1000});
  });
  const auto a = s.reduce(ReduceOp::MEAN, v, std::nullopt).to_vector();
  const auto b = s.reduce(ReduceOp::MEAN, v, std::nullopt).to_vector();
  EXPECT_EQ(a, b);
  // Replica order: ((v0 + v1) + v2) + …, then / n.
  for (int i = 0; i < 1000; i += 97) {
    float acc = v[0].to_vector()[i];
    for (int r = 1; r < n(); ++r) acc += v[r].to_vector()[i];
    EXPECT_EQ(a[i], acc / float(n())) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Replicas, ReduceTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "replicas"; });

}  // namespace
}  // namespace mirrored

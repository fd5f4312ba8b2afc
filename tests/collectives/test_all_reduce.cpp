// ReplicaContext::all_reduce and all_gather through both CPU cross-device ops, for 1–4 replicas.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "collectives/replicas_and_ops.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;

using testing::Ops;

class CollectiveTest : public testing::ReplicasAndOps {
 protected:
  int id_sum() const { return n() * (n() - 1) / 2; }
  static int id() { return get_replica_context()->replica_id_in_sync_group(); }
};

TEST_P(CollectiveTest, AllReduceOfNumbers) {
  auto s = make();
  auto out = s->run([] {
    ReplicaContext* ctx = get_replica_context();
    return std::make_tuple(ctx->all_reduce(ReduceOp::SUM, id()), ctx->all_reduce("sum", int64_t(id()) << 40),
                           ctx->all_reduce(ReduceOp::MEAN, float(2 * id())), ctx->all_reduce("MEAN", double(id())));
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::get<0>(out[r]), id_sum());
    EXPECT_EQ(std::get<1>(out[r]), int64_t(id_sum()) << 40);
    EXPECT_EQ(std::get<2>(out[r]), float(n() - 1));
    EXPECT_EQ(std::get<3>(out[r]), double(id_sum()) / n());
  }
}

TEST_P(CollectiveTest, AllReduceOfTensorsGivesEachReplicaItsOwnCopy) {
  auto s = make();
  auto out = s->run([] {
    Tensor<float> x = Tensor<float>::from_vector({float(id()), 1, 2, 3, 4, float(-id())}, {2, 3});
    Tensor<float> sum = get_replica_context()->all_reduce(ReduceOp::SUM, x);
    return std::make_pair(sum, std::vector<float>(x.to_vector()));
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].first.shape(), (Shape{2, 3}));
    EXPECT_EQ(out[r].first.to_vector(),
              (std::vector<float>{float(id_sum()), 1.0f * n(), 2.0f * n(), 3.0f * n(), 4.0f * n(), -float(id_sum())}));
    EXPECT_EQ(out[r].second[0], float(r));  // the input is untouched
  }
  for (int r = 1; r < n(); ++r) EXPECT_NE(out[r].first.data(), out[0].first.data());
}

TEST_P(CollectiveTest, LargeOddSizedBuffersAreExact) {
  auto s = make();
  constexpr int64_t kCount = (1 << 20) + 37;  // not a multiple of any slice size
  const int replicas = n(), ids = id_sum();
  auto out = s->run([&] {
    Tensor<float> x = Tensor<float>::empty({kCount});
    for (int64_t i = 0; i < kCount; ++i) x.data()[i] = float((i % 1000) + id());
    Tensor<float> y = get_replica_context()->all_reduce(ReduceOp::SUM, x);
    int64_t wrong = 0;
    for (int64_t i = 0; i < kCount; ++i) wrong += y.data()[i] != float(replicas * (i % 1000) + ids);
    return wrong;
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], 0) << "replica " << r;
}

// Packs of 8 MiB and more are written to the outputs with streaming stores: a pack of an odd-sized
// float tensor and an int32 one (two packs), and a float pack of two tensors whose boundary falls
// inside a replica's slice, with SUM and MEAN.
TEST_P(CollectiveTest, StreamedLargePacksAreExact) {
  if (std::get<1>(GetParam()) != Ops::InProcess) GTEST_SKIP() << "streaming stores are InProcessAllReduce's";
  auto s = make();
  constexpr int64_t kBig = (int64_t{9} << 20) / 4 + 13;  // just over 9 MiB of floats
  const int replicas = n(), ids = id_sum();
  auto out = s->run([&] {
    Tensor<float> a = Tensor<float>::empty({kBig});
    Tensor<float> b = Tensor<float>::empty({kBig / 3});
    Tensor<int32_t> c = Tensor<int32_t>::empty({kBig});
    for (int64_t i = 0; i < kBig; ++i) {
      a.data()[i] = float((i % 1000) * replicas + id());
      c.data()[i] = int32_t(i % 7919) - id();
    }
    for (int64_t i = 0; i < kBig / 3; ++i) b.data()[i] = float(i % 501);
    ReplicaContext* ctx = get_replica_context();
    auto [sa, sb, sc] = ctx->all_reduce(ReduceOp::SUM, std::make_tuple(a, b, c));
    const Tensor<float> ma = ctx->all_reduce(ReduceOp::MEAN, a);
    int64_t wrong = 0;
    for (int64_t i = 0; i < kBig; ++i) {
      wrong += sa.data()[i] != float((i % 1000) * replicas * replicas + ids);
      wrong += ma.data()[i] != float((i % 1000) * replicas) + float(ids) / float(replicas);
      wrong += sc.data()[i] != int32_t(i % 7919) * replicas - ids;
    }
    for (int64_t i = 0; i < kBig / 3; ++i) wrong += sb.data()[i] != float(i % 501) * float(replicas);
    return wrong;
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], 0) << "replica " << r;
}

TEST_P(CollectiveTest, AllDtypesAndEmptyTensors) {
  auto s = make();
  auto out = s->run([] {
    ReplicaContext* ctx = get_replica_context();
    return std::make_tuple(ctx->all_reduce(ReduceOp::SUM, Tensor<double>{0.5, double(id())}),
                           ctx->all_reduce(ReduceOp::SUM, Tensor<int32_t>{id(), 7}),
                           ctx->all_reduce(ReduceOp::SUM, Tensor<int64_t>{id()}),
                           ctx->all_reduce(ReduceOp::SUM, Tensor<uint8_t>{uint8_t(id()), 1}),
                           ctx->all_reduce(ReduceOp::SUM, Tensor<float>::zeros({0, 4})));
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::get<0>(out[r]).to_vector(), (std::vector<double>{0.5 * n(), double(id_sum())}));
    EXPECT_EQ(std::get<1>(out[r]).to_vector(), (std::vector<int32_t>{id_sum(), 7 * n()}));
    EXPECT_EQ(std::get<2>(out[r]).to_vector(), (std::vector<int64_t>{id_sum()}));
    EXPECT_EQ(std::get<3>(out[r]).to_vector(), (std::vector<uint8_t>{uint8_t(id_sum()), uint8_t(n())}));
    EXPECT_EQ(std::get<4>(out[r]).shape(), (Shape{0, 4}));
  }
}

TEST_P(CollectiveTest, AllReduceOfNests) {
  auto s = make();
  using Nest = std::map<std::string, std::tuple<Tensor<float>, std::vector<double>>>;
  auto out = s->run([] {
    Nest grads{{"dense", {Tensor<float>{float(id()), 1}, {1.0, double(id())}}}, {"bias", {Tensor<float>{2}, {}}}};
    return get_replica_context()->all_reduce(ReduceOp::SUM, grads);
  });
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(std::get<0>(out[r].at("dense")).to_vector(), (std::vector<float>{float(id_sum()), float(n())}));
    EXPECT_EQ(std::get<1>(out[r].at("dense")), (std::vector<double>{double(n()), double(id_sum())}));
    EXPECT_EQ(std::get<0>(out[r].at("bias")).to_vector(), (std::vector<float>{2.0f * n()}));
    EXPECT_TRUE(std::get<1>(out[r].at("bias")).empty());
  }
}

TEST_P(CollectiveTest, ManyCollectivesInSequence) {
  auto s = make();
  auto out = s->run([] {
    float acc = 1.0f;
    for (int i = 0; i < 200; ++i) acc = get_replica_context()->all_reduce(ReduceOp::MEAN, acc + float(id() % 2));
    return acc;
  });
  // Each step adds the mean of (id % 2) over the replicas.
  float expected = 1.0f;
  for (int i = 0; i < 200; ++i) {
    float sum = 0;
    for (int r = 0; r < n(); ++r) sum += expected + float(r % 2);
    expected = sum / float(n());
  }
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], expected);
}

TEST_P(CollectiveTest, SumIsInReplicaOrderAndBitwiseReproducible) {
  auto s = make();
  auto inputs = s->experimental_distribute_values_from_function([](const ValueContext& c) {
    std::vector<float> x(4099);
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = 0.1f * float(i + 1) / float(c.replica_id_in_sync_group + 3);
    return Tensor<float>::from_vector(x, {4099});
  });
  auto step = [](const Tensor<float>& x) { return get_replica_context()->all_reduce(ReduceOp::SUM, x).to_vector(); };
  auto a = s->run(step, inputs);
  auto b = s->run(step, inputs);
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(a[r], a[0]);
    EXPECT_EQ(b[r], a[0]);
  }
  for (std::size_t i = 0; i < a[0].size(); ++i) {
    float acc = inputs[0].data()[i];
    for (int r = 1; r < n(); ++r) acc += inputs[r].data()[i];
    ASSERT_EQ(std::memcmp(&acc, &a[0][i], sizeof(float)), 0) << "element " << i;
  }
}

TEST_P(CollectiveTest, IntegerMeanIsRejected) {
  auto s = make();
  EXPECT_THAT(message_of<InvalidArgumentError>(
                  [&] { s->run([] { return get_replica_context()->all_reduce(ReduceOp::MEAN, 3); }); }),
              HasSubstr("MEAN of integer values"));
}

TEST_P(CollectiveTest, MismatchedShapesNameBothSides) {
  if (n() == 1) GTEST_SKIP() << "needs two replicas to differ";
  auto s = make();
  std::string msg = message_of<InvalidArgumentError>([&] {
    s->run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::zeros({id() == 1 ? 3 : 2})); });
  });
  EXPECT_THAT(msg, HasSubstr("replica 0 passed shape (2,) but replica 1 passed shape (3,)"));
  std::string dtype_msg = message_of<InvalidArgumentError>([&] {
    s->run([] {
      if (id() == 1)
        get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<double>{1});
      else
        get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>{1});
    });
  });
  EXPECT_THAT(dtype_msg, HasSubstr("replica 0 passed dtype float32 but replica 1 passed dtype float64"));
  // Still usable.
  auto ok = s->run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, 1); });
  EXPECT_EQ(ok[0], n());
}

TEST_P(CollectiveTest, AllGatherConcatenatesInReplicaOrder) {
  auto s = make();
  auto out = s->run([] {
    // Replica r contributes r+1 rows of [r, r].
    Tensor<int32_t> rows = Tensor<int32_t>::full({id() + 1, 2}, id());
    return std::make_pair(get_replica_context()->all_gather(rows, 0), get_replica_context()->all_gather(rows, -2));
  });
  std::vector<int32_t> expected;
  for (int r = 0; r < n(); ++r)
    for (int i = 0; i <= r; ++i) expected.insert(expected.end(), {r, r});
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].first.shape(), (Shape{int64_t(expected.size() / 2), 2}));
    EXPECT_EQ(out[r].first.to_vector(), expected);
    EXPECT_EQ(out[r].second.to_vector(), expected);
  }
}

TEST_P(CollectiveTest, AllGatherAlongInnerAxis) {
  auto s = make();
  auto out = s->run([] {
    return get_replica_context()->all_gather(
        Tensor<float>::from_vector({0, 1, 2, 3, 4, 5}, {1, 2, 3}) + float(10 * id()), 1);
  });
  // Shape (1, 2n, 3): replica r's two rows follow replica r-1's.
  std::vector<float> layout;
  for (int r = 0; r < n(); ++r)
    for (float k : {0.f, 1.f, 2.f, 3.f, 4.f, 5.f}) layout.push_back(10.0f * r + k);
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].shape(), (Shape{1, 2 * n(), 3}));
    EXPECT_EQ(out[r].to_vector(), layout);
  }
}

TEST_P(CollectiveTest, AllGatherErrors) {
  auto s = make();
  auto gather = [&](auto make_value, int axis) {
    return message_of<InvalidArgumentError>(
        [&] { s->run([&] { get_replica_context()->all_gather(make_value(), axis); }); });
  };
  EXPECT_THAT(gather([] { return Tensor<float>::scalar(1); }, 0), HasSubstr("rank-0"));
  EXPECT_EQ(gather([] { return Tensor<float>{1}; }, 1), "`axis` = 1 out of range for `value` with rank 1");
  if (n() > 1) {
    EXPECT_THAT(gather(
                    [] {
                      return Tensor<float>::zeros({2, id() == 1 ? 3 : 2});
                    },
                    0),
                HasSubstr("replica 0 passed shape (2, 2) and replica 1 passed shape (2, 3)"));
    EXPECT_THAT(gather(
                    [] {
                      return id() == 1 ? Tensor<float>::zeros({2}) : Tensor<float>::zeros({2, 1});
                    },
                    0),
                HasSubstr("ranks differ"));
  }
}

INSTANTIATE_TEST_SUITE_P(Replicas, CollectiveTest,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4),
                                            ::testing::Values(Ops::InProcess, Ops::ToOneDevice)),
                         testing::replicas_and_ops_name);

}  // namespace
}  // namespace mirrored

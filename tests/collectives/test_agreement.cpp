// Every replica-context collective checks, once all replicas have joined and before any data
// moves, that they all asked for the same thing: reduce op, axis, dtypes, shapes, nest structure,
// pack size, merge_call types. Every replica reaches the same verdict, so all fail together, with
// InvalidArgumentError naming both replicas and both values, and the strategy stays usable.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "collectives/replicas_and_ops.hpp"
#include "harness.hpp"

namespace mirrored {
namespace {

using testing::cpus;
using ::testing::HasSubstr;
using testing::message_of;
using testing::Seen;

using testing::Ops;

class AgreementTest : public testing::ReplicasAndOps {
 protected:
  int last() const { return n() - 1; }  // the replica that disagrees

  // Runs `fn` (which makes replica last() disagree) and returns run's InvalidArgumentError
  // message, after checking that every replica saw that same error (none was left to time out or
  // was merely aborted) and that the next run of the same strategy gives exact results.
  template <class Fn>
  std::string mismatch(MirroredStrategy& s, Fn fn) {
    std::vector<std::optional<Seen>> seen(n());
    std::string msg =
        message_of<InvalidArgumentError>([&] { s.run([&] { testing::recording(seen[id()], [&] { fn(); }); }); });
    for (int r = 0; r < n(); ++r) {
      EXPECT_TRUE(seen[r].has_value()) << "replica " << r << " did not fail";
      if (seen[r]) {
        EXPECT_EQ(seen[r]->type, "InvalidArgumentError") << "replica " << r;
        EXPECT_EQ(seen[r]->what, msg) << "replica " << r;
      }
    }
    auto ok = s.run([] { return get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>{1, float(id())}); });
    for (int r = 0; r < n(); ++r)
      EXPECT_EQ(ok[r].to_vector(), (std::vector<float>{float(n()), float(n() * (n() - 1) / 2)})) << "replica " << r;
    return msg;
  }
  std::string odd() const { return std::to_string(last()); }
};

TEST_P(AgreementTest, AllReduceOpsMustAgree) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       get_replica_context()->all_reduce(id() == odd_one ? ReduceOp::MEAN : ReduceOp::SUM,
                                                         Tensor<float>::full({40}, 2.0f));
                     }),
            "all_reduce: replica 0 passed reduce op SUM but replica " + odd() + " passed MEAN");
}

TEST_P(AgreementTest, AllReduceDtypesMustAgree) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       if (id() == odd_one)
                         get_replica_context()->all_reduce(ReduceOp::SUM, std::make_tuple(1.0f, Tensor<double>{1}));
                       else
                         get_replica_context()->all_reduce(ReduceOp::SUM, std::make_tuple(1.0f, Tensor<float>{1}));
                     }),
            "all_reduce: replica 0 passed dtype float32 but replica " + odd() +
                " passed dtype float64 (tensor 1 of the nest)");
}

TEST_P(AgreementTest, AllReducePackSizesMustAgree) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       CommunicationOptions o;
                       o.bytes_per_pack = id() == odd_one ? 64 : 0;
                       get_replica_context()->all_reduce(ReduceOp::SUM, std::vector<float>{1, 2, 3}, o);
                     }),
            "all_reduce: replica 0 passed CommunicationOptions::bytes_per_pack 0 but replica " + odd() + " passed 64");
}

// Regression: map keys were joined with ",", so these two maps had the same structure
// and were summed key by key as if {"a,b", "c"} were {"a", "b,c"}.
TEST_P(AgreementTest, MapKeysAreComparedExactly) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(
      mismatch(
          *s,
          [&] {
            if (id() == odd_one)
              get_replica_context()->all_reduce(ReduceOp::SUM, std::map<std::string, float>{{"a", 10}, {"b,c", 20}});
            else
              get_replica_context()->all_reduce(ReduceOp::SUM, std::map<std::string, float>{{"a,b", 1}, {"c", 2}});
          }),
      "all_reduce: replica 0 passed keys {\"a,b\", \"c\"} but replica " + odd() +
          " passed keys {\"a\", \"b,c\"} (nests must have the same structure on every replica)");
}

TEST_P(AgreementTest, StructureMismatchSaysWhereInTheNest) {
  auto s = make();
  const int odd_one = last();
  using Nest = std::tuple<float, std::map<std::string, std::vector<float>>>;
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       const std::size_t len = id() == odd_one ? 3 : 2;
                       get_replica_context()->all_reduce(
                           ReduceOp::SUM, Nest{1.0f, {{"bias", {1}}, {"w\"x", std::vector<float>(len, 1.0f)}}});
                     }),
            "all_reduce: replica 0 passed a vector of 2 elements but replica " + odd() +
                " passed a vector of 3 elements at [1][\"w\\\"x\"] (nests must have the same structure on every "
                "replica)");
  // Same leaves, different containers.
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       if (id() == odd_one)
                         get_replica_context()->all_reduce(ReduceOp::SUM, std::make_tuple(1.0f, 2.0f));
                       else
                         get_replica_context()->all_reduce(ReduceOp::SUM, std::vector<float>{1.0f, 2.0f});
                     }),
            "all_reduce: replica 0 passed a vector of 2 elements but replica " + odd() +
                " passed a tuple of 2 elements (nests must have the same structure on every replica)");
}

TEST_P(AgreementTest, EqualMapsWithCommasInKeysReduce) {
  auto s = make();
  auto out = s->run([] {
    return get_replica_context()->all_reduce(ReduceOp::SUM,
                                             std::map<std::string, float>{{"a,b", float(id())}, {"", 1}, {"3:x", 2}});
  });
  const float ids = float(n() * (n() - 1) / 2);
  for (int r = 0; r < n(); ++r)
    EXPECT_EQ(out[r], (std::map<std::string, float>{{"a,b", ids}, {"", float(n())}, {"3:x", 2.0f * n()}}));
}

// Regression: all_gather compared ranks and shapes only. With float on some replicas
// and double on another, each output was sized for its own dtype and the other replica's bytes
// were copied into it: a heap overflow (ASan: write past an 8000-byte block).
TEST_P(AgreementTest, AllGatherDtypesMustAgree) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(mismatch(*s,
                     [&] {
                       if (id() == odd_one)
                         get_replica_context()->all_gather(Tensor<double>::full({1000}, 1.0), 0);
                       else
                         get_replica_context()->all_gather(Tensor<float>::full({1000}, 1.0f), 0);
                     }),
            "all_gather: replica 0 passed dtype float32 but replica " + odd() + " passed dtype float64");
}

// Regression: the axis was not posted, so all_gather(x, axis = replica id) gave
// replicas differently shaped results.
TEST_P(AgreementTest, AllGatherAxesMustAgree) {
  auto s = make();
  const int odd_one = last();
  EXPECT_EQ(
      mismatch(*s,
               [&] {
                 get_replica_context()->all_gather(Tensor<float>::full({2, 2}, float(id())), id() == odd_one ? 1 : 0);
               }),
      "all_gather: replica 0 passed axis 0 but replica " + odd() + " passed axis 1 (for values of rank 2)");
}

TEST_P(AgreementTest, NegativeAndPositiveNamesOfAnAxisAgree) {
  auto s = make();
  const int odd_one = last();
  auto out = s->run([&] {
    return get_replica_context()->all_gather(Tensor<int32_t>::full({1, 2}, id()), id() == odd_one ? -1 : 1);
  });
  std::vector<int32_t> want;
  for (int r = 0; r < n(); ++r) want.insert(want.end(), {r, r});
  for (int r = 0; r < n(); ++r) {
    EXPECT_EQ(out[r].shape(), (Shape{1, 2 * n()}));
    EXPECT_EQ(out[r].to_vector(), want);
  }
}

TEST_P(AgreementTest, MergeCallTypesMustAgree) {
  auto s = make();
  const int odd_one = last();
  const std::string msg = mismatch(*s, [&] {
    if (id() == odd_one)
      get_replica_context()->merge_call([](Strategy&, const PerReplica<int>& v) { return v[0]; }, 7);
    else
      get_replica_context()->merge_call([](Strategy&, const PerReplica<float>& v) { return int(v[0]); }, 7.0f);
  });
  EXPECT_EQ(msg, "merge_call: replica 0 passed (result, arguments...) of types <int, float> but replica " + odd() +
                     " passed <int, int>; every replica must pass arguments of the same types and a merge_fn with the "
                     "same result type");
  // Different merge_fns with the same types are fine: replica 0's runs (as in TF).
  auto out = s->run([] {
    if (id() == 0)
      return get_replica_context()->merge_call([](Strategy&, const PerReplica<int>& v) { return v[1]; }, 5 + id());
    return get_replica_context()->merge_call([](Strategy&, const PerReplica<int>&) { return -1; }, 5 + id());
  });
  for (int r = 0; r < n(); ++r) EXPECT_EQ(out[r], 6);
}

TEST_P(AgreementTest, MergeCallResultTypesMustAgree) {
  auto s = make();
  const int odd_one = last();
  const std::string msg = mismatch(*s, [&] {
    if (id() == odd_one)
      get_replica_context()->merge_call([](Strategy&) { return std::string("x"); });
    else
      get_replica_context()->merge_call([](Strategy&) { return 1.0; });
  });
  EXPECT_THAT(msg, HasSubstr("merge_call: replica 0 passed (result, arguments...) of types <double> but replica " +
                             odd() + " passed <std::"));
}

INSTANTIATE_TEST_SUITE_P(Replicas, AgreementTest,
                         ::testing::Combine(::testing::Values(2, 3, 4),
                                            ::testing::Values(Ops::InProcess, Ops::ToOneDevice)),
                         testing::replicas_and_ops_name);

}  // namespace
}  // namespace mirrored

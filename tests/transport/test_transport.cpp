// The WorkerTransport contract (cluster/transport/transport.hpp), checked the same way against
// both implementations: Gloo over TCP on 127.0.0.1 and shared memory. Workers are threads of this
// process (both transports meet through a file store), except where a peer's process must die.
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "child_process.hpp"
#include "cluster/store/store.hpp"
#include "cluster/transport/transport.hpp"
#include "data_test_util.hpp"
#include "mirrored/dtype.hpp"
#include "mirrored/half.hpp"
#include "transport/transport_world.hpp"

namespace mirrored {
namespace {

using detail::cluster::TransportError;
using detail::cluster::WorkerTransport;
using testing::TransportKind;
using testing::TransportWorld;
using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// Generous for an operation that should succeed: a slow, shared CI machine stays inside it, and a
// broken transport still fails the test instead of hanging it.
Clock::time_point generous() { return Clock::now() + seconds(60); }

// Worker `rank`'s element `i`: small integers, so that every sum is exact in every dtype (the
// largest sum of three workers is 21, within uint8 and bfloat16's exact integers).
double contribution(int rank, int64_t i) { return static_cast<double>(i % 5 + rank + 1); }

template <class T>
std::vector<T> contributions(int rank, int64_t count) {
  std::vector<T> v;
  for (int64_t i = 0; i < count; ++i) v.push_back(T(static_cast<float>(contribution(rank, i))));
  return v;
}

// Elements as doubles, whatever their storage type, for exact comparisons.
template <class T>
std::vector<double> as_doubles(const std::vector<T>& v) {
  std::vector<double> out;
  for (const T& x : v) out.push_back(static_cast<double>(static_cast<float>(x)));
  return out;
}
template <>
std::vector<double> as_doubles(const std::vector<double>& v) {
  return v;
}

std::vector<double> expected_sums(int workers, int64_t count) {
  std::vector<double> out;
  for (int64_t i = 0; i < count; ++i) {
    double s = 0;
    for (int w = 0; w < workers; ++w) s += contribution(w, i);
    out.push_back(s);
  }
  return out;
}

class TransportContract : public ::testing::TestWithParam<TransportKind> {
 protected:
  // A job of `workers` threads on the transport under test.
  std::unique_ptr<TransportWorld> world(int workers) {
    auto w = std::make_unique<TransportWorld>(GetParam(), dir_.path(""), workers);
    for (int r = 0; r < workers; ++r) {
      if ((*w)[r] == nullptr)
        ADD_FAILURE() << "worker " << r << " has no " << testing::transport_kind_name(GetParam()) << " transport";
    }
    return w;
  }

  testing::TempDir dir_;
};

template <class T>
void expect_sum_of(TransportWorld& world, int64_t count, bool in_place) {
  const DType dtype = dtype_of<T>();
  std::vector<std::vector<double>> got(static_cast<std::size_t>(world.size()));
  testing::on_every_worker(world.size(), [&](int rank) {
    auto in = contributions<T>(rank, count);
    std::vector<T> out(static_cast<std::size_t>(count), T(0.0f));
    world[rank]->all_reduce_sum(dtype, in.data(), in_place ? in.data() : out.data(), count, generous());
    got[static_cast<std::size_t>(rank)] = as_doubles(in_place ? in : out);
  });
  for (int rank = 0; rank < world.size(); ++rank)
    EXPECT_EQ(got[static_cast<std::size_t>(rank)], expected_sums(world.size(), count))
        << dtype_name(dtype) << " on worker " << rank;
}

TEST_P(TransportContract, SumsEveryDtypeExactlyOnEveryWorker) {
  auto w = world(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  expect_sum_of<float>(*w, 1000, false);
  expect_sum_of<double>(*w, 1000, false);
  expect_sum_of<int32_t>(*w, 1000, false);
  expect_sum_of<int64_t>(*w, 1000, false);
  expect_sum_of<uint8_t>(*w, 1000, false);
  expect_sum_of<float16>(*w, 1000, false);
  expect_sum_of<bfloat16>(*w, 1000, false);
}

TEST_P(TransportContract, SumsInPlaceWhenInputAndOutputAreOneBuffer) {
  auto w = world(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  expect_sum_of<float>(*w, 1001, true);
  expect_sum_of<int64_t>(*w, 7, true);
  expect_sum_of<float16>(*w, 33, true);
}

TEST_P(TransportContract, SumsMoreElementsThanOneSharedMemorySlotHolds) {
  // 2.5 M floats are 10 MB: more than one 8 MiB slot of the shared-memory transport, and many
  // blocks of Gloo's ring.
  auto w = world(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  expect_sum_of<float>(*w, 2'500'000, false);
}

TEST_P(TransportContract, SumOfNoElementsLeavesTheOutputAlone) {
  auto w = world(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<int> untouched(2, 0);
  testing::on_every_worker(2, [&](int rank) {
    float in = 1.0f, out = -7.0f;
    (*w)[rank]->all_reduce_sum(DType::float32, &in, &out, 0, generous());
    untouched[static_cast<std::size_t>(rank)] = out == -7.0f ? 1 : 0;
  });
  EXPECT_EQ(untouched, (std::vector<int>{1, 1}));
}

// The half-precision sum: each worker's contribution is rounded to the half type before it
// crosses, and the halves of an element are added in float and rounded once.
struct HalfCase {
  DType half;
  float big;       // element 0: worker 0's contribution
  float small;     // element 0: every other worker's; one hop's rounding would drop it
  float near_one;  // element 1: every worker's; rounds down to 1 as a half
  float sum0;      // big + 2 * small, representable in the half type
};

void expect_half_sums(TransportWorld& world, DType dtype, const HalfCase& c) {
  std::vector<std::vector<double>> got(3);
  testing::on_every_worker(3, [&](int rank) {
    const std::vector<double> values{rank == 0 ? c.big : c.small, c.near_one, static_cast<double>(rank) - 1.0};
    std::vector<unsigned char> in(values.size() * dtype_size(dtype)), out(in.size());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::float32) {
        const float f = static_cast<float>(values[i]);
        std::memcpy(in.data() + i * 4, &f, 4);
      } else {
        std::memcpy(in.data() + i * 8, &values[i], 8);
      }
    }
    world[rank]->all_reduce_half(dtype, c.half, in.data(), out.data(), static_cast<int64_t>(values.size()), generous());
    for (std::size_t i = 0; i < values.size(); ++i) {
      if (dtype == DType::float32) {
        float f;
        std::memcpy(&f, out.data() + i * 4, 4);
        got[static_cast<std::size_t>(rank)].push_back(f);
      } else {
        double d;
        std::memcpy(&d, out.data() + i * 8, 8);
        got[static_cast<std::size_t>(rank)].push_back(d);
      }
    }
  });
  // Element 1 unrounded would be 3 + 3 * (near_one - 1), which rounds up to the next half above 3.
  // Element 2 (-1 + 0 + 1) shows that signs survive.
  const std::vector<double> expected{c.sum0, 3.0, 0.0};
  for (int rank = 0; rank < 3; ++rank)
    EXPECT_EQ(got[static_cast<std::size_t>(rank)], expected)
        << dtype_name(dtype) << " through " << dtype_name(c.half) << " on worker " << rank;
}

TEST_P(TransportContract, HalfSumRoundsEachContributionAndTheSumOnce) {
  auto w = world(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // float16 has an ulp of 1 at 1024 and of 2^-10 at 1: 1024 + 0.5 rounds to 1024 (ties to
  // even) at each hop, but 1024 + 0.5 + 0.5 summed in float is 1025.
  const HalfCase f16{DType::float16, 1024.0f, 0.5f, 1.0f + 0x1p-11f - 0x1p-20f, 1025.0f};
  // bfloat16 has an ulp of 2 at 256 and of 2^-7 at 1.
  const HalfCase bf16{DType::bfloat16, 256.0f, 1.0f, 1.0f + 0x1p-8f - 0x1p-16f, 258.0f};
  for (const auto& c : {f16, bf16}) {
    expect_half_sums(*w, DType::float32, c);
    expect_half_sums(*w, DType::float64, c);
  }
}

TEST_P(TransportContract, AllGatherConcatenatesUnevenPartsInRankOrder) {
  auto w = world(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::vector<std::size_t> sizes{3, 0, 5};
  std::vector<std::string> got(3);
  testing::on_every_worker(3, [&](int rank) {
    const std::string mine(sizes[static_cast<std::size_t>(rank)], static_cast<char>('a' + rank));
    std::string out(8, '?');
    (*w)[rank]->all_gather(mine.data(), out.data(), sizes, generous());
    got[static_cast<std::size_t>(rank)] = out;
  });
  EXPECT_EQ(got, (std::vector<std::string>(3, "aaaccccc")));
}

TEST_P(TransportContract, BroadcastGivesEveryWorkerTheChiefsBytes) {
  // 9 MiB: more than one shared-memory slot.
  auto w = world(3);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const std::size_t bytes = std::size_t{9} << 20;
  std::string chiefs(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) chiefs[i] = static_cast<char>(i * 7 + i / 4096);
  std::vector<int> same(3, 0);
  testing::on_every_worker(3, [&](int rank) {
    std::string buf = rank == 0 ? chiefs : std::string(bytes, static_cast<char>(rank));
    (*w)[rank]->broadcast(buf.data(), bytes, generous());
    same[static_cast<std::size_t>(rank)] = buf == chiefs ? 1 : 0;
  });
  EXPECT_EQ(same, (std::vector<int>{1, 1, 1}));
}

TEST_P(TransportContract, KeepsOperationsApartOverManyRounds) {
  // Operations of every kind back to back: none may take another's bytes.
  auto w = world(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  std::vector<std::vector<int64_t>> got(2);
  testing::on_every_worker(2, [&](int rank) {
    for (int64_t round = 0; round < 20; ++round) {
      int64_t sum_in = (rank + 1) * round, sum = 0;
      (*w)[rank]->all_reduce_sum(DType::int64, &sum_in, &sum, 1, generous());
      int64_t value = rank == 0 ? round * 100 : -1;
      (*w)[rank]->broadcast(&value, sizeof(value), generous());
      int64_t mine = rank * 1000 + round, both[2] = {0, 0};
      (*w)[rank]->all_gather(&mine, both, {sizeof(int64_t), sizeof(int64_t)}, generous());
      got[static_cast<std::size_t>(rank)].insert(got[static_cast<std::size_t>(rank)].end(),
                                                 {sum, value, both[0], both[1]});
    }
  });
  std::vector<int64_t> expected;
  for (int64_t round = 0; round < 20; ++round)
    expected.insert(expected.end(), {3 * round, round * 100, round, 1000 + round});
  EXPECT_EQ(got[0], expected);
  EXPECT_EQ(got[1], expected);
}

TEST_P(TransportContract, APeerThatNeverCallsTimesTheOthersOutAtTheirDeadline) {
  auto w = world(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  const auto start = Clock::now();
  float in = 1.0f, out = 0.0f;
  try {
    (*w)[0]->all_reduce_sum(DType::float32, &in, &out, 1, start + milliseconds(500));
    ADD_FAILURE() << "the all-reduce returned without its peer";
  } catch (const TransportError& e) {
    EXPECT_TRUE(e.timed_out) << e.message;
  }
  // Not before the deadline, up to Gloo's granularity: its timeouts are whole milliseconds, the
  // time left cut down to one.
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, milliseconds(499));
  EXPECT_LT(waited, seconds(10));
}

TEST_P(TransportContract, InterruptFailsTheOperationInFlightAndEveryLaterOne) {
  auto w = world(2);
  ASSERT_FALSE(::testing::Test::HasFailure());
  WorkerTransport& chief = *(*w)[0];
  const auto start = Clock::now();
  std::thread interrupter([&] {
    std::this_thread::sleep_for(milliseconds(300));
    chief.interrupt();
  });
  float in = 1.0f, out = 0.0f;
  try {
    chief.all_reduce_sum(DType::float32, &in, &out, 1, start + seconds(60));
    ADD_FAILURE() << "the all-reduce returned without its peer";
  } catch (const TransportError& e) {
    EXPECT_FALSE(e.timed_out) << e.message;
  }
  interrupter.join();
  EXPECT_LT(Clock::now() - start, seconds(10));

  const auto later = Clock::now();
  try {
    chief.broadcast(&in, sizeof(in), later + seconds(60));
    ADD_FAILURE() << "a broadcast after the interrupt returned";
  } catch (const TransportError& e) {
    EXPECT_FALSE(e.timed_out) << e.message;
  }
  EXPECT_LT(Clock::now() - later, seconds(1));
  chief.interrupt();  // again: harmless
}

TEST_P(TransportContract, APeerWhoseProcessExitsFailsTheOthersPromptly) {
  // The peer is a child process: the shared-memory transport notices a peer's death by its pid.
  const std::string prefix = testing::fresh_prefix();
  const long parent = ::getpid();
  auto store = detail::cluster::make_file_store(dir_.path(""));
  // The child learns its pid itself; the parent learns it from the fork.
  auto infos = [&](long child_pid) {
    return std::vector<detail::cluster::WorkerInfo>{testing::same_host_info(parent),
                                                    testing::same_host_info(child_pid)};
  };
  testing::ChildProcess child([&](const testing::ChildProcess::Ready&) {
    // Joins as worker 1, waits until the chief has its transport too, and exits without a word.
    auto t = testing::make_transport(GetParam(), *store, prefix, 1, infos(::getpid()), Clock::now() + seconds(30));
    return t && store->get(prefix + "go", 30) ? 0 : 1;
  });
  // Reaped as soon as it exits: a zombie's pid still exists.
  int status = -1;
  std::thread reaper([&] { status = child.wait(); });
  std::unique_ptr<WorkerTransport> t;
  try {
    t = testing::make_transport(GetParam(), *store, prefix, 0, infos(child.pid()), Clock::now() + seconds(30));
  } catch (...) {
    child.kill();
    reaper.join();
    throw;
  }
  store->set(prefix + "go", "1");
  if (!t) {
    child.kill();
    reaper.join();
    FAIL() << "the chief has no transport";
  }
  const auto start = Clock::now();
  float in = 1.0f, out = 0.0f;
  try {
    t->all_reduce_sum(DType::float32, &in, &out, 1, start + seconds(60));
    ADD_FAILURE() << "the all-reduce returned without its peer";
  } catch (const TransportError& e) {
    EXPECT_FALSE(e.timed_out) << e.message;
  }
  EXPECT_LT(Clock::now() - start, seconds(10));
  reaper.join();
  EXPECT_TRUE(testing::ChildProcess::exited_with(status, 0)) << "the child's status: " << status;
}

INSTANTIATE_TEST_SUITE_P(BothTransports, TransportContract, ::testing::Values(TransportKind::gloo, TransportKind::shm),
                         [](const ::testing::TestParamInfo<TransportKind>& info) {
                           return testing::transport_kind_name(info.param);
                         });

}  // namespace
}  // namespace mirrored

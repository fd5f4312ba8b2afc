// Coordinator (cluster/coordinator/coordinator.hpp) with doubles of what it joins through: an
// in-memory store whose chosen calls fail or time out, and a transport that records interrupts.
// Workers are threads of this process; every wait below is bounded.
#include <atomic>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cluster/coordinator/coordinator.hpp"
#include "cluster/store/tcp_store.hpp"
#include "doubles/store_double.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {
namespace {

using detail::cluster::ClusterLayout;
using detail::cluster::Coordinator;
using detail::cluster::TransportError;
using detail::cluster::TransportJob;
using detail::cluster::WorkerTransport;
using ::testing::HasSubstr;
using testing::MemoryStore;
using testing::MemoryStoreState;
using testing::StoreFault;
using Clock = std::chrono::steady_clock;
using std::chrono::seconds;

// A transport that moves nothing (the tests' collective bodies stand for it) and counts interrupts.
class RecordingTransport : public WorkerTransport {
 public:
  std::string name() const override { return "recording"; }
  void all_reduce_sum(DType, const void*, void*, int64_t, Clock::time_point) override {}
  void all_reduce_half(DType, DType, const void*, void*, int64_t, Clock::time_point) override {}
  void all_gather(const void*, void*, const std::vector<std::size_t>&, Clock::time_point) override {}
  void broadcast(void*, std::size_t, Clock::time_point) override {}
  void interrupt() noexcept override { interrupts.fetch_add(1); }
  std::atomic<int> interrupts{0};
};

ClusterLayout layout(int rank) {
  ClusterLayout l;
  l.num_workers = 2;
  l.rank = rank;
  l.task_type = "worker";
  l.task_id = rank;
  l.addresses = {"127.0.0.1:1", "127.0.0.1:2"};
  l.names = {"worker 0 (a)", "worker 1 (b)"};
  return l;
}

// Until `done()` or 10 s: the monitor polls the store every 125 ms.
template <class F>
bool eventually(F done) {
  const auto until = Clock::now() + seconds(10);
  while (!done()) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// Both workers of a job on one memory store, joined concurrently (each waits for the other).
struct TwoWorkers {
  std::shared_ptr<MemoryStoreState> state = std::make_shared<MemoryStoreState>();
  std::unique_ptr<Coordinator> worker[2];
  RecordingTransport* transport[2] = {nullptr, nullptr};
  double timeout_s;

  // `timeout_s`: the start-up timeout, also how long a worker that did not fail waits at the end
  // for a failed one's goodbye (which never comes).
  explicit TwoWorkers(std::vector<StoreFault> chief_faults = {}, double timeout_s = 10.0) : timeout_s(timeout_s) {
    std::thread other([&] { worker[1] = join(1, {}); });
    worker[0] = join(0, std::move(chief_faults));
    other.join();
  }
  // Both leave together: each waits for the other's goodbye.
  ~TwoWorkers() {
    std::thread other([&] { worker[1].reset(); });
    worker[0].reset();
    other.join();
  }
  std::unique_ptr<Coordinator> join(int rank, std::vector<StoreFault> faults) {
    return std::make_unique<Coordinator>(layout(rank), timeout_s, 2, "CPU",
                                         std::make_unique<MemoryStore>(state, std::move(faults)), "gen-7",
                                         [this, rank](const TransportJob&, Clock::time_point) {
                                           auto t = std::make_unique<RecordingTransport>();
                                           transport[rank] = t.get();
                                           return std::unique_ptr<WorkerTransport>(std::move(t));
                                         });
  }
};

TEST(CoordinatorWithDoubles, JoiningGivesEveryWorkersInfoAndTheJobToTheTransportFactory) {
  auto state = std::make_shared<MemoryStoreState>();
  std::vector<std::string> seen(2);
  std::unique_ptr<Coordinator> c[2];
  auto join = [&](int rank) {
    c[rank] = std::make_unique<Coordinator>(
        layout(rank), 10.0, 3, rank == 0 ? "CPU" : "GPU", std::make_unique<MemoryStore>(state), "gen-7",
        [&seen, rank](const TransportJob& job, Clock::time_point) {
          seen[static_cast<std::size_t>(rank)] =
              std::to_string(job.rank) + "/" + std::to_string(job.num_workers()) + " " + job.names[1];
          return std::unique_ptr<WorkerTransport>(std::make_unique<RecordingTransport>());
        });
  };
  std::thread other(join, 1);
  join(0);
  other.join();
  EXPECT_EQ(seen, (std::vector<std::string>{"0/2 worker 1 (b)", "1/2 worker 1 (b)"}));
  EXPECT_THAT(c[0]->prefix(), ::testing::EndsWith("/gen-7/"));
  EXPECT_EQ(c[0]->prefix(), c[1]->prefix());
  ASSERT_EQ(c[0]->workers().size(), 2u);
  EXPECT_EQ(c[0]->workers()[1].local_replicas, 3);
  EXPECT_EQ(c[0]->workers()[1].device_kind, "GPU");
  EXPECT_EQ(c[1]->workers()[0].device_kind, "CPU");
  std::thread leave([&] { c[1].reset(); });
  c[0].reset();
  leave.join();
}

TEST(CoordinatorWithDoubles, AWorkerThatNeverJoinsIsNamedWhenTheStartUpTimeoutEnds) {
  auto state = std::make_shared<MemoryStoreState>();
  bool factory_called = false;
  const auto start = Clock::now();
  try {
    Coordinator c(layout(0), 0.3, 1, "CPU", std::make_unique<MemoryStore>(state), "g",
                  [&](const TransportJob&, Clock::time_point) {
                    factory_called = true;
                    return std::unique_ptr<WorkerTransport>(std::make_unique<RecordingTransport>());
                  });
    ADD_FAILURE() << "joined without worker 1";
  } catch (const DeadlineExceededError& e) {
    EXPECT_THAT(e.what(), HasSubstr("worker 1 (b) has not joined the job within 0.3 s"));
  }
  const auto waited = Clock::now() - start;
  EXPECT_GE(waited, std::chrono::milliseconds(300));
  EXPECT_LT(waited, seconds(5));
  EXPECT_FALSE(factory_called);
}

TEST(CoordinatorWithDoubles, AStoreThatFailsWhileTheWorkersMeetFailsTheJoinWithItsCause) {
  auto state = std::make_shared<MemoryStoreState>();
  const StoreFault fault{"wait", "join/", 1, std::make_exception_ptr(UnavailableError("store connection reset"))};
  const auto start = Clock::now();
  try {
    Coordinator c(layout(0), 30.0, 1, "CPU", std::make_unique<MemoryStore>(state, std::vector<StoreFault>{fault}), "g",
                  [](const TransportJob&, Clock::time_point) -> std::unique_ptr<WorkerTransport> {
                    throw std::logic_error("not reached");
                  });
    ADD_FAILURE() << "joined through a failed store";
  } catch (const UnavailableError& e) {
    EXPECT_THAT(e.what(), HasSubstr("worker 0 (a) went away while the workers were starting up: "
                                    "store connection reset"));
  }
  EXPECT_LT(Clock::now() - start, seconds(5));  // at once, not at the 30 s start-up timeout
}

TEST(CoordinatorWithDoubles, AStoreThatFailsToPublishTheJoinFailsWithTheStoresOwnError) {
  auto state = std::make_shared<MemoryStoreState>();
  const StoreFault fault{"set", "join/0", 1, std::make_exception_ptr(UnavailableError("disk full"))};
  try {
    Coordinator c(layout(0), 30.0, 1, "CPU", std::make_unique<MemoryStore>(state, std::vector<StoreFault>{fault}), "g",
                  [](const TransportJob&, Clock::time_point) -> std::unique_ptr<WorkerTransport> {
                    throw std::logic_error("not reached");
                  });
    ADD_FAILURE() << "joined without telling the others";
  } catch (const UnavailableError& e) {
    EXPECT_STREQ(e.what(), "disk full");
  }
}

TEST(CoordinatorWithDoubles, ATransportThatCannotConnectFailsTheJoinWithTheSameError) {
  auto state = std::make_shared<MemoryStoreState>();
  std::string errors[2];
  auto join = [&](int rank) {
    try {
      Coordinator c(layout(rank), 10.0, 1, "CPU", std::make_unique<MemoryStore>(state), "g",
                    [](const TransportJob&, Clock::time_point) -> std::unique_ptr<WorkerTransport> {
                      throw UnavailableError("no route to worker 1");
                    });
      errors[rank] = "joined";
    } catch (const UnavailableError& e) {
      errors[rank] = e.what();
    }
  };
  std::thread other(join, 1);
  join(0);
  other.join();
  EXPECT_EQ(errors[0], "no route to worker 1");
  EXPECT_EQ(errors[1], "no route to worker 1");
}

TEST(CoordinatorWithDoubles, TheBodyGetsTheCallsOwnDeadline) {
  TwoWorkers job;
  const auto deadline = Deadline::after(30);
  Clock::time_point got{};
  job.worker[0]->collective("step", deadline, [&](Clock::time_point d) { got = d; });
  EXPECT_EQ(got, deadline.time_point());
  EXPECT_EQ(job.worker[0]->collectives(), 1);
}

TEST(CoordinatorWithDoubles, AUsageErrorInTheBodyPropagatesAndLeavesTheJobRunning) {
  TwoWorkers job;
  try {
    job.worker[0]->collective("step", Deadline::after(30),
                              [](Clock::time_point) { throw InvalidArgumentError("shapes differ"); });
    ADD_FAILURE() << "the body's error vanished";
  } catch (const InvalidArgumentError& e) {
    EXPECT_STREQ(e.what(), "shapes differ");
  }
  EXPECT_FALSE(job.worker[0]->failure().has_value());
  EXPECT_EQ(job.transport[0]->interrupts.load(), 0);
  int ran = 0;
  job.worker[0]->collective("step", Deadline::after(30), [&](Clock::time_point) { ++ran; });
  EXPECT_EQ(ran, 1);
}

TEST(CoordinatorWithDoubles, AConnectionFailureFailsTheJobWithOneCauseOnEveryWorker) {
  TwoWorkers job;
  const auto start = Clock::now();
  std::string chiefs;
  try {
    job.worker[0]->collective("all_reduce", Deadline::after(30), [](Clock::time_point) {
      throw TransportError{false, "connection reset by peer"};
    });
    ADD_FAILURE() << "the transport's failure vanished";
  } catch (const UnavailableError& e) {
    chiefs = e.what();
  }
  EXPECT_LT(Clock::now() - start, seconds(5));  // the wait for another cause is about 1 s
  const std::string cause = "a connection between workers failed (seen by worker 0 (a)): connection reset by peer";
  EXPECT_EQ(chiefs, "MultiWorkerMirroredStrategy: all_reduce: " + cause);
  EXPECT_EQ(job.transport[0]->interrupts.load(), 1);

  // Published for the others: worker 1's monitor interrupts its transport, and its next
  // collective reports the same cause.
  const auto published = job.state->peek(detail::cluster::failure_key(job.worker[0]->prefix()));
  ASSERT_TRUE(published.has_value());
  EXPECT_EQ(detail::cluster::decode_failure(*published).message, cause);
  EXPECT_TRUE(eventually([&] { return job.transport[1]->interrupts.load() > 0; }));
  try {
    job.worker[1]->collective("all_reduce", Deadline::after(30), [](Clock::time_point) {});
    ADD_FAILURE() << "worker 1 ran a collective of a failed job";
  } catch (const UnavailableError& e) {
    EXPECT_EQ(std::string(e.what()), "MultiWorkerMirroredStrategy: all_reduce: " + cause);
  }
  // Reported once; every later collective is refused.
  EXPECT_THROW(job.worker[0]->collective("all_reduce", Deadline::after(30), [](Clock::time_point) {}),
               FailedPreconditionError);
}

TEST(CoordinatorWithDoubles, ATimedOutTransportFailsWithDeadlineExceededNamingTheTimeout) {
  TwoWorkers job;
  try {
    job.worker[0]->collective("gather", Deadline::after(0.25), [](Clock::time_point) {
      throw TransportError{true, "no answer"};
    });
    ADD_FAILURE() << "the timeout vanished";
  } catch (const DeadlineExceededError& e) {
    EXPECT_THAT(e.what(), HasSubstr("did not complete within the collective timeout of 0.25 s"));
    EXPECT_THAT(e.what(), HasSubstr("seen by worker 0 (a): no answer"));
  }
  // Published: worker 1 stops too (and so leaves without waiting for worker 0's goodbye).
  EXPECT_TRUE(eventually([&] { return job.transport[1]->interrupts.load() > 0; }));
}

TEST(CoordinatorWithDoubles, AStoreThatCannotPublishTheFailureStillReportsThisWorkersCause) {
  // Worker 1 never learns of the failure: it leaves after the 2 s wait for worker 0's goodbye.
  TwoWorkers job({StoreFault{"set_if_absent", "failure", 1, std::make_exception_ptr(UnavailableError("store down"))}},
                 2.0);
  try {
    job.worker[0]->collective("all_reduce", Deadline::after(30), [](Clock::time_point) {
      throw TransportError{false, "broken pipe"};
    });
    ADD_FAILURE() << "the transport's failure vanished";
  } catch (const UnavailableError& e) {
    EXPECT_STREQ(e.what(),
                 "MultiWorkerMirroredStrategy: all_reduce: a connection between workers failed (seen by "
                 "worker 0 (a)): broken pipe");
  }
  EXPECT_FALSE(job.state->peek(detail::cluster::failure_key(job.worker[0]->prefix())).has_value());
}

TEST(CoordinatorWithDoubles, AFailurePublishedByAnotherWorkerInterruptsThisOneAndIsReportedAsIs) {
  TwoWorkers job;
  job.state->put(
      detail::cluster::failure_key(job.worker[0]->prefix()),
      detail::cluster::encode_failure({static_cast<int>(ErrorCode::DEADLINE_EXCEEDED), "worker 1 timed out"}));
  EXPECT_TRUE(eventually([&] { return job.transport[0]->interrupts.load() > 0; }));
  try {
    job.worker[0]->collective("step", Deadline::after(30),
                              [](Clock::time_point) { ADD_FAILURE() << "the body of a failed job ran"; });
    ADD_FAILURE() << "a collective of a failed job ran";
  } catch (const DeadlineExceededError& e) {
    EXPECT_STREQ(e.what(), "MultiWorkerMirroredStrategy: step: worker 1 timed out");
  }
}

}  // namespace
}  // namespace mirrored

// Fault injection (ctest label `faults`): every collective kind, with one replica that throws
// before the collective, throws inside it, returns without making it, hangs past a short deadline,
// or asks for something else than the others (kind, reduce op, axis, dtype, shape, structure), for
// 2, 3, 4 and 8 replicas, the faulty one being the first or the last. Each case checks the error
// type run rethrows, what every replica saw, that no replica waited past its deadline + 1 s, and
// that the next run of the same strategy gives exact results.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <ostream>
#include <sstream>

#include "faults/faults.hpp"

namespace mirrored {
namespace {

using namespace std::chrono_literals;
using testing::call_collective;
using testing::Kind;
using testing::kind_name;
using testing::observe;
using testing::Outcome;

enum class Fault {
  throw_before,     // the faulty replica throws instead of joining the collective
  throw_during,     // it fails inside: in the backend (BreakingOps) or, for merge_call, in merge_fn
  return_early,     // it returns from its function without making the collective
  hang,             // it arrives only after the others' deadline has passed
  other_kind,       // it makes another kind of collective
  other_op,         // all_reduce: MEAN where the others pass SUM
  other_axis,       // all_gather: axis 1 where the others pass axis 0
  other_dtype,      // float64 where the others pass float32 (merge_call: its argument)
  other_shape,      // all_reduce: another shape; all_gather: another size off the axis
  other_structure,  // all_reduce: a nest with other map keys
};

const char* fault_name(Fault f) {
  switch (f) {
    case Fault::throw_before: return "throw_before";
    case Fault::throw_during: return "throw_during";
    case Fault::return_early: return "return_early";
    case Fault::hang: return "hang";
    case Fault::other_kind: return "other_kind";
    case Fault::other_op: return "other_op";
    case Fault::other_axis: return "other_axis";
    case Fault::other_dtype: return "other_dtype";
    case Fault::other_shape: return "other_shape";
    case Fault::other_structure: return "other_structure";
  }
  return "?";
}

struct Case {
  Kind kind;
  Fault fault;
  int n;
  bool faulty_first;  // the faulty replica is 0, else n - 1

  int faulty() const { return faulty_first ? 0 : n - 1; }
  std::string name() const {
    return std::string(kind_name(kind)) + "_" + fault_name(fault) + "_" + std::to_string(n) + "replicas_faulty" +
           (faulty_first ? "First" : "Last");
  }
};

// gtest shows a case by its name rather than its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name(); }

// Fail-fast faults must be reported long before this deadline: one that ran into it would show as
// DeadlineExceededError, the wrong type. It is not shorter so that a replica thread the scheduler
// starts late (8 replicas on a loaded 2-core machine, under TSan) cannot time the others out.
constexpr double kFaultDeadline = 2.0;
// The deadline the hang cases wait out.
constexpr double kHangDeadline = 0.25;

// The faulty replica's call, for the faults that make a different call.
void call_differently(Kind kind, Fault fault) {
  ReplicaContext* ctx = get_replica_context();
  switch (fault) {
    case Fault::other_kind:
      if (kind == Kind::all_reduce)
        call_collective(Kind::all_gather);
      else
        call_collective(Kind::all_reduce);
      return;
    case Fault::other_op: ctx->all_reduce(ReduceOp::MEAN, Tensor<float>::full({3}, 1.0f)); return;
    case Fault::other_axis: ctx->all_gather(Tensor<float>::full({2, 2}, 1.0f), 1); return;
    case Fault::other_dtype:
      if (kind == Kind::all_reduce) ctx->all_reduce(ReduceOp::SUM, Tensor<double>::full({3}, 1.0));
      if (kind == Kind::all_gather) ctx->all_gather(Tensor<double>::full({2}, 1.0), 0);
      if (kind == Kind::merge_call)
        ctx->merge_call([](Strategy&, const PerReplica<double>& v) { return float(v[0]); }, 1.0);
      return;
    case Fault::other_shape:
      if (kind == Kind::all_reduce) ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({4}, 1.0f));
      if (kind == Kind::all_gather) ctx->all_gather(Tensor<float>::full({2, 3}, 1.0f), 0);
      return;
    case Fault::other_structure:
      ctx->all_reduce(ReduceOp::SUM, std::map<std::string, float>{{"a", 1}, {"b,c", 2}});
      return;
    default: return;
  }
}

// The others' call, for those faults (the counterpart of call_differently).
void call_normally(Kind kind, Fault fault) {
  ReplicaContext* ctx = get_replica_context();
  switch (fault) {
    case Fault::other_axis: ctx->all_gather(Tensor<float>::full({2, 2}, 1.0f), 0); return;
    case Fault::other_shape:
      if (kind == Kind::all_gather) {
        ctx->all_gather(Tensor<float>::full({2, 2}, 1.0f), 0);
        return;
      }
      break;
    case Fault::other_structure:
      ctx->all_reduce(ReduceOp::SUM, std::map<std::string, float>{{"a,b", 1}, {"c", 2}});
      return;
    default: break;
  }
  call_collective(kind);
}

// The error type run must rethrow, and the types the healthy replicas may see.
struct Expect {
  std::string run;
  std::vector<std::string> others;
  std::string faulty;  // "" when it does not call the collective or returns
};

Expect expected(const Case& c) {
  switch (c.fault) {
    case Fault::throw_before: return {"InjectedFault", {"AbortedError"}, ""};
    case Fault::throw_during:
      if (c.kind == Kind::merge_call) return {"InjectedFault", {"AbortedError"}, "InjectedFault"};
      return {"UnavailableError", {"AbortedError"}, "UnavailableError"};
    // The first replica to see it fails with FailedPreconditionError and aborts the group; the
    // others may see that abort first.
    case Fault::return_early: return {"FailedPreconditionError", {"FailedPreconditionError", "AbortedError"}, ""};
    // Likewise the first to time out; the late one finds the run aborted.
    case Fault::hang: return {"DeadlineExceededError", {"DeadlineExceededError", "AbortedError"}, "AbortedError"};
    // Every replica reaches the same verdict from the same posts.
    case Fault::other_kind: return {"FailedPreconditionError", {"FailedPreconditionError"}, "FailedPreconditionError"};
    default: return {"InvalidArgumentError", {"InvalidArgumentError"}, "InvalidArgumentError"};
  }
}

std::string describe(const std::vector<Outcome>& seen) {
  std::ostringstream os;
  for (std::size_t r = 0; r < seen.size(); ++r)
    os << "\n  replica " << r << ": " << (seen[r].called ? (seen[r].type.empty() ? "returned" : seen[r].type) : "-")
       << " after " << seen[r].seconds << " s";
  return os.str();
}

class CollectiveFaults : public ::testing::TestWithParam<Case> {};

TEST_P(CollectiveFaults, FailsWithTheRightTypeInTimeAndTheNextRunWorks) {
  const Case c = GetParam();
  auto ops = std::make_shared<testing::BreakingOps>();
  MirroredStrategy s(testing::cpus(c.n), ops);
  const double deadline = c.fault == Fault::hang ? kHangDeadline : kFaultDeadline;
  s.extended().set_collective_timeout_seconds(deadline);  // all_reduce, all_gather and merge_call
  if (c.fault == Fault::throw_during && c.kind != Kind::merge_call) ops->fail_on = c.faulty();

  const int faulty = c.faulty();
  std::vector<Outcome> seen(c.n);
  std::atomic<int> healthy_done{0};
  std::string run_error;
  try {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      if (r != faulty) {
        struct Done {
          std::atomic<int>& n;
          ~Done() { ++n; }
        } done{healthy_done};
        if (c.fault == Fault::throw_during && c.kind == Kind::merge_call) {
          observe(seen[r], [&] {
            get_replica_context()->merge_call([](Strategy&, const PerReplica<float>& v) { return v[0]; }, 1.0f);
          });
        } else {
          observe(seen[r], [&] { call_normally(c.kind, c.fault); });
        }
        return;
      }
      switch (c.fault) {
        case Fault::throw_before: throw testing::InjectedFault("injected before " + std::string(kind_name(c.kind)));
        case Fault::return_early: return;
        case Fault::hang: {
          // Arrive once every healthy replica has given up (bounded, should that never happen).
          const auto give_up = std::chrono::steady_clock::now() + 10s;
          while (healthy_done.load() < c.n - 1 && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(1ms);
          observe(seen[r], [&] { call_collective(c.kind); });
          return;
        }
        case Fault::throw_during:
          if (c.kind == Kind::merge_call) {
            // merge_fn runs on replica 0 only: there it throws.
            observe(seen[r], [&] {
              get_replica_context()->merge_call(
                  [](Strategy&, const PerReplica<float>&) -> float { throw testing::InjectedFault("merge_fn failed"); },
                  1.0f);
            });
          } else {
            observe(seen[r], [&] { call_collective(c.kind); });
          }
          return;
        default: observe(seen[r], [&] { call_differently(c.kind, c.fault); }); return;
      }
    });
  } catch (...) {
    run_error = testing::error_type(std::current_exception());
  }
  ops->fail_on = -1;

  const Expect want = expected(c);
  EXPECT_EQ(run_error, want.run) << describe(seen);
  for (int r = 0; r < c.n; ++r) {
    const Outcome& o = seen[r];
    if (r == faulty) {
      EXPECT_EQ(o.type, want.faulty) << "faulty replica " << r << describe(seen);
    } else {
      ASSERT_TRUE(o.called) << "replica " << r << describe(seen);
      EXPECT_NE(std::find(want.others.begin(), want.others.end(), o.type), want.others.end())
          << "replica " << r << " saw " << o.type << describe(seen);
    }
    EXPECT_LE(o.seconds, deadline + 1.0) << "replica " << r << describe(seen);
  }
  EXPECT_EQ(testing::check_strategy_works(s), "");
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  const std::vector<Fault> common{Fault::throw_before, Fault::throw_during, Fault::return_early,
                                  Fault::hang,         Fault::other_kind,   Fault::other_dtype};
  for (Kind kind : {Kind::all_reduce, Kind::all_gather, Kind::merge_call}) {
    std::vector<Fault> faults = common;
    if (kind == Kind::all_reduce)
      faults.insert(faults.end(), {Fault::other_op, Fault::other_shape, Fault::other_structure});
    if (kind == Kind::all_gather) faults.insert(faults.end(), {Fault::other_axis, Fault::other_shape});
    for (Fault fault : faults) {
      for (int n : {2, 3, 4, 8}) {
        for (bool first : {true, false}) {
          // merge_fn runs on replica 0 only, so only replica 0 can fail inside it.
          if (kind == Kind::merge_call && fault == Fault::throw_during && !first) continue;
          out.push_back(Case{kind, fault, n, first});
        }
      }
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Faults, CollectiveFaults, ::testing::ValuesIn(all_cases()),
                         [](const auto& info) { return info.param.name(); });

// ---------------------------------------------------------------------------------------------
// One deadline per collective: made where each replica's call enters the library, the earliest of
// them bounding every later wait of the collective (the rendezvous, the backend's syncs), never
// re-armed by a layer below.

// A backend in which replica `stuck` never leaves the collective: it waits (until the run is
// aborted) where the others sync.
class StuckOps : public ReductionToOneDevice {
 public:
  explicit StuckOps(int replica) : stuck(replica) {}
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    if (step.replica() == stuck.load()) {
      const auto give_up = std::chrono::steady_clock::now() + 20s;
      while (!step.aborted() && std::chrono::steady_clock::now() < give_up) std::this_thread::sleep_for(1ms);
    }
    step.sync();
    ReductionToOneDevice::all_reduce(op, step);
  }
  std::atomic<int> stuck;  // -1: none
};

TEST(OneDeadline, ACollectiveEndsByItsFirstReplicasDeadlinePlusTheGrace) {
  // Replica 1 enters 0.9 t after replica 0; inside, replica 2 never gets through. The others'
  // wait in the backend ends t after replica 0 entered (the earliest deadline), not t after the
  // late replica's join completed (1.9 t), and within the documented grace.
  constexpr double t = 2.0;
  auto ops = std::make_shared<StuckOps>(2);
  MirroredStrategy s(testing::cpus(3), ops);
  CommunicationOptions o;
  o.timeout_seconds = t;
  std::vector<double> took(3, -1);
  std::vector<std::chrono::steady_clock::time_point> starts(3), ends(3);
  std::vector<std::string> type(3);
  std::string run_error;
  try {
    s.run([&] {
      const int r = get_replica_context()->replica_id_in_sync_group();
      if (r == 1) std::this_thread::sleep_for(std::chrono::duration<double>(0.9 * t));
      starts[r] = std::chrono::steady_clock::now();
      try {
        get_replica_context()->all_reduce(ReduceOp::SUM, 1.0f, o);
      } catch (...) {
        ends[r] = std::chrono::steady_clock::now();
        took[r] = std::chrono::duration<double>(ends[r] - starts[r]).count();
        type[r] = testing::error_type(std::current_exception());
        throw;
      }
    });
  } catch (...) {
    run_error = testing::error_type(std::current_exception());
  }
  EXPECT_EQ(run_error, "DeadlineExceededError");
  // The first of replicas 0 and 1 to see the deadline raises it; the other sees the abort.
  EXPECT_TRUE(type[0] == "DeadlineExceededError" || type[0] == "AbortedError") << type[0];
  // The collective's deadline is the earliest entry's (replica 0's or the stuck replica 2's, which
  // may enter a moment before replica 0) plus t.
  EXPECT_GE(std::chrono::duration<double>(ends[0] - std::min(starts[0], starts[2])).count(), t);
  EXPECT_LT(took[0], t + kCollectiveGraceSeconds) << "replica 0 waited past its deadline plus the grace";
  // The late replica fails with replica 0: 0.1 t after it entered, long before its own t.
  EXPECT_LT(took[1], 0.1 * t + kCollectiveGraceSeconds) << "replica 1 got a deadline of its own";
  ops->stuck = -1;
  EXPECT_EQ(testing::check_strategy_works(s), "");
}

TEST(OneDeadline, AReplicaThatNeverArrivesFailsTheCollectiveAtTheTimeoutPlusTheGrace) {
  constexpr double t = 1.0;
  for (int n : {2, 4}) {
    MirroredStrategy s(testing::cpus(n));
    CommunicationOptions o;
    o.timeout_seconds = t;
    std::atomic<int> others_done{0};
    std::vector<double> took(n, -1);
    std::vector<std::string> type(n);
    try {
      s.run([&] {
        const int r = get_replica_context()->replica_id_in_sync_group();
        if (r == n - 1) {
          // Never arrives while the others wait (bounded, should they never give up).
          const auto give_up = std::chrono::steady_clock::now() + 20s;
          while (others_done.load() < n - 1 && std::chrono::steady_clock::now() < give_up)
            std::this_thread::sleep_for(1ms);
          return;
        }
        const auto start = std::chrono::steady_clock::now();
        try {
          get_replica_context()->all_reduce(ReduceOp::SUM, Tensor<float>::full({1024}, 1.0f), o);
        } catch (...) {
          took[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
          type[r] = testing::error_type(std::current_exception());
          ++others_done;
          throw;
        }
      });
    } catch (...) {
    }
    // The first replica past its deadline raises it (after its timeout); the others see the abort.
    int timed_out = 0;
    for (int r = 0; r < n - 1; ++r) {
      EXPECT_LT(took[r], t + kCollectiveGraceSeconds) << n << " replicas, replica " << r;
      if (type[r] == "DeadlineExceededError") {
        ++timed_out;
        EXPECT_GE(took[r], t) << n << " replicas, replica " << r;
      } else {
        EXPECT_EQ(type[r], "AbortedError") << n << " replicas, replica " << r;
      }
    }
    EXPECT_GE(timed_out, 1) << n << " replicas";
    EXPECT_EQ(testing::check_strategy_works(s), "");
  }
}

}  // namespace
}  // namespace mirrored

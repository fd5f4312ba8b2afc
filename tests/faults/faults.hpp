#pragma once
// Helpers of the fault-injection suite: what each replica saw (the error's type and how long it
// waited), a cross-device ops double that fails inside the backend, and the collectives driven by
// kind. Replica functions only record; assertions run on the main thread afterwards.

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "harness.hpp"

namespace mirrored::testing {

/// The error a test injects into a replica function (run must rethrow it with this type).
struct InjectedFault : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The parts streamed into one string (for SCOPED_TRACE and messages).
template <class... Parts>
std::string str(const Parts&... parts) {
  return detail::str_cat(parts...);
}

/// The error type names a replica can see.
inline std::string error_type(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const InjectedFault&) {
    return "InjectedFault";
  } catch (const AbortedError&) {
    return "AbortedError";
  } catch (const DeadlineExceededError&) {
    return "DeadlineExceededError";
  } catch (const FailedPreconditionError&) {
    return "FailedPreconditionError";
  } catch (const InvalidArgumentError&) {
    return "InvalidArgumentError";
  } catch (const UnavailableError&) {
    return "UnavailableError";
  } catch (const std::exception& x) {
    return std::string("std::exception: ") + x.what();
  } catch (...) {
    return "unknown";
  }
}

/// What one replica saw in a collective: the type of the error it threw ("" for none, i.e. it
/// returned normally) and the seconds it spent in the call.
struct Outcome {
  bool called = false;
  std::string type;
  double seconds = 0;
};

/// Calls `body()` as replica's collective call, records the outcome and rethrows.
template <class Body>
void observe(Outcome& slot, Body body) {
  slot.called = true;
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(); };
  try {
    body();
  } catch (...) {
    slot.seconds = elapsed();
    slot.type = error_type(std::current_exception());
    throw;
  }
  slot.seconds = elapsed();
}

/// InProcessAllReduce, except that replica `fail_on` throws UnavailableError inside the backend,
/// after doing its part (so bytes have moved into other replicas' outputs), like a link that
/// breaks in the middle of a collective.
class BreakingOps : public InProcessAllReduce {
 public:
  std::string name() const override { return "BreakingOps"; }
  void all_reduce(ReduceOp op, CollectiveStep& step) override {
    InProcessAllReduce::all_reduce(op, step);
    if (step.replica() == fail_on.load()) throw UnavailableError("link broke inside all_reduce");
  }
  void all_gather(int axis, CollectiveStep& step) override {
    InProcessAllReduce::all_gather(axis, step);
    if (step.replica() == fail_on.load()) throw UnavailableError("link broke inside all_gather");
  }
  std::atomic<int> fail_on{-1};
};

/// The kinds of collective a replica function can make.
enum class Kind { all_reduce, all_gather, merge_call };

inline const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_reduce: return "all_reduce";
    case Kind::all_gather: return "all_gather";
    case Kind::merge_call: return "merge_call";
  }
  return "?";
}

/// One well-formed call of `kind` by the calling replica (replica r contributes r + 1).
inline void call_collective(Kind kind) {
  ReplicaContext* ctx = get_replica_context();
  const float mine = float(ctx->replica_id_in_sync_group() + 1);
  switch (kind) {
    case Kind::all_reduce: ctx->all_reduce(ReduceOp::SUM, Tensor<float>::full({3}, mine)); break;
    case Kind::all_gather: ctx->all_gather(Tensor<float>::full({2}, mine), 0); break;
    case Kind::merge_call: ctx->merge_call([](Strategy&, const PerReplica<float>& v) { return v[0]; }, mine); break;
  }
}

/// Checks on the main thread that every collective kind gives exact results on `s` (after a
/// failed run): returns "" or what was wrong.
inline std::string check_strategy_works(MirroredStrategy& s) {
  const int n = s.num_replicas_in_sync();
  auto out = s.run([] {
    ReplicaContext* ctx = get_replica_context();
    const int r = ctx->replica_id_in_sync_group();
    Tensor<float> sum = ctx->all_reduce(ReduceOp::SUM, Tensor<float>{float(r + 1), 1});
    Tensor<int32_t> gathered = ctx->all_gather(Tensor<int32_t>{r}, 0);
    const int ids = ctx->merge_call(
        [](Strategy&, const PerReplica<int>& v) {
          int total = 0;
          for (int x : v.values()) total += x;
          return total;
        },
        r);
    return std::make_tuple(sum.to_vector(), gathered.to_vector(), ids);
  });
  std::vector<int32_t> all_ids;
  for (int r = 0; r < n; ++r) all_ids.push_back(r);
  for (int r = 0; r < n; ++r) {
    const auto& [sum, gathered, ids] = out[r];
    if (sum != std::vector<float>{float(n * (n + 1) / 2), float(n)})
      return "all_reduce is wrong on replica " + std::to_string(r);
    if (gathered != all_ids) return "all_gather is wrong on replica " + std::to_string(r);
    if (ids != n * (n - 1) / 2) return "merge_call is wrong on replica " + std::to_string(r);
  }
  return "";
}

}  // namespace mirrored::testing

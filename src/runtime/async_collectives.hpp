#pragma once
// Private: asynchronous collectives (ReplicaContext::all_reduce_async, PendingCollective). Each
// replica has a lane: a communication thread of the library that runs the replica's issued
// collectives one after another, in issue order, through the same joined code path as the
// synchronous calls (so results are bitwise the same and mismatches are caught the same way).
// Deadlines are the watchdog's (collective_watchdog.hpp), counted from issue.

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "collectives/collective_group.hpp"
#include "mirrored/collective_step.hpp"
#include "mirrored/communication_options.hpp"
#include "mirrored/deadline.hpp"
#include "mirrored/detail/device_backend.hpp"
#include "mirrored/detail/untyped_tensor.hpp"
#include "mirrored/reduce_op.hpp"
#include "runtime/collective_watchdog.hpp"

namespace mirrored {
class ReplicaContext;
}  // namespace mirrored

namespace mirrored::detail {

class AsyncCollectives;

struct AsyncCollective {
  ReplicaContext* ctx = nullptr;
  AsyncCollectives* lanes = nullptr;
  CollectiveGroup* group = nullptr;
  int replica = 0;              // among this process's replicas
  bool reduce_scatter = false;  // else an all-reduce
  ReduceOp op = ReduceOp::SUM;
  std::vector<UntypedTensor> in, out;  // out[i] may be in[i] (reduced in place)
  std::string structure;
  CommunicationOptions options;                                // as the replica passed them to the call
  std::vector<int64_t> split;                                  // reduce_scatter: every replica's piece
  mirrored::Deadline deadline = mirrored::Deadline::after(0);  // made when it was issued; the watchdog enforces it
  // GPU replicas: the replica's backend, the point of its compute stream the communication
  // stream starts after, and the end of the collective on the communication stream.
  DeviceBackend* backend = nullptr;
  std::unique_ptr<DeviceEvent> issued, completed;
  std::optional<CollectiveWatchdog::Ticket> ticket;

  std::atomic<bool> done{false};  // set (release) once error is final and the outputs are enqueued
  std::mutex mu;                  // settles the watchdog against completion: expired, expiry, error
  bool expired = false;
  std::string expiry;
  std::exception_ptr error;
  // A failure found after `done` was published (an NCCL collective's completion wait, which runs
  // after the result is handed out): set by the lane, read once it has finished the job.
  std::exception_ptr device_error;
  bool waited = false;      // the owner's thread only
  uint64_t flight_seq = 0;  // its flight-recorder entry (made when issued)

  /// What the lane posts for it: `kind` is its asynchronous kind on a lane, its synchronous one
  /// where it runs at once (a replica alone).
  CollectiveRequest request(CollectiveKind kind) const noexcept {
    return {.kind = kind,
            .op = op,
            .inputs = &in,
            .outputs = &out,
            .structure = &structure,
            .options = options,
            .split = reduce_scatter ? &split : nullptr};
  }
  /// How the group sees it.
  CollectiveKind kind() const noexcept {
    return reduce_scatter ? CollectiveKind::reduce_scatter_async : CollectiveKind::all_reduce_async;
  }
};

/// The lanes of one strategy (one per local replica, their threads started on first use) and
/// its watchdog.
class AsyncCollectives {
 public:
  explicit AsyncCollectives(int num_replicas);
  ~AsyncCollectives();
  AsyncCollectives(const AsyncCollectives&) = delete;
  AsyncCollectives& operator=(const AsyncCollectives&) = delete;

  /// Queues `job` on its replica's lane.
  void submit(std::shared_ptr<AsyncCollective> job);
  /// Returns once every collective replica `replica` issued has finished (bounded by their
  /// deadlines, which the watchdog enforces).
  void drain(int replica) noexcept;
  /// The collectives of `replica` that failed since the last call (whether or not someone waited
  /// for them): at the end of a run, those nobody waited for fail it.
  std::vector<std::shared_ptr<AsyncCollective>> take_failed(int replica);
  CollectiveWatchdog& watchdog() noexcept { return watchdog_; }

 private:
  struct Lane {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::shared_ptr<AsyncCollective>> queue;
    std::atomic<int64_t> pending{0};  // issued, not finished
    std::vector<std::shared_ptr<AsyncCollective>> failed;
    bool stop = false;
    std::thread thread;
  };
  void loop(Lane& lane);

  CollectiveWatchdog watchdog_;
  std::vector<std::unique_ptr<Lane>> lanes_;
};

/// What runs on a lane, and what needs the replica context's private parts (a friend of it).
class AsyncRunner {
 public:
  /// Runs `job` on the calling lane thread and publishes its outcome.
  static void run(AsyncCollective& job) noexcept;
  /// An unwaited collective's error fails the replica's run.
  static void record_failure(AsyncCollective& job) noexcept;
};

/// Blocks until `job` is done (its deadline bounds it: the watchdog aborts it then).
void wait_done(const AsyncCollective& job) noexcept;

}  // namespace mirrored::detail

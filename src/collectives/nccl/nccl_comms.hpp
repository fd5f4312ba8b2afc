#pragma once
// Private: NCCL communicators of one set of replica GPUs and the bounded waits around them, for
// NcclAllReduce (nccl_all_reduce.cpp). Communicators are non-blocking and created together
// (ncclCommInitRankConfig for every rank inside one group: ncclCommInitAll with a configuration);
// every wait has a deadline, and a wait that fails aborts them all (ncclCommAbort).
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "collectives/collective_group.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::nccl {

/// Throws the mirrored error for a failed NCCL call (UnavailableError for system, remote and
/// CUDA errors, InternalError otherwise), naming the call and where it ran.
[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm);

/// The NCCL type of a dtype.
ncclDataType_t nccl_type(DType d);

// Communicators of one set of replica GPUs.
struct Comms {
  std::vector<int> logical;   // rank -> logical GPU index
  std::vector<int> physical;  // rank -> physical GPU
  std::vector<ncclComm_t> comms;
  std::vector<cudaEvent_t> done;  // rank -> event on its stream after its collective
  std::shared_mutex mu;           // shared: using the communicators; exclusive: aborting them
  std::atomic<bool> aborted{false};

  ~Comms() {
    std::unique_lock lock(mu);
    abort_locked();
    for (std::size_t r = 0; r < done.size(); ++r) {
      if (!done[r]) continue;
      detail::CudaDeviceGuard guard(physical[r], std::nothrow);
      if (cudaEventDestroy(done[r]) != cudaSuccess) (void)cudaGetLastError();
    }
  }
  // Tears the communicators down without waiting for peers (also what a destructor needs: no
  // collective is in flight then, and abort never blocks on other ranks).
  void abort_locked() noexcept {
    if (aborted) return;
    aborted = true;
    for (std::size_t r = 0; r < comms.size(); ++r) {
      if (!comms[r]) continue;
      detail::CudaDeviceGuard guard(physical[r], std::nothrow);
      (void)ncclCommAbort(comms[r]);
    }
  }
  void abort() noexcept {
    std::unique_lock lock(mu);
    abort_locked();
  }
  std::string where(int rank) const {
    return detail::describe_gpu_call_site(Device(DeviceType::GPU, logical[rank]), physical[rank]);
  }
};

// Starts this process's communicators in one NCCL group: c.comms[r] becomes rank first_rank + r
// of `nranks` on c.physical[r] (c.mu held exclusively). On any failure it aborts those started and
// throws, naming `call` (or the group) and the rank's GPU; `all` names every GPU, for a failed
// ncclGroupStart.
void init_ranks(Comms& c, int nranks, int first_rank, const ncclUniqueId& id, ncclConfig_t& config,
                const std::string& all, const char* call);

/// Creates and initialises the communicators of these replica GPUs (rank r on `logical[r]`, which
/// lives on `physical[r]`) within `timeout_s`. \throws DeadlineExceededError past it (having
/// aborted them), the NCCL error of a failed initialisation.
std::shared_ptr<Comms> create_comms(const std::vector<int>& logical, const std::vector<int>& physical,
                                    double timeout_s);

// What a collective's waits observe: its one deadline (the call's; enqueueing and completion
// share it), and for a replica-context collective the run's abort signal (another replica failed).
// A cross-replica call has no step.
struct Limits {
  double timeout_s;
  std::chrono::steady_clock::time_point deadline;
  CollectiveStep* step = nullptr;
  // Watched instead of `step` by a wait that runs after the step has gone (a deferred completion).
  const CollectiveGroup* group = nullptr;
  /// The call's `deadline`, moved later by the time `creating` communicators took since
  /// `started` (their creation, once per set of GPUs, has a bound of its own: it is start-up, not
  /// the collective; with communicators in place the move is nil).
  static Limits until(const Deadline& deadline, std::chrono::steady_clock::time_point started,
                      CollectiveStep* step = nullptr);
  bool aborted() const { return (step && step->aborted()) || (group && group->aborted()); }
};

// Waits until rank `me`'s enqueued NCCL work (and what follows it on the stream up to `done`)
// has finished, by the collective's deadline; aborts the communicators on a timeout, an NCCL
// error or an aborted run.
void wait_for_completion(Comms& c, int me, CudaBackend& be, const Limits& limits, const char* what);

// Waits until rank `me`'s calls of a group are on its stream (a non-blocking communicator may
// still be connecting when ncclGroupEnd returns), by the collective's deadline.
void wait_enqueued(Comms& c, int me, const Limits& limits, const char* what);

// An open NCCL group of this thread, ended on every path: an exception between ncclGroupStart and
// ncclGroupEnd would leave the group open, and NCCL would then defer every later call of the
// thread without ever launching it (each later collective hanging until its deadline).
class GroupScope {
 public:
  GroupScope() = default;  // the caller has called ncclGroupStart successfully
  GroupScope(const GroupScope&) = delete;
  GroupScope& operator=(const GroupScope&) = delete;
  ~GroupScope() { (void)end(); }
  ncclResult_t end() noexcept {
    if (!open_) return ncclSuccess;
    open_ = false;
    return ncclGroupEnd();
  }

 private:
  bool open_ = true;
};

// Runs `enqueue(rank, comm)` for each rank of `ranks` inside one NCCL group (one rank per
// replica thread, or every rank from one cross-replica thread) and waits until the calls are on
// the streams.
template <class Enqueue>
void enqueue_group(Comms& c, const std::vector<int>& ranks, const Limits& limits, const char* what, Enqueue enqueue) {
  {
    std::shared_lock lock(c.mu);
    MIRRORED_ENFORCE(!c.aborted, AbortedError, "NcclAllReduce::", what, " on replica ", ranks.front(),
                     ": the NCCL communicators were aborted");
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) throw_nccl_error(res, "ncclGroupStart", c.where(ranks.front()), c.comms[ranks.front()]);
    GroupScope group;
    ncclResult_t called = ncclSuccess;
    int failed = ranks.front();
    for (int r : ranks) {
      detail::CudaDeviceGuard guard(c.physical[r], std::nothrow);
      called = enqueue(r, c.comms[r]);  // may throw (a stream to create): `group` ends the group
      if (called != ncclSuccess && called != ncclInProgress) {
        failed = r;
        break;
      }
    }
    res = group.end();
    if (called != ncclSuccess && called != ncclInProgress)
      throw_nccl_error(called, what, c.where(failed), c.comms[failed]);
    if (res != ncclSuccess && res != ncclInProgress)
      throw_nccl_error(res, "ncclGroupEnd", c.where(ranks.front()), c.comms[ranks.front()]);
  }
  for (int r : ranks) wait_enqueued(c, r, limits, what);
}

}  // namespace mirrored::detail::nccl

// NCCL communicators and the bounded waits around them (nccl_comms.hpp).
#include "collectives/nccl/nccl_comms.hpp"

#include <chrono>
#include <cstdlib>
#include <thread>

#include "util/spin.hpp"

namespace mirrored::detail::nccl {

using Clock = std::chrono::steady_clock;
using Poll = Backoff;

namespace {

// Every rank lives in this process and is initialised by one thread: connect them during
// initialisation rather than at the first collective, where a rank that never arrives would
// leave a half-made connection for ncclCommAbort to interrupt. NCCL reads NCCL_RUNTIME_CONNECT
// from the environment (its ncclConfig_t has no field for it up to 2.28 at least), and setenv
// races with getenv on any other thread, so it is set here, while the library is loaded, before
// main and before any thread of the library exists. A user's setting wins. Should a later NCCL
// give the configuration a `runtimeConnect` field, create_comms sets that instead.
template <class Config>
constexpr bool kConfigHasRuntimeConnect = requires(Config c) {
  c.runtimeConnect = 0;
};

// Connects during initialisation through the configuration, where NCCL has the field.
template <class Config>
void connect_at_init(Config& config) {
  if constexpr (kConfigHasRuntimeConnect<Config>) config.runtimeConnect = 0;
}

[[maybe_unused]] const bool kRuntimeConnectSet = [] {
  if constexpr (!kConfigHasRuntimeConnect<ncclConfig_t>) (void)::setenv("NCCL_RUNTIME_CONNECT", "0", 0);
  return true;
}();

}  // namespace

Limits Limits::until(const Deadline& deadline, Clock::time_point started, CollectiveStep* step) {
  const Deadline moved = deadline.extended(std::chrono::duration<double>(Clock::now() - started).count());
  return Limits{deadline.timeout_seconds(), moved.time_point(), step};
}

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm) {
  std::string message = str_cat("NcclAllReduce: ", call, " failed on ", where, ": ", ncclGetErrorString(r));
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) message += str_cat(" (", last, ")");
  }
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
    case ncclUnhandledCudaError: throw UnavailableError(message);
    default: throw InternalError(message);
  }
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
    // NCCL reduces these in their own precision along its ring (a rounding per hop, unlike the
    // float accumulation of the host and kernel paths).
    case DType::float16: return ncclFloat16;
    case DType::bfloat16: return ncclBfloat16;
    case DType::uint8: break;
  }
  return ncclUint8;
}

void init_ranks(Comms& c, int nranks, int first_rank, const ncclUniqueId& id, ncclConfig_t& config,
                const std::string& all, const char* call) {
  ncclResult_t res = ncclGroupStart();
  if (res != ncclSuccess) throw_nccl_error(res, "ncclGroupStart", all, nullptr);
  ncclResult_t failed = ncclSuccess;
  const char* failed_call = call;
  int failed_rank = 0;
  GroupScope group;
  try {
    for (int r = 0; r < static_cast<int>(c.comms.size()) && failed == ncclSuccess; ++r) {
      const auto k = static_cast<std::size_t>(r);
      CudaDeviceGuard guard(c.physical[k], Device(DeviceType::GPU, c.logical[k]));  // may throw
      res = ncclCommInitRankConfig(&c.comms[k], nranks, id, first_rank + r, &config);
      if (res != ncclSuccess && res != ncclInProgress) {
        failed = res;
        failed_rank = r;
      }
    }
  } catch (...) {
    (void)group.end();
    c.abort_locked();  // the ranks already initialising
    throw;
  }
  res = group.end();
  if (failed == ncclSuccess && res != ncclSuccess && res != ncclInProgress) {
    failed = res;
    failed_call = "ncclGroupEnd (communicator initialisation)";
  }
  if (failed != ncclSuccess) {
    c.abort_locked();
    throw_nccl_error(failed, failed_call, c.where(failed_rank), nullptr);
  }
}

std::shared_ptr<Comms> create_comms(const std::vector<int>& logical, const std::vector<int>& physical,
                                    double timeout_s) {
  const int n = static_cast<int>(logical.size());
  auto c = std::make_shared<Comms>();
  c->logical = logical;
  c->physical = physical;
  c->comms.assign(n, nullptr);
  c->done.assign(n, nullptr);
  const std::string all = str_cat(n, " GPUs");
  ncclUniqueId id;
  ncclResult_t res = ncclGetUniqueId(&id);
  if (res != ncclSuccess) throw_nccl_error(res, "ncclGetUniqueId", all, nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  connect_at_init(config);
  {
    std::unique_lock lock(c->mu);
    for (int r = 0; r < n; ++r) {
      CudaBackend& be = cuda_backend(logical[r]);
      CudaDeviceGuard guard(physical[r], be.device());
      be.check(cudaEventCreateWithFlags(&c->done[r], cudaEventDisableTiming), "cudaEventCreateWithFlags");
    }
    init_ranks(*c, n, 0, id, config, all, "ncclCommInitRankConfig");
  }
  // Non-blocking initialisation: wait until every communicator is ready, within the deadline.
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 0; r < n; ++r) {
    Poll poll;
    while (true) {
      ncclResult_t state = ncclSuccess;
      res = ncclCommGetAsyncError(c->comms[r], &state);
      if (res != ncclSuccess) state = res;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress) {
        const std::string where = c->where(r);
        const char* last = ncclGetLastError(c->comms[r]);
        const std::string detail = last && *last ? str_cat(" (", last, ")") : "";
        c->abort();
        throw_nccl_error(state, str_cat("communicator initialisation", detail).c_str(), where, nullptr);
      }
      if (Clock::now() > deadline) {
        c->abort();
        throw DeadlineExceededError(str_cat("NcclAllReduce: creating the NCCL communicators of ", n,
                                            " GPUs took longer than ", timeout_s, " s; they were aborted"));
      }
      poll.pause();
    }
  }
  return c;
}

void wait_for_completion(Comms& c, int me, CudaBackend& be, const Limits& limits, const char* what) {
  const auto deadline = limits.deadline;
  Poll poll;
  while (true) {
    {
      std::shared_lock lock(c.mu);
      if (c.aborted) {
        throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me,
                                   ": the NCCL communicators were aborted (another replica's collective failed or "
                                   "timed out)"));
      }
      const cudaError_t q = cudaEventQuery(c.done[me]);
      // Not an error, but the runtime may keep it as this thread's last error, which a later
      // kernel launch check would then report.
      if (q == cudaErrorNotReady) (void)cudaGetLastError();
      if (q != cudaSuccess && q != cudaErrorNotReady) {
        lock.unlock();
        c.abort();
        be.check(q, "cudaEventQuery (NCCL collective)");
      }
      // Also once the event is reached: a collective that failed inside NCCL (a proxy or network
      // error) may end its kernel early, and its output is then undefined.
      ncclResult_t state = ncclSuccess;
      const ncclResult_t res = ncclCommGetAsyncError(c.comms[me], &state);
      if (res != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        const ncclResult_t bad = res != ncclSuccess ? res : state;
        const std::string where = c.where(me);
        lock.unlock();
        c.abort();
        throw_nccl_error(bad, what, where, nullptr);
      }
      if (q == cudaSuccess) return;
    }
    if (limits.aborted()) {
      c.abort();
      throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me,
                                 ": another replica failed; the NCCL communicators were aborted"));
    }
    if (Clock::now() > deadline) {
      c.abort();
      throw DeadlineExceededError(str_cat("NcclAllReduce::", what, " on replica ", me, " (", c.where(me),
                                          ") did not complete within ", limits.timeout_s,
                                          " s; the NCCL communicators were aborted (the next collective creates "
                                          "new ones)"));
    }
    poll.pause();
  }
}

void wait_enqueued(Comms& c, int me, const Limits& limits, const char* what) {
  const auto deadline = limits.deadline;
  Poll poll;
  while (true) {
    {
      std::shared_lock lock(c.mu);
      MIRRORED_ENFORCE(!c.aborted, AbortedError, "NcclAllReduce::", what, " on replica ", me,
                       ": the NCCL communicators were aborted");
      ncclResult_t state = ncclSuccess;
      const ncclResult_t res = ncclCommGetAsyncError(c.comms[me], &state);
      const ncclResult_t bad = res != ncclSuccess ? res : state;
      if (bad == ncclSuccess) return;
      if (bad != ncclInProgress) {
        const std::string where = c.where(me);
        lock.unlock();
        c.abort();
        throw_nccl_error(bad, what, where, nullptr);
      }
    }
    if (limits.aborted() || Clock::now() > deadline) {
      c.abort();
      if (limits.aborted())
        throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me, ": another replica failed"));
      throw DeadlineExceededError(str_cat("NcclAllReduce::", what, " on replica ", me, " could not be enqueued within ",
                                          limits.timeout_s, " s; the NCCL communicators were aborted"));
    }
    poll.pause();
  }
}

}  // namespace mirrored::detail::nccl

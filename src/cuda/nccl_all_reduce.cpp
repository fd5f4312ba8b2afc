// NcclAllReduce with NCCL: one non-blocking communicator per replica GPU, created together
// (ncclCommInitRankConfig for every rank inside one group: ncclCommInitAll with a configuration),
// collectives enqueued by each replica thread on its own stream, and every wait bounded by the
// collective's deadline. A collective that runs past it, or whose run is aborted because another
// replica failed, aborts the communicators (ncclCommAbort); the next collective creates new ones.
#ifdef MIRRORED_HAVE_NCCL
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <shared_mutex>
#include <string>
#include <thread>
#include <vector>

#include "../collective_helpers.hpp"
#include "../gpu_registry.hpp"
#include "cuda_backend.hpp"
#include "mirrored/cross_device_ops.hpp"
#include "mirrored/detail/ops_selection.hpp"
#include "mirrored/errors.hpp"

namespace mirrored {

namespace detail {
bool nccl_compiled_in() noexcept { return true; }
}  // namespace detail

namespace {

using detail::CudaBackend;
using detail::str_cat;
using detail::UntypedTensor;
using Clock = std::chrono::steady_clock;

[[noreturn]] void throw_nccl_error(ncclResult_t r, const char* call, const std::string& where, ncclComm_t comm) {
  std::string message = str_cat("NcclAllReduce: ", call, " failed on ", where, ": ", ncclGetErrorString(r));
  if (comm) {
    const char* last = ncclGetLastError(comm);
    if (last && *last) message += str_cat(" (", last, ")");
  }
  switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
    case ncclUnhandledCudaError:
      throw UnavailableError(message);
    default:
      throw InternalError(message);
  }
}

ncclDataType_t nccl_type(DType d) {
  switch (d) {
    case DType::float32: return ncclFloat32;
    case DType::float64: return ncclFloat64;
    case DType::int32: return ncclInt32;
    case DType::int64: return ncclInt64;
    case DType::uint8: break;
  }
  return ncclUint8;
}

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

// Backs off from a busy poll to short sleeps.
class Poll {
 public:
  void pause() {
    ++spins_;
    if (spins_ < 64) return;
    if (spins_ < 256) {
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(spins_ < 2048 ? 20 : 500));
  }

 private:
  int spins_ = 0;
};

bool is_power_of_two(int n) { return n > 0 && (n & (n - 1)) == 0; }

}  // namespace

struct NcclAllReduce::Impl {
  static constexpr double kInitTimeoutS = 120;
  std::mutex mu;
  std::shared_ptr<Comms> current;

  // The communicators of these replica GPUs: the current ones, or new ones made by the first
  // replica to get here (the others find them ready).
  std::shared_ptr<Comms> acquire(const std::vector<int>& logical, const std::vector<int>& physical,
                                 double timeout_s, bool run_aborted) {
    std::lock_guard lock(mu);
    if (current && !current->aborted && current->logical == logical) return current;
    MIRRORED_ENFORCE(!run_aborted, AbortedError, "NcclAllReduce: the run was aborted because another replica failed");
    current.reset();  // aborts the previous set (it is idle: no collective of it is in flight)
    // Creating communicators (topology detection, connections) can take seconds on a large
    // machine, more than a short collective deadline allows; it gets at least kInitTimeoutS.
    current = create(logical, physical, std::max(timeout_s, kInitTimeoutS));
    return current;
  }

  static std::shared_ptr<Comms> create(const std::vector<int>& logical, const std::vector<int>& physical,
                                       double timeout_s) {
    const int n = static_cast<int>(logical.size());
    auto c = std::make_shared<Comms>();
    c->logical = logical;
    c->physical = physical;
    c->comms.assign(n, nullptr);
    c->done.assign(n, nullptr);
    const std::string all = str_cat(n, " GPUs");
    // Every rank lives in this process and is initialised by this thread: connect them during
    // initialisation rather than at the first collective, where a rank that never arrives would
    // leave a half-made connection for ncclCommAbort to interrupt. A user's setting wins.
    (void)setenv("NCCL_RUNTIME_CONNECT", "0", 0);
    ncclUniqueId id;
    ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) throw_nccl_error(res, "ncclGetUniqueId", all, nullptr);
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    {
      std::unique_lock lock(c->mu);
      for (int r = 0; r < n; ++r) {
        detail::CudaBackend& be = detail::cuda_backend(logical[r]);
        detail::CudaDeviceGuard guard(physical[r], be.device());
        be.check(cudaEventCreateWithFlags(&c->done[r], cudaEventDisableTiming), "cudaEventCreateWithFlags");
      }
      res = ncclGroupStart();
      if (res != ncclSuccess) throw_nccl_error(res, "ncclGroupStart", all, nullptr);
      ncclResult_t failed = ncclSuccess;
      const char* failed_call = "ncclCommInitRankConfig";
      int failed_rank = 0;
      for (int r = 0; r < n && failed == ncclSuccess; ++r) {
        detail::CudaDeviceGuard guard(physical[r], Device(DeviceType::GPU, logical[r]));
        res = ncclCommInitRankConfig(&c->comms[r], n, id, r, &config);
        if (res != ncclSuccess && res != ncclInProgress) {
          failed = res;
          failed_rank = r;
        }
      }
      res = ncclGroupEnd();
      if (failed == ncclSuccess && res != ncclSuccess && res != ncclInProgress) {
        failed = res;
        failed_call = "ncclGroupEnd (communicator initialisation)";
      }
      if (failed != ncclSuccess) {
        c->abort_locked();
        throw_nccl_error(failed, failed_call, c->where(failed_rank), nullptr);
      }
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
};

namespace {

// What a wait observes: its deadline, and for a replica-context collective the run's abort signal
// (another replica failed). A cross-replica call has no step.
struct Limits {
  double timeout_s;
  detail::CollectiveStep* step = nullptr;
  bool aborted() const { return step && step->aborted(); }
};

// Waits until rank `me`'s enqueued NCCL work (and what follows it on the stream up to `done`)
// has finished, within the deadline; aborts the communicators on a timeout, an NCCL error or an
// aborted run.
void wait_for_completion(Comms& c, int me, CudaBackend& be, const Limits& limits, const char* what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limits.timeout_s);
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
      if (q == cudaSuccess) return;
      // Not an error, but the runtime may keep it as this thread's last error, which a later
      // kernel launch check would then report.
      if (q == cudaErrorNotReady) (void)cudaGetLastError();
      if (q != cudaErrorNotReady) {
        lock.unlock();
        c.abort();
        be.check(q, "cudaEventQuery (NCCL collective)");
      }
      ncclResult_t state = ncclSuccess;
      const ncclResult_t res = ncclCommGetAsyncError(c.comms[me], &state);
      if (res != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        const ncclResult_t bad = res != ncclSuccess ? res : state;
        const std::string where = c.where(me);
        lock.unlock();
        c.abort();
        throw_nccl_error(bad, what, where, nullptr);
      }
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

// Waits until rank `me`'s calls of a group are on its stream (a non-blocking communicator may
// still be connecting when ncclGroupEnd returns).
void wait_enqueued(Comms& c, int me, const Limits& limits, const char* what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(limits.timeout_s);
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
      if (limits.aborted()) throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me, ": another replica failed"));
      throw DeadlineExceededError(str_cat("NcclAllReduce::", what, " on replica ", me,
                                          " could not be enqueued within ", limits.timeout_s,
                                          " s; the NCCL communicators were aborted"));
    }
    poll.pause();
  }
}

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
    ncclResult_t called = ncclSuccess;
    int failed = ranks.front();
    for (int r : ranks) {
      detail::CudaDeviceGuard guard(c.physical[r], std::nothrow);
      called = enqueue(r, c.comms[r]);
      if (called != ncclSuccess && called != ncclInProgress) {
        failed = r;
        break;
      }
    }
    res = ncclGroupEnd();
    if (called != ncclSuccess && called != ncclInProgress) throw_nccl_error(called, what, c.where(failed), c.comms[failed]);
    if (res != ncclSuccess && res != ncclInProgress)
      throw_nccl_error(res, "ncclGroupEnd", c.where(ranks.front()), c.comms[ranks.front()]);
  }
  for (int r : ranks) wait_enqueued(c, r, limits, what);
}

// Which replica GPU each replica's tensors of a leaf live on, or -1 when the leaf is not all on
// GPUs. `home` collects each replica's GPU (the first seen); a leaf elsewhere does not qualify.
bool leaf_on_replica_gpus(const std::vector<const UntypedTensor*>& tensors_by_replica_flat, int per_replica,
                          std::vector<int>& home) {
  const int n = static_cast<int>(home.size());
  std::vector<int> idx(n, -1);
  for (int r = 0; r < n; ++r) {
    for (int k = 0; k < per_replica; ++k) {
      const Device& d = tensors_by_replica_flat[static_cast<std::size_t>(r * per_replica + k)]->device();
      if (d.is_host()) return false;
      if (idx[r] < 0) idx[r] = d.index();
      if (idx[r] != d.index()) return false;
    }
  }
  for (int r = 0; r < n; ++r) {
    if (home[r] >= 0 && home[r] != idx[r]) return false;
  }
  for (int r = 0; r < n; ++r) home[r] = idx[r];
  return true;
}

std::vector<int> physical_of(const std::vector<int>& logical, const char* what) {
  std::vector<int> physical;
  std::set<int> seen;
  for (std::size_t r = 0; r < logical.size(); ++r) {
    const int p = detail::logical_gpu_location(logical[r]).first;
    if (!seen.insert(p).second) {
      std::size_t other = 0;
      while (physical[other] != p) ++other;
      throw InvalidArgumentError(str_cat(
          "NcclAllReduce::", what, ": replicas ", other, " (GPU:", logical[other], ") and ", r, " (GPU:", logical[r],
          ") are logical GPUs of the same physical GPU ", p,
          "; NCCL cannot run two ranks on one GPU. Use ReductionToOneDevice (the default for logical GPUs that share "
          "a chip) or one replica per physical GPU"));
    }
    physical.push_back(p);
  }
  return physical;
}

// One rank's part of a packed NCCL all-reduce: leaf k is `ins[k]` -> `outs[k]` (on the rank's
// GPU); a concatenated pack gets its own input and output buffers, filled before the NCCL calls
// and split after them, all in the rank's stream order.
class RankPacks {
 public:
  RankPacks(CudaBackend& be, const std::vector<detail::NcclPack>& packs, std::vector<const UntypedTensor*> ins,
            std::vector<const UntypedTensor*> outs)
      : be_(be), packs_(packs), ins_(std::move(ins)), outs_(std::move(outs)), bufs_(packs.size()) {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const auto& pack = packs_[p];
      const UntypedTensor& first = *ins_[pack.leaves.front()];
      if (!pack.concatenated()) {
        bufs_[p].in = first.data();
        bufs_[p].out = outs_[pack.leaves.front()]->data();
        continue;
      }
      bufs_[p].in_t = detail::make_untyped(first.dtype, {pack.numel}, be_.device());
      bufs_[p].out_t = detail::make_untyped(first.dtype, {pack.numel}, be_.device());
      bufs_[p].in = bufs_[p].in_t.data();
      bufs_[p].out = bufs_[p].out_t.data();
      std::size_t offset = 0;
      for (std::size_t k : pack.leaves) {
        be_.copy_within(static_cast<unsigned char*>(bufs_[p].in) + offset, ins_[k]->data(), ins_[k]->bytes());
        offset += ins_[k]->bytes();
      }
    }
  }

  CudaBackend& backend() const noexcept { return be_; }

  // The NCCL calls (inside the caller's group).
  ncclResult_t enqueue(ReduceOp op, int n, ncclComm_t comm) const {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const DType dtype = dtype_of(p);
      const std::size_t elem = dtype_size(dtype);
      const ncclRedOp_t redop = uses_avg(op, n, dtype) ? ncclAvg : ncclSum;
      for (const auto& [b, e] : packs_[p].chunks) {
        const ncclResult_t r =
            ncclAllReduce(static_cast<const unsigned char*>(bufs_[p].in) + b * elem,
                          static_cast<unsigned char*>(bufs_[p].out) + b * elem, static_cast<std::size_t>(e - b),
                          nccl_type(dtype), redop, comm, be_.stream());
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
    }
    return ncclSuccess;
  }

  // After the NCCL calls: MEAN without ncclAvg divides; concatenated packs are split.
  void finish(ReduceOp op, int n) const {
    for (std::size_t p = 0; p < packs_.size(); ++p) {
      const auto& pack = packs_[p];
      const DType dtype = dtype_of(p);
      if (op == ReduceOp::MEAN && !uses_avg(op, n, dtype)) be_.divide(dtype, bufs_[p].out, pack.numel, n);
      if (!pack.concatenated()) continue;
      std::size_t offset = 0;
      for (std::size_t k : pack.leaves) {
        be_.copy_within(outs_[k]->data(), static_cast<const unsigned char*>(bufs_[p].out) + offset, outs_[k]->bytes());
        offset += outs_[k]->bytes();
      }
    }
  }

 private:
  struct Buffers {
    void* in = nullptr;
    void* out = nullptr;
    UntypedTensor in_t, out_t;  // owners when concatenated
  };
  DType dtype_of(std::size_t p) const { return ins_[packs_[p].leaves.front()]->dtype; }
  // ncclAvg pre-multiplies floats by 1/n, which is exact only for a power of two; integers keep
  // the sum-then-truncating-division of the other implementations.
  static bool uses_avg(ReduceOp op, int n, DType dtype) {
    return op == ReduceOp::MEAN && is_power_of_two(n) && dtype_is_floating(dtype);
  }

  CudaBackend& be_;
  const std::vector<detail::NcclPack>& packs_;
  std::vector<const UntypedTensor*> ins_, outs_;
  std::vector<Buffers> bufs_;
};

}  // namespace

NcclAllReduce::NcclAllReduce(int num_packs) : num_packs_(num_packs), impl_(std::make_unique<Impl>()) {
  MIRRORED_ENFORCE(num_packs >= 0, InvalidArgumentError, "NcclAllReduce: num_packs must be >= 0, got ", num_packs);
}

NcclAllReduce::~NcclAllReduce() = default;

void NcclAllReduce::reduce(ReduceOp op, const std::vector<UntypedTensor>& per_replica, const UntypedTensor& out) {
  // Into one destination, TF's NcclAllReduce reduces on one device too.
  ReductionToOneDevice().reduce(op, per_replica, out);
}

void NcclAllReduce::all_reduce(ReduceOp op, detail::CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const std::size_t leaves = step.inputs(me).size();
  if (n == 1) {
    for (std::size_t i = 0; i < leaves; ++i) {
      const auto& in = step.inputs(0)[i];
      const auto& out = step.outputs(0)[i];
      detail::copy_between(out.data(), out.device(), in.data(), in.device(), out.bytes());
    }
    return;
  }
  // Leaves whose every tensor is on its replica's GPU go through NCCL; the rest (numbers, host
  // tensors) through the host. Every replica classifies alike from the same posts.
  std::vector<int> home(n, -1);
  std::vector<std::size_t> on_gpus, elsewhere;
  for (std::size_t i = 0; i < leaves; ++i) {
    if (step.inputs(0)[i].numel == 0) continue;
    std::vector<const UntypedTensor*> flat;
    for (int r = 0; r < n; ++r) {
      flat.push_back(&step.inputs(r)[i]);
      flat.push_back(&step.outputs(r)[i]);
    }
    (leaf_on_replica_gpus(flat, 2, home) ? on_gpus : elsewhere).push_back(i);
  }
  if (!elsewhere.empty()) detail::all_reduce_via_first(op, step, elsewhere);
  if (on_gpus.empty()) return;

  const std::vector<int> physical = physical_of(home, "all_reduce");
  std::shared_ptr<Comms> comms = impl_->acquire(home, physical, step.timeout_seconds(), step.aborted());
  CudaBackend& be = detail::cuda_backend(home[me]);
  detail::CudaDeviceGuard guard(be.physical(), be.device());
  std::vector<const UntypedTensor*> ins, outs;
  std::vector<std::pair<DType, int64_t>> described;
  for (std::size_t i : on_gpus) {
    ins.push_back(&step.inputs(me)[i]);
    outs.push_back(&step.outputs(me)[i]);
    described.emplace_back(step.inputs(me)[i].dtype, step.inputs(me)[i].numel);
  }
  const auto packs = detail::plan_nccl_packs(described, num_packs_);
  RankPacks rank(be, packs, ins, outs);
  const Limits limits{step.timeout_seconds(), &step};
  enqueue_group(*comms, {me}, limits, "all_reduce",
                [&](int, ncclComm_t comm) { return rank.enqueue(op, n, comm); });
  rank.finish(op, n);
  be.check(cudaEventRecord(comms->done[me], be.stream()), "cudaEventRecord");
  wait_for_completion(*comms, me, be, limits, "all_reduce");
}

bool NcclAllReduce::batch_all_reduce(ReduceOp op, const std::vector<std::vector<UntypedTensor>>& inputs,
                                     const std::vector<Device>& devices, std::vector<std::vector<UntypedTensor>>& outputs,
                                     double timeout_s) {
  const int n = static_cast<int>(devices.size());
  if (n < 2 || inputs.empty()) return false;
  // Only replicas on distinct physical GPUs with every input on its replica's GPU; anything else
  // (host replicas, logical GPUs of one chip, inputs elsewhere) takes the caller's host path.
  std::vector<int> logical, physical;
  std::set<int> seen;
  for (const Device& d : devices) {
    if (d.is_host()) return false;
    const int p = detail::logical_gpu_location(d.index()).first;
    if (!seen.insert(p).second) return false;
    logical.push_back(d.index());
    physical.push_back(p);
  }
  for (const auto& per_replica : inputs)
    for (int r = 0; r < n; ++r)
      if (per_replica[static_cast<std::size_t>(r)].device() != devices[static_cast<std::size_t>(r)]) return false;

  std::vector<std::vector<UntypedTensor>> out(inputs.size());
  std::vector<std::size_t> leaves;  // non-empty values, reduced through NCCL
  std::vector<std::pair<DType, int64_t>> described;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    for (int r = 0; r < n; ++r) {
      const auto& in = inputs[i][static_cast<std::size_t>(r)];
      out[i].push_back(detail::make_untyped(in.dtype, in.shape, devices[static_cast<std::size_t>(r)]));
    }
    if (inputs[i][0].numel == 0) continue;
    leaves.push_back(i);
    described.emplace_back(inputs[i][0].dtype, inputs[i][0].numel);
  }
  if (!leaves.empty()) {
    std::shared_ptr<Comms> comms = impl_->acquire(logical, physical, timeout_s, false);
    const auto packs = detail::plan_nccl_packs(described, num_packs_);
    std::vector<std::unique_ptr<RankPacks>> ranks;
    for (int r = 0; r < n; ++r) {
      CudaBackend& be = detail::cuda_backend(logical[static_cast<std::size_t>(r)]);
      detail::CudaDeviceGuard guard(be.physical(), be.device());
      std::vector<const UntypedTensor*> ins, outs;
      for (std::size_t i : leaves) {
        ins.push_back(&inputs[i][static_cast<std::size_t>(r)]);
        outs.push_back(&out[i][static_cast<std::size_t>(r)]);
      }
      ranks.push_back(std::make_unique<RankPacks>(be, packs, ins, outs));
    }
    std::vector<int> all(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) all[static_cast<std::size_t>(r)] = r;
    const Limits limits{timeout_s};
    enqueue_group(*comms, all, limits, "batch_all_reduce", [&](int r, ncclComm_t comm) {
      return ranks[static_cast<std::size_t>(r)]->enqueue(op, n, comm);
    });
    for (int r = 0; r < n; ++r) {
      CudaBackend& be = ranks[static_cast<std::size_t>(r)]->backend();
      detail::CudaDeviceGuard guard(be.physical(), be.device());
      ranks[static_cast<std::size_t>(r)]->finish(op, n);
      be.check(cudaEventRecord(comms->done[static_cast<std::size_t>(r)], be.stream()), "cudaEventRecord");
    }
    for (int r = 0; r < n; ++r)
      wait_for_completion(*comms, r, ranks[static_cast<std::size_t>(r)]->backend(), limits, "batch_all_reduce");
  }
  outputs = std::move(out);
  return true;
}

void NcclAllReduce::all_gather(int axis, detail::CollectiveStep& step) {
  const int n = step.num_replicas();
  const int me = step.replica();
  const auto& outs = step.outputs(me);
  for (std::size_t i = 0; i < outs.size(); ++i) {
    std::vector<const UntypedTensor*> parts;
    for (int r = 0; r < n; ++r) parts.push_back(&step.inputs(r)[i]);
    // NCCL when every input is on its replica's GPU and this replica's output on its own.
    std::vector<int> home(n, -1);
    bool nccl = n > 1 && leaf_on_replica_gpus(parts, 1, home) && !outs[i].device().is_host() &&
                outs[i].device().index() == home[me] && outs[i].numel > 0;
    if (!nccl) {
      detail::concat_into(parts, axis, outs[i]);
      continue;
    }
    const std::vector<int> physical = physical_of(home, "all_gather");
    std::shared_ptr<Comms> comms = impl_->acquire(home, physical, step.timeout_seconds(), step.aborted());
    CudaBackend& be = detail::cuda_backend(home[me]);
    detail::CudaDeviceGuard guard(be.physical(), be.device());
    const UntypedTensor& out = outs[i];
    const DType dtype = out.dtype;
    const std::size_t elem = dtype_size(dtype);
    int64_t outer = 1, inner = 1;
    for (int d = 0; d < axis; ++d) outer *= out.shape[d];
    for (std::size_t d = axis + 1; d < out.shape.size(); ++d) inner *= out.shape[d];
    std::vector<int64_t> row(n), offset(n);  // elements per outer index, and where they go in an output row
    int64_t at = 0;
    bool equal = true;
    for (int r = 0; r < n; ++r) {
      row[r] = parts[r]->shape[axis] * inner;
      offset[r] = at;
      at += row[r];
      equal = equal && row[r] == row[0];
    }
    const int64_t out_row = at;
    std::vector<UntypedTensor> staged(n);  // broadcast targets when parts interleave in the output
    if (!(outer == 1 && equal)) {
      for (int root = 0; root < n; ++root)
        if (outer > 1 && row[root] > 0) staged[root] = detail::make_untyped(dtype, {outer * row[root]}, be.device());
    }
    const Limits limits{step.timeout_seconds(), &step};
    enqueue_group(*comms, {me}, limits, "all_gather", [&](int, ncclComm_t comm) {
      if (outer == 1 && equal) {
        return ncclAllGather(parts[me]->data(), out.data(), static_cast<std::size_t>(row[me]), nccl_type(dtype), comm,
                             be.stream());
      }
      for (int root = 0; root < n; ++root) {
        if (row[root] == 0) continue;
        void* recv;
        if (outer == 1) {
          recv = static_cast<unsigned char*>(out.data()) + offset[root] * elem;
        } else {
          recv = staged[root].data();
        }
        const void* send = root == me ? parts[me]->data() : recv;
        const ncclResult_t r = ncclBroadcast(send, recv, static_cast<std::size_t>(outer * row[root]), nccl_type(dtype),
                                             root, comm, be.stream());
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
      return ncclSuccess;
    });
    if (outer > 1) {
      // Interleave the broadcast parts into the output rows.
      for (int root = 0; root < n; ++root) {
        if (row[root] == 0) continue;
        be.check(cudaMemcpy2DAsync(static_cast<unsigned char*>(out.data()) + offset[root] * elem,
                                   static_cast<std::size_t>(out_row) * elem, staged[root].data(),
                                   static_cast<std::size_t>(row[root]) * elem, static_cast<std::size_t>(row[root]) * elem,
                                   static_cast<std::size_t>(outer), cudaMemcpyDeviceToDevice, be.stream()),
                 "cudaMemcpy2DAsync");
      }
    }
    be.check(cudaEventRecord(comms->done[me], be.stream()), "cudaEventRecord");
    wait_for_completion(*comms, me, be, limits, "all_gather");
  }
}

}  // namespace mirrored
#endif  // MIRRORED_HAVE_NCCL

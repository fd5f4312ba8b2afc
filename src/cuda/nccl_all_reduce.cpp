// NcclAllReduce with NCCL: one non-blocking communicator per replica GPU, created together
// (ncclCommInitRankConfig for every rank inside one group: ncclCommInitAll with a configuration),
// collectives enqueued by each replica thread on its own stream, and every wait bounded by the
// collective's deadline. A collective that runs past it, or whose run is aborted because another
// replica failed, aborts the communicators (ncclCommAbort); the next collective creates new ones.
#ifdef MIRRORED_HAVE_NCCL
#include <nccl.h>

#include <atomic>
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
  std::mutex mu;
  std::shared_ptr<Comms> current;

  // The communicators of these replica GPUs: the current ones, or new ones made by the first
  // replica to get here (the others find them ready).
  std::shared_ptr<Comms> acquire(const std::vector<int>& logical, const std::vector<int>& physical,
                                 detail::CollectiveStep& step) {
    std::lock_guard lock(mu);
    if (current && !current->aborted && current->logical == logical) return current;
    MIRRORED_ENFORCE(!step.aborted(), AbortedError, "NcclAllReduce: the run was aborted because another replica failed");
    current.reset();  // aborts the previous set (it is idle: no collective of it is in flight)
    current = create(logical, physical, step.timeout_seconds());
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

// Waits until rank `me`'s enqueued NCCL work (and what follows it on the stream up to `done`)
// has finished, within the step's deadline; aborts the communicators on a timeout, an NCCL error
// or an aborted run.
void wait_for_completion(Comms& c, int me, CudaBackend& be, detail::CollectiveStep& step, const char* what) {
  const auto deadline = Clock::now() + std::chrono::duration<double>(step.timeout_seconds());
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
    if (step.aborted()) {
      c.abort();
      throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me,
                                 ": another replica failed; the NCCL communicators were aborted"));
    }
    if (Clock::now() > deadline) {
      c.abort();
      throw DeadlineExceededError(str_cat("NcclAllReduce::", what, " on replica ", me, " (", c.where(me),
                                          ") did not complete within ", step.timeout_seconds(),
                                          " s; the NCCL communicators were aborted (the next collective creates "
                                          "new ones)"));
    }
    poll.pause();
  }
}

// Runs `enqueue()` (NCCL calls for rank `me` inside one group) and waits until they are on the
// stream (non-blocking communicators may still be connecting), then records `done`.
template <class Enqueue>
void enqueue_group(Comms& c, int me, detail::CollectiveStep& step, const char* what,
                   Enqueue enqueue) {
  {
    std::shared_lock lock(c.mu);
    MIRRORED_ENFORCE(!c.aborted, AbortedError, "NcclAllReduce::", what, " on replica ", me,
                     ": the NCCL communicators were aborted");
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) throw_nccl_error(res, "ncclGroupStart", c.where(me), c.comms[me]);
    const ncclResult_t called = enqueue(c.comms[me]);
    res = ncclGroupEnd();
    if (called != ncclSuccess && called != ncclInProgress) throw_nccl_error(called, what, c.where(me), c.comms[me]);
    if (res != ncclSuccess && res != ncclInProgress) throw_nccl_error(res, "ncclGroupEnd", c.where(me), c.comms[me]);
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(step.timeout_seconds());
  Poll poll;
  while (true) {
    {
      std::shared_lock lock(c.mu);
      MIRRORED_ENFORCE(!c.aborted, AbortedError, "NcclAllReduce::", what, " on replica ", me,
                       ": the NCCL communicators were aborted");
      ncclResult_t state = ncclSuccess;
      const ncclResult_t res = ncclCommGetAsyncError(c.comms[me], &state);
      const ncclResult_t bad = res != ncclSuccess ? res : state;
      if (bad == ncclSuccess) break;
      if (bad != ncclInProgress) {
        const std::string where = c.where(me);
        lock.unlock();
        c.abort();
        throw_nccl_error(bad, what, where, nullptr);
      }
    }
    if (step.aborted() || Clock::now() > deadline) {
      c.abort();
      if (step.aborted()) throw AbortedError(str_cat("NcclAllReduce::", what, " on replica ", me, ": another replica failed"));
      throw DeadlineExceededError(str_cat("NcclAllReduce::", what, " on replica ", me,
                                          " could not be enqueued within ", step.timeout_seconds(),
                                          " s; the NCCL communicators were aborted"));
    }
    poll.pause();
  }
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
  std::shared_ptr<Comms> comms = impl_->acquire(home, physical, step);
  CudaBackend& be = detail::cuda_backend(home[me]);
  detail::CudaDeviceGuard guard(be.physical(), be.device());
  const Device& dev = be.device();

  std::vector<std::pair<DType, int64_t>> described;
  for (std::size_t i : on_gpus) described.emplace_back(step.inputs(me)[i].dtype, step.inputs(me)[i].numel);
  const auto packs = detail::plan_nccl_packs(described, num_packs_);
  const bool use_avg = op == ReduceOp::MEAN && is_power_of_two(n);  // ncclAvg premultiplies: exact only then
  const ncclRedOp_t redop = use_avg ? ncclAvg : ncclSum;

  // Concatenated packs get their own buffers.
  struct Buffers {
    void* in;
    void* out;
    UntypedTensor in_t, out_t;  // owners when concatenated
  };
  std::vector<Buffers> bufs(packs.size());
  for (std::size_t p = 0; p < packs.size(); ++p) {
    const auto& pack = packs[p];
    const std::size_t first = on_gpus[pack.leaves.front()];
    const DType dtype = step.inputs(me)[first].dtype;
    if (!pack.concatenated()) {
      bufs[p].in = step.inputs(me)[first].data();
      bufs[p].out = step.outputs(me)[first].data();
      continue;
    }
    bufs[p].in_t = detail::make_untyped(dtype, {pack.numel}, dev);
    bufs[p].out_t = detail::make_untyped(dtype, {pack.numel}, dev);
    bufs[p].in = bufs[p].in_t.data();
    bufs[p].out = bufs[p].out_t.data();
    std::size_t offset = 0;
    for (std::size_t k : pack.leaves) {
      const auto& t = step.inputs(me)[on_gpus[k]];
      be.copy_within(static_cast<unsigned char*>(bufs[p].in) + offset, t.data(), t.bytes());
      offset += t.bytes();
    }
  }
  enqueue_group(*comms, me, step, "all_reduce", [&](ncclComm_t comm) {
    for (std::size_t p = 0; p < packs.size(); ++p) {
      const DType dtype = step.inputs(me)[on_gpus[packs[p].leaves.front()]].dtype;
      const std::size_t elem = dtype_size(dtype);
      for (const auto& [b, e] : packs[p].chunks) {
        const ncclResult_t r = ncclAllReduce(static_cast<const unsigned char*>(bufs[p].in) + b * elem,
                                             static_cast<unsigned char*>(bufs[p].out) + b * elem,
                                             static_cast<std::size_t>(e - b), nccl_type(dtype), redop, comm, be.stream());
        if (r != ncclSuccess && r != ncclInProgress) return r;
      }
    }
    return ncclSuccess;
  });
  for (std::size_t p = 0; p < packs.size(); ++p) {
    const auto& pack = packs[p];
    const DType dtype = step.inputs(me)[on_gpus[pack.leaves.front()]].dtype;
    if (op == ReduceOp::MEAN && !use_avg) be.divide(dtype, bufs[p].out, pack.numel, n);
    if (!pack.concatenated()) continue;
    std::size_t offset = 0;
    for (std::size_t k : pack.leaves) {
      const auto& t = step.outputs(me)[on_gpus[k]];
      be.copy_within(t.data(), static_cast<const unsigned char*>(bufs[p].out) + offset, t.bytes());
      offset += t.bytes();
    }
  }
  be.check(cudaEventRecord(comms->done[me], be.stream()), "cudaEventRecord");
  wait_for_completion(*comms, me, be, step, "all_reduce");
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
    std::shared_ptr<Comms> comms = impl_->acquire(home, physical, step);
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
    enqueue_group(*comms, me, step, "all_gather", [&](ncclComm_t comm) {
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
    wait_for_completion(*comms, me, be, step, "all_gather");
  }
}

}  // namespace mirrored
#endif  // MIRRORED_HAVE_NCCL

// One NCCL communicator over every GPU of every worker of a multi-worker job (the GPU path of
// MultiWorkerMirroredStrategy): global rank = worker rank × local GPUs + local index; the unique
// id comes from the chief through the job's store. Waits are bounded like NcclAllReduce's
// (nccl_comms.hpp): non-blocking communicators, polled with a deadline, aborted on any failure.
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "cluster/transport/world_all_reduce.hpp"
#include "collectives/nccl/nccl_comms.hpp"
#include "device/cuda/cuda_backend.hpp"
#include "device/placement.hpp"
#include "mirrored/errors.hpp"

namespace mirrored::detail::cluster {
namespace {

using Clock = std::chrono::steady_clock;

class NcclWorld : public WorldAllReduce {
 public:
  explicit NcclWorld(std::shared_ptr<nccl::Comms> comms) : comms_(std::move(comms)) {}

  bool covers(const CollectiveStep& step) const override {
    for (int r = 0; r < step.num_replicas(); ++r) {
      const Device gpu(DeviceType::GPU, comms_->logical[static_cast<std::size_t>(r)]);
      for (const auto& t : step.inputs(r))
        if (t.device().is_host() || t.device().index() != gpu.index()) return false;
      for (const auto& t : step.outputs(r))
        if (t.device().is_host() || t.device().index() != gpu.index()) return false;
    }
    return true;
  }

  void all_reduce_sum(CollectiveStep& step) override {
    nccl::Comms& c = *comms_;
    const int me = step.replica();
    CudaBackend& be = cuda_backend(c.logical[static_cast<std::size_t>(me)]);
    const nccl::Limits limits = nccl::Limits::until(step.deadline(), Clock::now(), &step);
    const auto& ins = step.inputs(me);
    const auto& outs = step.outputs(me);
    nccl::enqueue_group(c, {me}, limits, "all_reduce across workers", [&](int, ncclComm_t comm) {
      ncclResult_t res = ncclSuccess;
      for (std::size_t i = 0; i < ins.size() && (res == ncclSuccess || res == ncclInProgress); ++i) {
        if (!ins[i].numel) continue;
        res = ncclAllReduce(ins[i].data(), outs[i].data(), static_cast<std::size_t>(ins[i].numel),
                            nccl::nccl_type(ins[i].dtype), ncclSum, comm, be.stream_for_call());
      }
      return res;
    });
    {
      CudaDeviceGuard guard(c.physical[static_cast<std::size_t>(me)], be.device());
      // The stream of this call (an asynchronous collective's communication stream), as NCCL used.
      be.check(cudaEventRecord(c.done[static_cast<std::size_t>(me)], be.stream_for_call()), "cudaEventRecord");
    }
    nccl::wait_for_completion(c, me, be, limits, "all_reduce across workers");
  }

  void abort() noexcept override { comms_->abort(); }

 private:
  std::shared_ptr<nccl::Comms> comms_;
};

}  // namespace

WorldAllReduce::~WorldAllReduce() = default;

bool nccl_world_possible(const std::vector<Device>& local) {
  std::set<int> physical;
  for (const Device& d : local) {
    if (d.is_host()) return false;
    physical.insert(physical_gpu_of(d));
  }
  return !local.empty() && physical.size() == local.size();
}

std::unique_ptr<WorldAllReduce> make_nccl_world_all_reduce(const std::vector<Device>& local, int rank, int workers,
                                                           KeyValueStore& store, const std::string& prefix,
                                                           double timeout_s) {
  std::vector<int> logical, physical;
  for (const Device& d : local) {
    logical.push_back(d.index());
    physical.push_back(physical_gpu_of(d));
  }
  const std::string key = prefix + "nccl/";
  const int n_local = static_cast<int>(local.size());
  const int nranks = workers * n_local;
  ncclUniqueId id;
  if (rank == 0) {
    const ncclResult_t res = ncclGetUniqueId(&id);
    if (res != ncclSuccess) nccl::throw_nccl_error(res, "ncclGetUniqueId", "the chief", nullptr);
    store.set(key + "id", std::string(reinterpret_cast<const char*>(&id), sizeof(id)));
  } else {
    const auto bytes = store.get(key + "id", timeout_s);
    MIRRORED_ENFORCE(bytes && bytes->size() == sizeof(id), DeadlineExceededError,
                     "MultiWorkerMirroredStrategy: the chief's NCCL unique id did not arrive within ", timeout_s, " s");
    std::memcpy(&id, bytes->data(), sizeof(id));
  }

  auto c = std::make_shared<nccl::Comms>();
  c->logical = logical;
  c->physical = physical;
  c->comms.assign(static_cast<std::size_t>(n_local), nullptr);
  c->done.assign(static_cast<std::size_t>(n_local), nullptr);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  {
    std::unique_lock lock(c->mu);
    for (int r = 0; r < n_local; ++r) {
      CudaBackend& be = cuda_backend(logical[static_cast<std::size_t>(r)]);
      CudaDeviceGuard guard(physical[static_cast<std::size_t>(r)], be.device());
      be.check(cudaEventCreateWithFlags(&c->done[static_cast<std::size_t>(r)], cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    }
    nccl::init_ranks(*c, nranks, rank * n_local, id, config, "the workers' GPUs",
                     "ncclCommInitRankConfig (every worker's GPUs)");
  }
  const auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  for (int r = 0; r < n_local; ++r) {
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t res = ncclCommGetAsyncError(c->comms[static_cast<std::size_t>(r)], &state);
      const ncclResult_t now = res != ncclSuccess ? res : state;
      if (now == ncclSuccess) break;
      if (now != ncclInProgress) {
        const std::string where = c->where(r);
        c->abort();
        nccl::throw_nccl_error(now, "communicator initialisation (every worker's GPUs)", where, nullptr);
      }
      if (Clock::now() > deadline) {
        c->abort();
        throw DeadlineExceededError(str_cat("MultiWorkerMirroredStrategy: the NCCL communicator of ", nranks,
                                            " GPUs on ", workers, " workers was not ready within ", timeout_s,
                                            " s; it was aborted"));
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }
  return std::make_unique<NcclWorld>(std::move(c));
}

}  // namespace mirrored::detail::cluster
